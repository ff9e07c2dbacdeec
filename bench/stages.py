"""Where replay's and the agent's CPU goes, stage by stage: read, decode, parse, assemble,
encode, transport (gRPC and HTTP), and what the agent adds.

    python bench/stages.py [--lines 200000] [--runs 5] [--cri] [--agent]

Each run is a fresh process that times every stage on its own over the same file, in turn,
each on the previous stage's output held in memory (the cyclic GC off while a stage is timed): read (the file's lines), decode (those
lines → records), parse (records → events), assemble (records and events → timelines),
encode (timelines → OTLP requests, the agent's batcher), and the transport (those requests
sent to bench/sink.py in its own process, not counted, over gRPC and over HTTP). CPU is
`time.process_time` around each stage (user + sys of the process, threads included, so the
gRPC client's own threads count). The figure is the least of the runs: on a shared machine
noise only ever adds CPU. The whole-process rows run the real commands (`replay`, and with
`--agent` the agent `run` on the file at a kubelet-style path, stopped once the sink has
every span) and take their CPU from `wait4`. Figures, not assertions: nothing gates CI.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bridge.config import AgentConfig  # noqa: E402

BATCH_SPANS = AgentConfig().max_batch_spans
STAGES = ("read", "decode", "parse", "assemble", "encode", "grpc", "http")


# -- the child: every stage once, timed on its own ---------------------------------------------

def encode_batches(timelines: list, batch_spans: int, resource: dict) -> list:
    """The timelines as the agent's batcher makes them into OTLP requests."""
    from bridge.export.batch import Batcher

    batcher, out = Batcher(resource, batch_spans), []
    for t in timelines:
        batcher.add(t)
        if batcher.full:
            out.append(batcher.take().request)
    if not batcher.empty:
        out.append(batcher.take().request)
    return out


def child(path: str, grpc_port: str, http_port: str, batch_spans: str) -> None:
    from bridge.assemble import Assembler
    from bridge.decode import Decoder
    from bridge.tail.source import source_for
    from bridge.decode.stream import RecordStream
    from bridge.export.resource import base_resource
    from bridge.export.transport import GRPC, HTTP, destination, make_transport
    from bridge.parse import Parser
    from bridge.tail import read_lines

    cpu: dict[str, float] = {}

    def timed(stage: str, fn):
        # Every stage's output is held here, which the streaming pipeline never does; with the
        # cyclic GC on, each stage would pay for scanning all of it. Off while timed: the GC's
        # share in the real pipeline is the whole-process rows minus start-up and the stages.
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        out = fn()
        cpu[stage] = time.process_time() - t0
        gc.enable()
        return out

    lines = timed("read", lambda: list(read_lines(path, 0, [0])))
    stream = RecordStream(Decoder(mtime=os.stat(path).st_mtime))
    records = timed("decode", lambda: list(stream.over(lines)))
    parse = Parser().parse
    events = timed("parse", lambda: [parse(r.message, r.level, r.origin) for r in records])
    timelines: list = []
    assembler = Assembler(source_for(path), timelines.append)

    def assemble():
        feed = assembler.feed
        for r, e in zip(records, events):
            if e is not None:
                feed(r, e)
        assembler.flush()

    timed("assemble", assemble)
    resource = base_resource(os.environ)
    requests = timed("encode", lambda: encode_batches(timelines, int(batch_spans), resource))
    for stage, port, proto in (("grpc", grpc_port, GRPC), ("http", http_port, HTTP)):
        transport = make_transport(destination({}, f"http://127.0.0.1:{port}", proto))
        transport.send(requests[0])  # connected, warmed up: not counted

        def send(transport=transport):
            for r in requests[1:]:
                if not transport.send(r):
                    raise SystemExit("the sink refused a request")

        timed(stage, send)
        transport.close()
    spans = sum(r.spans for r in requests)
    sent_bytes = sum(len(r.payload) for r in requests)
    share = (spans - requests[0].spans) / spans  # the transports sent all but the warm-up request
    cpu["grpc"] /= share
    cpu["http"] /= share
    print(json.dumps({"cpu": cpu, "lines": len(lines), "spans": spans, "bytes": sent_bytes,
                      "requests": len(requests)}))


# -- the parent ---------------------------------------------------------------------------------

def counts(http_port: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/counts", timeout=10) as r:
        return json.load(r)


def whole(argv: list[str]) -> tuple[float, float, str]:
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    out = proc.stdout.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out}\n{proc.stderr.read().decode()}")
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, out


