"""An upstream-vLLM-like log for the parse benchmark: most lines are not request lines.

Issue #5's target is the parse stage on "the upstream-vLLM mix where most lines are not request
lines": a log where the prefilter and the chatter rules see most of the traffic. The mix, per
line drawn:

- 15 % request lines: two thirds seed lifecycle lines (the generator's, in order), one third
  upstream request lines (`Received request …` with its sampling params, `Added request`,
  `Finished request`), which the upstream grammar parses in full;
- 1 % engine stats lines (V1 `Engine 000: Avg prompt throughput …` and V0's): vLLM prints one
  per engine every 10 s (VLLM_LOG_STATS_INTERVAL), so 1 % is already a quiet server's rate;
- 84 % other lines: uvicorn access lines, torch/NCCL C++ warnings, tqdm progress bars, and
  INFO/DEBUG chatter of vLLM's modules (routes, the engine's heartbeat, model-runner and
  worker lines), with the numbers, ids and addresses in them varying.

An earlier version of this mix counted `Received`/`Added`/`Finished` and stats lines as noise
(the upstream grammar did not exist yet); with that grammar they are request and engine lines,
and that version's mix was 79 % lines the bridge parses in full. `bench/run.py` prints the
shares it measured, so the figure always says what it was measured on.
"""

from __future__ import annotations

import random

from bridge.synth import SynthConfig, generate
from bridge.synth.seed import _header

#: Upstream request lines (level, origin, template).
_UPSTREAM_REQUEST = [
    ("INFO", "logger.py:39", "Received request chatcmpl-{h}: prompt: '<|user|>hello there {n}', params: "
     "SamplingParams(n=1, temperature=0.7, top_p=1.0, max_tokens={n}), prompt_token_ids: None, lora_request: None."),
    ("INFO", "async_llm.py:261", "Added request chatcmpl-{h}."),
    ("INFO", "engine.py:310", "Finished request chatcmpl-{h}."),
]
_STATS = [
    ("INFO", "metrics.py:455", "Avg prompt throughput: {f} tokens/s, Avg generation throughput: {f} tokens/s, "
     "Running: {n} reqs, Swapped: 0 reqs, Pending: {n} reqs, GPU KV cache usage: {f}%, CPU KV cache usage: 0.0%."),
    ("INFO", "loggers.py:116", "Engine 000: Avg prompt throughput: {f} tokens/s, Avg generation throughput: {f} "
     "tokens/s, Running: {n} reqs, Waiting: {n} reqs, GPU KV cache usage: {f}%, Prefix cache hit rate: {f}%"),
]
#: Other lines with a vLLM header (level, origin, template).
_CHATTER = [  # origins are fixed: a call site's file and line do not change from line to line
    ("INFO", "launcher.py:28", "Route: /v1/chat/completions, Methods: POST"),
    ("DEBUG", "client.py:180", "Waiting for output from MQLLMEngine."),
    ("DEBUG", "core.py:688", "EngineCore waiting for work."),
    ("DEBUG", "gpu_model_runner.py:2131", "Padding batch of {n} requests to CUDA graph size {n}"),
    ("DEBUG", "utils.py:112", "Found nccl from library libnccl.so.2"),
    ("INFO", "gpu_worker.py:305", "Memory usage after step: {f} GiB"),
    ("WARNING", "tokenizer.py:409", "Token indices sequence length is longer than the specified maximum ({n} > {n})"),
]
#: Lines without a vLLM header.
_RAW = [
    'INFO:     10.0.{n}.7:5{n} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "[W1115 10:00:00.{n} ProcessGroupNCCL.cpp:1250] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default now",
    "Processed prompts:  {n}%|████      | {n}/{n} [00:01<00:02, {f}it/s]",
]


def _fill(template: str, rnd: random.Random) -> str:
    return template.format(f=f"{rnd.uniform(0, 900):.1f}", n=rnd.randrange(1, 999), h=f"{rnd.getrandbits(64):016x}")


def upstream_like_lines(n: int, request_share: float = 0.15, stats_share: float = 0.01, seed: int = 1) -> list[str]:
    """`n` log lines: `request_share` request lines (2/3 seed, 1/3 upstream), `stats_share` engine
    stats lines, the rest other lines (1/4 of them header-less)."""
    rnd = random.Random(seed)
    want_seed = int(n * request_share * 2 / 3) + 1
    records, _ = generate(SynthConfig(requests=max(10, want_seed // 9), seed=seed, noise_ratio=0.0))
    seed_lines = iter([_header(ts, lvl, org, msg) for ts, _, lvl, org, msg in records][:want_seed])
    base_ts = records[0][0]
    out: list[str] = []
    for i in range(n):
        ts = base_ts + i * 1_000_000
        x = rnd.random()
        if x < request_share:
            line = next(seed_lines, None) if x < request_share * 2 / 3 else None
            if line is None:
                level, origin, template = rnd.choice(_UPSTREAM_REQUEST)
                line = _header(ts, level, origin, _fill(template, rnd))
            out.append(line)
        elif x < request_share + stats_share:
            level, origin, template = rnd.choice(_STATS)
            out.append(_header(ts, level, origin, _fill(template, rnd)))
        elif rnd.random() < 0.25:
            out.append(_fill(rnd.choice(_RAW), rnd))
        else:
            level, origin, template = rnd.choice(_CHATTER)
            out.append(_header(ts, level, origin, _fill(template, rnd)))
    return out
