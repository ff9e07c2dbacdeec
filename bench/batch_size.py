"""What the batch size costs: encode and transport per line for several `max_batch_spans`,
interleaved in one process, least CPU of the rounds.

    python bench/batch_size.py [--sizes 512,1024,2048] [--rounds 5] [--lines 200000] [--cri] [--agent]

The file is read, parsed and assembled once; each round then encodes the timelines into
batches of each size in turn and sends them into `bench/sink.py` (its own process, not
counted) over gRPC and HTTP. Taking turns inside one process is what makes a difference of a
few tenths of a µs visible on a machine whose whole-process figures move by 20-40 %.
`--agent` then also runs the whole agent on the file with each size in turn (bench/stages.py's
agent run), CPU of its whole process.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from replay_cpu import ensure_log  # noqa: E402
from stages import encode_batches  # noqa: E402
from stages import run_agent  # noqa: E402

from bridge.export.resource import base_resource  # noqa: E402
from bridge.export.transport import GRPC, HTTP, destination, make_transport  # noqa: E402
from bridge.pipeline import replay  # noqa: E402


def timelines_of(path: str) -> list:
    out: list = []
    replay([path], [out.append])  # the pipeline replay runs, its timelines kept
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="512,1024,2048")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--cri", action="store_true")
    ap.add_argument("--agent", action="store_true", help="also the agent, whole process, with each size")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    path, lines = ensure_log(args.lines, cri=args.cri)
    timelines = timelines_of(path)
    resource = base_resource(os.environ)
    sink = subprocess.Popen([sys.executable, os.path.join(HERE, "sink.py")], stdout=subprocess.PIPE, text=True)
    try:
        ports = dict(kv.split("=") for kv in sink.stdout.readline().split())
        transports = {proto: make_transport(destination({}, f"http://127.0.0.1:{ports[key]}", proto))
                      for key, proto in (("grpc", GRPC), ("http", HTTP))}
        best: dict[tuple[int, str], float] = {}
        gc.disable()  # the timelines are held: a collection would scan them all
        for _ in range(args.rounds):
            for size in sizes:
                t0 = time.process_time()
                requests = encode_batches(timelines, size, resource)
                cpu = {"encode": time.process_time() - t0}
                for proto, transport in transports.items():
                    t0 = time.process_time()
                    for r in requests:
                        if not transport.send(r):
                            raise SystemExit("the sink refused a request")
                    cpu[proto] = time.process_time() - t0
                for stage, c in cpu.items():
                    best[size, stage] = min(best.get((size, stage), c), c)
                del requests
        for t in transports.values():
            t.close()
        gc.enable()
        agent: dict[tuple[int, str], list[float]] = {}
        spans = sum(r.spans for r in encode_batches(timelines, sizes[0], resource)) if args.agent else 0
        for _ in range(args.rounds if args.agent else 0):
            for size in sizes:
                for key, proto in (("grpc", GRPC), ("http", HTTP)):
                    cpu, _ = run_agent(path, proto, ports[key], ports["http"], spans, size)
                    agent.setdefault((size, proto), []).append(cpu / lines * 1e6)
    finally:
        sink.terminate()
        sink.wait(30)
    print(f"file: {path} ({lines} lines), {len(timelines)} timelines; CPU-µs per line, least of {args.rounds} "
          "interleaved rounds")
    print("| max_batch_spans | encode | gRPC | HTTP | encode + gRPC | encode + HTTP |\n|---:|---:|---:|---:|---:|---:|")
    for size in sizes:
        e, g, h = (best[size, s] / lines * 1e6 for s in ("encode", GRPC, HTTP))
        print(f"| {size} | {e:.2f} | {g:.2f} | {h:.2f} | {e + g:.2f} | {e + h:.2f} |")
    if agent:
        print(f"\nthe agent (`run`), whole process, CPU-µs per line: least and median of {args.rounds} interleaved runs")
        print("| max_batch_spans | gRPC least | gRPC median | HTTP least | HTTP median |\n|---:|---:|---:|---:|---:|")
        for size in sizes:
            g, h = sorted(agent[size, GRPC]), sorted(agent[size, HTTP])
            print(f"| {size} | {g[0]:.2f} | {g[len(g) // 2]:.2f} | {h[0]:.2f} | {h[len(h) // 2]:.2f} |")


if __name__ == "__main__":
    main()
