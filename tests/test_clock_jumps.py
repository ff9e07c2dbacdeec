"""Clock jumps (issue 37, point 4): a log's clock set years ahead or back between two lines splits
no request and closes nothing by itself; it is counted and reported, and no stamp is rewritten.

The truth is the generator's (`bridge.synth`): which requests it wrote, how each ended, and the
stamps it gave each line. The jump is made on its CRI log by moving the stamps of every line
from one point on, a point chosen inside a request (it has lines on both sides).
"""

from __future__ import annotations

import calendar
import io
import re
import time
from collections import Counter

import pytest
from replay_equiv import assert_agent_equals_replay, closing_line, synth_cri_lines

from bridge.assemble import clock
from bridge.assemble.timeline import RequestTimeline
from bridge.pipeline import ReplayConfig, replay
from waits import deadline

_NS = 1_000_000_000
YEAR50 = (50 * 365 + 12) * 86_400 * _NS  # 50 years (12 leap days)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{9})Z ")
_RID = re.compile(r"request (0x[0-9a-f]+)")


def _ns(line: str) -> int:
    m = _STAMP.match(line)
    return calendar.timegm(time.strptime(m[1], "%Y-%m-%dT%H:%M:%S")) * _NS + int(m[2])


def _stamp(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // _NS)) + f".{ns % _NS:09d}Z"


def _moved(lines: list[str], at: int, by_ns: int) -> list[str]:
    """The lines, those from index `at` on stamped `by_ns` later (earlier if negative)."""
    return lines[:at] + [_stamp(_ns(x) + by_ns) + x[_STAMP.match(x).end() - 1:] for x in lines[at:]]


def _straddling(lines: list[str]) -> tuple[int, str]:
    """A line index near the middle that falls inside a request: (index, that request's id)."""
    ids = [m[1] if (m := _RID.search(x)) else None for x in lines]
    for at in range(len(lines) // 2, len(lines)):
        before = set(ids[:at])
        for rid in ids[at:at + 5]:
            if rid is not None and rid in before and rid not in ids[at - 40:at - 20]:
                return at, rid  # lines of this request on both sides of `at`, close to it
    raise AssertionError("no request straddles the middle")


def _events(t: RequestTimeline) -> list:
    """The root's events and its phases' (KV block events sit on the phase they fall in)."""
    return [*t.events, *(e for p in t.phases for e in p.events)]


def _replay(lines: list[str], tmp_path, pure: bool, monkeypatch) -> tuple[list, object]:
    """`pure`: the assembler without its C paths (the stage this changes; test_native compares
    every stage's C and Python paths on these logs below)."""
    if pure:
        import bridge.assemble.requests as requests_mod
        from bridge.assemble import build
        # the assembler's one C path (issue 36 dropped _fastfeed.c): the timeline's build
        monkeypatch.setattr(requests_mod, "request_timeline", build._request_timeline)
    path = tmp_path / "0.log"
    path.write_text("".join(lines))
    out: list = []
    stats = replay([str(path)], [out.append], ReplayConfig())
    return out, stats


@pytest.fixture(params=[False, True], ids=["c", "pure-assembler"])
def pure(request):
    return request.param


@pytest.mark.parametrize("by", [YEAR50, -YEAR50], ids=["ahead", "back"])
def test_a_jump_of_years_inside_a_request_splits_nothing_and_keeps_both_sides(tmp_path, monkeypatch, pure, by):
    lines, truth = synth_cri_lines(7, requests=80, reuse=0)
    at, rid = _straddling(lines)
    moved = _moved(lines, at, by)
    out, stats = _replay(moved, tmp_path, pure, monkeypatch)
    roots = [t for t in out if isinstance(t, RequestTimeline)]
    # one root per request the generator wrote, each ending as the generator says it did
    assert Counter(t.request_id for t in roots) == Counter(r.request_id for r in truth.requests)
    assert Counter(t.outcome for t in roots) == Counter(r.outcome for r in truth.requests)
    assert stats.assemble.clock_jumps == 1
    assert stats.assemble.requests_evicted == 0
    # the straddling request: its block events at the stamps its lines carry (both sides: below)
    (r,) = [t for t in roots if t.request_id == rid]
    own = {_ns(x) for x in moved if f"request {rid}" in x and "block" in x}
    blocks = [e.ts_ns for e in _events(r) if e.name.startswith("vllm.kv_block")]
    assert blocks and set(blocks) <= own
    # the jump as an event on it, with both stamps as they were written
    (jump,) = [e for e in r.events if e.name == "vllm.clock_jump"]
    assert jump.ts_ns == _ns(moved[at])
    assert jump.attrs["vllm.clock.jump_s"] == pytest.approx((_ns(moved[at]) - _ns(moved[at - 1])) / _NS, abs=1e-3)
    assert jump.attrs["vllm.clock.after"].startswith(moved[at][:19])


def test_both_sides_of_the_straddling_request_are_its_own_lines(tmp_path, monkeypatch, pure):
    """Its block events on the two sides of the jump, each at the stamp the file gave its line."""
    lines, _ = synth_cri_lines(7, requests=80, reuse=0)
    at, rid = _straddling(lines)
    for by in (YEAR50, -YEAR50):
        moved = _moved(lines, at, by)
        out, _ = _replay(moved, tmp_path, pure, monkeypatch)
        (r,) = [t for t in out if isinstance(t, RequestTimeline) and t.request_id == rid]
        stamps = {_ns(x) for x in moved if re.search(rf"(Allocated|Freed) block \S+ for request {rid}\b", x)}
        early = {s for i, x in enumerate(moved[:at]) if f"request {rid}" in x for s in [_ns(x)]}
        late = {s for x in moved[at:] if f"request {rid}" in x for s in [_ns(x)]}
        events = {e.ts_ns for e in _events(r) if e.name.startswith("vllm.kv_block")}
        assert events <= stamps
        if stamps & early and stamps & late:
            assert events & early and events & late


def test_every_request_open_at_the_jump_gets_the_event(tmp_path, monkeypatch, pure):
    lines, truth = synth_cri_lines(8, requests=80, reuse=0)
    at, _ = _straddling(lines)
    out, _ = _replay(_moved(lines, at, YEAR50), tmp_path, pure, monkeypatch)
    roots = [t for t in out if isinstance(t, RequestTimeline)]
    by_id = {r.request_id: r for r in truth.requests}
    jump_ns = _ns(lines[at])  # in the generator's own time
    # open: arrived, and its last line (the last block free, else its end) not yet written
    in_flight = {r.request_id for r in truth.requests if r.arrival_ns < jump_ns and
                 (r.last_free_ns or r.finish_ns or jump_ns) >= jump_ns}
    marked = {t.request_id for t in roots if any(e.name == "vllm.clock_jump" for e in t.events)}
    assert in_flight and marked <= set(by_id)
    # a request between its arrival and its last line when the clock jumped; a generated arrival
    # may precede its first line (queue time), so `marked` may hold fewer, never others
    assert marked <= in_flight
    assert len(marked) >= len(in_flight) // 2


@pytest.mark.parametrize("gap_s", [6 * 3600, 30 * 86_400], ids=["6h", "30d"])
def test_a_long_idle_gap_is_silence_not_a_clock_jump(tmp_path, monkeypatch, pure, gap_s):
    """Hours or days without a line are real (an idle vLLM logs nothing): no clock event, and a
    request with no line for longer than the TTL is evicted as before."""
    lines, truth = synth_cri_lines(7, requests=80, reuse=0)
    at, rid = _straddling(lines)
    out, stats = _replay(_moved(lines, at, gap_s * _NS), tmp_path, pure, monkeypatch)
    assert stats.assemble.clock_jumps == 0
    assert stats.assemble.requests_evicted >= 1
    assert not [t for t in out if isinstance(t, RequestTimeline) and any(e.name == "vllm.clock_jump" for e in t.events)]


def test_an_hour_back_is_no_jump(tmp_path, monkeypatch, pure):
    """Summer time ending on header stamps, an NTP step: less than a day back is the same clock."""
    lines, truth = synth_cri_lines(7, requests=80, reuse=0)
    at, _ = _straddling(lines)
    out, stats = _replay(_moved(lines, at, -3600 * _NS), tmp_path, pure, monkeypatch)
    assert stats.assemble.clock_jumps == 0


def test_the_thresholds_by_cause():
    day, year = 86_400 * _NS, 366 * 86_400 * _NS
    t = 1_771_149_600 * _NS
    assert not clock.jumped(t, t + year - 1)  # months of silence: real
    assert clock.jumped(t, t + year)
    assert not clock.jumped(t, t - day + 1)   # zones, summer time, NTP steps
    assert clock.jumped(t, t - day)
    assert not clock.jumped(0, t)             # the first line has nothing before it


@pytest.mark.parametrize("by", [YEAR50, -YEAR50, 6 * 3600 * _NS], ids=["ahead", "back", "idle"])
def test_c_and_python_agree_through_a_jump(tmp_path, by):
    """Every stage's output, counters and OTLP bytes, C paths against pure Python."""
    test_native = pytest.importorskip("test_native")
    if not test_native.NATIVE:
        pytest.skip("C extensions not built or VLLM_TRACE_BRIDGE_PURE=1")
    lines, _ = synth_cri_lines(7, requests=80, reuse=0)
    at, _ = _straddling(lines)
    path = tmp_path / "0.log"
    path.write_text("".join(_moved(lines, at, by)))
    got = test_native._assert_same(str(path))
    assert got["assemble"].clock_jumps == (0 if by == 6 * 3600 * _NS else 1)


def test_the_replay_summary_reports_the_jump(tmp_path):
    from bridge.cli import main

    lines, _ = synth_cri_lines(7, requests=40, reuse=0)
    at, _ = _straddling(lines)
    (tmp_path / "0.log").write_text("".join(_moved(lines, at, YEAR50)))
    buf = io.StringIO()
    assert main(["replay", str(tmp_path / "0.log"), "--waterfalls", "0"], env={}, out=buf) == 0
    assert re.search(r"^clock\s+1 clock jump", buf.getvalue(), re.M), buf.getvalue()


@pytest.mark.parametrize("by", [YEAR50, -YEAR50], ids=["ahead", "back"])
def test_agent_through_a_jump_sends_what_replay_sends_and_splits_nothing(tmp_path, by):
    """The live agent (rotations, a kill -9, the wall clock extending the log's between reads)
    and a replay of the files agree span for span, and neither splits a request."""
    lines, truth = synth_cri_lines(9, requests=60, reuse=0)
    at, _ = _straddling(lines)
    moved = _moved(lines, at, by)
    # An idle gauge two hours after the last line closes what is open in both (the harness adds one
    # after the latest stamp, which after a jump back is one more jump, ahead: it closes nothing).
    moved.append(closing_line(moved[-1:]))
    out = assert_agent_equals_replay(tmp_path, moved, 9, rotations=2)
    m = re.search(r"^requests\s+(\d+)", out.replay_stdout, re.M)
    assert int(m[1]) == len(truth.requests), out.replay_stdout
    assert re.search(r"^clock\s+\d+ clock jump", out.replay_stdout, re.M), out.replay_stdout


def test_the_agent_idle_after_a_jump_back_keeps_the_new_clock(tmp_path):
    """The agent extends a quiet log's clock by the wall clock. After a jump back it extends the
    new time: a request begun after the jump, quiet while the agent waits, is still whole when its
    last lines come (extending the old, later time made it look decades old: evicted, split)."""
    from agentkit import AgentProc, pod_log, roots_by_request, wait_for
    from receivers import GrpcReceiver

    lines, truth = synth_cri_lines(9, requests=60, reuse=0)
    at, _ = _straddling(lines)
    moved = _moved(lines, at, -YEAR50)
    # a request that starts after the jump and has lines still to come
    ids = [m[1] if (m := _RID.search(x)) else None for x in moved]
    pause = next(i for i in range(at + 1, len(moved)) if ids[i] and ids[i] not in ids[:i] and ids[i] in ids[i + 1:])
    moved.append(closing_line(moved[-1:]))
    log = pod_log(tmp_path)
    with GrpcReceiver() as rx:
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint,
                          "--poll-interval", "0.2").start()
        try:
            for end in (at, pause + 1):  # read apart: the agent's last batch before the jump is the old time
                with open(log, "a") as f:
                    f.writelines(moved[at if end > at else 0:end])
                assert wait_for(lambda: agent.metric("lines_read") == end, deadline(60))
            assert agent.metric("clock_jumps") == 1
            assert [e["file"] for e in agent.log_events() if e.get("event") == "clock_jump"] == [log]
            time.sleep(2)  # quiet and read to its end: the agent's wall-clock ticks run
            with open(log, "a") as f:
                f.writelines(moved[pause + 1:])
            assert wait_for(lambda: agent.metric("lines_read") == len(moved) and agent.metric("requests_open") == 0
                            and agent.metric("export_queue_spans") == 0, deadline(60))
            time.sleep(1)
        finally:
            assert agent.term()[0] == 0
        roots = roots_by_request(s for _, s in rx.spans())
    assert Counter(rid for rid, _ in roots.elements()) == Counter(r.request_id for r in truth.requests)


def test_a_first_line_without_a_stamp_is_no_clock_reading(tmp_path):
    """A file's first lines before any stamp take the file's time (its mtime, days after its lines
    when it was copied or kept): a guess, not the clock; the stamped lines after it are no jump."""
    import os

    path = tmp_path / "vllm.log"
    path.write_text("Triton is installed, but doesn't include CPU backend. Disabling Triton.\n"
                    "INFO 02-15 10:23:00 scheduler.py:234] Scheduling request 0xa: priority=0, "
                    "num_scheduled_blocks=1, remaining_blocks=4\n"
                    "INFO 02-15 10:23:01 scheduler.py:789] Request 0xa: prompt_tokens=1, generated_tokens=2, "
                    "ttft=1.0ms, itl=1.0ms, total_latency=0.5s\n")
    t = calendar.timegm((2025, 2, 18, 0, 0, 0))  # three days after its lines
    os.utime(path, (t, t))
    stats = replay([str(path)], [lambda t: None], ReplayConfig())
    assert stats.assemble.clock_jumps == 0


def test_check_counts_the_jumps(tmp_path):
    from bridge.check import check_file, render

    lines, _ = synth_cri_lines(7, requests=40, reuse=0)
    at, _ = _straddling(lines)
    back = at + (len(lines) - at) // 2
    path = tmp_path / "0.log"
    path.write_text("".join(_moved(_moved(lines, at, YEAR50), back, -YEAR50)))  # ahead, then back again
    report = check_file(str(path))
    assert report.clock_jumps == 2
    assert "clock jumps   2" in render(report)
    path.write_text("".join(_moved(lines, at, 6 * 3600 * _NS)))
    assert check_file(str(path)).clock_jumps == 0
