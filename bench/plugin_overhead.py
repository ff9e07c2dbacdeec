"""What the vLLM plugin costs vLLM: vLLM 0.32's REAL `Scheduler` (engine core) and
`OutputProcessor` (API server) driven in-process, side by side with vLLM's own native tracing.

    ~/.cache/vllm-trace-bridge/vllm-venv/bin/python bench/plugin_overhead.py \
        [--rounds 30] [--requests 200] [--max-tokens 32] [--before REV]

Run it with the vLLM venv's interpreter (it imports vLLM; nothing else of the bridge). Every
round runs each condition once, in a shuffled order, on fresh objects:

- `plain` and `plain2`: vLLM as shipped (the second is the control: plain vs plain);
- `before`: the plugin as it was at git revision `--before` (default: the merge base with
  main's first-parent history, i.e. `HEAD~` is NOT assumed: pass the revision you mean);
- `plugin`: this checkout's plugin (bridge/vllm_plugin), default settings;
- `engine` (with `--engine`): the same, with its engine-core lines on
  (`VLLM_TRACE_BRIDGE_PLUGIN_ENGINE=1`);
- `native`: vLLM's own tracing (`OutputProcessor(tracing_enabled=True)`: the `llm_request`
  span of every finished request, with a span processor that encodes each batch of 512 spans to
  OTLP protobuf inline, as the exporter's thread would; the network send is not counted).
  The engine core's "detailed traces" (`--collect-detailed-traces`) time the model runner,
  which is not driven here, so native's engine-core figure is the scheduler's only.

Each condition gets its own subclasses of vLLM's classes, so a plugin's wrappers touch only its
own condition. A plugin writes through what it writes with in vLLM (the old one: vLLM's
logging, formatted as vLLM's handler does; the new one: its own `LineWriter`), into /dev/null.
The load: `--requests` requests of 64-token prompts with `--max-tokens` output
tokens each, at most 64 running, through `schedule` → a fake model output (one token per
request) → `update_from_output` → `OutputProcessor.process_outputs`, twice per round: with a KV
cache big enough for all (no preemption) and with one small enough that vLLM preempts.

Measured: thread CPU time (`time.thread_time`) of the engine core's calls (`add_request`,
`schedule`, `update_from_output`) and of the API server's (`OutputProcessor.add_request`,
`process_outputs`), per request, with Python's garbage collector held off during a run (a
collection would land on whichever condition runs then); the median over rounds, and the
median of each round's difference to `plain` (paired: a round's conditions share the machine's
load of that moment). `plain2 − plain` says how precise that difference is. Figures, not
assertions.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_PLUGINS", "none")  # the installed plugin must not patch vLLM's own classes
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path(os.path.expanduser("~/.cache/vllm-trace-bridge/tiny-llama-plugin"))


def _logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers.clear()
    h = logging.StreamHandler(open(os.devnull, "w"))
    # vLLM's own format (vllm/logger.py), so formatting a line is counted too.
    h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                                     "%m-%d %H:%M:%S"))
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def _load_plugin(name: str, src: dict[str, str]):
    """The plugin package from its two files' text, under its own name (imports rewritten)."""
    tmp = Path(tempfile.mkdtemp(prefix="plugin-")) / name
    tmp.mkdir()
    for fname, text in src.items():
        (tmp / fname).write_text(text.replace("bridge.vllm_plugin", name))
    sys.path.insert(0, str(tmp.parent))
    return importlib.import_module(f"{name}.hooks")


def _git_show(rev: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True,
                          text=True).stdout


