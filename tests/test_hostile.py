"""Hostile input (issue #17): no line crashes either path, and the two paths agree on it.

Each case of tests/hostile_corpus.py is a log file with well-formed requests around its hostile
lines; it is run through the whole replay pipeline in two processes, with the C fast paths and
with VLLM_TRACE_BRIDGE_PURE=1 (tests/hostile_replay.py). For each: nothing escapes, both paths
give the same counters, timelines and OTLP bytes, every good request is exported once with the
tokens written for it, and the hostile lines are counted as the case says. Then: the tail never
reads the rest of a cut line as a line, and every regex of parse and decode is linear.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_corpus import CASES, GOOD, MIB4
from waits import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _replay_both(paths: list[str]) -> tuple[dict, dict]:
    out = []
    for env in ({"VLLM_TRACE_BRIDGE_PURE": ""}, {"VLLM_TRACE_BRIDGE_PURE": "1"}):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "hostile_replay.py"), *paths],
                           env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT, timeout=deadline(600))
        assert p.returncode == 0, p.stderr[-2000:]
        out.append({os.path.basename(d["path"])[:-4]: d for d in map(json.loads, p.stdout.splitlines())})
    return out[0], out[1]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    paths = []
    for case in CASES:
        path = d / f"{case.name}.log"
        path.write_bytes(b"".join(case.lines()))
        paths.append(str(path))
    return _replay_both(paths)


def test_corpus_names_are_unique():
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_case_crashes_neither_path_and_both_agree(case, replayed):
    fast, pure = (r[case.name] for r in replayed)
    assert fast["error"] is None and pure["error"] is None, (fast["error"], pure["error"])
    for key in ("stats", "requests", "timelines", "wire", "spans_bytes"):
        assert fast[key] == pure[key], f"{case.name}: {key} differs between the C and the pure path"
    # the good requests around the hostile lines: each exported once, as written
    for g in GOOD:
        got = [r for r in fast["requests"] if r[0] == g.rid]
        assert len(got) == 1, (g.rid, fast["requests"])
        rid, outcome, prompt, generated, start_ns, end_ns = got[0]
        assert (outcome, prompt, generated) == ("finished", g.prompt_tokens, g.generated_tokens)
        assert 1_739_614_980 * 10**9 <= start_ns <= end_ns < 1_739_615_100 * 10**9  # 2025, never 1970
    # and every exported time is one OTLP can carry
    for r in fast["requests"]:
        assert 0 <= r[4] <= r[5] < 2**64
    stats = fast["stats"]
    for (stage, counter), n in case.expect.items():
        got = stats["parse"]["malformed"].get(counter, 0) if stage == "malformed" else stats[stage][counter]
        assert got == n, (stage, counter, got)
    if not any(stage == "malformed" for stage, _ in case.expect):
        assert stats["parse"]["malformed"] == {}
    assert max(fast["seconds"], pure["seconds"]) < 10, "a hostile line took seconds: a regex backtracks"


# -- the tail: a line cut at MAX_LINE_BYTES ----------------------------------------------------


def _follow(path: str, offset: int = 0):
    from bridge.tail.source import source_for
    from bridge.tail.follow import TailStats, TrackedFile

    fh = open(path, "rb")
    fh.seek(offset)
    tf = TrackedFile(path, source_for(path), 0, fh, os.fstat(fh.fileno()).st_ino, offset)
    stats, lines = TailStats(), []
    try:
        for _ in range(100):
            got = tf.read(1 << 20, stats)
            lines += got
            if not got and tf.at_eof:
                break
    finally:
        fh.close()
    return lines, stats, tf


def test_the_rest_of_an_oversized_line_is_never_read_as_a_line(tmp_path):
    """The agent reads at most MAX_LINE_BYTES of a line; its rest, whatever it says (a forged
    summary here, as a client's prompt could), is dropped, and the next line is read whole."""
    from bridge.tail.follow import MAX_LINE_BYTES

    assert MAX_LINE_BYTES == MIB4
    forged = b"INFO 02-15 10:23:05 x.py:1] Request 0xa002: prompt_tokens=999999, generated_tokens=1 "
    head = b"INFO 02-15 10:23:03 x.py:1] Received request cmpl-big: prompt: '"
    # the forged text starts the rest, which runs on over several reads
    big = head + b"x" * (MAX_LINE_BYTES - len(head)) + forged + b"x" * (3 * MAX_LINE_BYTES) + b" rest\n"
    good = b"INFO 02-15 10:23:06 x.py:1] Added request q1.\n"
    path = tmp_path / "0.log"
    path.write_bytes(good + big + good)
    lines, stats, _ = _follow(str(path))
    assert [raw for _, raw in lines] == [good, big[:MAX_LINE_BYTES], good]
    assert [pos for pos, _ in lines] == [0, len(good), len(good) + len(big)]
    assert stats.lines_oversized == 1
    assert stats.bytes_cut == len(big) - MAX_LINE_BYTES
    # a resume from inside the cut line (a checkpoint after its head) drops its rest as well
    lines, _, _ = _follow(str(path), len(good) + MAX_LINE_BYTES)
    assert [raw for _, raw in lines] == [good]
    lines, _, _ = _follow(str(path), len(good))  # a resume at a line start reads it
    assert [raw for _, raw in lines][1:] == [good]


def test_a_line_written_in_pieces_is_still_read_whole(tmp_path):
    """The cut is for lines over the limit only: a writer mid-line is waited for, not cut."""
    from bridge.tail.source import source_for
    from bridge.tail.follow import TailStats, TrackedFile

    path = tmp_path / "0.log"
    path.write_bytes(b"INFO 02-15 10:23:03 x.py:1] Added req")
    fh = open(path, "rb")
    tf = TrackedFile(str(path), source_for(str(path)), 0, fh, os.fstat(fh.fileno()).st_ino, 0)
    stats = TailStats()
    assert tf.read(1 << 20, stats) == []
    with open(path, "ab") as f:
        f.write(b"uest q1.\nINFO 02-15 10:23:04 x.py:1] Added request q2.\n")
    assert [raw for _, raw in tf.read(1 << 20, stats)] == [
        b"INFO 02-15 10:23:03 x.py:1] Added request q1.\n", b"INFO 02-15 10:23:04 x.py:1] Added request q2.\n"]
    assert stats.lines_oversized == stats.bytes_cut == 0
    fh.close()


# -- every regex of parse and decode is linear in the line length ------------------------------


def _patterns():
    """(module.name, pattern, the calls the module makes on it): `match` for every pattern, and
    `search`/`findall`/`finditer`/`sub` where the module's source calls them on that name."""
    import inspect

    import bridge.decode
    import bridge.parse

    mods = [importlib.import_module(f"{pkg.__name__}.{i.name}") for pkg in (bridge.parse, bridge.decode)
            for i in pkgutil.iter_modules(pkg.__path__) if not i.name.startswith("_")] + [bridge.parse, bridge.decode]
    sources = "\n".join(inspect.getsource(mod) for mod in mods)
    found = {}
    for mod in mods:  # submodules first: a pattern is named where it is defined
        for name, value in vars(mod).items():
            items = value if isinstance(value, (list, tuple)) else [value]
            for item in items:
                for v in (item if isinstance(item, tuple) else (item,)):
                    if isinstance(v, re.Pattern) and isinstance(v.pattern, str) and id(v) not in found:
                        ops = ["match"] + [op for op in ("search", "findall", "finditer", "sub")
                                           if re.search(rf"(?<![\w.]){re.escape(name)}\.{op}\(", sources)]
                        found[id(v)] = (f"{mod.__name__}.{name}", v, tuple(ops))
    return sorted(found.values(), key=lambda x: x[0])


PATTERNS = _patterns()


def _literals(pattern: str) -> list[str]:
    """Runs of literal text in a pattern: what an attacker repeats to make it try hard."""
    text = re.sub(r"\\[dDwWsSbB]|\[[^\]]*\]|\(\?[:=!<]*|[()*+?{}|^$.]|\d+,?\d*\}", "\x00", pattern)
    text = text.replace("\\", "")
    return [t for t in text.split("\x00") if len(t) >= 2][:6] or ["a"]


def _hostile_texts(pattern: str, n: int) -> list[str]:
    texts = ["1" * n + "%", "1" * n + "|", "a" * n, " " * n + "x", "|" + " " * n + "1" * n, "a " * n, "=" * n,
             "(" * n, "[" * n + "]", "a:" * n, "Error" * n, "1." * n, "1," * n + "x"]
    for lit in _literals(pattern):
        texts += [lit * (n // len(lit) + 1), lit + "a" * n, lit + "1" * n, lit + " " * n + "x", lit + "1" * n + "x",
                  (lit + " ") * (n // (len(lit) + 1) + 1), (lit + "1") * (n // (len(lit) + 1) + 1)]
    return texts


def _worst(pattern: re.Pattern, ops: tuple[str, ...], n: int) -> float:
    worst = 0.0
    for text in _hostile_texts(pattern.pattern, n):
        for op in ops:
            call = getattr(pattern, op)
            t = time.perf_counter()
            call("", text) if op == "sub" else call(text)
            worst = max(worst, time.perf_counter() - t)
    return worst


def test_the_audit_finds_the_regexes():
    names = {name: ops for name, _, ops in PATTERNS}
    assert names["bridge.parse.upstream._PROGRESS"] == ("match", "search")
    assert names["bridge.decode.prefix.HEADER"] == ("match", "search")
    assert {"bridge.parse.seed._SUMMARY", "bridge.decode.prefix._PROCESS", "bridge.parse.upstream._EXC"} <= set(names)
    assert len(PATTERNS) > 40


@pytest.mark.parametrize("name,pattern,ops", PATTERNS, ids=[n for n, _, _ in PATTERNS])
def test_every_parse_and_decode_regex_is_linear(name, pattern, ops):
    """Eight times the input may take ~eight times as long, never ~sixty-four (quadratic): the
    slowest of many hostile texts built from the pattern's own literals, at 500 and 4,000
    characters, with each call the code makes on it."""
    small = _worst(pattern, ops, 500)
    large = _worst(pattern, ops, 4_000)
    assert large < 0.02 or large < 24 * max(small, 2e-5), (name, small, large)


# -- the wire: an int beyond int64 (a sum of bounded counts) is never wrapped --------------------


@pytest.mark.parametrize("value", [2**64 + 12345, 2**63, -(2**63) - 1, 10**30 - 1, 10**400, -(10**400)])
def test_an_int_beyond_int64_is_encoded_as_its_double_on_both_paths(value):
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    from bridge.export.wire import FAST_REQUEST, KeyValues

    encoded = [b"".join(KeyValues(0x4A).all({"n": value}))]
    if FAST_REQUEST is not None:
        from bridge.export import _fastwire

        encoded.append(_fastwire.key_values(0x4A, {"n": value}))
    expected = float("inf") if value > 10**308 else float("-inf") if value < -10**308 else float(value)
    for raw in encoded:
        assert raw[:1] == b"\x4a"
        kv = KeyValue.FromString(raw[2:])
        assert kv.value.WhichOneof("value") == "double_value" and kv.value.double_value == expected
    assert len(set(encoded)) == 1


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63), 0, -1, 12345])
def test_an_int64_stays_an_int(value):
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    from bridge.export.wire import KeyValues

    kv = KeyValue.FromString(b"".join(KeyValues(0x4A).all({"n": value}))[2:])
    assert kv.value.WhichOneof("value") == "int_value" and kv.value.int_value == value


# -- other doors: a year given by flag, a gateway's access log, a file name that is not UTF-8 ----


@pytest.mark.parametrize("year", [1900, 1969, 2554, 9999])
def test_a_header_year_otlp_cannot_carry_is_replaced_on_both_paths(year):
    from bridge.decode import Decoder
    from bridge.decode import stream as stream_mod
    from bridge.decode.record import CLOCK_ANCHORED
    from bridge.decode.stream import RecordStream

    lines, offset = [], 0
    for raw in [b"INFO 02-15 10:23:03 x.py:1] Added request q1.\n"] * 3:
        lines.append((offset, raw))
        offset += len(raw)
    got = []
    for fast in {stream_mod.FAST, None}:
        s = RecordStream(Decoder(year=year, mtime=1.74e9), fast=fast)
        records = list(s.over(lines))
        assert [(r.ts_ns, r.clock) for r in records] == [(1_740_000_000 * 10**9, CLOCK_ANCHORED)] * 3
        assert s.decoder.stats.times_out_of_range == 3
        got.append((records, s.decoder.stats))
    assert got[0] == got[-1]


def test_a_gateway_line_that_would_crash_is_skipped_or_cleaned():
    from bridge.parse.gateway import GatewayParser, gateway_format

    parse = GatewayParser(gateway_format("nginx"))
    assert parse('{"request_id": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}") is None  # RecursionError
    entry = parse('{"request_id": "r\\ud800", "time_iso8601": "1900-01-01T00:00:00+00:00"}')
    assert entry.request_id == "r\ufffd" and entry.ts_ns is None
    entry.request_id.encode()
    assert parse('{"request_id": "b", "time_iso8601": "2025-02-15T10:23:03+00:00"}').ts_ns == 1_739_614_983 * 10**9


def test_a_file_name_that_is_not_utf8_replays_on_both_paths(tmp_path):
    name = os.path.join(os.fsencode(str(tmp_path)), b"vllm-\xff\xfe.log")
    with open(name, "wb") as f:
        f.write(b"".join(CASES[0].lines()))
    fast, pure = _replay_both([os.fsdecode(name)])
    (fast,), (pure,) = fast.values(), pure.values()
    assert fast["error"] is None and pure["error"] is None, (fast["error"], pure["error"])
    assert fast["wire"] == pure["wire"] and fast["spans_bytes"] > 0
    assert sorted(r[0] for r in fast["requests"] if r[0].startswith("0xa")) == [g.rid for g in GOOD]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.tuples(st.sampled_from([0, 1, 2, 40, 300, 70_000]), st.booleans(), st.booleans()),
                      min_size=1, max_size=60),
       budgets=st.lists(st.sampled_from([1, 7, 100, 4096, 1 << 20]), min_size=1, max_size=8),
       cut_at=st.integers(0, 3))
