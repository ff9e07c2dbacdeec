"""The assembler as a table: for each kind of event, who handles it and what it does to a
request in each phase of its life. The rows are data, in `table.toml` beside this module;
`Assembler` dispatches from them (so they cannot drift from the handlers), and
`python -m bridge.assemble` prints them.

A request's phase is where the index holds it (`index.Occurrences`): NONE (no request open
under the id the line names), IN_FLIGHT (open, not over), OVER (open and over: lingering for
its last block frees or its API server's lines), GONE (emitted; its id remembered a while so a
late line is counted, not made an orphan). Engine-wide lines act on every request in flight.
A row says how its line finds its request (`Row.lookup`: seed lines look only among the open,
the API server's also among the emitted ids). A line in a phase its row has no action for does
nothing but count (`AssembleStats.no_action`): no handler's hidden branch decides it.
A request leaves IN_FLIGHT only by `Assembler.end` (`ending.End`) and leaves the index only by
`Assembler.close` (`ending.Close`); `tick` closes those lingering past `linger_s`, those idle,
and those past their TTL.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from enum import Enum

from bridge.assemble import ids
from bridge.assemble.clock import ClockJump
from bridge.parse import events as ev


class RequestPhase(Enum):
    NONE = "none"
    IN_FLIGHT = "in flight"
    OVER = "over"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Row:
    event: type
    owner: str      # "requests": the assembler's (seedlines.py, apilines.py, requests.py); "engine": engine.py's
    handler: str    # the method's name
    actions: dict   # RequestPhase → what it does (engine-wide rows: one entry, under None)
    lookup: str | None = None  # how its line's `request_id` finds its request (SEED, API); None: no one id


N, F, O, G = RequestPhase.NONE, RequestPhase.IN_FLIGHT, RequestPhase.OVER, RequestPhase.GONE
_ALL = None  # engine-wide: every request in flight
SEED, API = "seed", "api"
#: The phases a line can find its request in: seed lines never look at emitted ids (only the
#: API server's requests are remembered there, `index.Occurrences.gone`).
PHASES = {SEED: (N, F, O), API: (N, F, O, G)}
#: table.toml's column for each phase.
_COLUMNS = {"none": N, "in_flight": F, "over": O, "gone": G, "every_request": _ALL}
_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table.toml")


def load(path: str = _PATH) -> tuple[Row, ...]:
    """The rows of `table.toml`, in its order. A name it does not know (an event, a column, a
    lookup, an owner) is an error here, at import: the table cannot say what no code does."""
    with open(path, "rb") as f:
        sections = tomllib.load(f)
    kinds = {**{name: t for name, t in vars(ev).items() if isinstance(t, type)}, "ClockJump": ClockJump}
    rows = []
    for name, cells in sections.items():
        cells = dict(cells)
        owner, _, handler = cells.pop("handler").partition(".")
        lookup = cells.pop("lookup", None)
        if name not in kinds or owner not in ("requests", "engine") or lookup not in (None, SEED, API) \
                or not cells.keys() <= _COLUMNS.keys():
            raise ValueError(f"{path}: [{name}] names what no code has")
        rows.append(Row(kinds[name], owner, handler, {_COLUMNS[k]: action for k, action in cells.items()}, lookup))
    return tuple(rows)


TABLE: tuple[Row, ...] = load()


def missing(row: Row) -> tuple[RequestPhase, ...]:
    """The phases a row's line can find its request in that the row has no action for."""
    return tuple(p for p in PHASES.get(row.lookup, ()) if p not in row.actions)


def phase_of(requests, lookup: str, rid: str) -> RequestPhase:
    """The phase of the request a line naming `rid` finds, as `lookup` finds it."""
    index = requests.index
    if lookup == SEED:
        r = index.open.get(requests._seed_id(rid))
    else:
        key = ids.resolve(rid, index.open)
        if key is None:
            return G if ids.resolve(rid, index.gone) is not None else N
        r = index.open[key]
    return N if r is None else F if r.terminal_ns is None else O


def _gated(row: Row, handler, requests):
    """`handler` only in the phases the row has an action for; in the others a counted no-op."""
    lookup, acts, stats = row.lookup, row.actions, requests.stats

    def gate(record, event) -> None:
        if phase_of(requests, lookup, event.request_id) in acts:
            handler(record, event)
        else:
            stats.no_action += 1
    return gate


def handlers(requests, engine, table: tuple[Row, ...] = TABLE) -> dict[type, object]:
    """Event type → what handles it: the row's bound method, behind a gate (`_gated`) when the
    row leaves a phase without an action (none of TABLE's does: each costs a lookup a line)."""
    out = {}
    for row in table:
        handler = getattr(requests if row.owner == "requests" else engine, row.handler)
        out[row.event] = _gated(row, handler, requests) if missing(row) else handler
    return out


def render() -> str:
    lines = []
    for row in TABLE:
        lines.append(f"{row.event.__name__}  →  {row.owner}.{row.handler}"
                     + (f"  (finds its request as a {row.lookup} line)" if row.lookup else ""))
        for phase, action in row.actions.items():
            lines.append(f"    {'(every request in flight)' if phase is None else phase.value:26s} {action}")
        for phase in missing(row):
            lines.append(f"    {phase.value:26s} no action: counted (no_action), nothing else")
    return "\n".join(lines)
