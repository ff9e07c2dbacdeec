"""A line's bytes are bounded before decompression output is buffered (issue 37, point 2):
`replay` and `check` cut a line over MAX_LINE_BYTES as the live follower does, plain or `.gz`,
reading its rest a bound at a time. Truth: the bytes the test wrote (which lines, where)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest

from bridge.tail.files import MAX_LINE_BYTES, read_lines
from waits import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = b"INFO 02-15 10:23:02 scheduler.py:789] Request 0xa1: prompt_tokens=1, generated_tokens=2, ttft=1.0ms, " \
       b"itl=1.0ms, total_latency=0.5s\n"
# What a client's prompt could put inside a logged line, past the bound: never a line of its own.
FORGED = b"INFO 02-15 10:23:05 x.py:1] Request 0xf00: prompt_tokens=999999, generated_tokens=1, ttft=1.0ms, " \
         b"itl=1.0ms, total_latency=0.5s "


def _write(path: str, parts) -> None:
    if path.endswith(".gz"):
        co = zlib.compressobj(6, zlib.DEFLATED, 31)
        with open(path, "wb") as f:
            for p in parts:
                f.write(co.compress(p))
            f.write(co.flush())
    else:
        with open(path, "wb") as f:
            for p in parts:
                f.write(p)


@pytest.mark.parametrize("name", ["0.log", "0.log.20260215-100000.gz"])
@pytest.mark.parametrize("tail", [b" rest\n", b" rest"])  # the long line ends with a newline, or the file does
def test_replay_cuts_an_oversized_line_where_the_follower_does(tmp_path, name, tail):
    head = b"INFO 02-15 10:23:03 x.py:1] Received request cmpl-big: prompt: '"
    big = head + b"x" * (MAX_LINE_BYTES - len(head)) + FORGED + b"x" * (3 * MAX_LINE_BYTES) + tail
    path = str(tmp_path / name)
    parts = [GOOD, big] + ([GOOD] if tail.endswith(b"\n") else [])
    _write(path, parts)
    cut: dict[str, int] = {}
    got = list(read_lines(path, cut=cut))
    want = [(0, GOOD), (len(GOOD), big[:MAX_LINE_BYTES])] + ([(len(GOOD) + len(big), GOOD)] if len(parts) == 3 else [])
    assert got == want
    assert cut == {"lines_oversized": 1, "bytes_cut": len(big) - MAX_LINE_BYTES}
    # The live follower reads the same lines at the same places (the agent ≡ replay).
    from bridge.tail.source import source_for
    from bridge.tail.follow import TailStats, TrackedFile, _open
    with _open(path) as fh:
        tf = TrackedFile(path, source_for(path), 0, fh, os.stat(path).st_ino, 0)
        stats, lines = TailStats(), []
        for _ in range(100):
            got = tf.read(1 << 20, stats)
            lines += got
            if not got and tf.at_eof:
                break
        lines += tf.flush_partial()
    assert lines == want and stats.bytes_cut == cut["bytes_cut"] and stats.lines_oversized == 1


@pytest.mark.parametrize("n", [MAX_LINE_BYTES - 1, MAX_LINE_BYTES, MAX_LINE_BYTES + 1])
def test_lines_at_the_bound(tmp_path, n):
    """A line of exactly MAX_LINE_BYTES with its newline is whole; one byte more is cut."""
    line = b"y" * (n - 1) + b"\n"
    path = str(tmp_path / "0.log.gz")
    _write(path, [line, GOOD])
    cut: dict[str, int] = {}
    got = [raw for _, raw in read_lines(path, cut=cut)]
    if n <= MAX_LINE_BYTES:
        assert got == [line, GOOD] and not cut
    else:
        assert got == [line[:MAX_LINE_BYTES], GOOD] and cut == {"lines_oversized": 1, "bytes_cut": 1}


_PEAK = """
import resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stdout.write(p.stdout + p.stderr)
"""


@pytest.mark.parametrize("command", ["replay", "check"])
def test_a_gz_with_one_huge_line_stays_small_in_memory(tmp_path, command):
    """128 MiB of one line in a 130 KB `.gz`: the old reader held the whole line (and copies of
    it: about 3.2 times its size, 3.2 GB for 1 GiB); now the peak stays near the bound.
    Peak RSS of the command alone, from a parent process of its own."""
    path = str(tmp_path / "0.log.20260215-100000.gz")
    good2 = GOOD.replace(b"0xa1", b"0xa2")
    _write(path, [GOOD, b"x" * (8 << 20), FORGED, *([b"x" * (1 << 20)] * 120), b"\n", good2])
    assert os.path.getsize(path) < 1 << 20
    p = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, "-m", "bridge", command, path],
                       capture_output=True, text=True, cwd=ROOT, timeout=deadline(300))
    first, _, out = p.stdout.partition("\n")
    rc, peak_kb = map(int, first.split())
    assert rc == 0, out
    assert peak_kb < 120 * 1024, f"peak RSS {peak_kb / 1024:.0f} MB"
    assert "request_summary 2" in out and "0xf00" not in out  # the forged line inside was never a line
    assert "over 4 MiB" in out
    dropped = (8 << 20) + len(FORGED) + (120 << 20) + 1 - MAX_LINE_BYTES
    assert f"{dropped} bytes dropped" in out, out
