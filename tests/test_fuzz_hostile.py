"""Differential fuzzing (issue #17): lines from the grammar, mutated, through every stage with the
C fast paths and without them.

Lines are the seed dialect's and upstream vLLM's (the bundled sample and the upstream fixtures)
and JSON-format records, mutated: numbers replaced by huge ones (4,301 digits, 2^64+12345,
1e307 written out), odd Unicode and lone surrogate escapes, binary bytes, very long lines,
headers, runtime stamps and JSON times OTLP cannot carry. They are put between well-formed
requests written by hand (tests/hostile_corpus.GOOD) in a plain, CRI or docker file. Asserted:
no exception escapes either path; records, events, every counter, timelines and OTLP bytes are
equal; every good request is exported once, with the tokens written for it.

A bounded run is in the default suite; `-m fuzz` runs a longer one (FUZZ_EXAMPLES, default 3000).
"""

from __future__ import annotations

import glob
import os
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.assemble import Assembler
from bridge.decode import Decoder
from bridge.tail.source import source_for
from bridge.decode import stream as stream_mod
from bridge.decode.stream import RecordStream
from bridge.export.batch import OtlpSink
from bridge.export.wire import FAST_REQUEST, WireEncoder
from bridge.parse import FAST_PARSE, Parser
from bridge.tail import read_lines
from hostile_corpus import GOOD, _frame, _lifecycle, header
from receivers import CapturingTransport

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = stream_mod.FAST is not None and FAST_PARSE is not None and FAST_REQUEST is not None


def _messages() -> list[str]:
    """Message parts (header removed) of the sample and the upstream fixtures: the grammar."""
    out: list[str] = []
    paths = [os.path.join(ROOT, "bridge", "samples", "seed.log")] + sorted(
        glob.glob(os.path.join(ROOT, "tests", "fixtures", "*", "*.log")))
    for path in paths:
        seen = 0
        for _, raw in read_lines(path):
            msg = raw.decode("utf-8", "replace").rstrip("\n")
            msg = msg.split("] ", 1)[-1] if "] " in msg[:120] else msg
            if msg and msg not in out and seen < 60:
                out.append(msg)
                seen += 1
    return out


MESSAGES = _messages()
HUGE = ["9" * 4301, str(2**64 + 12345), str(2**63), "1" + "0" * 307, "1e307", "1" + "0" * 400, "0" * 30 + "7",
        "99999999999999999999", "-" + "9" * 25, "1" * 100_000, "nan", "inf", "١٢", "0.0000000000000000000001"]
ODD = ["\ud800", "\udfff", "\U0010ffff", "\ufeff", "\x00", "\x1b[31m", "\r", "é", "\u202e", "\\ud800", "\\udc00\\u0000",
       "'", "\"", "%", "|", "{", "[" * 50]
HEADS = ["INFO 02-15 10:23:03 x.py:1] ", "INFO 02-30 10:23:03 x.py:1] ", "INFO 13-45 25:61:61 x.py:1] ",
         "ERROR 12-31 23:59:59 x.py:1] ", "WARNING 00-00 00:00:00 x.py:1] ", "", "(APIServer pid=1) INFO 02-15 10:23:03 "
         "[x.py:1] ", "1900-01-01T00:00:00Z ", "9999-12-31T23:59:59Z INFO 02-15 10:23:03 x.py:1] "]
STAMPS = ["2025-02-15T10:23:03.5Z", "1900-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "0001-01-01T00:00:00Z",
          "1970-01-01T00:00:00+01:00", "2554-07-21T23:34:34Z", "2025-02-30T10:23:03Z", "2025-02-15T10:23:03.5+99:99"]
ASCTIMES = ["2025-02-15 10:23:03,250", "1900-02-15 10:23:03,250", "9999-12-31 23:59:59,999", "0001-01-01 00:00:00,000",
            "1970-01-01 00:00:00,000", "2025-02-30 10:23:03,250", "x"]


@st.composite
def mutated_message(draw) -> str:
    msg = draw(st.sampled_from(MESSAGES))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["number", "number", "odd", "cut", "repeat", "append"]))
        if kind == "number":  # a number of the line (the first, or a random one) replaced
            starts = [i for i, c in enumerate(msg) if c.isdigit() and (i == 0 or not msg[i - 1].isdigit())]
            if starts:
                i = draw(st.sampled_from(starts))
                j = i
                while j < len(msg) and msg[j].isdigit():
                    j += 1
                msg = msg[:i] + draw(st.sampled_from(HUGE)) + msg[j:]
        elif kind == "odd":
            i = draw(st.integers(0, len(msg)))
            msg = msg[:i] + draw(st.sampled_from(ODD)) + msg[i:]
        elif kind == "cut":
            msg = msg[:draw(st.integers(0, len(msg)))]
        elif kind == "repeat" and len(msg) < 2000:  # very long lines, up to a few MB
            msg = msg * draw(st.sampled_from([2, 50, 2000]))
        else:
            msg += draw(st.text(max_size=20))
    return msg.replace("\n", " ")


