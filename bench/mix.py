"""An upstream-vLLM-like log for the parse benchmark: most lines are not request lines.

Upstream vLLM logs are dominated by lines the bridge does not turn into events (throughput
metrics, request-received echoes, uvicorn access lines, torch/NCCL C++ warnings). The upstream
grammar lives on another branch; this mix uses the seed dialect's request lines and a spread of
upstream-shaped lines that the seed grammar does not claim, which is exactly what the
prefilter has to reject cheaply.
"""

from __future__ import annotations

import random

from bridge.synth import SynthConfig, generate
from bridge.synth.seed import _header

_NOISE = [
    ("INFO", "metrics.py:455", "Avg prompt throughput: {f} tokens/s, Avg generation throughput: {f} tokens/s, "
     "Running: {n} reqs, Swapped: 0 reqs, Pending: {n} reqs, GPU KV cache usage: {f}%, CPU KV cache usage: 0.0%."),
    ("INFO", "loggers.py:116", "Engine 000: Avg prompt throughput: {f} tokens/s, Avg generation throughput: {f} "
     "tokens/s, Running: {n} reqs, Waiting: {n} reqs, GPU KV cache usage: {f}%, Prefix cache hit rate: {f}%"),
    ("INFO", "logger.py:39", "Received request chatcmpl-{h}: prompt: '<|user|>hello there {n}', params: "
     "SamplingParams(n=1, temperature=0.7, top_p=1.0, max_tokens={n}), prompt_token_ids: None, lora_request: None."),
    ("INFO", "async_llm.py:261", "Added request chatcmpl-{h}."),
    ("INFO", "engine.py:310", "Finished request chatcmpl-{h}."),
    ("INFO", "launcher.py:28", "Route: /v1/chat/completions, Methods: POST"),
    ("DEBUG", "client.py:180", "Waiting for output from MQLLMEngine."),
]
_RAW = [
    'INFO:     10.0.{n}.7:5{n} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "[W1115 10:00:00.{n} ProcessGroupNCCL.cpp:1250] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default now",
]


def _fill(template: str, rnd: random.Random) -> str:
    return template.format(f=f"{rnd.uniform(0, 900):.1f}", n=rnd.randrange(1, 999), h=f"{rnd.getrandbits(64):016x}")


def upstream_like_lines(n: int, request_share: float = 0.15, seed: int = 1) -> list[str]:
    """`n` log lines with headers; `request_share` of them seed request lines, the rest noise."""
    rnd = random.Random(seed)
    want_requests = int(n * request_share)
    records, _ = generate(SynthConfig(requests=max(10, want_requests // 9), seed=seed, noise_ratio=0.0))
    seed_lines = [_header(ts, lvl, org, msg) for ts, _, lvl, org, msg in records][:want_requests]
    base_ts = records[0][0]
    out: list[str] = []
    it = iter(seed_lines)
    for i in range(n):
        if rnd.random() < request_share:
            line = next(it, None)
            if line is not None:
                out.append(line)
                continue
        if rnd.random() < 0.15:
            out.append(_fill(rnd.choice(_RAW), rnd))
        else:
            level, origin, template = rnd.choice(_NOISE)
            out.append(_header(base_ts + i * 1_000_000, level, origin, _fill(template, rnd)))
    return out
