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

import os
from collections.abc import Callable
from types import MethodType
from dataclasses import dataclass

from bridge.assemble import ids
from bridge.assemble.context import Rule, w3c_rule
from bridge.assemble.build import EVENT_CAP, _request_timeline, engine_timeline, request_timeline
from bridge.assemble.diagnosis import Thresholds
from bridge.assemble.startup import Startup
from bridge.assemble.timeline import SpanEvent, Timeline
from bridge.decode.record import Record
from bridge.decode.source import Source
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
    RequestSummary,
    RequestTimedOut,
    ResponseGenerated,
    Scheduled,
    SequencePreempted,
    StartupFact,
)

_NS = 1_000_000_000
# A stats line is printed from a snapshot taken a little before it: a request added just before
# an idle line may still log its end. It is closed only if nothing more comes for this long.
_IDLE_GRACE_NS = 2 * _NS
_BLOCK_EVENTS_KEPT = 8 * EVENT_CAP  # spread over the phases later, EVENT_CAP per span
#: Free reasons that mean the request is over (not a preemption): blocks released at its end.
_RELEASE_REASONS = frozenset({"completed", "finished", "aborted"})


def _load_fast():
    """The C fast path for KV block and summary lines of open requests (`_fastfeed.c`), or None: not built
    (no compiler at install), or VLLM_TRACE_BRIDGE_PURE=1. It takes only lines whose handling
    it can do exactly as `feed` below would, and hands every other line to `feed`."""
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return None
    try:
        from bridge.assemble import _fastfeed
    except ImportError:
        return None
    return _fastfeed


_FAST = _load_fast()
_FEEDER = _FAST.Feeder if _FAST is not None else None


@dataclass(frozen=True, slots=True)
class AssembleConfig:
    thresholds: Thresholds = Thresholds()
    ttl_s: float = 600.0      # an open request with no new line for this long is evicted
    linger_s: float = 5.0     # a finished request waits this long for its last block frees
    oom_window_s: float = 2.0  # a CUDA OOM this close before a failed allocation explains it
    context_rule: Rule = w3c_rule  # request id → the caller's trace context (context.make_rule)


@dataclass(slots=True)
class AssembleStats:
    requests_opened: int = 0
    requests_emitted: int = 0
    requests_evicted: int = 0
    engine_incidents: int = 0
    orphan_lines: int = 0  # a line for a request that is not (or no longer) known


class RequestState:
    """Everything one occurrence of a request has shown. Lists stay None until needed."""

    __slots__ = (
        "request_id", "occurrence", "first_ns", "last_ns", "first_offset", "last_offset",
        "schedules", "preemptions", "allocated", "freed", "held", "block_events", "block_dropped",
        "events", "dropped", "summary", "terminal_ns", "outcome", "error_type", "error_message",
        "timeout_after_s", "queue_at_schedule", "gpu_at_schedule", "min_free_ratio",
        "max_gpu_ratio", "last_free_ns", "release_ns", "extra", "sampled_preemptions", "idle_at",
    )

    def __init__(self, request_id: str, occurrence: str, ts: int, offset: int) -> None:
        self.request_id = request_id
        self.occurrence = occurrence
        self.first_ns = self.last_ns = ts
        self.first_offset = self.last_offset = offset
        self.schedules: list[tuple[int, Scheduled]] | None = None
        self.preemptions: list[list] | None = None  # [start_ns, end_ns | None, Preempted]
        self.allocated = self.freed = self.held = 0
        self.block_events: list[SpanEvent] | None = None
        self.block_dropped = 0
        self.events: list[SpanEvent] | None = None  # root events: gauges, errors, incidents
        self.dropped = 0
        self.summary: RequestSummary | None = None
        self.terminal_ns: int | None = None
        self.outcome = "incomplete"
        self.error_type: str | None = None
        self.error_message = ""
        self.timeout_after_s: float | None = None
        self.queue_at_schedule: QueueState | None = None
        self.gpu_at_schedule: GpuMemory | None = None
        self.min_free_ratio: float | None = None
        self.max_gpu_ratio: float | None = None
        self.last_free_ns: int | None = None
        self.release_ns: int | None = None  # first block freed at the end, before the end's line
        self.extra: dict | None = None      # upstream attributes: gen_ai.*, vllm.process, …
        self.sampled_preemptions = 0        # V0's preemption warning (1st and every 50th only)
        self.idle_at: int | None = None     # when a stats line showed the engine idle with this open

    def set(self, key: str, value) -> None:
        if self.extra is None:
            self.extra = {}
        self.extra[key] = value

    def add_event(self, event: SpanEvent, capped: bool) -> None:
        if self.events is None:
            self.events = []
        if capped and len(self.events) >= EVENT_CAP:
            self.dropped += 1
        else:
            self.events.append(event)

    def add_block_event(self, event: SpanEvent) -> None:
        if self.block_events is None:
            self.block_events = []
        if len(self.block_events) >= _BLOCK_EVENTS_KEPT:
            self.block_dropped += 1
        else:
            self.block_events.append(event)


