"""The assembler's table (bridge/assemble/table.py) is its dispatch: every event the parser can
produce has a row, each row names a method that exists, and the printed table shows them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from bridge.assemble import Assembler
from bridge.assemble.clock import ClockJump
from bridge.assemble.table import SEED, TABLE, RequestPhase, handlers, missing
from bridge.decode.record import CLOCK_EXACT, Record
from bridge.parse import events
from bridge.tail.source import source_for


def _event_types() -> set[type]:
    """Every dataclass the parser hands on as an event (PluginTimes is a field of events, not one)."""
    return {v for v in vars(events).values()
            if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == events.__name__
            and v is not events.PluginTimes}


def test_every_event_has_exactly_one_row():
    """The parser's events and the assembler's own (a clock jump, between two lines)."""
    rows = [row.event for row in TABLE]
    assert len(rows) == len(set(rows))
    assert set(rows) == _event_types() | {ClockJump}


def test_the_assembler_dispatches_from_the_table():
    a = Assembler(source_for("x.log"), lambda t: None)
    table = handlers(a, a.engine)
    assert {t: (m.__self__, m.__func__) for t, m in a._handlers.items()} == \
        {t: (m.__self__, m.__func__) for t, m in table.items()}


def test_python_m_bridge_assemble_prints_every_row():
    out = subprocess.run([sys.executable, "-m", "bridge.assemble"], capture_output=True, text=True, check=True).stdout
    for row in TABLE:
        assert f"{row.event.__name__}  →  {row.owner}.{row.handler}" in out


def test_every_row_with_a_lookup_names_one_request():
    for row in TABLE:
        if row.lookup is not None:
            assert "request_id" in {f.name for f in dataclasses.fields(row.event)}, row


def _record(ts_s: int, offset: int) -> Record:
    return Record(ts_s * 1_000_000_000, CLOCK_EXACT, "INFO", "x.py:1", "", offset, offset + 1)


def test_a_phase_with_no_action_is_a_counted_no_op():
    """A row that leaves a phase out (as a new state's row might): a line in that phase reaches no
    handler, is counted, and the request is as the lines before it left it."""
    def run(table, lines):
        out: list = []
        a = Assembler(source_for("x.log"), out.append)
        if table is not None:
            a._handlers = handlers(a, a.engine, table)
        for record, event in lines:
            a.feed(record, event)
        a.flush()
        return a.stats, [(t.request_id, t.start_ns, t.end_ns, t.outcome, sorted(t.attrs.items())) for t in out]

    lines = [(_record(1, 0), events.RequestReceived("cmpl-1", 5, None, None, None, None)),
             (_record(2, 10), events.RequestFinished("cmpl-1")),
             (_record(3, 20), events.RequestFinished("cmpl-1"))]  # the request is OVER by now
    cut = tuple(dataclasses.replace(row, actions={p: x for p, x in row.actions.items() if p is not RequestPhase.OVER})
                if row.event is events.RequestFinished else row for row in TABLE)
    assert missing(next(r for r in cut if r.event is events.RequestFinished)) == (RequestPhase.OVER,)
    full_stats, full = run(None, lines)
    cut_stats, gated = run(cut, lines)
    _, before = run(None, lines[:2])
    assert (full_stats.no_action, cut_stats.no_action) == (0, 1)
    assert gated == before != full  # the OVER action (touch) moved its last line; the gate did not


def test_the_printed_table_shows_a_phase_left_out():
    assert all(not missing(row) for row in TABLE)  # no gate: TABLE's rows cost no lookup a line
    out = subprocess.run([sys.executable, "-m", "bridge.assemble"], capture_output=True, text=True, check=True).stdout
    assert out.count("(finds its request as a seed line)") == sum(row.lookup == SEED for row in TABLE)


def test_the_agent_serves_the_no_action_count_on_its_metrics(tmp_path):
    """A line that hits no action is counted where a user can see it: the recorded NIXL failure
    run's decode log has one `handshake_setup_failed` line naming no request (`'request_id':
    None` in its context: vLLM fails the requests waiting on it with a line each), which the
    table's KvTransferFailed row leaves at a count; /metrics serves it as lines_no_action_total."""
    import re
    import shutil
    from pathlib import Path

    from agentkit import AgentProc, pod_log, wait_for
    from receivers import GrpcReceiver
    from waits import deadline

    fixture = Path(__file__).resolve().parent / "fixtures" / "distributed" / "pd_fail_decode.log"
    text = fixture.read_text()
    unnamed = len(re.findall(r"NIXL transfer failure: \w+ \| Context: \{[^}]*'request_id': None", text))
    assert unnamed == 1
    log = pod_log(tmp_path)
    shutil.copy(fixture, log)
    with GrpcReceiver() as rx:
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint).start()
        try:
            lines = fixture.read_bytes().count(b"\n")  # physical lines (two carry a \r inside)
            assert wait_for(lambda: (agent.metric("lines_read"), agent.metric("lines_no_action")) == (lines, unnamed),
                            deadline(60)), (agent.metric("lines_read"), agent.metric("lines_no_action"))
            _, metrics = agent.get("/metrics")
            assert "# HELP vllm_trace_bridge_lines_no_action_total Lines recognised" in metrics
        finally:
            assert agent.term()[0] == 0