def test_the_chunked_read_gives_what_the_line_by_line_read_gives(tmp_path_factory, pieces, budgets, cut_at):
    """`TrackedFile.read` splits a whole chunk in C; `read_lines` is the line-by-line reference.
    Over a file written in pieces (lines of any length, some long, writes ending mid-line) and
    read with any budget between the writes, both give the same lines, positions, counters
    and state."""
    from bridge.tail.source import source_for
    from bridge.tail.follow import TailStats, TrackedFile

    d = tmp_path_factory.mktemp("chunked")
    path = str(d / "0.log")
    open(path, "wb").close()
    fhs = [open(path, "rb"), open(path, "rb")]
    tfs = [TrackedFile(path, source_for(path), 0, fh, os.fstat(fh.fileno()).st_ino, 0) for fh in fhs]
    stats = [TailStats(), TailStats()]
    got: list[list] = [[], []]
    try:
        for k, (size, newline, read_now) in enumerate(pieces):
            with open(path, "ab") as f:
                f.write(bytes([97 + k % 26]) * size + (b"\n" if newline else b"") + (b"\r" if k == cut_at else b""))
            for b in budgets if read_now else ():  # the two may split rounds differently: the lines add up the same
                got[0] += tfs[0].read(b, stats[0])
                got[1] += tfs[1].read_lines(b, stats[1])
        for tf, read, out, stat in ((tfs[0], tfs[0].read, got[0], stats[0]), (tfs[1], tfs[1].read_lines, got[1], stats[1])):
            while True:
                more = read(1 << 20, stat)
                out += more
                if not more and tf.at_eof:
                    break
        assert got[0] == got[1]
        assert stats[0] == stats[1]
        assert (tfs[0].offset, tfs[0].partial, tfs[0].cut) == (tfs[1].offset, tfs[1].partial, tfs[1].cut)
        # and the whole file at once (many lines in one chunk), then whatever a writer adds
        for fh in fhs:
            fh.seek(0)
        again = [TrackedFile(path, source_for(path), 0, fh, os.fstat(fh.fileno()).st_ino, 0) for fh in fhs]
        with open(path, "ab") as f:
            f.write(b"tail\n")
        assert again[0].read(1 << 20, TailStats()) + again[0].read(1 << 20, TailStats()) == \
            again[1].read_lines(1 << 20, TailStats()) + again[1].read_lines(1 << 20, TailStats())
        assert again[0].offset == again[1].offset
    finally:
        for fh in fhs:
            fh.close()
