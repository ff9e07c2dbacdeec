"""Demo stand-in for a vLLM pod: writes seed-dialect vLLM logs the way containerd stores them.

Each batch comes from the package's ground-truth generator (bridge.synth, the same one the tests
use), starts at the current time, and is written line by line at the moment each line's CRI
timestamp comes due. The bridge therefore tails a live, growing file at the kubelet's path:

    /var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log

    python vllm-logs.py [--root /var/log/pods] [--requests 30] [--batches 0 (forever)] [--no-pace]
"""

from __future__ import annotations

import argparse
import calendar
import io
import os
import sys
import time

from bridge.synth import SynthConfig, generate, write

POD_DIR = "demo_vllm-0_3f2a9c5e-7b1d-4e8a-9c3f-5d6e7f8a9b0c/vllm"


def _cri_seconds(line: str) -> float:
    stamp = line.split(" ", 1)[0]                      # 2025-02-15T10:23:00.123456789Z
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{frac or 0}")


def batch(seed: int, requests: int) -> list[str]:
    cfg = SynthConfig(
        requests=requests, seed=seed, cri=True,
        start=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
        incomplete_tail=0, model_load_failure=False,
        nccl_incidents=1 if seed % 5 == 0 else 0, oom_failures=1 if seed % 3 == 0 else 0,
    )
    lines, _ = generate(cfg)
    buf = io.StringIO()
    write(lines, buf, cfg)
    return buf.getvalue().splitlines(keepends=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="/var/log/pods")
    p.add_argument("--requests", type=int, default=30, help="requests per batch")
    p.add_argument("--batches", type=int, default=0, help="stop after N batches (0: never)")
    p.add_argument("--no-pace", action="store_true", help="write at once instead of in real time")
    args = p.parse_args()
    path = os.path.join(args.root, POD_DIR, "0.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"writing vLLM logs to {path}", flush=True)
    n = 0
    with open(path, "a", encoding="utf-8") as out:
        while not args.batches or n < args.batches:
            n += 1
            for line in batch(n, args.requests):
                if not args.no_pace:
                    delay = _cri_seconds(line) - time.time()
                    if delay > 0:
                        time.sleep(delay)
                out.write(line)
                out.flush()
            print(f"batch {n}: {args.requests} requests written", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
