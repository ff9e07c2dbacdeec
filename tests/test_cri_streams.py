"""CRI partial lines are joined per stream (issue 37, point 3), on the C path and the Python one.

The truth is what the writer wrote: each stream's lines before the kubelet cut them into `P`
parts. The kubelet writes stdout and stderr independently, so their parts interleave in the
file; joining them in file order glues one stream's piece into the other's line.
"""

from __future__ import annotations

import random

import pytest

from bridge.decode import Decoder, stream as stream_mod
from bridge.decode.stream import RecordStream

STAMP = "2025-02-15T10:23:01.{:09d}Z"


def _summary(rid: str) -> str:
    return (f"INFO 02-15 10:23:01 scheduler.py:789] Request {rid}: prompt_tokens=1, generated_tokens=2, "
            "ttft=1.0ms, itl=1.0ms, total_latency=0.5s")


def _kubelet(lines: list[tuple[str, str]], seed: int, cut: int = 17) -> list[tuple[str, str]]:
    """Each (stream, text) cut into `P` parts of at most `cut` chars and an `F` end, the two
    streams' parts interleaved at random as two writers' would be (each stream's in order)."""
    rng = random.Random(seed)
    per: dict[str, list[tuple[str, str]]] = {"stdout": [], "stderr": []}
    for stream, text in lines:
        pieces = [text[i:i + cut] for i in range(0, len(text), cut)] if rng.random() < 0.7 else [text]
        for k, piece in enumerate(pieces):
            per[stream].append((stream, ("P " if k < len(pieces) - 1 else "F ") + piece))
    out = []
    while per["stdout"] or per["stderr"]:
        stream = rng.choice([s for s in per if per[s]])
        out.append(per[stream].pop(0))
    return out


def _frame(entries) -> list[tuple[int, bytes]]:
    lines, at = [], 0
    for i, (stream, rest) in enumerate(entries):
        raw = f"{STAMP.format(i)} {stream} {rest}\n".encode()
        lines.append((at, raw))
        at += len(raw)
    return lines


def _messages(lines, fast: bool) -> list[str]:
    rs = RecordStream(Decoder(mtime=1.7e9), fast=stream_mod.FAST if fast else None)
    return [r.message for r in rs.over(lines)]


PATHS = [False] + ([True] if stream_mod.FAST is not None else [])


@pytest.mark.parametrize("fast", PATHS, ids=lambda f: "c" if f else "python")
def test_a_stderr_part_inside_a_stdout_line_does_not_eat_it(fast):
    head = "INFO 02-15 10:23:01 scheduler.py:789] "
    entries = [("stdout", "P " + head + "Request 0xa: prompt_tokens=1, "),
               ("stderr", "P " + "WARNING 02-15 10:23:01 x.py:1] a warning cut"),
               ("stdout", "F generated_tokens=2, ttft=1.0ms, itl=1.0ms, total_latency=0.5s"),
               ("stdout", "F " + _summary("0xb")),
               ("stderr", "F  in two")]
    got = _messages(_frame(entries), fast)
    assert got == [
        "Request 0xa: prompt_tokens=1, generated_tokens=2, ttft=1.0ms, itl=1.0ms, total_latency=0.5s",
        "Request 0xb: prompt_tokens=1, generated_tokens=2, ttft=1.0ms, itl=1.0ms, total_latency=0.5s",
        "a warning cut in two"]


@pytest.mark.parametrize("fast", PATHS, ids=lambda f: "c" if f else "python")
def test_a_part_never_finished_is_still_a_line_at_the_end(fast):
    entries = [("stderr", "P WARNING 02-15 10:23:01 x.py:1] never ended"),
               ("stdout", "F " + _summary("0xa")),
               ("stdout", "F " + _summary("0xb"))]
    got = _messages(_frame(entries), fast)
    assert got == [_summary("0xa").split("] ", 1)[1], _summary("0xb").split("] ", 1)[1], "never ended"]


@pytest.mark.parametrize("seed", range(20))
def test_interleaved_streams_give_each_stream_its_own_lines_on_both_paths(seed):
    rng = random.Random(seed)
    written = []
    for i in range(60):
        stream = rng.choice(["stdout", "stderr"])
        written.append((stream, _summary(f"0x{seed:x}{i:04x}")))
    framed = _frame(_kubelet(written, seed))
    want = sorted(text.split("] ", 1)[1] for _, text in written)
    for fast in PATHS:
        got = _messages(framed, fast)
        assert sorted(got) == want, fast
        for stream in ("stdout", "stderr"):  # each stream's lines in the order it wrote them
            mine = [text.split("] ", 1)[1] for s, text in written if s == stream]
            assert [m for m in got if m in mine] == mine