class _Encoding:
    """A span processor doing what vLLM's BatchSpanProcessor + OTLP exporter do with a span,
    inline: keep it, and encode every 512 to an OTLP request (not sent)."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        self.encode, self.batch = encode_spans, []

    def on_start(self, span, parent_context=None) -> None:
        pass

    def _on_ending(self, span) -> None:
        pass

    def on_end(self, span) -> None:
        self.batch.append(span)
        if len(self.batch) >= 512:
            self.flush()

    def flush(self, timeout_millis: int = 0) -> bool:
        if self.batch:
            self.encode(self.batch).SerializeToString()
            self.batch = []
        return True

    force_flush = flush

    def shutdown(self) -> None:
        self.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--before", default=None, help="git revision of the plugin to compare (e.g. main)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--engine", action="store_true",
                    help="also `engine`: this plugin with VLLM_TRACE_BRIDGE_PLUGIN_ENGINE=1")
    args = ap.parse_args()

    import torch
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.version import __version__

    provider = TracerProvider()
    encoder = _Encoding()
    provider.add_span_processor(encoder)
    trace.set_tracer_provider(provider)

    cfg = EngineArgs(model=str(MODEL), max_model_len=1024, enforce_eager=True, max_num_seqs=64,
                     skip_tokenizer_init=True, enable_prefix_caching=False).create_engine_config()
    som = StructuredOutputManager(cfg)

    def kv(blocks: int):
        return KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=16, dtype=torch.float32))])

    conditions: dict[str, tuple[type, type, bool, type]] = {}
    for name in ("plain", "plain2", "native"):
        conditions[name] = (type(f"S_{name}", (Scheduler,), {}), type(f"O_{name}", (OutputProcessor,), {}),
                            name == "native", IterationStats)
    now = _load_plugin("plugin_now", {f: (ROOT / "bridge/vllm_plugin" / f).read_text()
                                      for f in ("__init__.py", "hooks.py")})
    hook_mods = {"plugin": now}
    if args.engine:
        hook_mods["engine"] = now  # the same plugin, its engine-core lines asked for
    if args.before:
        hook_mods["before"] = _load_plugin("plugin_before", {
            f: _git_show(args.before, f"bridge/vllm_plugin/{f}") for f in ("__init__.py", "hooks.py")})
    for name, mod in hook_mods.items():
        s_cls, o_cls = type(f"S_{name}", (Scheduler,), {}), type(f"O_{name}", (OutputProcessor,), {})
        # the plugin's own writer when it has one (into /dev/null), else a logger as vLLM's
        out = mod.LineWriter(open(os.devnull, "w")) if hasattr(mod, "LineWriter") else _logger(f"bench.{name}")
        i_cls = IterationStats
        kw = {}
        if "stats_cls" in mod.install.__code__.co_varnames:  # hooks vLLM's IterationStats too
            i_cls = kw["stats_cls"] = type(f"I_{name}", (IterationStats,), {})
            kw["async_cls"] = None  # AsyncLLM.add_request is not driven here
        assert mod.install(s_cls, __version__, out, output_cls=o_cls, **kw), name
        conditions[name] = (s_cls, o_cls, False, i_cls)

    sp = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, detokenize=False,
                        output_kind=RequestOutputKind.DELTA)
    prompt = list(range(1, 65))

    def run(name: str, blocks: int, rnd: int) -> tuple[float, float]:
        s_cls, o_cls, tracing, i_cls = conditions[name]
        cfg.cache_config.num_gpu_blocks = blocks
        if name == "engine":
            os.environ["VLLM_TRACE_BRIDGE_PLUGIN_ENGINE"] = "1"  # read as the scheduler is made
        try:
            s = s_cls(cfg, kv(blocks), som, block_size=16, log_stats=True)
        finally:
            os.environ.pop("VLLM_TRACE_BRIDGE_PLUGIN_ENGINE", None)
        op = o_cls(None, log_stats=True, tracing_enabled=tracing)
        engine = front = 0.0
        clock = time.thread_time
        pending = [EngineCoreRequest(request_id=f"cmpl-{rnd}-{i}-0-{i:08x}", prompt_token_ids=prompt,
                                     mm_features=None, sampling_params=sp, pooling_params=None,
                                     arrival_time=time.time(), lora_request=None, cache_salt=None,
                                     data_parallel_rank=None, external_req_id=f"cmpl-{rnd}-{i}-0")
                   for i in range(args.requests)]
        pending.reverse()
        done = 0
        while done < args.requests:
            # the API server hands requests over as they come: 8 per step while any are left
            t0 = clock()
            batch = [pending.pop() for _ in range(min(8, len(pending)))]
            for er in batch:
                op.add_request(er, None)
            t1 = clock()
            for er in batch:
                s.add_request(Request.from_engine_core_request(er, None))
            so = s.schedule()
            ids = list(so.num_scheduled_tokens)
            mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                    sampled_token_ids=[[7] for _ in ids])
            outs = s.update_from_output(so, mro)
            t2 = clock()
            for eco in outs.values():
                it = i_cls()
                op.process_outputs(eco.outputs, eco.timestamp, it)
                done += len(it.finished_requests)
            t3 = clock()
            front += (t1 - t0) + (t3 - t2)
            engine += t2 - t1
        encoder.flush()
        return engine / args.requests, front / args.requests

    cfg.cache_config.num_gpu_blocks = 64
    probe = conditions["plugin"][0](cfg, kv(64), som, block_size=16, log_stats=True)
    untouched = all(getattr(type(probe), m) is getattr(Scheduler, m) and m not in vars(probe)
                    for m in ("add_request", "schedule", "update_from_output", "_preempt_request", "_free_request",
                              "_free_request_blocks"))
    rng = random.Random(args.seed)
    loads = {"no preemption": 64 * 8, "KV pressure": 40}
    names = list(conditions)
    res = {(load, n): ([], []) for load in loads for n in names}
    for name in names:  # warm-up: imports, caches
        for blocks in loads.values():
            run(name, blocks, -1)
    gc.collect()
    gc.disable()  # a collection lands in whichever condition runs then: noise, not cost
    try:
        for rnd in range(args.rounds):
            for load, blocks in loads.items():
                order = names[:]
                rng.shuffle(order)
                for name in order:
                    e, f = run(name, blocks, rnd)
                    res[(load, name)][0].append(e)
                    res[(load, name)][1].append(f)
                gc.collect()
    finally:
        gc.enable()

    print(f"vLLM {__version__}, real Scheduler + OutputProcessor in-process; {args.rounds} rounds x "
          f"{args.requests} requests x {args.max_tokens} tokens, conditions shuffled per round; "
          f"thread CPU µs per request: median, and in brackets the median of the same round's "
          f"difference to plain")

    print(f"  plugin's scheduler runs vLLM's own engine-core methods, no wrapper in between: {untouched}")

    def paired(load: str, name: str, k: int) -> float:
        base = res[(load, "plain")][k]
        return statistics.median(x - b for x, b in zip(res[(load, name)][k], base))

    for load in loads:
        print(f"  {load}:")
        for name in names:
            e = statistics.median(res[(load, name)][0])
            f = statistics.median(res[(load, name)][1])
            de, df = paired(load, name, 0), paired(load, name, 1)
            both = statistics.median(x + y - a - b for x, y, a, b in zip(
                res[(load, name)][0], res[(load, name)][1], res[(load, "plain")][0], res[(load, "plain")][1]))
            print(f"    {name:7s} engine core {e * 1e6:8.1f} ({de * 1e6:+7.1f})   "
                  f"API server {f * 1e6:8.1f} ({df * 1e6:+7.1f})   both ({both * 1e6:+7.1f})")


if __name__ == "__main__":
    main()
