"""The decode stage alone (RecordStream: Decoder + Joiner), in process, on vLLM V1's prefixed lines.

    python bench/decode_prefix.py [--lines 1000000] [--runs 3]   # µs/line, C path and pure Python
    python bench/decode_prefix.py --coverage FILE...             # lines the C path takes, per file

Takes the CRI log `bench/replay_cpu.py --cri` generates (cached under bench/out/; run that first
with the same --lines) and writes beside it a copy whose every line starts, as V1 writes it, with
`(APIServer pid=1) ` or `(EngineCore_DP0 pid=7) ` (alternating; a `P` part's continuation gets
none). Figures, not assertions: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bridge.decode import Decoder  # noqa: E402
from bridge.decode import stream as stream_mod  # noqa: E402
from bridge.decode.stream import RecordStream  # noqa: E402
from bridge.tail import read_lines  # noqa: E402

PREFIXES = (b"(APIServer pid=1) ", b"(EngineCore_DP0 pid=7) ")


def prefixed_log(lines: int) -> str:
    requests = max(10, int(lines / 10.2))  # as replay_cpu.ensure_log names it
    src = os.path.join(HERE, "out", f"seed-{requests}-cri.log")
    dst = src.replace("-cri.log", "-cri-prefixed.log")
    if not os.path.exists(dst):
        if not os.path.exists(src):
            raise SystemExit(f"{src} missing: run `python bench/replay_cpu.py --cri --lines {lines} --runs 1` first")
        with open(src, "rb") as f, open(dst + ".tmp", "wb") as out:
            whole = True  # the previous line was an `F`: this one starts a logical line
            for k, raw in enumerate(f):
                stamp, stream, tag, text = raw.split(b" ", 3)
                out.write(b" ".join((stamp, stream, tag, (PREFIXES[k % 2] if whole else b"") + text)))
                whole = tag == b"F"
        os.replace(dst + ".tmp", dst)
    return dst


def c_lines(path: str) -> tuple[int, int]:
    """(lines the C path took, lines) over one file."""
    lines = list(read_lines(path))
    s = RecordStream(Decoder(mtime=1.7e9))
    python = []

    def fallback(raw, offset):
        python.append(offset)
        return s._python(raw, offset)

    for _ in stream_mod.FAST.records(s.decoder, s.joiner, fallback, lines):
        pass
    return len(lines) - len(python), len(lines)


def decode_us(lines: list, fast) -> float:
    """CPU-µs per line, gc off (as the README's per-stage figures): the 1M lines held here would
    otherwise be scanned by every collection."""
    gc.disable()
    t = time.process_time()
    s = RecordStream(Decoder(mtime=1.7e9), fast=fast)
    for _ in s.over(lines):
        pass
    t = time.process_time() - t
    gc.enable()
    return t / len(lines) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--coverage", nargs="*")
    args = ap.parse_args()
    if stream_mod.FAST is None:
        raise SystemExit("the C path is not built (or VLLM_TRACE_BRIDGE_PURE=1)")
    if args.coverage is not None:
        for path in args.coverage:
            took, n = c_lines(path)
            print(f"{took:>8} / {n:<8} {os.path.relpath(path)}")
        return
    path = prefixed_log(args.lines)
    lines = list(read_lines(path))
    took, n = c_lines(path)
    print(f"file: {path} ({n} lines, {took} taken by the C path)")
    for name, fast in (("C path", stream_mod.FAST), ("pure Python", None)):
        runs = [decode_us(lines, fast) for _ in range(args.runs)]
        print(f"{name:>12}: decode µs/line, median of {args.runs}: {statistics.median(runs):.2f}  "
              f"({' '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
