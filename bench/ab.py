"""Before and after, interleaved: `bench/stages.py` of two checkouts, one run of each in turn.

    python bench/ab.py BEFORE_DIR AFTER_DIR [--rounds 3] [--cri] [--agent]
    python bench/ab.py . . --cri --agent --before-args="--max-batch-spans 512"   # one setting

On this shared machine a whole process's CPU moves by 20-40 % between minutes, so the same
benchmark run a few minutes apart on each side can show a change that is not there. Taking
turns and keeping each row's least CPU (noise only ever adds) compares like with like. Each
side runs its own `bench/stages.py` (its own code, its own defaults) from its own directory.
Prints each stages row as `before → after` in CPU-µs per line.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

_ROW = re.compile(r"^\| ([^|]+?) \| (-?[0-9.]+) \|")


def one_run(tree: str, extra: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, os.path.join(tree, "bench", "stages.py"), "--runs", "1", *extra],
                         cwd=tree, check=True, capture_output=True, text=True).stdout
    return {m[1]: float(m[2]) for m in map(_ROW.match, out.splitlines()) if m}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cri", action="store_true")
    ap.add_argument("--agent", action="store_true")
    ap.add_argument("--before-args", default="", help="more bench/stages.py arguments for the before side")
    ap.add_argument("--after-args", default="", help="more bench/stages.py arguments for the after side")
    args = ap.parse_args()
    extra = [*(["--cri"] if args.cri else []), *(["--agent"] if args.agent else [])]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(args.rounds):
        for side in ("before", "after"):
            more = shlex.split(getattr(args, f"{side}_args"))
            runs[side].append(one_run(os.path.abspath(getattr(args, side)), extra + more))
            print(f"round {i + 1} {side} done", file=sys.stderr, flush=True)
    rows = [r for r in runs["after"][0] if all(r in x for x in runs["before"] + runs["after"])]
    print(f"CPU-µs per line, least of {args.rounds} interleaved runs: {args.before} {args.before_args} → "
          f"{args.after} {args.after_args}")
    print("| row | before | after | change |\n|---|---:|---:|---:|")
    for row in rows:
        b = min(x[row] for x in runs["before"])
        a = min(x[row] for x in runs["after"])
        change = f"{(a - b) / b * 100:+.0f} %" if b > 0 else ""
        print(f"| {row} | {b:.2f} | {a:.2f} | {change} |")


if __name__ == "__main__":
    main()
