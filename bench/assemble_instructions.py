"""Instructions per line of the assemble stage alone, under callgrind: a count the machine's load
cannot move (CPU time on the shared machine moves by 20-40 %), for changes of a few per cent.

    python bench/assemble_instructions.py [--lines 100000] [--log FILE]   # needs valgrind

It runs this checkout twice under `valgrind --tool=callgrind` on the same seed log: once
decoding and parsing it, once also assembling it (the records and events fed as
`bench/stages.py`'s assemble stage does, cyclic GC off, the flush included); the difference of
the two totals is the stage. `PYTHONHASHSEED=0` keeps both runs' dicts alike. Pass the same
`--log` to two checkouts to compare them (the log's path is part of the ids).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def child(path: str, assemble: bool) -> None:
    sys.path.insert(0, ROOT)
    from bridge.assemble import Assembler
    from bridge.decode import Decoder
    from bridge.decode.stream import RecordStream
    from bridge.parse import Parser
    from bridge.tail import read_lines
    from bridge.tail.source import source_for

    lines = list(read_lines(path, 0, [0]))
    records = list(RecordStream(Decoder(mtime=os.stat(path).st_mtime)).over(lines))
    parse = Parser().parse
    events = [parse(r.message, r.level, r.origin) for r in records]
    timelines: list = []
    assembler = Assembler(source_for(path), timelines.append)
    gc.collect()
    gc.disable()
    if assemble:
        feed = assembler.feed
        for r, e in zip(records, events):
            if e is not None:
                feed(r, e)
        assembler.flush()
    print(len(lines))
    os._exit(0)  # no teardown: the stage's output is held, as in bench/stages.py


def instructions(path: str, assemble: bool) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable, __file__,
             "--child", path, "1" if assemble else "0"],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    return int(re.search(r"Collected : (\d+)", proc.stderr)[1]), int(proc.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--log", help="the log to assemble (default: the seed log bench/stages.py makes)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1] == "1")
        return
    path = args.log
    if path is None:
        sys.path.insert(0, HERE)
        from replay_cpu import ensure_log
        path, _ = ensure_log(args.lines, False)
    prep, n = instructions(path, False)
    full, _ = instructions(path, True)
    print(f"assemble stage: {full - prep:,} instructions, {(full - prep) / n:,.0f} a line ({n:,} lines of {path})")


if __name__ == "__main__":
    main()