class Assembler:
    """Feed it (record, event) pairs of one source in file order; it calls `emit` with each
    finished `RequestTimeline` or `EngineTimeline`."""

    def __init__(self, source: Source, emit: Callable[[Timeline], None], config: AssembleConfig = AssembleConfig(),
                 fast: bool = True):
        """`fast=False`: this stage's pure-Python code only (the C paths' reference)."""
        self.source = source
        self._timeline = request_timeline if fast else _request_timeline
        self._fan_out = _FAST.fan_out if fast and _FAST is not None else None
        self.stats = AssembleStats()
        self._emit = emit
        self._config = config
        self._ttl_ns = int(config.ttl_s * _NS)
        self._linger_ns = int(config.linger_s * _NS)
        self._open: dict[str, RequestState] = {}       # every request not yet emitted
        self._in_flight: dict[str, RequestState] = {}  # the subset not yet over
        self._recent_starts: dict[str, tuple[int, int]] = {}  # id → (first_ns, n) for reuse within a tick
        self._queue: QueueState | None = None
        self._gpu: GpuMemory | None = None
        # Where the gauges a new request snapshots were read: a request depends on those
        # lines too, so a resume must start early enough to read them again.
        self._queue_offset: int | None = None
        self._gpu_offset: int | None = None
        self._last_oom: tuple[int, CudaOom] | None = None
        self._pending_nccl: tuple[Record, NcclTimeout] | None = None
        self._last_incident = (0, 0)  # (ts, n): occurrence of incidents within one timestamp
        self._now = 0
        self._next_sweep = 0
        self._startup: Startup | None = None
        self._engine: dict = {}  # what the banner said: gen_ai.request.model, vllm.version
        self._stats_engines: set[str] = set()  # data-parallel engines seen in stats lines
        self._handlers = {
            Scheduled: self._on_scheduled,
            Preempted: self._on_preempted,
            BlockAllocated: self._on_allocated,
            BlockFreed: self._on_freed,
            RequestSummary: self._on_summary,
            RequestTimedOut: self._on_timeout,
            AllocationFailed: self._on_alloc_failed,
            QueueState: self._on_queue,
            GpuMemory: self._on_gpu,
            CudaOom: self._on_cuda_oom,
            ModelLoadFailed: self._on_model_load,
            NcclTimeout: self._on_nccl,
            NcclHint: self._on_nccl_hint,
            RequestReceived: self._on_received,
            RequestAdded: self._on_added,
            RequestDetails: self._on_details,
            RequestFinished: self._on_finished,
            RequestsAborted: self._on_aborted,
            RequestFailed: self._on_failed,
            ResponseGenerated: self._on_generated,
            SequencePreempted: self._on_sequence_preempted,
            EngineStats: self._on_stats,
            EngineConfig: self._on_config,
            StartupFact: self._on_startup_fact,
            EngineError: self._on_engine_error,
            AccessLog: self._ignore,
            Notice: self._ignore,
        }
        if fast and _FEEDER is not None and type(self) is Assembler:  # shadows the method for this instance
            self.feed = _FEEDER(self, MethodType(Assembler.feed, self), BlockAllocated, BlockFreed, SpanEvent,
                                RequestSummary)

    # -- input ---------------------------------------------------------------------------

    def feed(self, record: Record, event) -> None:
        ts = record.ts_ns
        if ts > self._now:
            self._now = ts
            if ts >= self._next_sweep:
                self.tick(ts)
        if self._pending_nccl is not None and type(event) is not NcclHint:
            self._flush_nccl(None)
        self._handlers[type(event)](record, event)

    def tick(self, now_ns: int) -> None:
        """Emit what is due at `now_ns`: finished requests done lingering, open ones past TTL.
        Replay ticks on log time; the live agent also ticks on the wall clock."""
        self._next_sweep = now_ns + _NS
        self._recent_starts.clear()
        if self._pending_nccl is not None and now_ns - self._pending_nccl[0].ts_ns >= _NS:
            self._flush_nccl(None)
        linger_deadline = now_ns - self._linger_ns
        ttl_deadline = now_ns - self._ttl_ns
        idle_deadline = now_ns - _IDLE_GRACE_NS
        for r in [r for r in self._in_flight.values()
                  if r.idle_at is not None and r.idle_at <= idle_deadline and r.last_ns <= r.idle_at]:
            self._close_idle(r)
        due = [
            r for r in self._open.values()
            if (r.terminal_ns is not None and r.terminal_ns <= linger_deadline) or r.last_ns <= ttl_deadline
        ]
        for r in due:
            if r.terminal_ns is None:
                self.stats.requests_evicted += 1
            self._finish(r)

    def flush(self) -> None:
        """End of input: everything still open is emitted, unfinished requests as incomplete."""
        if self._pending_nccl is not None:
            self._flush_nccl(None)
        self._end_startup()
        for r in list(self._open.values()):
            if r.terminal_ns is None and r.idle_at is not None and r.last_ns <= r.idle_at:
                self._close_idle(r)
            else:
                self._finish(r)

    @property
    def open_requests(self) -> int:
        return len(self._open)

    @property
    def min_open_offset(self) -> int | None:
        """The earliest position still needed by anything not yet emitted (for checkpoints)."""
        low = min((r.first_offset for r in self._open.values()), default=None)
        if self._pending_nccl is not None:
            held = self._pending_nccl[0].offset
            low = held if low is None else min(low, held)
        return low

    def evict_oldest(self, keep: int) -> int:
        """Emit the oldest open requests (as they stand) until at most `keep` remain."""
        excess = len(self._open) - keep
        if excess <= 0:
            return 0
        for r in list(self._open.values())[:excess]:
            if r.terminal_ns is None:
                self.stats.requests_evicted += 1
            self._finish(r)
        return excess

    # -- request lines -------------------------------------------------------------------

    def _start(self, rid: str, record: Record) -> RequestState:
        """The request this starting line belongs to, opening a new occurrence if needed."""
        r = self._open.get(rid)
        if r is not None:
            if r.terminal_ns is None:
                if record.ts_ns > r.last_ns:
                    r.last_ns = record.ts_ns
                r.last_offset = record.offset
                return r
            self._finish(r)  # over already: the id has been reused
        ts = record.ts_ns
        prev = self._recent_starts.get(rid)
        n = prev[1] + 1 if prev is not None and prev[0] == ts else 0
        self._recent_starts[rid] = (ts, n)
        r = RequestState(rid, str(ts) if n == 0 else f"{ts}.{n}", ts, record.offset)
        for dep in (self._queue_offset, self._gpu_offset):
            if dep is not None and dep < r.first_offset:
                r.first_offset = dep
        self._open[rid] = r
        self._in_flight[rid] = r
        self.stats.requests_opened += 1
        return r

    def _touch(self, rid: str, record: Record) -> RequestState | None:
        r = self._open.get(rid)
        if r is None:
            self.stats.orphan_lines += 1
            return None
        if record.ts_ns > r.last_ns:
            r.last_ns = record.ts_ns
        r.last_offset = record.offset
        return r

    def _seed_id(self, rid: str) -> str:
        """A seed line's id, or the upstream request in flight it names (`<id>-<8 hex>` is V1's
        engine-side spelling of `<id>`): the vLLM plugin's lines join vLLM's own."""
        if rid in self._open or not self._open:
            return rid
        return ids.resolve(rid, self._open) or rid

    def _on_scheduled(self, record: Record, ev: Scheduled) -> None:
        r = self._start(self._seed_id(ev.request_id), record)
        ts = record.ts_ns
        if r.schedules is None:
            r.schedules = []
            r.queue_at_schedule = self._queue
            r.gpu_at_schedule = self._gpu
        r.schedules.append((ts, ev))
        if r.preemptions and r.preemptions[-1][1] is None:
            r.preemptions[-1][1] = ts  # rescheduled: the preemption is over

    def _on_preempted(self, record: Record, ev: Preempted) -> None:
        r = self._start(self._seed_id(ev.request_id), record)
        if r.preemptions is None:
            r.preemptions = []
        if r.preemptions and r.preemptions[-1][1] is None:
            return  # preempted again before being rescheduled: still the same preemption
        r.preemptions.append([record.ts_ns, None, ev])

    def _on_allocated(self, record: Record, ev: BlockAllocated) -> None:
        r = self._start(self._seed_id(ev.request_id), record)
        r.allocated += 1
        r.held += 1
        r.add_block_event(SpanEvent("vllm.kv_block.allocated", record.ts_ns, {
            "vllm.kv_block.id": ev.block, "vllm.kv_block.size_bytes": ev.size_bytes}))

    def _on_freed(self, record: Record, ev: BlockFreed) -> None:
        r = self._touch(self._seed_id(ev.request_id), record)
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
            if r.held <= 0 and r.outcome != "timeout":  # a timeout may still get its API line
                self._finish(r)
        elif ev.reason in _RELEASE_REASONS:
            # Released before the line that ends the request: V1's engine frees a finished
            # request's blocks at once, and the API server logs its end after the hand-off.
            if r.release_ns is None:
                r.release_ns = record.ts_ns
            r.last_free_ns = record.ts_ns

    def _on_summary(self, record: Record, ev: RequestSummary) -> None:
        r = self._start(self._seed_id(ev.request_id), record)
        r.summary = ev
        self._terminate(r, record.ts_ns, "finished")
        if r.held <= 0:
            self._finish(r)

    def _on_timeout(self, record: Record, ev: RequestTimedOut) -> None:
        r = self._open.get(ev.request_id)
        if r is not None and r.outcome == "timeout":  # the second of the two timeout lines
            self._touch(ev.request_id, record)
            if ev.after_s is not None:
                r.timeout_after_s = ev.after_s
            return
        r = self._start(ev.request_id, record)
        r.timeout_after_s = ev.after_s
        self._fail(r, record.ts_ns, "timeout", "timeout", "RequestTimeout", ev.message)

    def _on_alloc_failed(self, record: Record, ev: AllocationFailed) -> None:
        r = self._start(ev.request_id, record)
        message = ev.message
        oom = self._last_oom
        if oom is not None and record.ts_ns - oom[0] <= self._config.oom_window_s * _NS:
            message = f"{message}: {oom[1].message}"
        self._fail(r, record.ts_ns, "failed", "oom", "OutOfMemoryError", message)

    def _terminate(self, r: RequestState, ts: int, outcome: str) -> None:
        r.terminal_ns = ts
        r.outcome = outcome
        self._in_flight.pop(r.request_id, None)

    def _fail(self, r: RequestState, ts: int, outcome: str, error_type: str, exc_type: str, message: str) -> None:
        r.error_type = error_type
        r.error_message = message
        r.add_event(SpanEvent("exception", ts, {"exception.type": exc_type, "exception.message": message}), False)
        self._terminate(r, ts, outcome)

    def _finish(self, r: RequestState) -> None:
        del self._open[r.request_id]
        self._in_flight.pop(r.request_id, None)
        self.stats.requests_emitted += 1
        if r.extra is not None and self._engine:  # upstream request: the engine's model and version
            for key, value in self._engine.items():
                r.extra.setdefault(key, value)
        parent = self._config.context_rule(r.request_id)
        self._emit(self._timeline(r, self.source, self._config.thresholds, parent))

    # -- upstream request lines ----------------------------------------------------------

    def _ignore(self, record: Record, ev) -> None:
        """Recognised, nothing to assemble (uvicorn access lines carry no request id)."""

    def _upstream(self, key: str, record: Record) -> RequestState:
        """Open (or continue) an upstream request under `key`, with what its id tells."""
        self._end_startup()
        r = self._start(key, record)
        if r.extra is None:
            r.extra = {"gen_ai.response.id": ids.response_id(key)}
            op = ids.operation(key)
            if op is not None:
                r.extra["gen_ai.operation.name"] = op
            if record.process:
                r.extra["vllm.process"] = record.process
        return r

    def _resolve(self, rid: str, record: Record) -> RequestState | None:
        key = ids.resolve(rid, self._open)
        if key is None:
            self.stats.orphan_lines += 1
            return None
        return self._touch(key, record)

    def _on_received(self, record: Record, ev: RequestReceived) -> None:
        r = self._upstream(ev.request_id, record)
        for key, value in (("gen_ai.request.max_tokens", ev.max_tokens), ("gen_ai.request.temperature", ev.temperature),
                           ("gen_ai.request.top_p", ev.top_p), ("gen_ai.request.n", ev.n),
                           ("vllm.lora.name", ev.lora)):
            if value is not None:
                r.set(key, value)

    def _on_details(self, record: Record, ev: RequestDetails) -> None:
        # DEBUG prints it just before `Received request`: it opens the request like that line.
        self._upstream(ev.request_id, record).set("gen_ai.usage.input_tokens", ev.prompt_tokens)

    def _on_added(self, record: Record, ev: RequestAdded) -> None:
        key = ids.resolve(ev.request_id, self._in_flight)
        r = self._upstream(key if key is not None else ids.canonical(ev.request_id), record)
        if ev.request_id != r.request_id:
            r.set("vllm.request.internal_id", ev.request_id)

    def _on_finished(self, record: Record, ev: RequestFinished) -> None:
        r = self._resolve(ev.request_id, record)
        if r is not None and r.terminal_ns is None:
            self._terminate(r, record.ts_ns, "finished")

    def _on_generated(self, record: Record, ev: ResponseGenerated) -> None:
        r = self._resolve(ev.request_id, record)
        if r is None:
            return
        if ev.output_tokens is not None:
            previous = (r.extra or {}).get("gen_ai.usage.output_tokens", 0) if ev.streaming == "delta" else 0
            r.set("gen_ai.usage.output_tokens", previous + ev.output_tokens)
        if ev.finish_reason is None and ev.streaming != "complete":
            return
        reasons = (r.extra or {}).get("gen_ai.response.finish_reasons", [])
        if ev.finish_reason is not None and ev.finish_reason not in reasons:
            r.set("gen_ai.response.finish_reasons", [*reasons, ev.finish_reason])
        if r.terminal_ns is None:
            self._terminate(r, record.ts_ns, "finished")

    def _on_aborted(self, record: Record, ev: RequestsAborted) -> None:
        for rid in ev.request_ids:
            r = self._resolve(rid, record)
            if r is not None and r.terminal_ns is None:
                self._fail(r, record.ts_ns, "aborted", "aborted", "RequestAborted", f"Request {rid} aborted")

    def _on_failed(self, record: Record, ev: RequestFailed) -> None:
        r = self._resolve(ev.request_id, record)
        if r is None:
            key = ids.canonical(ev.request_id)  # V0's "Failing the request" may be its only line
            r = self._upstream(key, record)
        if r.terminal_ns is None:
            self._fail(r, record.ts_ns, "failed", ev.error_type, "RequestFailed", ev.reason)

    def _on_sequence_preempted(self, record: Record, ev: SequencePreempted) -> None:
        r = self._resolve(ev.request_id, record)
        if r is None:
            return
        r.sampled_preemptions += 1
        r.add_event(SpanEvent("vllm.preempted", record.ts_ns, {
            "vllm.preemption.mode": ev.mode, "vllm.preemption.cumulative": ev.cumulative}), True)

    # -- upstream engine lines -----------------------------------------------------------

    def _on_stats(self, record: Record, ev: EngineStats) -> None:
        attrs = {}
        for name in ("running", "waiting", "swapped", "deferred", "preemptions", "corrupted"):
            v = getattr(ev, name)
            if v is not None:
                attrs[f"vllm.queue.{name}"] = v
        for name, key in (("prompt_throughput", "vllm.throughput.prompt_tokens_per_s"),
                          ("generation_throughput", "vllm.throughput.generation_tokens_per_s"),
                          ("gpu_kv_usage", "vllm.kv_cache.gpu_usage"), ("cpu_kv_usage", "vllm.kv_cache.cpu_usage"),
                          ("prefix_cache_hit_rate", "vllm.prefix_cache.hit_rate"),
                          ("external_prefix_cache_hit_rate", "vllm.prefix_cache.external_hit_rate"),
                          ("mm_cache_hit_rate", "vllm.mm_cache.hit_rate")):
            v = getattr(ev, name)
            if v is not None:
                attrs[key] = v
        if ev.engine is not None:
            attrs["vllm.engine.index"] = ev.engine
        event = SpanEvent("vllm.engine_stats", record.ts_ns, attrs)
        free = 1.0 - ev.gpu_kv_usage if ev.gpu_kv_usage is not None else None
        for r in self._in_flight.values():
            r.add_event(event, True)
            if free is not None and (r.min_free_ratio is None or free < r.min_free_ratio):
                r.min_free_ratio = free
        if ev.engine is not None:
            self._stats_engines.add(ev.engine)
        if ev.running == 0 and not ev.waiting and not ev.swapped and (
                len(self._stats_engines) <= 1 or "Aggregated" in (ev.engine or "")):
            self._idle(record)

    def _idle(self, record: Record) -> None:
        """The engine says nothing runs or waits: requests with no end line are over, end
        unknown — once nothing more comes for them within the grace (see `tick`)."""
        for r in self._in_flight.values():
            if r.extra is not None and r.last_ns < record.ts_ns and r.idle_at is None:
                r.idle_at = record.ts_ns

    def _close_idle(self, r: RequestState) -> None:
        r.set("vllm.end_unknown", True)
        if "vllm.request.internal_id" in r.extra:
            # V1 with internal ids (≈ 0.14+) logs every abort and failure: an idle engine and
            # neither line means the request finished (a completion never logs its end).
            r.outcome = "finished"
        self._finish(r)

    def _on_config(self, record: Record, ev: EngineConfig) -> None:
        if self._startup is None or self._startup.has_banner:  # a second banner: the engine restarted
            self._end_startup()
            self._startup = Startup(record)
        self._startup.has_banner = True
        facts = [("vllm.version", ev.version)]
        if ev.engine:
            facts.append(("vllm.engine.version", ev.engine))
        if ev.model:
            facts.append(("gen_ai.request.model", ev.model))
            self._engine["gen_ai.request.model"] = ev.model
        self._engine["vllm.version"] = ev.version
        self._startup.add(record, facts)

    def _on_startup_fact(self, record: Record, ev: StartupFact) -> None:
        if self._startup is None:
            self._startup = Startup(record)
        self._startup.add(record, ev.facts)
        for key, value in ev.facts:
            if key == "vllm.version":
                self._engine.setdefault(key, value)

    def _end_startup(self, error_type: str = "", message: str = "") -> None:
        if self._startup is not None:
            self._emit(self._startup.timeline(self.source, error_type, message))
            self._startup = None

    def _on_engine_error(self, record: Record, ev: EngineError) -> None:
        if self._startup is not None and (ev.fatal or ev.error_type in ("model_load", "oom")):
            self._startup.add(record, ())
            self._end_startup(ev.error_type, ev.message)
        attrs = {"vllm.incident.fatal": ev.fatal}
        if ev.exception_type:
            attrs["exception.type"] = ev.exception_type
        if ev.stacktrace:
            attrs["exception.stacktrace"] = ev.stacktrace
        if record.process:
            attrs["vllm.process"] = record.process
        self._incident(record, ev.error_type, ev.error_type, record.ts_ns, ev.message, attrs)
        if ev.fatal:  # engine death is the best evidence of when the requests in flight ended
            for r in list(self._in_flight.values()):
                self._fail(r, record.ts_ns, "failed", ev.error_type, ev.exception_type or "EngineDeadError",
                           ev.message)

    # -- engine-wide lines ---------------------------------------------------------------

    def _on_queue(self, record: Record, ev: QueueState) -> None:
        self._queue = ev
        self._queue_offset = record.offset
        ratio = ev.free_blocks / ev.total_blocks if ev.total_blocks else None
        event = SpanEvent("vllm.queue_state", record.ts_ns, {
            "vllm.queue.running": ev.running, "vllm.queue.waiting": ev.waiting,
            "vllm.kv.free_blocks": ev.free_blocks, "vllm.kv.total_blocks": ev.total_blocks})
        if self._fan_out is not None and self._fan_out(self._in_flight, event, ratio, None):
            return  # done in C, exactly as below
        for r in self._in_flight.values():  # one shared, read-only event object
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
        if (self._fan_out is not None and type(ev.utilization) is float
                and self._fan_out(self._in_flight, event, None, ev.utilization)):
            return  # done in C, exactly as below
        for r in self._in_flight.values():
            r.add_event(event, True)
            if r.max_gpu_ratio is None or ev.utilization > r.max_gpu_ratio:
                r.max_gpu_ratio = ev.utilization

    def _on_cuda_oom(self, record: Record, ev: CudaOom) -> None:
        self._last_oom = (record.ts_ns, ev)
        attrs = {}
        if ev.requested_bytes is not None:
            attrs["vllm.oom.requested_bytes"] = ev.requested_bytes
        self._incident(record, "cuda_oom", "oom", record.ts_ns, ev.message, attrs)

    def _on_model_load(self, record: Record, ev: ModelLoadFailed) -> None:
        message = f"{ev.exception_type}: {ev.message}" if ev.exception_type else ev.message
        attrs = {"exception.type": ev.exception_type} if ev.exception_type else {}
        self._incident(record, "model_load", "model_load", record.ts_ns, message, attrs)

    def _on_nccl(self, record: Record, ev: NcclTimeout) -> None:
        # Held for one line: the next one usually says what may have caused it.
        self._pending_nccl = (record, ev)

    def _on_nccl_hint(self, record: Record, ev: NcclHint) -> None:
        if self._pending_nccl is None:
            self.stats.orphan_lines += 1
            return
        self._flush_nccl(ev)

    def _flush_nccl(self, hint: NcclHint | None) -> None:
        record, ev = self._pending_nccl
        self._pending_nccl = None
        attrs = {"vllm.nccl.rank": ev.rank, "vllm.nccl.timeout_s": ev.after_s}
        if hint is not None:
            attrs["vllm.incident.causes"] = hint.causes
        start = max(0, record.ts_ns - int(ev.after_s * _NS))  # as build does: never before 1970
        self._incident(record, "nccl_timeout", "distributed", start, ev.message, attrs)

    def _incident(self, record: Record, kind: str, error_type: str, start_ns: int, message: str, attrs: dict) -> None:
        prev_ts, n = self._last_incident
        n = n + 1 if prev_ts == record.ts_ns else 0
        self._last_incident = (record.ts_ns, n)
        affected = list(self._in_flight)
        event = SpanEvent("vllm.engine.incident", record.ts_ns, {
            "error.type": error_type, "vllm.incident.kind": kind, "exception.message": message})
        for r in self._in_flight.values():
            r.add_event(event, False)
        self.stats.engine_incidents += 1
        self._emit(engine_timeline(
            self.source, kind, f"{record.ts_ns}.{n}", start_ns, record.ts_ns,
            error_type, message, attrs, affected, record.offset, record.end_offset))
