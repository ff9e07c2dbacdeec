"""What one occurrence of a request has shown so far: the state `requests` keeps and `build`
turns into a timeline. Its own module so that the state machine and the timeline builder both
depend on it and not on each other."""

from __future__ import annotations

from bridge.assemble.timeline import SpanEvent
from bridge.parse.events import GpuMemory, PluginTimes, QueueState, RequestSummary, Scheduled
from bridge.core.position import GEN_SHIFT

EVENT_CAP = 32  # sampled events (KV blocks, gauges) kept per span; totals are attributes
BLOCK_EVENTS_KEPT = 8 * EVENT_CAP  # spread over the phases later, EVENT_CAP per span
# Which start lines a request has shown: a second one of the same kind is a new request (a
# client that resends its X-Request-Id).
SEEN_RECEIVED, SEEN_DETAILS = 1, 2


def fan_out(requests, event: SpanEvent, free_ratio: float | None = None, gpu_ratio: float | None = None) -> None:
    """An engine-wide gauge's event on every request in flight (one shared, read-only object,
    capped as `add_event`), and the least free KV ratio and the highest GPU use each saw. The
    commonest fan-out (every stats line × every request in flight): `add_event` inlined."""
    for r in requests:
        events = r.events
        if events is not None and len(events) < EVENT_CAP:
            events.append(event)
        elif events is None:
            r.events = [event]
        else:
            r.dropped += 1
        if free_ratio is not None and (r.min_free_ratio is None or free_ratio < r.min_free_ratio):
            r.min_free_ratio = free_ratio
        if gpu_ratio is not None and (r.max_gpu_ratio is None or gpu_ratio > r.max_gpu_ratio):
            r.max_gpu_ratio = gpu_ratio


def given(*pairs: tuple[str, object]) -> dict:
    """The (attribute, value) pairs a line gave: those whose value is not None, in order."""
    return {key: value for key, value in pairs if value is not None}


class Answer:
    """What the API server's lines said of the engine's ids and the answer of one request
    (upstream requests only: a seed log has none of these lines)."""

    __slots__ = ("added", "closed", "tokens")

    def __init__(self) -> None:
        self.added: set[str] = set()  # the engine-side ids `Added request` named
        # A stream's closing lines seen (`Generated response <id> (streaming complete)`): vLLM's
        # chat server logs one per choice, so n of them say the stream is over.
        self.closed = 0
        # A whole response's `details: output_token_ids` counts, one per logged choice: vLLM
        # logs a choice only when it has text, so they are the output only once all n are in.
        self.tokens: list[int] = []


class RequestState:
    """Everything one occurrence of a request has shown. Lists stay None until needed."""

    __slots__ = (
        "request_id", "occurrence", "first_ns", "last_ns", "first_offset", "last_offset",
        "schedules", "preemptions", "allocated", "freed", "held", "block_events", "block_dropped",
        "events", "dropped", "summary", "terminal_ns", "outcome", "error_type", "error_message",
        "timeout_after_s", "queue_at_schedule", "gpu_at_schedule", "min_free_ratio",
        "max_gpu_ratio", "last_free_ns", "release_ns", "extra", "sampled_preemptions", "idle_at",
        "seen", "answer", "seqs", "coarse_start", "times", "generation", "kv",
    )

    def __init__(self, request_id: str, occurrence: str, ts: int, offset: int) -> None:
        self.request_id = request_id
        self.occurrence = occurrence
        self.first_ns = self.last_ns = ts
        self.first_offset = self.last_offset = offset
        self.generation = offset >> GEN_SHIFT  # the file of its first line (the timeline names it)
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
        self.seen = 0                       # SEEN_* bits: start lines shown
        self.answer: Answer | None = None   # the API server's lines about its answer, from the first
        # n>1: the engine's child sequences (`<i>_<id>`) the plugin's lines named, by index →
        # (end ns, their own summary) once finished, else None. One root for the client's request.
        self.seqs: dict | None = None
        # The first line was stamped to the second only (vLLM's header): a more precise line
        # about the request may say when within that second it began (build).
        self.coarse_start = False
        self.times: PluginTimes | None = None  # vLLM's own phase stamps, from the plugin's end line
        self.kv = None  # kvlines.KvState: a disaggregated request's KV lines (#34), else None

    def answered(self) -> Answer:
        """Its `Answer`, made by the first line that adds to it."""
        if self.answer is None:
            self.answer = Answer()
        return self.answer

    @property
    def engine_ids(self) -> set[str] | tuple:
        """The engine-side ids `Added request` named (empty: not added yet)."""
        return self.answer.added if self.answer is not None else ()

    @property
    def streams_closed(self) -> int:
        return self.answer.closed if self.answer is not None else 0

    def set(self, key: str, value) -> None:
        if self.extra is None:
            self.extra = {}
        self.extra[key] = value

    def add_event(self, event: SpanEvent, capped: bool) -> None:
        events = self.events
        if events is None:
            self.events = [event]
        elif capped and len(events) >= EVENT_CAP:
            self.dropped += 1
        else:
            events.append(event)

    def add_block_event(self, event: SpanEvent) -> None:
        events = self.block_events
        if events is None:
            self.block_events = [event]
        elif len(events) >= BLOCK_EVENTS_KEPT:
            self.block_dropped += 1
        else:
            events.append(event)
