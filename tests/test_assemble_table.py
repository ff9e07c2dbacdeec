"""The assembler's table (bridge/assemble/table.py) is its dispatch: every event the parser can
produce has a row, each row names a method that exists, and the printed table shows them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from bridge.assemble import Assembler
from bridge.assemble.clock import ClockJump
from bridge.assemble.table import TABLE, handlers
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
