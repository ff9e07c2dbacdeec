"""The assembler as a table: for each kind of event, who handles it and what it does to a
request in each phase of its life. `Assembler` dispatches from this table (so it cannot drift
from the handlers), and `python -m bridge.assemble` prints it.

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

TABLE: tuple[Row, ...] = (
    # -- the engine core's and the plugin's per-request lines (seedlines.py) --
    Row(ev.Scheduled, "requests", "_on_scheduled", {
        N: "open", F: "touch; record the schedule, end an open preemption", O: "close DONE; open a new occurrence"}, SEED),
    Row(ev.Preempted, "requests", "_on_preempted", {
        N: "open", F: "touch; begin a preemption unless one is open", O: "close DONE; open a new occurrence"}, SEED),
    Row(ev.BlockAllocated, "requests", "_on_allocated", {
        N: "open", F: "touch; count the block, keep its event", O: "close DONE; open a new occurrence"}, SEED),
    Row(ev.BlockFreed, "requests", "_on_freed", {
        N: "orphan line", F: "touch; count; a release before the end's line marks the release",
        O: "touch; count; close DONE once no block is held (and no API line is awaited)"}, SEED),
    Row(ev.RequestSummary, "requests", "_on_summary", {
        N: "open", F: "end FINISHED (n>1: once every child is done); close DONE if nothing is held or awaited",
        O: "close DONE; open a new occurrence"}, SEED),
    Row(ev.RequestEnded, "requests", "_on_ended", {
        N: "open", F: "end ABORTED or FAILED; close DONE if nothing is held",
        O: "take the plugin's times; n>1: close DONE once every child is done"}, SEED),
    Row(ev.RequestTimedOut, "requests", "_on_timeout", {
        N: "open; end TIMEOUT", F: "end TIMEOUT", O: "the second timeout line: touch, take its duration"}, SEED),
    Row(ev.AllocationFailed, "requests", "_on_alloc_failed", {
        N: "open; end FAILED (oom)", F: "end FAILED (oom)", O: "close DONE; open; end FAILED (oom)"}, SEED),
    # -- the API server's lines (apilines.py) --
    Row(ev.RequestReceived, "requests", "_on_received", {
        N: "open (upstream)", F: "a second receipt: close REUSED and open, or a twin while the first is not added (ends logged: not ended)",
        O: "close DONE; open", G: "open (upstream)"}, API),
    Row(ev.RequestDetails, "requests", "_on_details", {
        N: "open (upstream)", F: "shown already: close REUSED and open; else touch", O: "close DONE; open",
        G: "open (upstream)"}, API),
    Row(ev.RequestAdded, "requests", "_on_added", {
        N: "open (upstream)", F: "touch, note the engine id; another engine id: close REUSED and open",
        O: "open a new occurrence", G: "open (upstream)"}, API),
    Row(ev.RequestFinished, "requests", "_on_finished", {
        N: "open, start unknown; end FINISHED", F: "end FINISHED; the engine serves (no death)", O: "touch",
        G: "orphan line"}, API),
    Row(ev.ResponseGenerated, "requests", "_on_generated", {
        N: "open, start unknown", F: "count tokens, note the finish reason; the last choice: end FINISHED, "
        "ABORTED, or STOPPED during a stop",
        O: "a later end; after the summary: close DONE; after a death or a stop: served after all", G: "orphan line"}, API),
    Row(ev.RequestsAborted, "requests", "_on_aborted", {
        N: "open, start unknown", F: "end ABORTED (STOPPED during a stop)", O: "touch", G: "orphan line"}),
    Row(ev.RequestFailed, "requests", "_on_failed", {
        N: "open, start unknown", F: "end FAILED (ENGINE_DIED after a death, STOPPED during a stop)", O: "touch",
        G: "orphan line"}, API),
    Row(ev.RequestWaiting, "requests", "_on_waiting", {
        N: "open, start unknown", F: "touch", O: "touch", G: "orphan line"}, API),
    Row(ev.SequencePreempted, "requests", "_on_sequence_preempted", {
        N: "open, start unknown", F: "touch; a preemption event", O: "touch; a preemption event", G: "orphan line"}, API),
    # -- user rules, gauges, lines with nothing to assemble (requests.py) --
    Row(ev.RuleEvent, "requests", "_on_rule_event", {
        N: "open, start unknown (an id named)", F: "an event, its attributes", O: "an event, its attributes",
        G: "orphan line", _ALL: "no id: an event on every request in flight"}),
    Row(ev.Stamped, "requests", "_on_stamped", {_ALL: "the inner event, at the time its line gave"}),
    Row(ev.QueueState, "requests", "_on_queue", {_ALL: "snapshot for requests scheduled later; an event on each"}),
    Row(ev.GpuMemory, "requests", "_on_gpu", {_ALL: "snapshot for requests scheduled later; an event on each"}),
    Row(ev.AccessLog, "requests", "_ignore", {_ALL: "nothing"}),
    Row(ev.Notice, "requests", "_ignore", {_ALL: "nothing"}),
    Row(ev.KvReceived, "requests", "_on_kv_received", {
        N: "orphan line", F: "touch; the decode's kv_transfer times, its role and remote ids; failed: an exception",
        O: "touch; as in flight"}, SEED),
    Row(ev.KvReleased, "requests", "_on_kv_released", {
        N: "orphan line", F: "touch; kv_hold's end (the release came before the summary)",
        O: "touch; kv_hold's end; close DONE if nothing else is held or awaited"}, SEED),
    Row(ev.KvLeaseExpired, "requests", "_on_kv_lease_expired", {
        N: "orphan line", F: "touch; an event (the lease ran out)", O: "touch; an event (the lease ran out)"}),
    Row(ev.KvBlocksInvalid, "requests", "_on_kv_blocks_invalid", {
        N: "orphan line", F: "touch; an event", O: "touch; an event"}),
    Row(ev.KvTransferFailed, "requests", "_on_kv_transfer_failed", {
        N: "orphan line", F: "touch; an exception event (failed: error.type distributed), never an incident",
        O: "touch; an exception event", _ALL: "no request named: counted (no_action)"}),
    Row(ev.KvTransferMetrics, "requests", "_on_kv_metrics", {_ALL: "an event on every request in flight (aggregate)"}),
    # -- engine-wide lines (engine.py) --
    Row(ev.EngineStats, "engine", "on_stats", {
        _ALL: "an event on each; nothing held: each upstream one idle (closed IDLE after the grace)"}),
    Row(ev.EngineConfig, "engine", "on_config", {
        _ALL: "a new engine life: the startup begins, the incident closes, each closed UNENDED"}),
    Row(ev.StartupFact, "engine", "on_startup_fact", {_ALL: "a fact of the startup and of every later request"}),
    Row(ev.EngineError, "engine", "on_engine_error", {
        _ALL: "gathered into an incident (its event on each); fatal: each ends ENGINE_DIED; during a stop: "
        "each ends STOPPED"}),
    Row(ev.ServerStop, "engine", "on_stop", {
        _ALL: "a deliberate stop: those the engine no longer holds closed IDLE; abort mode: the rest end STOPPED"}),
    Row(ev.CudaOom, "engine", "on_cuda_oom", {_ALL: "an incident (oom); its event on each"}),
    Row(ev.ModelLoadFailed, "engine", "on_model_load", {_ALL: "an incident (model_load)"}),
    Row(ev.NcclTimeout, "engine", "on_nccl", {_ALL: "held for one line: the next may say its cause"}),
    Row(ev.NcclHint, "engine", "on_nccl_hint", {_ALL: "the held timeout's incident (distributed), with its causes"}),
    # -- between two lines: the assembler's own event (clock.py) --
    Row(ClockJump, "engine", "on_clock_jump", {
        _ALL: "counted; an event on every request not yet emitted; the incident and a held NCCL line close; "
        "no request ends (the assembler's clock follows it: deadlines count from it)"}),
)


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
