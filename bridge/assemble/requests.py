"""The assembler of one source (one engine's log): typed events in, finished timelines out.

Lines arrive in file order with their timestamps. `feed` hands each to its handler
(`table.toml` lists them: the request lines in `seedlines.py` and `apilines.py`, the engine-wide
ones in `engine.py`); this module keeps the clock (`tick`: lingering, TTL, idle) and the two
ways a request's life changes: `end` (it is over, `ending.End` says how) and `close` (its
timeline goes out, `ending.Close` says why). Which occurrence a line belongs to is `index.py`'s;
what the spans are is `build`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bridge.parse.context import Rule, w3c_rule
from bridge.assemble.apilines import ApiLines
from bridge.assemble.build import _request_timeline, request_timeline
from bridge.assemble.clock import AHEAD_NS, BEHIND_NS, ClockJump, ClockWatch
from bridge.assemble.diagnosis import Thresholds
from bridge.assemble.ending import STOPPED_MESSAGE, Close, End, engine_failed
from bridge.assemble.engine import IDLE_GRACE_NS, EngineLife
from bridge.assemble.index import Occurrences
from bridge.assemble.kvlines import KvLines, kv_due, kv_phases
from bridge.assemble.seedlines import SeedLines
from bridge.assemble.state import RequestState, fan_out
from bridge.assemble.table import handlers
from bridge.assemble.timeline import INFERRED, PD_ROLE, SpanEvent, Timeline, pd_key_id
from bridge.decode.record import CLOCK_ANCHORED, Record
from bridge.core.counts import counts
from bridge.core.position import GEN_SHIFT
from bridge.core.source import Source
from bridge.parse.events import GpuMemory, NcclHint, QueueState, RuleEvent, Stamped
from bridge.parse.literals import redact_error_text, redact_request_error

_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class AssembleConfig:
    thresholds: Thresholds = Thresholds()
    ttl_s: float = 600.0      # an open request with no new line for this long is evicted
    linger_s: float = 5.0     # a finished request waits this long for its last block frees
    # A disaggregated prefill waits this long after its end for its `KV blocks released` line
    # (NIXL's lease is 30 s by default, `kv_lease_duration`; a decode's heartbeats extend it).
    kv_hold_s: float = 60.0
    oom_window_s: float = 2.0  # a CUDA OOM this close before a failed allocation explains it
    context_rule: Rule = w3c_rule  # request id → the caller's trace context (context.make_rule)
    # Client-supplied context counts: the traceparent the vLLM plugin logged with a request (it
    # wins over `context_rule`), and `context_rule` itself. False: neither (docs/trace-context.md).
    client_context: bool = True
    # Error text from the log goes out as vLLM wrote it, tracebacks included. Off by default: a
    # user's prompt or values reach error messages (validation, chat template, tracebacks).
    export_error_text: bool = False


AssembleStats = counts("AssembleStats", __name__, """What the assembler of one source did, by count.

    requests_opened: requests begun (an occurrence opened)
    requests_emitted: request timelines emitted
    requests_evicted: requests closed unended by expiry (their TTL, or the open-request limit)
    engine_incidents: engine incidents emitted (`vllm.engine` spans)
    orphan_lines: lines for a request that is no longer known (emitted already)
    orphan_requests: requests whose start was not seen, rebuilt from later lines
    stop_errors: error records during a deliberate stop: part of the stop, no incident
    death_errors: error records after an engine death's incident went out: part of it
    reused_concurrent: requests received under an id another request held at the time
    requests_capped: requests closed early by `evict_oldest` (the open-request limit), ended or not
    clock_jumps: times the stream's clock leapt between neighbouring lines (clock.py)
    no_action: lines in a phase their table row has no action for (table.py)
