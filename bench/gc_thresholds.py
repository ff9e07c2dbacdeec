"""Does the cyclic GC's setting matter? The pipeline (read → decode → parse → assemble →
encode, no transport) over one file, in one process, under several GC settings taking turns.

    python bench/gc_thresholds.py [--cri] [--rounds 6] [--lines 200000]

Least CPU of the rounds per setting. In one process and interleaved, because whole-process
runs on this machine move by more than the differences measured here. Figures only.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from replay_cpu import ensure_log  # noqa: E402

from bridge.export.batch import Batcher  # noqa: E402
from bridge.export.resource import base_resource  # noqa: E402
from bridge.pipeline import replay  # noqa: E402

SETTINGS = {  # name → (thresholds, freeze what is alive first) ; "off": no cyclic GC at all
    "default (700, 10, 10)": ((700, 10, 10), False),
    "gc.freeze(), default": ((700, 10, 10), True),
    "(10000, 10, 10)": ((10000, 10, 10), False),
    "gc.freeze(), (10000, 10, 10)": ((10000, 10, 10), True),
    "gc.freeze(), (50000, 20, 20)": ((50000, 20, 20), True),
    "gc.freeze(), (50000, 50, 100): what replay and run set (cli.tune_gc)": ((50000, 50, 100), True),
    "off": (None, False),
}


def pipeline(path: str, resource: dict) -> None:
    """replay's pipeline, its timelines encoded into batches that are then dropped."""
    batcher = Batcher(resource, 1024)

    def emit(t) -> None:
        batcher.add(t)
        if batcher.full:
            batcher.take()

    replay([path], [emit])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cri", action="store_true")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--lines", type=int, default=200_000)
    args = ap.parse_args()
    path, lines = ensure_log(args.lines, args.cri)
    resource = base_resource(os.environ)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (thresholds, freeze) in SETTINGS.items():
            gc.enable()
            gc.unfreeze()
            gc.set_threshold(700, 10, 10)
            gc.collect()
            if thresholds is None:
                gc.disable()
            else:
                gc.set_threshold(*thresholds)
                if freeze:
                    gc.freeze()
            t0 = time.process_time()
            pipeline(path, resource)
            cpu = time.process_time() - t0
            best[name] = min(best.get(name, cpu), cpu)
    gc.enable()
    print(f"file: {path} ({lines} lines); the pipeline without transport, CPU-µs per line, least of "
          f"{args.rounds} interleaved rounds")
    print("| GC setting | CPU-µs per line |\n|---|---:|")
    for name, cpu in best.items():
        print(f"| {name} | {cpu / lines * 1e6:.2f} |")


if __name__ == "__main__":
    main()
