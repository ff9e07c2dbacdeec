"""Agent-mode figures: line-to-span latency at a steady write rate, and idle CPU.

    python bench/agent.py [--rate 1000] [--seconds 30] [--idle-files 200] [--idle-seconds 30] [--protocol grpc]

Latency: a writer appends CRI-framed seed-dialect lines at `--rate` lines/s to a kubelet-style
path; the agent (`vllm-trace-bridge run`, default settings, its own process) exports to a
real OTLP receiver in this process (gRPC, or OTLP/HTTP with `--protocol http/protobuf`). For
every request, latency = the moment its root span arrived − the moment the writer flushed the
last line that request needs (its last block free). Idle: the agent watches `--idle-files` files that never change; its CPU time
(user+sys from /proc) over `--idle-seconds` is reported as % of one core. Figures only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from receivers import GrpcReceiver, HttpReceiver, attrs  # noqa: E402

from bridge.synth import SynthConfig, generate, write  # noqa: E402


class _Timed:
    """Notes when each root span arrived (mixed into a real receiver below)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[str, int, float]] = []  # (request id, start ns, arrival wall time)

    def add(self, raw: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        now = time.time()
        for rs in ExportTraceServiceRequest.FromString(raw).resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    if s.name == "vllm.request":
                        self.arrivals.append((attrs(s.attributes)["vllm.request.id"], s.start_time_unix_nano, now))


class TimedGrpc(_Timed, GrpcReceiver):
    pass


class TimedHttp(_Timed, HttpReceiver):
    pass


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_agent(tmp: str, endpoint: str, protocol: str = "grpc") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bridge", "run", "--include", f"{tmp}/pods/*/*/*.log", "--state-dir",
         f"{tmp}/state", "--otlp-endpoint", endpoint, "--otlp-protocol", protocol, "--listen", "127.0.0.1:0",
         "--log-format", "json"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pod_dir(tmp: str, i: int) -> str:
    d = os.path.join(tmp, "pods", f"llm_vllm-{i}_3f2a9c1e-1111-2222-3333-{i:012d}", "vllm")
    os.makedirs(d, exist_ok=True)
    return d


def last_lines(lines) -> dict[tuple[str, int], int]:
    """The index of the last line each request occurrence needs (its last block free), by
    (request id, n-th occurrence of that id): the line whose write completes the request."""
    last_index: dict[tuple[str, int], int] = {}
    seen: dict[str, int] = {}
    open_ids: set[str] = set()
    for i, (_, _, _, _, msg) in enumerate(lines):
        rid = None
        for marker in ("for request ", "Scheduling request ", "Request "):
            if marker in msg:
                rid = msg.split(marker, 1)[1].split(",")[0].split(":")[0].split(" ")[0]
                break
        if rid is None or not rid.startswith("0x"):
            continue
        if msg.startswith("Scheduling") and rid not in open_ids:
            seen[rid] = seen.get(rid, -1) + 1
            open_ids.add(rid)
        if msg.startswith("Request ") and "prompt_tokens" in msg:
            open_ids.discard(rid)
        if rid in seen:
            last_index[(rid, seen[rid])] = i
    return last_index


def latency(rate: float, seconds: float, protocol: str = "grpc") -> dict:
    tmp = tempfile.mkdtemp(prefix="vtb-lat-")
    requests = int(rate * seconds / 10.2)
    cfg = SynthConfig(requests=requests, seed=17, cri=True, mean_interarrival_s=10.2 / rate,
                      model_load_failure=False, incomplete_tail=0, timeout_ratio=0, oom_failures=0,
                      nccl_incidents=0)
    lines, _ = generate(cfg)

    class Collect(list):
        def write(self, s):
            self.extend(s.splitlines(keepends=True))
    text = Collect()
    write(lines, text, cfg)
    last_index = last_lines(lines)
    rx = TimedHttp() if protocol == "http/protobuf" else TimedGrpc()
    rx.__enter__()
    agent = start_agent(tmp, rx.endpoint, protocol)
    written_at = [0.0] * len(lines)
    try:
        time.sleep(2)  # agent start-up
        log = os.path.join(pod_dir(tmp, 0), "0.log")
        phys = []
        gi = -1
        for raw in text:
            if raw.split(" ", 3)[2] == "F":
                gi += 1
            phys.append(gi)
        with open(log, "a") as f:
            start = time.monotonic()
            for k, raw in enumerate(text):
                f.write(raw)
                f.flush()
                written_at[phys[k]] = time.time()
                delay = start + (phys[k] + 1) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        time.sleep(3)
    finally:
        agent.terminate()
        agent.wait(20)
        rx.__exit__()
        shutil.rmtree(tmp, ignore_errors=True)
    by_id: dict[str, list[tuple[int, float]]] = {}
    for rid, start_ns, t in rx.arrivals:
        by_id.setdefault(rid, []).append((start_ns, t))
    lat = []
    for rid, arrivals in by_id.items():
        first = {}
        for start_ns, t in arrivals:
            first[start_ns] = min(t, first.get(start_ns, t))
        for n, (_, t) in enumerate(sorted(first.items())):
            i = last_index.get((rid, n))
            if i is not None and written_at[i]:
                lat.append(t - written_at[i])
    lat.sort()
    return {"requests": len(lat), "p50": statistics.median(lat), "p99": lat[int(len(lat) * 0.99) - 1],
            "max": lat[-1]}


def idle(files: int, seconds: float) -> dict:
    tmp = tempfile.mkdtemp(prefix="vtb-idle-")
    for i in range(files):
        with open(os.path.join(pod_dir(tmp, i), "0.log"), "w") as f:
            f.write("2025-02-15T10:23:00.000000000Z stdout F INFO 02-15 10:23:00 a.py:1] hello\n")
    rx = GrpcReceiver()
    rx.__enter__()
    agent = start_agent(tmp, rx.endpoint)
    try:
        time.sleep(5)  # start-up and the first reads
        c0, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(agent.pid), time.monotonic()
    finally:
        agent.terminate()
        agent.wait(20)
        rx.__exit__()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"files": files, "cpu_pct": 100 * (c1 - c0) / (t1 - t0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--idle-files", type=int, default=200)
    ap.add_argument("--idle-seconds", type=float, default=30)
    ap.add_argument("--protocol", choices=("grpc", "http/protobuf"), default="grpc",
                    help="the agent's OTLP transport for the latency run (a real receiver of that kind)")
    a = ap.parse_args()
    lat = latency(a.rate, a.seconds, a.protocol)
    print(f"latency at {a.rate:.0f} lines/s over {a.protocol}, default settings: {lat['requests']} requests, "
          f"p50 {lat['p50'] * 1000:.0f} ms, p99 {lat['p99'] * 1000:.0f} ms, max {lat['max'] * 1000:.0f} ms")
    idl = idle(a.idle_files, a.idle_seconds)
    print(f"idle: {idl['files']} files watched, {idl['cpu_pct']:.2f} % of one core")


if __name__ == "__main__":
    main()
