"""Per-request state machine for one source (one engine's log).

Lines arrive in file order with their timestamps; this module keeps what each request has
shown so far and hands finished requests to `build.request_timeline`. It decides *when* a
request is over and *which* occurrence a line belongs to; `build` decides what the spans are.

Ids repeat (the seed's ids are object addresses, reused once freed): a line that starts a
request (scheduling, preemption, allocation, summary) for an id whose request is already over
begins a new occurrence, and the old one is emitted first.

Upstream vLLM requests (`Received` / `Added` / `Generated response` / abort and failure lines)
join under one key whatever spelling a line uses (`ids`); they end at the best evidence there
is — a finish, abort or failure line, or an engine death — and otherwise stay `incomplete` with
an inferred end. The startup banner's model and version go on every request of that engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from bridge.assemble import ids
from bridge.parse.context import Rule, w3c_rule
from bridge.assemble.build import _request_timeline, request_timeline
from bridge.assemble.diagnosis import Thresholds
from bridge.assemble.ending import STOPPED_MESSAGE, Close, End, engine_failed
from bridge.assemble.engine import IDLE_GRACE_NS, EngineLife
from bridge.assemble.index import COARSE, Occurrences
from bridge.assemble.state import SEEN_DETAILS, SEEN_RECEIVED, RequestState
from bridge.assemble.timeline import INFERRED, SpanEvent, Timeline
from bridge.decode.record import CLOCK_EXACT, Record
from bridge.tail.files import GEN_SHIFT
from bridge.tail.source import Source
from bridge.parse.events import (
    AccessLog,
    AllocationFailed,
    BlockAllocated,
    BlockFreed,
    CudaOom,
    EngineConfig,
    EngineError,
    EngineStats,
    GpuMemory,
    ModelLoadFailed,
    NcclHint,
    NcclTimeout,
    Notice,
    Preempted,
    QueueState,
    RequestAdded,
    RequestDetails,
    RequestFailed,
    RequestFinished,
    RequestReceived,
    RequestsAborted,
    RequestEnded,
    RequestSummary,
    RequestTimedOut,
    ResponseGenerated,
    RuleEvent,
    Scheduled,
    SequencePreempted,
    ServerStop,
    Stamped,
    StartupFact,
)
from bridge.parse.literals import redact_error_text, redact_request_error

_NS = 1_000_000_000
#: Free reasons that mean the request is over (not a preemption): blocks released at its end.
_RELEASE_REASONS = frozenset({"completed", "finished", "aborted"})


@dataclass(frozen=True, slots=True)
class AssembleConfig:
    thresholds: Thresholds = Thresholds()
    ttl_s: float = 600.0      # an open request with no new line for this long is evicted
    linger_s: float = 5.0     # a finished request waits this long for its last block frees
    oom_window_s: float = 2.0  # a CUDA OOM this close before a failed allocation explains it
    context_rule: Rule = w3c_rule  # request id → the caller's trace context (context.make_rule)
    # Client-supplied context counts: the traceparent the vLLM plugin logged with a request (it
    # wins over `context_rule`), and `context_rule` itself. False: neither (docs/trace-context.md).
    client_context: bool = True
    # Error text from the log goes out as vLLM wrote it, tracebacks included. Off by default: a
    # user's prompt or values reach error messages (validation, chat template, tracebacks).
    export_error_text: bool = False


@dataclass(slots=True)
class AssembleStats:
    requests_opened: int = 0
    requests_emitted: int = 0
    requests_evicted: int = 0
    engine_incidents: int = 0
    orphan_lines: int = 0  # a line for a request that is no longer known (emitted already)
    orphan_requests: int = 0  # requests whose start was not seen, rebuilt from later lines
    stop_errors: int = 0   # error records during a deliberate stop: part of the stop, no incident
    death_errors: int = 0  # error records after an engine death's incident went out: part of it
    reused_concurrent: int = 0  # requests received under an id another request held at the time


def _exact(record: Record, ev) -> Record:
    """The record, timed by the event's own exact time when its line states one (the vLLM
    plugin's `t=`): better than any header or runtime stamp, which only say when the line was
    written or read. The assembler's clock (`_now`, sweeps) stays on the records' stamps."""
    at = ev.at_ns
    return record if at is None else replace(record, ts_ns=at, clock=CLOCK_EXACT)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else (a if b is None else min(a, b))


def _combined(rid: str, seqs: dict) -> tuple[RequestSummary, int]:
    """One summary for an n>1 request from its children's (each `(end ns, summary)`), as the
    client's response counts them: the prompt once, the generated tokens of all n (its
    `usage.completion_tokens`); arrival the children's (vLLM copies the parent's to each), first
    token the first of any child's, end the last child's. ITL: the mean gap over all of them."""
    done = [v for v in seqs.values() if v is not None and v[1] is not None]  # (an ended child has no summary)
    arrival = min(end - round(s.e2e_s * _NS) for end, s in done)
    first = min(end - round(s.e2e_s * _NS) + round(s.ttft_s * _NS) for end, s in done)
    end = max(e for e, _ in done)
    gaps = sum(max(0, s.generated_tokens - 1) for _, s in done)
    itl = sum(s.itl_s * max(0, s.generated_tokens - 1) for _, s in done) / gaps if gaps else 0.0
    summary = RequestSummary(rid, max(s.prompt_tokens for _, s in done), sum(s.generated_tokens for _, s in done),
                             (first - arrival) / _NS, itl, (end - arrival) / _NS, end)
    return summary, end


class Assembler:
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
        self.index = Occurrences()  # the requests not yet emitted: open, in flight, twins, and those gone
        self._queue: QueueState | None = None
        self._gpu: GpuMemory | None = None
        # Where the gauges a new request snapshots were read: a request depends on those
        # lines too, so a resume must start early enough to read them again.
        self._queue_offset: int | None = None
        self._gpu_offset: int | None = None
        self._now = 0
        self._next_sweep = 0
        # Requests the engine's death or the server's stop ended (not a line of their own) → the
        # exception event that says so; until emitted. Here, not on RequestState: few ever have one.
        self._signal_ends: dict[RequestState, SpanEvent] = {}
        self.engine = EngineLife(self, emit, self.source_at, self._text, self.stats, config.export_error_text)
        engine = self.engine
        self._handlers = {
            Scheduled: self._on_scheduled,
            Preempted: self._on_preempted,
            BlockAllocated: self._on_allocated,
            BlockFreed: self._on_freed,
            RequestSummary: self._on_summary,
            RequestEnded: self._on_ended,
            RequestTimedOut: self._on_timeout,
            AllocationFailed: self._on_alloc_failed,
            QueueState: self._on_queue,
            GpuMemory: self._on_gpu,
            CudaOom: engine.on_cuda_oom,
            ModelLoadFailed: engine.on_model_load,
            NcclTimeout: engine.on_nccl,
            NcclHint: engine.on_nccl_hint,
            RequestReceived: self._on_received,
            RequestAdded: self._on_added,
            RequestDetails: self._on_details,
            RequestFinished: self._on_finished,
            RequestsAborted: self._on_aborted,
            RequestFailed: self._on_failed,
            ResponseGenerated: self._on_generated,
            SequencePreempted: self._on_sequence_preempted,
            EngineStats: engine.on_stats,
            EngineConfig: engine.on_config,
            StartupFact: engine.on_startup_fact,
            EngineError: engine.on_engine_error,
            ServerStop: engine.on_stop,
            AccessLog: self._ignore,
            Notice: self._ignore,
            RuleEvent: self._on_rule_event,
            Stamped: self._on_stamped,
        }

    # -- input ---------------------------------------------------------------------------

    def feed(self, record: Record, event) -> None:
        ts = record.ts_ns
        if ts > self._now:
            self._now = ts
            if ts >= self._next_sweep:
                self.tick(ts)
        if self.engine.pending_nccl is not None and type(event) is not NcclHint:
            self.engine.flush_nccl(None)
        self._handlers[type(event)](record, event)

    def tick(self, now_ns: int) -> None:
        """Emit what is due at `now_ns`: finished requests done lingering, open ones past TTL.
        Replay ticks on log time; the live agent also ticks on the wall clock."""
        self._next_sweep = now_ns + _NS
        linger_deadline = now_ns - self._linger_ns
        ttl_deadline = now_ns - self._ttl_ns
        idle_deadline = now_ns - IDLE_GRACE_NS
        self.engine.tick(now_ns, ttl_deadline)
        for r in [r for r in self.index.in_flight.values()
                  if r.idle_at is not None and r.idle_at <= idle_deadline and r.last_ns <= r.idle_at]:
            self.close(r, Close.IDLE, r.idle_at)
        due = [
            r for r in self.index.open.values()
            if (r.terminal_ns is not None and r.terminal_ns <= linger_deadline) or r.last_ns <= ttl_deadline
        ]
        for r in due:
            self.close(r, Close.EXPIRED)
        self.index.forget(ttl_deadline)

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

    def _seed_id(self, rid: str) -> str:
        """A seed line's id, or the upstream request in flight it names (`<id>-<8 hex>` is V1's
        engine-side spelling of `<id>`): the vLLM plugin's lines join vLLM's own. An n>1 child
        (`<i>_<id>`) is its parent's: one client request, one root, whatever else is open."""
        if rid in self.index.open or not ids.respelled(rid):
            return rid
        key = ids.resolve(rid, self.index.open) if self.index.open else None
        if key is None and ids.child_index(rid) is not None:
            return ids.engine_base(rid)
        return key or rid

    def _start_seq(self, rid: str, record: Record) -> tuple[RequestState, int | None]:
        """`_start` for a plugin line, and which n>1 child of its request it names (or None).
        A child the request had not shown yet, after its siblings' summaries ended it (how many
        there are was never logged), continues it: siblings are not a reused id."""
        r = self.index.open.get(rid)
        if r is not None and r.terminal_ns is None:  # the commonest line: one of an open request's
            return self.index.touch(r, record), None
        key = self._seed_id(rid)
        k = ids.child_index(rid) if key != rid else None
        if k is not None:
            r = self.index.open.get(key)
            if r is not None and r.terminal_ns is not None and r.outcome == "finished" and r.seqs is not None \
                    and k not in r.seqs and self.index.open.get(r.request_id) is r:
                r.terminal_ns, r.outcome, r.summary = None, "incomplete", None
                self.index.in_flight[key] = r
        r = self._start(key, record)
        if k is not None:
            if r.seqs is None:
                r.seqs = {}
            r.seqs.setdefault(k, None)
        return r, k

    def _on_scheduled(self, record: Record, ev: Scheduled) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r, k = self._start_seq(ev.request_id, record)
        ts = record.ts_ns
        if r.schedules is None:
            r.schedules = []
            r.queue_at_schedule = self._queue
            r.gpu_at_schedule = self._gpu
        r.schedules.append((ts, ev))
        p = self._open_preemption(r, ev.request_id)
        if p is not None:
            p[1] = ts  # rescheduled: the preemption is over

    @staticmethod
    def _open_preemption(r: RequestState, rid: str) -> list | None:
        """The preemption not yet over of the sequence `rid` names: the request's last one, or,
        with n>1 children (each preempted and rescheduled on its own), that child's."""
        if not r.preemptions:
            return None
        if r.seqs is None:
            last = r.preemptions[-1]
            return last if last[1] is None else None
        for p in reversed(r.preemptions):
            if p[1] is None and p[2].request_id == rid:
                return p
        return None

    def _on_preempted(self, record: Record, ev: Preempted) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r, k = self._start_seq(ev.request_id, record)
        if r.preemptions is None:
            r.preemptions = []
        if self._open_preemption(r, ev.request_id) is not None:
            return  # preempted again before being rescheduled: still the same preemption
        r.preemptions.append([record.ts_ns, None, ev])

    def _on_allocated(self, record: Record, ev: BlockAllocated) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r, k = self._start_seq(ev.request_id, record)
        r.allocated += 1
        r.held += 1
        r.add_block_event(SpanEvent("vllm.kv_block.allocated", record.ts_ns, {
            "vllm.kv_block.id": ev.block, "vllm.kv_block.size_bytes": ev.size_bytes}))

    def _on_freed(self, record: Record, ev: BlockFreed) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        rid = ev.request_id
        r = self._touch(rid if rid in self.index.open else self._seed_id(rid), record)
        if r is None:
            return
        r.freed += ev.count
        r.held -= ev.count
        attrs = {"vllm.kv_block.id": ev.block} if ev.block else {"vllm.kv_block.count": ev.count}
        if ev.reason:
            attrs["vllm.kv_block.reason"] = ev.reason
        r.add_block_event(SpanEvent("vllm.kv_block.freed", record.ts_ns, attrs))
        if r.terminal_ns is not None:
            r.last_free_ns = record.ts_ns
            if r.held <= 0 and r.outcome != "timeout" and not self._awaits_api(r):  # a timeout may still get its API line
                self.close(r, Close.DONE)
        elif ev.reason in _RELEASE_REASONS and r.seqs is not None and self._seqs_left(r, ids.child_index(ev.request_id)):
            pass  # one child of n>1 released; the request goes on with the others
        elif ev.reason in _RELEASE_REASONS:
            # Released before the line that ends the request: V1's engine frees a finished
            # request's blocks at once, and the API server logs its end after the hand-off.
            if r.release_ns is None:
                r.release_ns = record.ts_ns
            r.last_free_ns = record.ts_ns

    def _on_summary(self, record: Record, ev: RequestSummary) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r, k = self._start_seq(ev.request_id, record)
        end = record.ts_ns
        if ev.times is not None:
            self._plugin_times(r, ev.request_id, ev.times)
        if k is not None:
            r.seqs[k] = (end, ev)
            if self._seqs_left(r):
                return  # its siblings are still running: the client's request is not over
            r.summary, end = _combined(r.request_id, r.seqs)
        else:
            r.summary = ev
        self.end(r, end, End.FINISHED)
        if r.held <= 0 and not self._awaits_api(r):
            self.close(r, Close.DONE)

    @staticmethod
    def _awaits_api(r: RequestState) -> bool:
        """The plugin's summary ended a chat vLLM's API server logs (`Received request`): it is
        written as the output processor finishes the request (`_update_stats_from_finished`),
        before the serving code logs the response (`Generated response … finish_reason: …`,
        chat and Responses API only: completions log no output). It lingers for those lines
        (`linger_s`), which name its finish reasons, until it has one per choice."""
        extra = r.extra
        if r.summary is None or extra is None or extra.get("gen_ai.operation.name") != "chat":
            return False
        return len(extra.get("gen_ai.response.finish_reasons", ())) < (extra.get("gen_ai.request.n") or 1)

    @staticmethod
    def _seqs_left(r: RequestState, ending: int | None = None) -> bool:
        """Whether children of an n>1 request other than `ending` have not finished: vLLM's
        `ParentRequest` answers the client once every one of its n children has. n is the
        logged `SamplingParams(n=…)`, else the children `Added request` or the plugin named."""
        n = (r.extra or {}).get("gen_ai.request.n") or (r.times.n if r.times is not None else None) or 0
        if not n and r.added:
            n = sum(1 for a in r.added if ids.child_index(a) is not None)
        seqs = r.seqs
        done = sum(1 for i, v in seqs.items() if v is not None or i == ending)
        return done < max(n, len(seqs))

    def _on_ended(self, record: Record, ev: RequestEnded) -> None:
        """The plugin's line for a request that did not complete: aborted (the client went, or
        vLLM aborted it) or failed, with the phases vLLM stamped before."""
        record = _exact(record, ev)
        rid = self._seed_id(ev.request_id)
        r = self.index.open.get(rid)
        k = ids.child_index(ev.request_id) if rid != ev.request_id else None
        if r is not None and r.terminal_ns is not None:  # vLLM's own line (or a sibling's) ended it first
            if ev.times is not None and r.times is None:
                self._plugin_times(r, ev.request_id, ev.times)
            if k is not None and r.seqs is not None:  # n>1: this child is over too
                r.seqs[k] = (record.ts_ns, None)
                if r.held <= 0 and not self._seqs_left(r) and self.index.open.get(r.request_id) is r:
                    self.close(r, Close.DONE)
            return
        r, k = self._start_seq(ev.request_id, record)  # a child of n>1 ends its parent: vLLM aborts all
        if k is not None:
            r.seqs[k] = (record.ts_ns, None)
        if ev.times is not None:
            self._plugin_times(r, ev.request_id, ev.times)
        r.set("gen_ai.usage.input_tokens", ev.prompt_tokens)
        r.set("gen_ai.usage.output_tokens", ev.generated_tokens)
        r.set("vllm.e2e_s", ev.e2e_s)
        if ev.finish == "abort":
            self.end(r, record.ts_ns, End.ABORTED, message=f"Request {ev.request_id} aborted")
        else:
            self.end(r, record.ts_ns, End.FAILED, ev.finish, f"Request {ev.request_id} ended: {ev.finish}")
        if r.held <= 0 and not (k is not None and self._seqs_left(r)):  # n>1: its siblings' lines come too
            self.close(r, Close.DONE)

    @staticmethod
    def _plugin_times(r: RequestState, rid: str, times) -> None:
        """vLLM's own stamps from the plugin's end line: the first scheduling and the
        preemptions, unless the engine core's lines gave them already (same stamps, with block
        counts); the first and last token go to the build."""
        if r.times is not None:  # another child of an n>1 request: one phase set for the client's request
            old = r.times
            times = replace(times, arrival_ns=_least(old.arrival_ns, times.arrival_ns),
                            queued_ns=_least(old.queued_ns, times.queued_ns),
                            scheduled_ns=_least(old.scheduled_ns, times.scheduled_ns),
                            first_token_ns=_least(old.first_token_ns, times.first_token_ns),
                            last_token_ns=max((t for t in (old.last_token_ns, times.last_token_ns) if t is not None),
                                              default=None),
                            preempted=old.preempted + times.preempted,
                            caller=old.caller or times.caller, tracestate=old.tracestate or times.tracestate)
        r.times = times
        if times.scheduled_ns is not None and not r.schedules:
            queued = (times.scheduled_ns - times.queued_ns) / 1e9 if times.queued_ns is not None else None
            r.schedules = [(times.scheduled_ns, Scheduled(rid, 0, None, None, queued, times.scheduled_ns))]
        if times.preempted and not r.preemptions:
            r.preemptions = [[start, end, Preempted(rid, "", None, start)] for start, end in times.preempted]

    def _on_timeout(self, record: Record, ev: RequestTimedOut) -> None:
        r = self.index.open.get(ev.request_id)
        if r is not None and r.outcome == "timeout":  # the second of the two timeout lines
            self._touch(ev.request_id, record)
            if ev.after_s is not None:
                r.timeout_after_s = ev.after_s
            return
        r = self._start(ev.request_id, record)
        r.timeout_after_s = ev.after_s
        self.end(r, record.ts_ns, End.TIMEOUT, message=self._text(ev.message))

    def _on_alloc_failed(self, record: Record, ev: AllocationFailed) -> None:
        r = self._start(ev.request_id, record)
        message = ev.message
        oom = self.engine.last_oom
        if oom is not None and record.ts_ns - oom[0] <= self._config.oom_window_s * _NS:
            message = f"{message}: {oom[1].message}"
        self.end(r, record.ts_ns, End.FAILED, "oom", self._text(message), "OutOfMemoryError")

    def end(self, r: RequestState, ts: int, why: End, error_type: str | None = None, message: str = "",
             exception: str | None = None, observed: bool = True) -> None:
        """The one way a request is over, at `ts`: `why` fixes its outcome, and but for
        `End.FINISHED` its `error.type` (unless given) and an exception event (`message` is
        already fit to leave the node: `self._text`, or the bridge's own words). Ended by a
        signal (the engine's death, the server's stop), its answer may still show up finished
        (`_served`). `observed=False`: no line shows when it ended (`vllm.end_inferred`)."""
        if why is not End.FINISHED:
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
        if r.extra is not None and ("vllm.start_unknown" in r.extra or "vllm.end_inferred" in r.extra):
            # A bound no line proves: the first line seen is no arrival; a stop's time no end.
            if "vllm.start_unknown" in r.extra:
                t.start_timing = INFERRED
            if "vllm.end_inferred" in r.extra:
                t.end_timing = INFERRED
            t.attrs["vllm.timing"] = INFERRED
        self._emit(t)

    # -- upstream request lines ----------------------------------------------------------

    def _ignore(self, record: Record, ev) -> None:
        """Recognised, nothing to assemble (uvicorn access lines carry no request id)."""

    def _upstream(self, key: str, record: Record) -> RequestState:
        """Open (or continue) an upstream request under `key`, with what its id tells."""
        self.engine.end_startup()
        r = self._start(key, record)
        if r.extra is None:
            self._describe(r, key, record)
        return r

    @staticmethod
    def _describe(r: RequestState, key: str, record: Record) -> None:
        r.extra = {"gen_ai.response.id": ids.response_id(key)}
        op = ids.operation(key)
        if op is not None:
            r.extra["gen_ai.operation.name"] = op
        if record.process:
            r.extra["vllm.process"] = record.process

    def _resolve(self, rid: str, record: Record) -> RequestState | None:
        """The request a line names; one whose start was not seen (an excerpt, an agent started
        late) is opened here, marked `vllm.start_unknown`. None for a request already emitted."""
        key = ids.resolve(rid, self.index.open)
        if key is not None:
            if self.index.twins and key in self.index.twins:
                return self.index.touch(self.index.occurrence(key, rid), record)
            return self._touch(key, record)
        if ids.resolve(rid, self.index.gone) is not None:
            self.stats.orphan_lines += 1
            return None
        return self._orphan(rid, record)

    def _orphan(self, rid: str, record: Record) -> RequestState:
        r = self._upstream(ids.canonical(rid), record)
        r.set("vllm.start_unknown", True)
        if rid != r.request_id:
            r.set("vllm.request.internal_id", rid)
        self.stats.orphan_requests += 1
        return r

    # -- one id, several requests at once (a client reusing X-Request-Id concurrently) --------

    def _concurrent(self, rid: str) -> bool:
        """A request under this id was received and is not yet added: vLLM adds a request right
        after it logs its arrival, so a second arrival now is another request at the same time."""
        return any(o.terminal_ns is None and o.extra is not None and o.seen & SEEN_RECEIVED and o.added is None
                   for o in self.index.group(rid))

    def _open_twin(self, rid: str, record: Record) -> RequestState:
        r = self.index.open_twin(rid, record, (self._queue_offset, self._gpu_offset))
        self.stats.requests_opened += 1
        self._describe(r, rid, record)
        self.stats.reused_concurrent += 1
        return r

    def _retire(self, rid: str) -> None:
        """A new request under an id whose concurrent requests were all added: they are over."""
        for o in self.index.group(rid):
            if o.terminal_ns is None:
                self.close(o, Close.REUSED)
            if o in self.index.twins.get(rid, ()) or self.index.open.get(rid) is o:
                self.close(o, Close.DONE)

    def _again(self, key: str, bit: int) -> None:
        """A start line this request has shown already: the id was reused by a new request
        (occurrence order). The one open under it ends where its lines end."""
        r = self.index.open.get(key)
        if r is not None and r.terminal_ns is None and r.seen & bit:
            self.close(r, Close.REUSED)

    def _on_received(self, record: Record, ev: RequestReceived) -> None:
        rid = ev.request_id
        if rid in self.index.open and self._concurrent(rid):
            self.engine.end_startup()
            r = self._open_twin(rid, record)
        else:
            if self.index.twins and rid in self.index.twins:
                self._retire(rid)
            self._again(rid, SEEN_RECEIVED)
            r = self._upstream(rid, record)
        r.seen |= SEEN_RECEIVED
        for key, value in (("gen_ai.request.max_tokens", ev.max_tokens), ("gen_ai.request.temperature", ev.temperature),
                           ("gen_ai.request.top_p", ev.top_p), ("gen_ai.request.n", ev.n),
                           ("vllm.lora.name", ev.lora)):
            if value is not None:
                r.set(key, value)

    def _on_details(self, record: Record, ev: RequestDetails) -> None:
        # DEBUG prints it just before `Received request`: it opens the request like that line.
        self._again(ev.request_id, SEEN_DETAILS)
        r = self._upstream(ev.request_id, record)
        r.seen |= SEEN_DETAILS
        r.set("gen_ai.usage.input_tokens", ev.prompt_tokens)

    def _on_added(self, record: Record, ev: RequestAdded) -> None:
        rid = ev.request_id
        if self.index.twins and self._add_twin(rid, record):
            return
        key = ids.resolve(rid, self.index.in_flight)
        if key is not None:
            r = self.index.open[key]
            # vLLM ≥ 0.14 gives every request its own `-<8 hex>` suffix, n>1 children `<i>_` of
            # it: an id added before, or another suffix, is another request under a reused id.
            if r.added is not None and (rid in r.added or ids.engine_base(rid) not in
                                        {ids.engine_base(a) for a in r.added}):
                self.close(r, Close.REUSED)
                key = None
        r = self._upstream(key if key is not None else ids.canonical(rid), record)
        if r.added is None:
            r.added = set()
            if rid != r.request_id:
                r.set("vllm.request.internal_id", rid)
        r.added.add(rid)

    def _add_twin(self, rid: str, record: Record) -> bool:
        """`Added request` under an id received several times at once: the engine adds them in
        the order they arrived, so the oldest not yet added is this one (an n>1 child joins the
        request its engine id was added as)."""
        key = ids.resolve(rid, self.index.open)
        if key is None or key not in self.index.twins:
            return False
        base = ids.engine_base(rid)
        group = self.index.group(key)
        r = next((o for o in group if o.added and base in {ids.engine_base(a) for a in o.added}), None) \
            or next((o for o in group if o.terminal_ns is None and o.added is None), None)
        if r is None:
            return False
        self.index.touch(r, record)
        if r.added is None:
            r.added = set()
            if rid != r.request_id:
                r.set("vllm.request.internal_id", rid)
        r.added.add(rid)
        return True

    @staticmethod
    def _when(record: Record, r: RequestState) -> int:
        """When a line about `r` happened. A header stamp says only its second, and the line was
        written after the request's lines before it: no earlier than the latest of them (a
        plugin line's exact `t=`, say) when that lies within the second. (Only the request's
        own lines: a resume reads all of them again, so the agent and a replay agree.)"""
        ts = record.ts_ns
        if record.clock in COARSE and ts < r.last_ns < ts + _NS:
            return r.last_ns
        return ts

    def _on_finished(self, record: Record, ev: RequestFinished) -> None:
        r = self._resolve(ev.request_id, record)
        if r is not None and r.terminal_ns is None:
            self.end(r, self._when(record, r), End.FINISHED)
            self.engine.alive()

    def _on_generated(self, record: Record, ev: ResponseGenerated) -> None:
        r = self._resolve(ev.request_id, record)
        if r is None:
            return
        if ev.output_tokens is not None and r.summary is None:
            # One line per choice of a whole response (serving.py logs each choice's token ids):
            # their counts add up, as the response's `usage.completion_tokens` does over n. (A
            # plugin summary counted them already, from vLLM's own stats, empty choices too.)
            r.set("gen_ai.usage.output_tokens", (r.extra or {}).get("gen_ai.usage.output_tokens", 0) + ev.output_tokens)
        if ev.finish_reason is None and ev.streaming != "complete":
            return
        if ev.streaming == "complete":
            r.closed += 1
        # One line per choice (n>1 logs each choice's reason): one reason per choice, as the
        # GenAI convention has it, and the last choice's line ends the request.
        extra = r.extra or {}
        n = extra.get("gen_ai.request.n") or 1
        reasons = extra.get("gen_ai.response.finish_reasons", [])
        if ev.finish_reason is not None and len(reasons) < n:
            reasons = [*reasons, ev.finish_reason]
            r.set("gen_ai.response.finish_reasons", reasons)
        if r.terminal_ns is None:
            ts = self._when(record, r)
            if ev.finish_reason != "abort" and len(reasons) < n and r.closed < n:
                pass  # one choice of n>1 is done (a stream's last delta); the others go on
            elif ev.finish_reason == "abort" and self.engine.stop_ns is not None:
                self.end(r, ts, End.STOPPED)  # aborted by the stop (vLLM's abort mode)
            elif ev.finish_reason == "abort":
                # aborted by the engine with no line of its own (`POST /pause`, core.py): the
                # client got a cut answer whose reason says so
                self.end(r, ts, End.ABORTED, message=f"Request {ev.request_id} aborted (finish_reason: abort)")
            else:
                self.end(r, ts, End.FINISHED)
                self.engine.alive()
        elif r.outcome == "finished" and r.error_type is None and record.ts_ns > r.terminal_ns and r.summary is None:
            # (a summary's end is vLLM's own e2e end, and its arrival counts back from it)
            r.terminal_ns = record.ts_ns
        elif r.summary is not None and ev.streaming != "delta" and r.held <= 0 and self.index.open.get(r.request_id) is r \
                and (r.closed >= (extra.get("gen_ai.request.n") or 1) if ev.streaming == "complete"
                     else not self._awaits_api(r)):
            # the plugin's summary, then a reason for every choice, or a stream's closing lines,
            # one per choice (serving_chat.py logs one for each): nothing more to come
            self.close(r, Close.DONE)
        elif r in self._signal_ends and ev.streaming != "complete" and ev.finish_reason not in (None, "abort"):
            # a choice's own reason, not `(streaming complete)`: vLLM logs that after an abort too
            self._served(r, record.ts_ns)

    def _served(self, r: RequestState, ts: int) -> None:
        """A request the engine's death or the stop had ended shows its answer finished after
        all: the engine had made it, and a loaded API server wrote it out after the death's
        lines (a choice's reason other than `abort` is logged only for a whole answer).
        It was served: finished here, its failure taken back; it stays linked to the incident."""
        end = self._signal_ends.pop(r)
        r.error_type, r.error_message, r.outcome, r.terminal_ns = None, "", "finished", ts
        if r.events:
            r.events = [e for e in r.events if e is not end]
        if r.extra is not None:
            r.extra.pop("vllm.end_inferred", None)
        inc = self.engine.incident
        if inc is not None and r in inc.failed:
            inc.failed.remove(r)

    def _on_aborted(self, record: Record, ev: RequestsAborted) -> None:
        for rid in ev.request_ids:
            r = self._resolve(rid, record)
            if r is not None and r.terminal_ns is None:
                if self.engine.stop_ns is not None:  # aborted by the stop (vLLM's abort mode, or cancelled)
                    self.end(r, self._when(record, r), End.STOPPED)
                else:
                    self.end(r, self._when(record, r), End.ABORTED, message=f"Request {rid} aborted")

    def _on_failed(self, record: Record, ev: RequestFailed) -> None:
        # V0's "Failing the request" may be its only line: `_resolve` opens it then.
        r = self._resolve(ev.request_id, record)
        if r is None or r.terminal_ns is not None:
            return
        ts = self._when(record, r)
        if ev.error_type == "engine_dead" and self.engine.death is None and self.engine.stop_ns is not None:
            self.end(r, ts, End.STOPPED)  # vLLM fails what is in flight with EngineDeadError on a stop
        elif ev.error_type == "engine_dead" and self.engine.death is not None:
            self.end(r, ts, End.ENGINE_DIED, self.engine.death, exception="RequestFailed")
        else:
            self.end(r, ts, End.FAILED, ev.error_type, self._request_text(ev.reason))

    def _on_sequence_preempted(self, record: Record, ev: SequencePreempted) -> None:
        r = self._resolve(ev.request_id, record)
        if r is None:
            return
        r.sampled_preemptions += 1
        r.add_event(SpanEvent("vllm.preempted", record.ts_ns, {
            "vllm.preemption.mode": ev.mode, "vllm.preemption.cumulative": ev.cumulative}), True)

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

    # -- upstream engine lines -----------------------------------------------------------

    # -- engine-wide lines ---------------------------------------------------------------

    def _on_queue(self, record: Record, ev: QueueState) -> None:
        self._queue = ev
        self._queue_offset = record.offset
        ratio = ev.free_blocks / ev.total_blocks if ev.total_blocks else None
        event = SpanEvent("vllm.queue_state", record.ts_ns, {
            "vllm.queue.running": ev.running, "vllm.queue.waiting": ev.waiting,
            "vllm.kv.free_blocks": ev.free_blocks, "vllm.kv.total_blocks": ev.total_blocks})
        for r in self.index.in_flight.values():  # one shared, read-only event object
            r.add_event(event, True)
            if ratio is not None and (r.min_free_ratio is None or ratio < r.min_free_ratio):
                r.min_free_ratio = ratio

    def _on_gpu(self, record: Record, ev: GpuMemory) -> None:
        self._gpu = ev
        self._gpu_offset = record.offset
        event = SpanEvent("vllm.gpu_memory", record.ts_ns, {
            "vllm.gpu.memory.used_bytes": ev.used_bytes, "vllm.gpu.memory.total_bytes": ev.total_bytes,
            "vllm.gpu.memory.utilization": ev.utilization, "vllm.kv_cache.used_bytes": ev.cache_bytes,
            "vllm.kv_cache.blocks_used": ev.kv_blocks_used, "vllm.kv_cache.blocks_total": ev.kv_blocks_total})
        for r in self.index.in_flight.values():
            r.add_event(event, True)
            if r.max_gpu_ratio is None or ev.utilization > r.max_gpu_ratio:
                r.max_gpu_ratio = ev.utilization