""")


class Assembler(SeedLines, ApiLines, KvLines):
    """Feed it (record, event) pairs of one source in file order; it calls `emit` with each
    finished `RequestTimeline` or `EngineTimeline`."""

    def __init__(self, source: Source, emit: Callable[[Timeline], None], config: AssembleConfig = AssembleConfig(),
                 fast: bool = True):
        """`fast=False`: this stage's pure-Python code only (the C paths' reference)."""
        self.source = source
        self._files: dict[int, Source] = {}  # generation → the file its lines came from (add_file)
        self._timeline = request_timeline if fast else _request_timeline
        self.stats = AssembleStats()
        self._emit = emit
        self._config = config
        self._ttl_ns = int(config.ttl_s * _NS)
        # Every error text taken from the log passes here before it joins a timeline.
        self._text: Callable[[str], str] = str if config.export_error_text else redact_error_text
        self._request_text: Callable[[str], str] = str if config.export_error_text else redact_request_error
        self._linger_ns = int(config.linger_s * _NS)
        self._kv_hold_ns = int(config.kv_hold_s * _NS)
        self.index = Occurrences()  # the requests not yet emitted: open, in flight, twins, and those gone
        # The vLLM plugin's end lines were seen: every request's end is logged, so one not ended
        # is in flight (two API servers can then hold one X-Request-Id at once: apilines)
        self.ends_logged = False
        self._queue: QueueState | None = None
        self._gpu: GpuMemory | None = None
        # Where the gauges a new request snapshots were read: a request depends on those
        # lines too, so a resume must start early enough to read them again.
        self._queue_offset: int | None = None
        self._gpu_offset: int | None = None
        self._now = 0
        self._next_sweep = 0
        self.clock = ClockWatch(max(self._ttl_ns, self._linger_ns, self._kv_hold_ns, IDLE_GRACE_NS))  # the latest clock jump
        self._guess_ns = -1  # `_now` when a line with no stamp of its own set it (its file's time)
        # Requests the engine's death or the server's stop ended (not a line of their own) → the
        # exception event that says so; until emitted. Here, not on RequestState: few ever have one.
        self._signal_ends: dict[RequestState, SpanEvent] = {}
        self.engine = EngineLife(self, emit, self.source_at, self._text, self.stats, config.export_error_text)
        self._handlers = handlers(self, self.engine)  # table.py: every event's handler, by phase

    # -- input ---------------------------------------------------------------------------

    def feed(self, record: Record, event) -> None:
        ts, now = record.ts_ns, self._now
        if ts > now:
            # a clock jump, not years of silence; a line with no stamp of its own (its file's
            # time, at the start of a file) is no reading of the clock, ahead or back (`_guess_ns`)
            if ts - now >= AHEAD_NS and now and record.clock != CLOCK_ANCHORED:
                self._jumped(record, ts)
            self._now = ts
            if ts >= self._next_sweep:
                if record.clock == CLOCK_ANCHORED:
                    self._guess_ns = ts
                self.tick(ts)
        elif now - ts >= BEHIND_NS and now != self._guess_ns:  # the clock set back
            self._jumped(record, ts)
        if self.engine.pending_nccl is not None and type(event) is not NcclHint:
            self.engine.flush_nccl(None)
        self._handlers[type(event)](record, event)

    def tick(self, now_ns: int) -> None:
        """Emit what is due at `now_ns`: finished requests done lingering, open ones past TTL.
        Replay ticks on log time; the live agent also ticks on the wall clock."""
        self._next_sweep = now_ns + _NS
        # a deadline before the latest clock jump counts from the jump: the jump ends nothing
        linger_deadline = self.clock.deadline(now_ns - self._linger_ns)
        kv_deadline = self.clock.deadline(now_ns - self._kv_hold_ns)
        ttl_deadline = self.clock.deadline(now_ns - self._ttl_ns)
        idle_deadline = self.clock.deadline(now_ns - IDLE_GRACE_NS)
        self.engine.tick(now_ns, ttl_deadline)
        for r in [r for r in self.index.in_flight.values()
                  if r.idle_at is not None and r.idle_at <= idle_deadline and r.last_ns <= r.idle_at]:
            self.close(r, Close.IDLE, r.idle_at)
        due = [
            r for r in self.index.open.values()
            if (r.terminal_ns is not None and r.terminal_ns <= linger_deadline
                and (r.kv is None or kv_due(r, kv_deadline)))
            or r.last_ns <= ttl_deadline
        ]
        due += self.clock.stale(self.index.open.values(), now_ns, due)  # stamped before a jump back, TTL over
        for r in due:
            self.close(r, Close.EXPIRED)
        self.index.forget(ttl_deadline)

    def _jumped(self, record: Record, ts: int) -> None:
        """The stream's clock jumped between two lines (`clock.py`): what it does is the table's
        `ClockJump` row; then the assembler's clock follows it (deadlines count from it)."""
        before = self._now
        self._handlers[ClockJump](record, ClockJump(before, ts))
        self.clock.jump(before, ts)
        self._now = self._next_sweep = ts

    def flush(self) -> None:
        """End of input: everything still open is emitted, unfinished requests as incomplete."""
        self.engine.flush()
        for r in list(self.index.open.values()):
            self.close(r, Close.FLUSHED)

    def add_file(self, generation: int, source: Source) -> None:
        """Lines at positions of `generation` come from `source`'s file (of this stream): the
        timelines that begin there name it. Ids stay the stream's (`self.source.key`)."""
        self._files[generation] = source

    def source_at(self, offset: int) -> Source:
        """The file of the line at `offset` (a position: generation << GEN_SHIFT | byte)."""
        return self._files.get(offset >> GEN_SHIFT, self.source) if self._files else self.source

    @property
    def open_requests(self) -> int:
        return len(self.index.open)

    def resume_facts(self, facts: dict) -> None:
        """Start from the engine facts in force where a resume starts (a checkpoint's)."""
        self.engine.resume_facts(facts)

    def facts_at(self, position: int) -> dict:
        """The engine facts in force just before `position` (`EngineLife.facts_at`)."""
        return self.engine.facts_at(position)

    @property
    def min_open_offset(self) -> int | None:
        """The earliest position still needed by anything not yet emitted (for checkpoints)."""
        low = min((r.first_offset for r in self.index.open.values()), default=None)
        held = self.engine.min_offset  # a held NCCL line, an incident's or a start's first line
        return held if low is None else low if held is None else min(low, held)

    def evict_oldest(self, keep: int) -> int:
        """Emit the oldest open requests (as they stand) until at most `keep` remain."""
        excess = len(self.index.open) - keep
        if excess <= 0:
            return 0
        for r in list(self.index.open.values())[:excess]:
            self.stats.requests_capped += 1  # one by one: a /metrics scrape meanwhile sees what is closed
            self.close(r, Close.EXPIRED)
        return excess

    # -- request lines -------------------------------------------------------------------

    def _start(self, rid: str, record: Record) -> RequestState:
        """The request this starting line belongs to, opening a new occurrence if needed."""
        r = self.index.open.get(rid)
        if r is not None:
            if r.terminal_ns is None:
                return self.index.touch(r, record)
            self.close(r, Close.DONE)  # over already: the id has been reused
        self.stats.requests_opened += 1
        return self.index.open_new(rid, record, (self._queue_offset, self._gpu_offset))

    def _touch(self, rid: str, record: Record) -> RequestState | None:
        r = self.index.open.get(rid)
        if r is None:
            self.stats.orphan_lines += 1
            return None
        return self.index.touch(r, record)

    def end(self, r: RequestState, ts: int, why: End, error_type: str | None = None, message: str = "",
             exception: str | None = None, observed: bool = True) -> None:
        """The one way a request is over, at `ts`: `why` fixes its outcome, and but for
        `End.FINISHED` its `error.type` (unless given) and an exception event (`message` is
        already fit to leave the node: `self._text`, or the bridge's own words). Ended by a
        signal (the engine's death, the server's stop), its answer may still show up finished
        (`_served`). `observed=False`: no line shows when it ended (`vllm.end_inferred`)."""
        if why is End.FINISHED:
            r.error_type, r.error_message = None, ""  # none before, but for one served after all (`_served`)
        else:
            if why is End.STOPPED:
                message = STOPPED_MESSAGE
            elif why is End.ENGINE_DIED:
                message = engine_failed(error_type)
            r.error_type = why.error_type if error_type is None else error_type
            r.error_message = message
            event = SpanEvent("exception", ts, {"exception.type": exception or why.exception,
                                                "exception.message": message})
            r.add_event(event, False)
            if why.by_signal:
                self._signal_ends[r] = event
        r.terminal_ns = ts
        r.outcome = why.outcome
        self.index.over(r)
        if not observed:
            r.set("vllm.end_inferred", True)

    def close(self, r: RequestState, why: Close, seen_ns: int | None = None) -> None:
        """The one way a request goes out: its timeline is emitted and its id released. A
        request no line ended is settled first, by what the engine's state says (`Close`)."""
        if why is not Close.DONE:  # (the commonest: over, nothing more to come; none of this applies)
            if why is Close.EXPIRED or why is Close.FLUSHED:
                if r.terminal_ns is not None:
                    why = Close.DONE
                else:
                    if why is Close.EXPIRED:
                        self.stats.requests_evicted += 1
                    why = Close.UNENDED
            if why is Close.UNENDED or why is Close.REUSED:
                # Seen idle after its last line, it ended as IDLE says; else in flight at a deliberate
                # stop, it was stopped; followed by a new request under its id, idle; else it stays
                # `incomplete`. Its end is inferred either way.
                if r.extra is not None and r.idle_at is not None and r.last_ns <= r.idle_at:
                    why, seen_ns = Close.IDLE, r.idle_at  # the engine said it was idle after its last line
                elif self.engine.stop_ns is not None and r.first_ns <= self.engine.stop_last_ns:
                    self.end(r, max(self.engine.stop_last_ns, r.last_ns), End.STOPPED, observed=False)
                elif r.extra is not None and why is Close.REUSED:
                    why = Close.IDLE
            if why is Close.IDLE:
                # Over by `seen_ns` (a stats line showed it gone): it ends there, inferred — its own
                # last line (`Added request`) is only its start.
                if seen_ns is not None and r.idle_at is not None and r.last_ns <= r.idle_at:
                    seen_ns = min(seen_ns, r.idle_at)  # the first line that showed the engine idle
                if seen_ns is not None and r.terminal_ns is None and seen_ns > r.last_ns:
                    r.last_ns = seen_ns
                if seen_ns is not None and r.events:
                    # Over by the idle line: the stats lines after it are not about it. (When the grace
                    # lets it close depends on when a tick comes, on the wall clock too in the agent:
                    # without this, the agent and a replay gave it different stats events.)
                    r.events = [e for e in r.events if e.ts_ns <= seen_ns or e.name != "vllm.engine_stats"]
                if "vllm.request.internal_id" in r.extra:
                    # V1 with internal ids (≈ 0.14+) logs every abort and failure: an idle engine and
                    # neither line means the request finished (a completion never logs its end).
                    r.outcome = "finished"
        if self._signal_ends:
            self._signal_ends.pop(r, None)
        self.index.release(r)
        self.stats.requests_emitted += 1
        if r.extra is not None:  # upstream request: the engine's model and version
            for key, value in self.engine.facts.items():
                r.extra.setdefault(key, value)
        if r.terminal_ns is None:  # no line ended it: its end is the last evidence (replay ≡ agent)
            r.set("vllm.end_inferred", True)
        parent = None
        if self._config.client_context:
            caller = r.times.caller if r.times is not None else None
            parent = caller if caller is not None else self._config.context_rule(r.request_id)
        t = self._timeline(r, self.source_at(r.generation << GEN_SHIFT), self._config.thresholds, parent)
        if r.kv is not None:
            kv_phases(t, r)  # after the build, C or pure: both agree on them
        if PD_ROLE in t.attrs and self._config.client_context:
            key_id = pd_key_id(t.attrs, t.request_id)
            if key_id is not None:  # either half reads the same context from the same id
                t.pd_context = self._config.context_rule(key_id)
        if r.extra is not None and ("vllm.start_unknown" in r.extra or "vllm.end_inferred" in r.extra):
            # A bound no line proves: the first line seen is no arrival; a stop's time no end.
            if "vllm.start_unknown" in r.extra:
                t.start_timing = INFERRED
            if "vllm.end_inferred" in r.extra:
                t.end_timing = INFERRED
            t.attrs["vllm.timing"] = INFERRED
        self._emit(t)

    # -- lines with nothing to assemble, user rules, gauges ------------------------------------

    def _ignore(self, record: Record, ev) -> None:
        """Recognised, nothing to assemble (uvicorn access lines carry no request id)."""

    # -- user rules (--rules) -----------------------------------------------------------

    def _on_rule_event(self, record: Record, ev: RuleEvent) -> None:
        """A user rule's span event: on the request it names (found under any spelling vLLM
        uses, like upstream lines), or with no request id on every request in flight."""
        if ev.request_id is None:
            event = SpanEvent(ev.name, record.ts_ns, dict(ev.attributes))
            for r in self.index.in_flight.values():
                r.add_event(event, True)
            return
        r = self._resolve(ev.request_id, record)
        if r is None:
            return
        r.add_event(SpanEvent(ev.name, record.ts_ns, dict(ev.attributes)), True)
        for key, value in ev.span_attributes:
            r.set(key, value)

    def _on_stamped(self, record: Record, ev: Stamped) -> None:
        """A rule's event with the time its line gave: that time stands for the record's."""
        self.feed(Record(ev.ts_ns, record.clock, record.level, record.origin, record.message, record.offset,
                         record.end_offset, record.process, record.continued), ev.event)

    # -- engine-wide lines ---------------------------------------------------------------

    def _on_queue(self, record: Record, ev: QueueState) -> None:
        self._queue = ev
        self._queue_offset = record.offset
        ratio = ev.free_blocks / ev.total_blocks if ev.total_blocks else None
        event = SpanEvent("vllm.queue_state", record.ts_ns, {
            "vllm.queue.running": ev.running, "vllm.queue.waiting": ev.waiting,
            "vllm.kv.free_blocks": ev.free_blocks, "vllm.kv.total_blocks": ev.total_blocks})
        fan_out(self.index.in_flight.values(), event, ratio)

    def _on_gpu(self, record: Record, ev: GpuMemory) -> None:
        self._gpu = ev
        self._gpu_offset = record.offset
        event = SpanEvent("vllm.gpu_memory", record.ts_ns, {
            "vllm.gpu.memory.used_bytes": ev.used_bytes, "vllm.gpu.memory.total_bytes": ev.total_bytes,
            "vllm.gpu.memory.utilization": ev.utilization, "vllm.kv_cache.used_bytes": ev.cache_bytes,
            "vllm.kv_cache.blocks_used": ev.kv_blocks_used, "vllm.kv_cache.blocks_total": ev.kv_blocks_total})
        fan_out(self.index.in_flight.values(), event, None, ev.utilization)