@st.composite
def hostile_line(draw, framing: str) -> bytes:
    """One physical line: a mutated message with a header (or none), framed as the file is, as
    a JSON record, or raw binary."""
    kind = draw(st.sampled_from(["text", "text", "text", "json", "binary", "cri", "docker"]))
    if kind == "binary":
        return draw(st.binary(max_size=200)).replace(b"\n", b" ") + b"\n"
    msg = draw(mutated_message())
    if kind == "json":
        name = draw(st.sampled_from(["APIServer", "\\ud800", "é", ""]))
        rid = draw(st.sampled_from(["", " \\ud800", "\\udbff\\udfff"]))
        text = msg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        text = "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else f"\\u{ord(c):04x}"
                       for c in text if ord(c) <= 0xFFFF)
        nest = draw(st.sampled_from(["", ', "x": ' + "[" * 100_000 + "]" * 100_000]))
        return ('{"asctime": "%s", "levelname": "%s", "name": "vllm.x", "message": "%s%s", "process": %s, '
                '"vllm_process_name": "%s"%s}\n' % (
                    draw(st.sampled_from(ASCTIMES)), draw(st.sampled_from(["INFO", "ERROR", "\\ud800"])), text, rid,
                    draw(st.sampled_from(["1", "1" + "0" * 5000, "null", "[]"])), name, nest)).encode("utf-8", "surrogatepass")
    line = draw(st.sampled_from(HEADS)) + msg
    if kind == "cri" or (kind == "text" and framing == "cri"):
        # A `P` part is closed by an `F` one: an unclosed part would, by CRI's rule, take the
        # good line after it as its rest.
        stamp = draw(st.sampled_from(STAMPS))
        if draw(st.booleans()):
            line = f"{stamp} stdout P {line}\n{stamp} stdout F {draw(mutated_message())}"
        else:
            line = f"{stamp} stdout F {line}"
    elif kind == "docker" or (kind == "text" and framing == "docker"):
        body = line.replace("\\", "\\\\").replace('"', '\\"')
        line = '{"log": "%s\\n", "stream": "stdout", "time": "%s"}' % (body, draw(st.sampled_from(STAMPS)))
    return line.encode("utf-8", "surrogatepass") + b"\n"  # one line, or a P part and its F


@st.composite
def hostile_files(draw):
    framing = draw(st.sampled_from(["plain", "plain", "cri", "docker"]))
    hostile = [line + b"\n" for item in draw(st.lists(hostile_line(framing), min_size=1, max_size=8))
               for line in item[:-1].split(b"\n")]  # a P part and its F are two physical lines
    before = _lifecycle(GOOD[0], 0) + _lifecycle(GOOD[1], 2)
    after = _lifecycle(GOOD[2], 20) + _lifecycle(GOOD[3], 22)
    lines = [_frame(framing, s, header(s) + m) for s, m in before] + hostile
    lines += [_frame(framing, s, header(s) + m) for s, m in after]
    return framing, lines


def run(lines: list[bytes], fast: bool) -> dict:
    """Every stage over one file's lines, as the pipeline runs them, with or without the C."""
    pairs, offset = [], 0
    for raw in lines:
        pairs.append((offset, raw))
        offset += len(raw)
    stream = RecordStream(Decoder(year=2025, mtime=1.74e9), fast=stream_mod.FAST if fast else None)
    parser = Parser(fast=FAST_PARSE if fast else None)
    transport = CapturingTransport()
    sink = OtlpSink(transport, {"service.name": "vllm"}, max_batch=256,
                    encoder=WireEncoder if fast else partial(WireEncoder, fast=None))
    timelines: list = []

    def emit(t) -> None:
        timelines.append(t)
        sink(t)

    assembler = Assembler(source_for("/var/log/pods/ns_pod_0123456789ab/vllm/0.log"), emit, fast=fast)
    records, events = [], []
    for record in stream.over(pairs):
        event = parser.parse(record.message, record.level, record.origin)
        records.append(record)
        events.append(event)
        if event is not None:
            assembler.feed(record, event)
    assembler.flush()
    sink.flush()
    return {"records": records, "decode": stream.decoder.stats, "join": stream.joiner.stats, "events": events,
            "parse": parser.snapshot(), "timelines": timelines, "assemble": assembler.stats,
            "attr_order": [(list(t.attrs), [list(p.attrs) for p in getattr(t, "phases", ())]) for t in timelines],
            "payloads": transport.payloads}


def check(framing: str, lines: list[bytes]) -> None:
    """Without the C (not built, or VLLM_TRACE_BRIDGE_PURE=1) the pure path is still checked."""
    pure = run(lines, False)
    if NATIVE:
        fast = run(lines, True)
        for key in pure:
            assert fast[key] == pure[key], f"{key} differs between the C and the pure path"
        assert [type(e) for e in fast["events"]] == [type(e) for e in pure["events"]]
    for g in GOOD:
        got = [t for t in pure["timelines"] if getattr(t, "request_id", None) == g.rid]
        assert len(got) == 1, (g.rid, framing)
        assert (got[0].outcome, got[0].attrs.get("gen_ai.usage.input_tokens"),
                got[0].attrs.get("gen_ai.usage.output_tokens")) == ("finished", g.prompt_tokens, g.generated_tokens)
    for t in pure["timelines"]:
        assert 0 <= t.start_ns <= t.end_ns < 2**64


_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)


@settings(max_examples=500, **_SETTINGS)
@given(hostile_files())
def test_hostile_lines_crash_neither_path_and_both_agree(file):
    check(*file)


FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "3000"))


@pytest.mark.fuzz
@settings(max_examples=FUZZ_EXAMPLES, **_SETTINGS)
@given(hostile_files())
def test_fuzz_long_run(file):
    check(*file)

