"""Phases with vLLM's own boundaries, from the plugin's exact times (issue #18).

The log is a plain file (one-second headers, no runtime stamp), as a server log on disk is; the
expected boundaries are worked out by hand from the `t=`, `queued=`, `ttft=` and
`total_latency=` the lines state, never from the bridge's earlier output.
"""

from __future__ import annotations

import time

import pytest

from bridge.parse import FAST_PARSE, MALFORMED, Parser, parse_line
from bridge.parse.events import BlockAllocated, BlockFreed, Preempted, RequestSummary, Scheduled
from bridge.pipeline import ReplayConfig, replay

T0 = 1_796_000_000  # a whole second: 2026-11-30T...Z
NS = 1_000_000_000


def _ns(seconds_after_t0: str) -> int:
    """`"0.650"` → T0 + 650 ms, in integer ns (no float on the way)."""
    whole, _, frac = seconds_after_t0.partition(".")
    return (T0 + int(whole)) * NS + int(frac.ljust(9, "0"))


def _line(process: str, at: str, origin: str, message: str) -> str:
    """vLLM's header for the second the line was written in (a plain file's only stamp)."""
    header = time.strftime("%m-%d %H:%M:%S", time.gmtime(_ns(at) // NS))
    return f"({process}) INFO {header} [{origin}] {message}\n"


def _t(at: str) -> str:
    whole, _, frac = at.partition(".")
    return f"{T0 + int(whole)}.{frac.ljust(6, '0')}"


LINES = [
    ("APIServer pid=1", "0.400", "request_logger.py:65",
     "Received request cmpl-a-0: params: SamplingParams(n=1, temperature=0.0, top_p=1.0, max_tokens=20), "
     "lora_request: None."),
    ("APIServer pid=1", "0.410", "async_llm.py:578", "Added request cmpl-a-0-deadbeef."),
    ("EngineCore pid=2", "0.900", "hooks.py:1",
     f"Scheduling request cmpl-a-0: priority=0, num_scheduled_blocks=2, remaining_blocks=6, queued=250.000ms, "
     f"t={_t('0.900')}"),
    ("EngineCore pid=2", "1.200", "hooks.py:1",
     f"Preempting request cmpl-a-0: reason=kv_cache_full, preempted_blocks=3, t={_t('1.200')}"),
    ("EngineCore pid=2", "1.350", "hooks.py:1",
     f"Scheduling request cmpl-a-0: priority=0, num_scheduled_blocks=3, remaining_blocks=1, t={_t('1.350')}"),
    ("EngineCore pid=2", "2.100", "hooks.py:1",
     f"Freed 4 blocks for request cmpl-a-0, reason=completed, t={_t('2.100')}"),
    ("APIServer pid=1", "2.1005", "hooks.py:2",
     f"Request cmpl-a-0: prompt_tokens=10, generated_tokens=20, ttft=400.000ms, itl=5.000ms, "
     f"total_latency=1.500000s, t={_t('2.1005')}"),
]


@pytest.fixture
def timeline(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("".join(_line(*x) for x in LINES))
    out = []
    replay([str(path)], [out.append], ReplayConfig(year=2026))
    (t,) = [x for x in out if getattr(x, "request_id", None) == "cmpl-a-0"]
    return t


def test_phases_take_vllms_boundaries_to_the_microsecond_from_a_plain_file(timeline):
    arrival = _ns("2.1005") - 1_500_000_000      # end − total_latency: vLLM's own arrival_time
    first_token = arrival + 400_000_000          # + ttft
    engine_in = _ns("0.900") - 250_000_000       # first scheduled − queued (vLLM's QUEUED event)
    want = [
        ("preprocess", arrival, engine_in),      # vLLM's arrival (rendering starts) → the engine's QUEUED
        ("queued", engine_in, _ns("0.900")),
        ("prefill", _ns("0.900"), first_token),
        ("preempted", _ns("1.200"), _ns("1.350")),
        ("decode", first_token, _ns("2.1005")),
        ("freed", _ns("2.100"), _ns("2.100")),
    ]
    got = sorted(((p.name, p.start_ns, p.end_ns) for p in timeline.phases), key=lambda x: (x[1], x[0]))
    assert got == sorted(want, key=lambda x: (x[1], x[0]))
    # the root is vLLM's own llm_request: from its arrival (the `Received` line's header says only
    # its second, T0, 600.5 ms earlier) to the end
    assert timeline.start_ns == arrival and timeline.end_ns == _ns("2.1005")
    assert timeline.attrs["gen_ai.latency.time_in_queue"] == pytest.approx(0.25, abs=1e-9)
    assert timeline.attrs["vllm.preemptions"] == 1


def test_no_boundary_is_marked_inferred_when_the_lines_give_them_all(timeline):
    for p in timeline.phases:
        assert "inferred" not in (p.start_timing, p.end_timing), p


def test_old_plugin_lines_without_a_time_still_parse_and_keep_their_header_time(tmp_path):
    path = tmp_path / "old.log"
    path.write_text(
        _line("EngineCore pid=2", "0.900", "hooks.py:1",
              "Scheduling request cmpl-b-0: priority=0, num_scheduled_blocks=2, remaining_blocks=6, queued=250.000ms")
        + _line("APIServer pid=1", "2.1005", "hooks.py:2",
                "Request cmpl-b-0: prompt_tokens=10, generated_tokens=20, ttft=400.000ms, itl=5.000ms, "
                "total_latency=1.500000s"))
    out = []
    replay([str(path)], [out.append], ReplayConfig(year=2026))
    (t,) = out
    names = [p.name for p in t.phases]
    assert names == ["queued", "prefill", "decode"]
    assert t.end_ns == (T0 + 2) * NS  # the header's second: no better time was given
    assert "preprocess" not in names  # no receipt line: no preprocess made up


EXACT = [
    ("Scheduling request x: priority=0, num_scheduled_blocks=4, remaining_blocks=2, queued=1.5ms, t=1796000000.123456",
     Scheduled("x", 0, 4, 2, 0.0015, 1_796_000_000_123_456_000)),
    ("Scheduling request x: priority=0, num_scheduled_blocks=4, remaining_blocks=2, t=12",
     Scheduled("x", 0, 4, 2, None, 12 * NS)),
    ("Preempting request x: reason=kv_cache_full, preempted_blocks=3, t=5.000001",
     Preempted("x", "kv_cache_full", 3, 5 * NS + 1000)),
    ("Freed block 7 for request x, reason=completed, t=5.5", BlockFreed("7", "x", "completed", 1, 5 * NS + NS // 2)),
    ("Freed 3 blocks for request x, reason=preempted, t=5.5", BlockFreed("", "x", "preempted", 3, 5 * NS + NS // 2)),
    ("Allocated block 3 for request x, size=16KB, t=9.25", BlockAllocated("3", "x", 16000, 9 * NS + NS // 4)),
    ("Request x: prompt_tokens=1, generated_tokens=2, ttft=1ms, itl=0ms, total_latency=2s, t=1.000000001",
     RequestSummary("x", 1, 2, 0.001, 0.0, 2.0, NS + 1)),
    # without a time, or with something else after `t=`: as the grammar always read them
    ("Freed block 7 for request x, reason=a,b", BlockFreed("7", "x", "a,b")),
    ("Freed block 7 for request x, reason=x, t=soon", BlockFreed("7", "x", "x,")),
    ("Preempting request x: reason=r, preempted_blocks=3", Preempted("x", "r", 3)),
]


@pytest.mark.parametrize("line, want", EXACT)
def test_the_exact_time_parses_the_same_on_both_paths(line, want):
    assert parse_line(line) == want                     # the Python rules, the reference
    assert Parser()(line) == want                       # C first where built, Python for what it declines
    if FAST_PARSE is not None and ", t=" in line and "soon" not in line and "blocks for" not in line:
        assert FAST_PARSE(line, {}) == want             # the plugin's plain form: the C takes it (`Freed <n> blocks`: never C)


_HEADS = [
    "Scheduling request x: priority=0, num_scheduled_blocks=4, remaining_blocks=2",
    "Scheduling request x: priority=-1, num_scheduled_blocks=4, remaining_blocks=2, queued=1.5ms",
    "Scheduling request x: priority=0, num_scheduled_blocks=4, remaining_blocks=2, queued=abc",
    "Preempting request x: reason=kv_cache_full, preempted_blocks=3",
    "Freed block 7 for request x", "Freed block 7 for request x, reason=completed",
    "Freed block 7 for request x, reason=x y", "Freed block 7 for request x, reason=a,b",
    "Freed 3 blocks for request x, reason=preempted",
    "Allocated block 3 for request x, size=16KB", "Allocated block 3 for request x, size=16 KB ",
    "Request x: prompt_tokens=1, generated_tokens=2, ttft=1ms, itl=0ms, total_latency=2s",
    "Request x: prompt_tokens=1, generated_tokens=2, ttft=1ms, itl=0ms, total_latency=2 ",
    "Request x timed out after 30s",
]
_TAILS = ["", ", t=1", ", t=1796000000.123456", ", t=0.000000001", ", t=1.", ", t=.5", ", t=12345678901",
          ", t=9999999999.5", ", t=9000000000.999999999", ", t=5.1234567890", ", t=1, t=2", ", t=5x", ", t=",
          " , t=5", ", t=5 ", ", t=-5", ", t=123456789012.5", ",t=5", ", t=5, queued=1ms"]


@pytest.mark.parametrize("tail", _TAILS)
def test_c_and_python_agree_on_every_shape_of_the_time(tail):
    """Every head × tail: the C answers exactly what the Python rules answer, or hands the line
    to them (None). Never another value."""
    for head in _HEADS:
        line = head + tail
        want = parse_line(line)
        assert Parser()(line) == (None if want is MALFORMED else want), line
        if FAST_PARSE is not None:
            got = FAST_PARSE(line, {})
            assert got is None or got == want, (line, got, want)
