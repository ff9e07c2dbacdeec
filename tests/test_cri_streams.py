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


# -- a kubelet rotation between a line's `P` parts and its `F` end (Decoder.carry / adopt) ---------

def _two_files(entries, cut: int) -> tuple[list, list]:
    """The framed lines cut into a rotated file (before `cut`) and the next (from it), each
    file's offsets from 0, the next's in generation 1 (bridge.core.position)."""
    from bridge.core.position import GEN_SHIFT

    framed = _frame(entries)
    start = framed[cut][0] if cut < len(framed) else framed[-1][0] + len(framed[-1][1])
    return framed[:cut], [((1 << GEN_SHIFT) + at - start, raw) for at, raw in framed[cut:]]


def _rotated_records(entries, cut: int, fast: bool):
    older, newer = _two_files(entries, cut)
    fast = stream_mod.FAST if fast else None
    first = RecordStream(Decoder(mtime=1.7e9), fast=fast)
    records = list(first.over(older, carry=True))
    carry = first.decoder.carry()
    second = RecordStream(Decoder(mtime=1.7e9), fast=fast)
    if carry is not None:
        second.decoder.adopt(carry)
    return records + list(second.over(newer)), carry


@pytest.mark.parametrize("fast", PATHS, ids=lambda f: "c" if f else "python")
def test_a_rotation_between_parts_keeps_each_streams_lines_whole_wherever_it_falls(fast):
    """The truth: each stream's lines as written. A rotation after any physical line (a stderr
    `P` pending while stdout's lines rotate, both streams' parts pending, a cut part) changes
    no line; a line begun before the rotation keeps its first part's position, in the older file."""
    written = []
    for seed in range(4):
        rng = random.Random(seed)
        written.append([(rng.choice(["stdout", "stderr"]), _summary(f"0x{seed:x}{i:03x}")) for i in range(12)])
    for seed, lines in enumerate(written):
        entries = _kubelet(lines, seed, cut=23)
        want = _messages(_frame(entries), fast)
        assert sorted(want) == sorted(text.split("] ", 1)[1] for _, text in lines)
        for cut in range(len(entries) + 1):
            records, carry = _rotated_records(entries, cut, fast)
            assert [r.message for r in records] == want, (seed, cut)
            last = {stream: rest for stream, rest in entries[:cut]}  # each stream's last piece before the cut
            pending = {stream for stream, rest in last.items() if rest.startswith("P")}
            assert ({h.stream for h in carry.held} if carry else set()) == pending, (seed, cut)
            if carry is not None:  # what was pending at the cut begins in the older file
                assert [r.offset >> 40 for r in records if r.offset == carry.position] == [0]


@pytest.mark.parametrize("fast", PATHS, ids=lambda f: "c" if f else "python")
def test_a_stderr_part_pending_while_stdout_rotates_is_joined_in_the_next_file(fast):
    head = "WARNING 02-15 10:23:01 x.py:1] "
    entries = [("stderr", "P " + head + "a warning "),
               ("stdout", "F " + _summary("0xa")),
               ("stdout", "P " + _summary("0xb")[:50]),
               # the rotation falls here: both streams have a part pending
               ("stdout", "F " + _summary("0xb")[50:]),
               ("stderr", "F cut in two by a rotation")]
    records, carry = _rotated_records(entries, 3, fast)
    assert [h.stream for h in carry.held] == ["stderr", "stdout"]  # the earliest first
    assert [r.message for r in records] == [_summary("0xa").split("] ", 1)[1], _summary("0xb").split("] ", 1)[1],
                                            "a warning cut in two by a rotation"]
    assert [(r.offset >> 40, r.end_offset >> 40) for r in records] == [(0, 0), (0, 1), (0, 1)]


def test_adopt_is_for_a_decoder_that_has_read_nothing():
    d = Decoder()
    d(f"{STAMP.format(0)} stdout F {_summary('0xa')}\n".encode(), 0)
    with pytest.raises(ValueError):
        d.adopt(Decoder().carry() or _carry_of("P x"))


def _carry_of(rest: str):
    d = Decoder()
    d(f"{STAMP.format(0)} stdout {rest}\n".encode(), 0)
    return d.carry()
