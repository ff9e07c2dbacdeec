"""Where replay's and the agent's CPU goes, stage by stage: read, decode, parse, assemble,
encode, transport (gRPC and HTTP), and the agent's own loop.

    python bench/stages.py [--lines 200000] [--runs 3] [--cri] [--agent]

Each depth runs in a fresh process that imports everything every depth needs, then runs the
pipeline up to that stage over the same file; its CPU time (user + sys, `wait4`) minus the
previous depth's is that stage's cost. `start` (imports only) is the baseline. The sink is
bench/sink.py in its own process (not counted). `--agent` adds `vllm-trace-bridge run` on the
file at a kubelet-style path, over each protocol, stopped once the sink has every span:
its CPU minus the same protocol's pipeline figure is the agent's own loop (polling,
checkpoints, the sender thread, metrics). Figures, not assertions: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

DEPTHS = ("start", "read", "decode", "parse", "assemble", "encode", "grpc", "http")


# -- the child: one depth, one file -------------------------------------------------------------

def child(depth: str, path: str, grpc_port: str, http_port: str) -> None:
    from bridge.decode import Decoder
    from bridge.decode.stream import RecordStream
    from bridge.export.batch import OtlpSink
    from bridge.export.otlp import base_resource
    from bridge.export.transport import GRPC, HTTP, Transport, destination, make_transport
    from bridge.parse import Parser
    from bridge.pipeline import replay
    from bridge.tail import read_lines
    import opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: F401  the same imports at every depth
    import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401

    class Discard(Transport):
        """Takes the encoded request and drops it: the encode depth without a socket."""

        def send(self, request) -> bool:
            return True

    if depth == "start":
        return
    lines = read_lines(path, 0, [0])  # as replay reads (it keeps the offset for decode retries)
    if depth == "read":
        for _ in lines:
            pass
        return
    stream = RecordStream(Decoder(mtime=os.stat(path).st_mtime)).over(lines)
    if depth == "decode":
        for _ in stream:
            pass
        return
    if depth == "parse":
        parse = Parser().parse
        for r in stream:
            parse(r.message, r.level, r.origin)
        return
    if depth == "assemble":
        replay([path], [lambda t: None])
        return
    resource = base_resource(os.environ)
    if depth == "encode":
        transport = Discard()
    else:
        port, proto = (grpc_port, GRPC) if depth == "grpc" else (http_port, HTTP)
        transport = make_transport(destination({}, f"http://127.0.0.1:{port}", proto))
    sink = OtlpSink(transport, resource)
    replay([path], [sink])
    if not sink.close():
        raise SystemExit("the sink refused spans")
    print(sink.stats.spans_sent)


# -- the parent ---------------------------------------------------------------------------------

def ensure_log(lines: int, cri: bool) -> tuple[str, int]:
    from replay_cpu import ensure_log as make
    return make(lines, cri)


def counts(http_port: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/counts", timeout=10) as r:
        return json.load(r)


def measure(argv: list[str]) -> tuple[float, float, str]:
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    out = proc.stdout.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out}\n{proc.stderr.read().decode()}")
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, out


def run_agent(path: str, cri: bool, proto: str, port: str, http_port: str, want: int) -> tuple[float, float]:
    """The agent on the file, until the sink has `want` more spans (or nothing comes for 10 s)."""
    tmp = tempfile.mkdtemp(prefix="stages-agent-")
    try:
        pod = os.path.join(tmp, "pods", "ns_pod_0000", "vllm")
        os.makedirs(pod)
        shutil.copy(path, os.path.join(pod, "0.log"))
        before = counts(http_port)["spans"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "bridge", "run", "--include", f"{tmp}/pods/*/*/*.log", "--state-dir",
             f"{tmp}/state", "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", proto,
             "--listen", "127.0.0.1:0", "--log-format", "json", "--start-at", "beginning"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        last, last_change = before, time.monotonic()
        while time.monotonic() - last_change < 10:
            time.sleep(0.2)
            got = counts(http_port)["spans"]
            if got != last:
                last, last_change = got, time.monotonic()
            if got - before >= want:
                break
        proc.send_signal(signal.SIGTERM)
        _, _, ru = os.wait4(proc.pid, 0)
        if last - before < want:
            print(f"  agent {proto}: {last - before} of {want} spans arrived", file=sys.stderr)
        return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cri", action="store_true")
    ap.add_argument("--agent", action="store_true", help="also the agent on the file, gRPC and HTTP")
    ap.add_argument("--child", nargs=4, metavar=("DEPTH", "FILE", "GRPC_PORT", "HTTP_PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    sys.path.insert(0, HERE)
    path, lines = ensure_log(args.lines, args.cri)
    sink = subprocess.Popen([sys.executable, os.path.join(HERE, "sink.py")], stdout=subprocess.PIPE, text=True)
    try:
        ports = dict(kv.split("=") for kv in sink.stdout.readline().split())
        cpu: dict[str, list[float]] = {d: [] for d in DEPTHS}
        rss: dict[str, float] = {}
        spans = 0
        for _ in range(args.runs):
            for d in DEPTHS:
                c, m, out = measure([sys.executable, __file__, "--child", d, path, ports["grpc"], ports["http"]])
                cpu[d].append(c)
                rss[d] = max(rss.get(d, 0.0), m)
                if d in ("grpc", "http"):
                    spans = int(out.split()[-1])
        agent: dict[str, list[float]] = {}
        if args.agent:
            for _ in range(args.runs):
                for d, proto, port in (("grpc", "grpc", ports["grpc"]), ("http", "http/protobuf", ports["http"])):
                    c, m = run_agent(path, args.cri, proto, port, ports["http"], spans)
                    agent.setdefault(d, []).append(c)
                    rss[f"agent {d}"] = max(rss.get(f"agent {d}", 0.0), m)
    finally:
        sink.terminate()
        sink.wait(30)
    med = {d: statistics.median(v) for d, v in cpu.items()}
    per = lambda s: s / lines * 1e6  # noqa: E731
    print(f"file: {path} ({lines} lines, {'CRI' if args.cri else 'plain'}), {spans} spans; "
          f"{args.runs} runs, CPU medians (user + sys of a fresh process each)")
    print(f"command: python bench/stages.py --lines {args.lines} --runs {args.runs}"
          f"{' --cri' if args.cri else ''}{' --agent' if args.agent else ''}")
    print(f"{'stage':<26} {'CPU-µs/line':>11} {'µs/span':>8} {'share':>6}  runs (s)")
    rows = [("start (interpreter, imports)", "start", None)] + [
        (name, d, prev) for name, d, prev in (
            ("read", "read", "start"), ("decode", "decode", "read"), ("parse", "parse", "decode"),
            ("assemble", "assemble", "parse"), ("encode", "encode", "assemble"),
            ("transport gRPC", "grpc", "encode"), ("transport HTTP", "http", "encode"))]
    for name, d, prev in rows:
        cost = med[d] - (med[prev] if prev else 0.0)
        total = med[d] - med["start"]
        share = f"{cost / total * 100:5.1f}%" if prev and d in ("grpc", "http") else ""
        print(f"{name:<26} {per(cost):>11.2f} {cost / max(spans, 1) * 1e6:>8.2f} {share:>6}  "
              + ", ".join(f"{x:.2f}" for x in cpu[d]))
    for d in ("grpc", "http"):
        ship = med[d] - med["assemble"]
        total = med[d] - med["start"]
        print(f"pipeline + {d:<4} (no start): {per(total):.2f} µs/line; shipping (encode + transport) "
              f"{ship / total * 100:.0f}% of it; peak RSS {rss[d]:.0f} MB")
    for d, v in agent.items():
        a = statistics.median(v)
        print(f"agent {d:<4} whole process: {per(a):.2f} µs/line ({', '.join(f'{x:.2f}' for x in v)} s); "
              f"its own loop beyond the pipeline: {per(a - med[d]):.2f} µs/line; peak RSS {rss[f'agent {d}']:.0f} MB")


if __name__ == "__main__":
    main()