def run_agent(path: str, proto: str, port: str, http_port: str, want: int, batch: int) -> tuple[float, float]:
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
             "--listen", "127.0.0.1:0", "--log-format", "json", "--start-at", "beginning",
             "--max-batch-spans", str(batch)],
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
            print(f"  agent {proto}: {last - before} of {want} spans arrived (requests still open at the end "
                  "are not exported before their TTL)", file=sys.stderr)
        return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cri", action="store_true")
    ap.add_argument("--agent", action="store_true", help="also the agent on the file, gRPC and HTTP")
    ap.add_argument("--max-batch-spans", type=int, default=BATCH_SPANS,
                    help="the encode stage's and the agent's batch (replay keeps its default)")
    ap.add_argument("--child", nargs=4, metavar=("FILE", "GRPC_PORT", "HTTP_PORT", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    sys.path.insert(0, HERE)
    from _common import as_installed
    from replay_cpu import ensure_log

    as_installed()

    path, _ = ensure_log(args.lines, args.cri)
    sink = subprocess.Popen([sys.executable, os.path.join(HERE, "sink.py")], stdout=subprocess.PIPE, text=True)
    try:
        ports = dict(kv.split("=") for kv in sink.stdout.readline().split())
        runs = []
        for _ in range(args.runs):
            _, _, out = whole([sys.executable, __file__, "--child", path, ports["grpc"], ports["http"], str(args.max_batch_spans)])
            runs.append(json.loads(out.strip().splitlines()[-1]))
        start = min(whole([sys.executable, "-m", "bridge", "replay", "--help"])[0] for _ in range(args.runs))
        wholes: dict[str, list[float]] = {}
        rss: dict[str, float] = {}
        info = runs[0]
        for _ in range(args.runs):
            for name, proto, port in (("replay gRPC", "grpc", ports["grpc"]), ("replay HTTP", "http/protobuf", ports["http"])):
                c, m, _ = whole([sys.executable, "-m", "bridge", "replay", path, "--otlp-endpoint",
                                 f"http://127.0.0.1:{port}", "--otlp-protocol", proto])
                wholes.setdefault(name, []).append(c)
                rss[name] = max(rss.get(name, 0.0), m)
            if args.agent:
                for name, proto, port in (("agent gRPC", "grpc", ports["grpc"]), ("agent HTTP", "http/protobuf", ports["http"])):
                    c, m = run_agent(path, proto, port, ports["http"], info["spans"], args.max_batch_spans)
                    wholes.setdefault(name, []).append(c)
                    rss[name] = max(rss.get(name, 0.0), m)
    finally:
        sink.terminate()
        sink.wait(30)
    lines, spans = info["lines"], info["spans"]
    best = {s: min(r["cpu"][s] for r in runs) for s in STAGES}
    per_line = lambda s: s / lines * 1e6  # noqa: E731
    print(f"file: {path} ({lines} lines, {'CRI' if args.cri else 'plain'}); {spans} spans in {info['requests']} "
          f"requests of up to {args.max_batch_spans} spans, {info['bytes'] / spans:.0f} bytes per span")
    print(f"command: python bench/stages.py --lines {args.lines} --runs {args.runs}"
          f"{' --cri' if args.cri else ''}{' --agent' if args.agent else ''}"
          f"{f' --max-batch-spans {args.max_batch_spans}' if args.max_batch_spans != BATCH_SPANS else ''}")
    print(f"least CPU of {args.runs} runs, each stage timed on its own in one process\n")
    print("| stage | CPU-µs per line | CPU-µs per span | share (with gRPC) |\n|---|---:|---:|---:|")
    with_grpc = sum(best[s] for s in STAGES if s != "http")
    for s in STAGES:
        share = f"{best[s] / with_grpc * 100:.0f} %" if s != "http" else ""
        print(f"| {s} | {per_line(best[s]):.2f} | {best[s] / spans * 1e6:.2f} | {share} |")
    ship = best["encode"] + best["grpc"]
    print(f"| all stages, gRPC | {per_line(with_grpc):.2f} | | shipping (encode + transport): "
          f"{ship / with_grpc * 100:.0f} % |")
    print(f"| start-up (`--help`: interpreter and imports, whole process) | {per_line(start):.2f} | | |")
    print("\n| whole process | CPU-µs per line | beyond start-up and the stages (GC, glue, the agent's own loop) "
          "| runs (s) | peak RSS |\n|---|---:|---:|---|---:|")
    for name, v in wholes.items():
        stages = with_grpc if "gRPC" in name else with_grpc - best["grpc"] + best["http"]
        print(f"| {name} | {per_line(min(v)):.2f} | {per_line(min(v) - start - stages):.2f} | "
              f"{', '.join(f'{x:.2f}' for x in v)} | {rss[name]:.0f} MB |")


if __name__ == "__main__":
    main()
