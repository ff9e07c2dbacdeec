"""CPU cost of `replay` per log line, whole process, into a real OTLP gRPC receiver.

    python bench/replay_cpu.py [--lines 1000000] [--runs 3] [--cri]

Generates a seed-dialect log (cached under bench/out/), starts the receiver in its own
process, runs `python -m bridge replay` several times and prints, per run and as the median:
CPU seconds (user+sys of the bridge process alone), CPU-µs per line, spans, spans per CPU
second, wall time and peak RSS. Figures, not assertions: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from _common import as_installed, synth_log  # noqa: E402


def ensure_log(lines: int, cri: bool) -> tuple[str, int]:
    # ~10.2 lines per request with the default mix (gauges, preemptions, blocks)
    path = synth_log(max(10, int(lines / 10.2)), cri)
    with open(path, "rb") as f:
        n = sum(1 for _ in f)
    return path, n


def run_once(path: str, endpoint: str) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "replay", path, "--otlp-endpoint", endpoint],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"replay failed: {out}\n{proc.stderr.read().decode()}")
    spans = int(out.split("export       ")[1].split(" spans")[0])
    return {"cpu": ru.ru_utime + ru.ru_stime, "wall": wall, "rss_mb": ru.ru_maxrss / 1024, "spans": spans}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cri", action="store_true")
    args = ap.parse_args()
    as_installed()
    path, lines = ensure_log(args.lines, args.cri)
    rx = subprocess.Popen([sys.executable, os.path.join(HERE, "receiver.py")], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = f"http://127.0.0.1:{rx.stdout.readline().strip()}"
        runs = [run_once(path, endpoint) for _ in range(args.runs)]
    finally:
        rx.terminate()
        received = rx.communicate(timeout=30)[0].strip()
    print(f"file: {path} ({lines} lines, {'CRI' if args.cri else 'plain'}); receiver: {received}")
    print(f"{'run':>5} {'CPU s':>8} {'µs/line':>8} {'spans':>9} {'spans/CPU-s':>12} {'wall s':>8} {'peak RSS MB':>12}")
    for i, r in enumerate(runs, 1):
        print(f"{i:>5} {r['cpu']:>8.2f} {r['cpu'] / lines * 1e6:>8.2f} {r['spans']:>9} "
              f"{r['spans'] / r['cpu']:>12.0f} {r['wall']:>8.2f} {r['rss_mb']:>12.1f}")
    med = statistics.median(r["cpu"] for r in runs)
    print(f"median CPU-µs per line: {med / lines * 1e6:.2f}   "
          f"median spans/CPU-s: {statistics.median(r['spans'] / r['cpu'] for r in runs):.0f}   "
          f"max peak RSS: {max(r['rss_mb'] for r in runs):.1f} MB")


if __name__ == "__main__":
    main()
