"""Property-based: no input makes a stage raise, and the counters always add up."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.assemble import AssembleConfig, Assembler
from bridge.decode import Decoder
from bridge.tail.source import source_for
from bridge.parse import Parser, parse_message
from bridge.synth import SynthConfig, generate
from bridge.synth.seed import _header

PREFIXES = ["Request ", "Scheduling request ", "Preempting request ", "Running queue: ", "Allocated block ",
            "Freed block ", "GPU memory usage: ", "CUDA out of memory.", "Failed to ", "NCCL timeout: ",
            "Possible causes: ", "Request timeout: "]

SAMPLE, _ = generate(SynthConfig(requests=40, seed=5))
SAMPLE_LINES = [_header(ts, lvl, org, msg) for ts, _, lvl, org, msg in SAMPLE]


@given(st.sampled_from(PREFIXES), st.text())
def test_parse_never_raises(prefix, rest):
    parse_message(prefix + rest)


@given(st.binary(max_size=300))
def test_decode_never_raises_on_bytes(raw):
    d = Decoder()
    for i, part in enumerate(raw.split(b"\n")):
        d(part + b"\n", i)
    d.flush()


def _mutate(line: str, rnd: random.Random) -> str:
    op = rnd.randrange(6)
    if op == 0:
        return line[: rnd.randrange(len(line) + 1)]
    if op == 1:
        i = rnd.randrange(len(line) + 1)
        return line[:i] + rnd.choice(["=", ",", ":", "x", "-1", "999999999999", " ", "é", "\x1b[0m"]) + line[i:]
    if op == 2:
        return "".join(c if not c.isdigit() or rnd.random() > 0.3 else str(rnd.randrange(10)) for c in line)
    if op == 3:
        return line.replace("0x7f8c4a", "0x", 1)
    if op == 4:
        return line.upper()
    return line


def run_pipeline(lines: list[str]):
    decoder, parser = Decoder(year=2025), Parser()
    out = []
    asm = Assembler(source_for("/tmp/x.log"), out.append, AssembleConfig(ttl_s=5))
    offset = 0
    for line in lines:
        raw = line.encode("utf-8", "surrogatepass") + b"\n"
        rec = decoder(raw, offset)
        offset += len(raw)
        if rec is not None:
            ev = parser(rec.message)
            if ev is not None:
                asm.feed(rec, ev)
    asm.flush()
    return decoder.stats, parser.snapshot(), asm.stats, out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.floats(0, 1), st.booleans())
def test_mutated_logs_never_raise_and_counts_add_up(seed, ratio, shuffle):
    rnd = random.Random(seed)
    lines = [(_mutate(line, rnd) if rnd.random() < ratio else line) for line in SAMPLE_LINES]
    if shuffle:
        window = lines[100:160]
        rnd.shuffle(window)
        lines[100:160] = window
    dstats, pstats, astats, out = run_pipeline(lines)
    assert dstats.records == pstats.lines
    assert pstats.lines == pstats.recognised + pstats.unrecognised + sum(pstats.malformed.values())
    requests = [t for t in out if hasattr(t, "phases")]
    assert astats.requests_opened == astats.requests_emitted == len(requests)
    for t in requests:
        assert t.start_ns <= t.end_ns
        for p in t.phases:
            assert t.start_ns <= p.start_ns <= p.end_ns <= t.end_ns, (t.request_id, p)


@given(st.lists(st.text(max_size=80), max_size=40))
def test_arbitrary_text_lines(lines):
    dstats, pstats, astats, _ = run_pipeline(lines)
    assert pstats.lines == pstats.recognised + pstats.unrecognised + sum(pstats.malformed.values())
    assert astats.requests_opened == astats.requests_emitted
