"""Typed events: the seam between the parse stage and the assemble stage.

One frozen, slotted dataclass per kind of line. Events carry only what the line says; when and
where the line was written travels beside them in the decode stage's `Record`.
Sizes are in bytes and durations in seconds, whatever unit the line used.

`at_ns`: the event's own time when the line states it (the vLLM plugin's `, t=<unix s>.<µs>`,
taken where vLLM records the event): the assemble stage prefers it to the record's stamp,
which is a one-second header or the time a runtime read the line.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.parse.context import TraceContext


@dataclass(frozen=True, slots=True)
class PluginTimes:
    """vLLM's own stamps of a request's phases, as the vLLM plugin's API-server line carries them
    (`arrival=`, `queued_at=`, … on the summary or `ended` line), unix ns; None: not stamped."""

    arrival_ns: int | None = None
    queued_ns: int | None = None
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    # (PREEMPTED, the SCHEDULED that ended it or None) per preemption
    preempted: tuple[tuple[int, int | None], ...] = ()
    caller: TraceContext | None = None  # the request's own valid W3C traceparent
    tracestate: str | None = None
    n: int | None = None  # an n>1 child's: how many children its client request has (`n=`)
    # vLLM's engine id of the request (`internal_id=`, `Added request <it>`), when it is not the
    # line's id: what tells apart two requests in flight at once under one X-Request-Id
    internal_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """The request finished; vLLM measured its durations."""

    request_id: str
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    itl_s: float
    e2e_s: float
    at_ns: int | None = None
    times: PluginTimes | None = None


@dataclass(frozen=True, slots=True)
class RequestEnded:
    """The vLLM plugin's line for a request that did not complete (`finish=abort`, `error`, …)."""

    request_id: str
    finish: str
    prompt_tokens: int
    generated_tokens: int
    e2e_s: float
    at_ns: int | None = None
    times: PluginTimes | None = None


@dataclass(frozen=True, slots=True)
class Scheduled:
    request_id: str
    priority: int
    blocks: int
    remaining_blocks: int
    # Time in the engine's own queue, when the line reports it (the vLLM plugin's `, queued=…`):
    # what vLLM's native tracing calls gen_ai.latency.time_in_queue.
    queued_s: float | None = None
    at_ns: int | None = None
    internal_id: str | None = None  # the plugin's `, internal_id=` (PluginTimes.internal_id)


@dataclass(frozen=True, slots=True)
class Preempted:
    request_id: str
    reason: str
    blocks: int
    at_ns: int | None = None
    internal_id: str | None = None  # the plugin's `, internal_id=` (PluginTimes.internal_id)


@dataclass(frozen=True, slots=True)
class QueueState:
    running: int
    waiting: int
    free_blocks: int
    total_blocks: int


@dataclass(frozen=True, slots=True)
class BlockAllocated:
    block: str
    request_id: str
    size_bytes: int
    at_ns: int | None = None


@dataclass(frozen=True, slots=True)
class BlockFreed:
    """One block freed (`Freed block …`), or `count` at once (`Freed <n> blocks for request …`,
    the vLLM plugin's one line per request when per-block lines are off); then `block` is ""."""

    block: str
    request_id: str
    reason: str
    count: int = 1
    at_ns: int | None = None
    internal_id: str | None = None  # the plugin's `, internal_id=` (PluginTimes.internal_id)


@dataclass(frozen=True, slots=True)
class GpuMemory:
    used_bytes: int
    total_bytes: int
    utilization: float
    cache_bytes: int
    kv_blocks_used: int
    kv_blocks_total: int


@dataclass(frozen=True, slots=True)
class CudaOom:
    """Engine-wide: the allocator gave up; no request is named."""

    requested_bytes: int | None
    message: str


@dataclass(frozen=True, slots=True)
class AllocationFailed:
    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class RequestTimedOut:
    """Either timeout line; `after_s` is known only from the scheduler's wording."""

    request_id: str
    after_s: float | None
    message: str


@dataclass(frozen=True, slots=True)
class ModelLoadFailed:
    exception_type: str
    message: str


@dataclass(frozen=True, slots=True)
class NcclTimeout:
    rank: int
    after_s: float
    message: str


@dataclass(frozen=True, slots=True)
class NcclHint:
    """The `Possible causes: …` line that follows an NCCL timeout."""

    causes: str


# -- disaggregated prefill/decode: the KV cache moved between two engines ---------------------
# The vLLM plugin's two lines (bridge/vllm_plugin/kv.py) and the NIXL connector's own. Ids:
# `request_id` is the API server's id (as the plugin's other lines), `engine_request_id` vLLM's
# `<id>-<8 hex>`, which the prefill hands the decode as `kv_transfer_params.remote_request_id`.


@dataclass(frozen=True, slots=True)
class KvReceived:
    """The decode's scheduler moved the request out of WAITING_FOR_REMOTE_KVS (`KV received for
    request …`): its KV cache arrived from the prefill (`ok`) or failed to. `waiting_since_ns`:
    the blocks were allocated for the load; `arrived_ns`: the worker reported it done; `at_ns`:
    the scheduler moved it on. None: the line did not say."""

    request_id: str
    engine_request_id: str
    remote_request_id: str | None
    remote_engine_id: str | None
    blocks: int
    ok: bool
    waiting_since_ns: int | None = None
    arrived_ns: int | None = None
    at_ns: int | None = None


@dataclass(frozen=True, slots=True)
class KvReleased:
    """The prefill freed the blocks it held for the decode (`KV blocks released for request …`):
    read by the decode, or the lease expired (then `KvLeaseExpired` names the same engine id).
    `held_since_ns`: the prefill's request ended and its connector kept the blocks. `engine_id`:
    the prefill engine's KV engine id (the decode's `remote_engine_id`), from plugins that write it."""

    request_id: str
    engine_request_id: str
    blocks: int
    held_since_ns: int | None = None
    at_ns: int | None = None
    engine_id: str | None = None


@dataclass(frozen=True, slots=True)
class KvLeaseExpired:
    """NIXL (worker, WARNING): `Releasing expired KV blocks for request <eid> which were retrieved
    by <n> remote worker(s) before lease expired.` — the prefill gave up waiting for the decode."""

    engine_request_id: str
    readers: int


@dataclass(frozen=True, slots=True)
class KvBlocksInvalid:
    """NIXL (worker, ERROR): `Potentially invalid KV blocks for unrecognized request <eid> were
    retrieved by a decode worker.` — a decode read blocks the prefill had already released."""

    engine_request_id: str


@dataclass(frozen=True, slots=True)
class KvTransferFailed:
    """NIXL (worker, ERROR): `NIXL transfer failure: <type>[. <msg>] | Context: {…}` (base_worker.py
    `_log_failure`): a failed handshake, read or notification. A connector's failure, not the
    engine's: on the request it names (`engine_request_id`, the decode's; `remote_request_id`
    the prefill's), or on none (`handshake_setup_failed`: the requests waiting on it fail next,
    each with its own line). `failure` is the type word only, never the free text after it;
    `cause` the class of the exception whose traceback the line carries (`zmq.error.Again`), not
    its message."""

    failure: str
    engine_request_id: str | None = None
    remote_request_id: str | None = None
    remote_engine_id: str | None = None
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class KvLoadFailed:
    """The scheduler (ERROR) fails the requests whose KV load failed (scheduler.py
    `_handle_invalid_blocks`, `kv_load_failure_policy=fail`, the default): `Failing <n> request(s)
    due to KV load failure (failure_policy=fail, <t> tokens affected). Request IDs: {…}` — their
    engine request ids; each then finishes with `FINISHED_ERROR`. A failure of those requests,
    not of the engine."""

    engine_request_ids: tuple[str, ...]
    tokens: int | None = None


@dataclass(frozen=True, slots=True)
class KvTransferMetrics:
    """`KV Transfer metrics: k=v, …` (kv_connector/v1/metrics.py, every stats interval, per engine):
    the connector's aggregate over the interval, never per request. Durations in seconds, sizes in
    bytes; None: the line had no such field (another connector's)."""

    transfers: int | None = None
    avg_xfer_s: float | None = None
    p90_xfer_s: float | None = None
    avg_post_s: float | None = None
    p90_post_s: float | None = None
    avg_bytes: int | None = None
    throughput_bps: float | None = None    # bytes per second (vLLM's `Throughput (MB/s)`, MiB)
    avg_descriptors: float | None = None
    failed: int | None = None
    failed_recvs: int | None = None        # mooncake's
    expired: int | None = None
    notifs_after_expiry: int | None = None


# -- upstream vLLM (reference/vllm-log-formats.md) ------------------------------------------
# Never a prompt, prompt token ids or generated text: only ids, numbers and enum-like words.


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """`Received request X: [prompt: …,] params: SamplingParams(…), …` — the params only."""

    request_id: str
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    n: int | None
    lora: str | None
    # A disaggregated request's `extra_args={'kv_transfer_params': {…}}`: `prefill` when it asks
    # for a remote decode (`do_remote_decode: True`), `decode` when its KV comes from a remote
    # prefill (`do_remote_prefill: True`), then with the prefill's engine and engine request id.
    pd_role: str | None = None
    remote_request_id: str | None = None
    remote_engine_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestDetails:
    """DEBUG `Request X details: prompt: '…', prompt_token_ids: […], …` — the count of ids only."""

    request_id: str
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class RequestAdded:
    request_id: str  # V1 ≥ 0.14 prints the internal `<external id>-<8 hex>`


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """V0 AsyncLLMEngine in-process only; V1 and V0 multiprocess never print it."""

    request_id: str


@dataclass(frozen=True, slots=True)
class RequestsAborted:
    """`Aborted request X.`, `Aborted request(s) a,b.` or V1's `Request X aborted.`"""

    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """V1 `Request X failed (…)`, V0 `Failing the request X because …`."""

    request_id: str
    error_type: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestWaiting:
    """The engine's scheduler holds a request back in a waiting state (V1 scheduler.py, DEBUG
    `<id> is still in WAITING_FOR_REMOTE_KVS state.`: a disaggregated decode waits for the
    prefill's KV cache). Evidence that the request is in this engine; no phase boundary (the
    line repeats every scheduler step)."""

    request_id: str
    state: str


@dataclass(frozen=True, slots=True)
class ResponseGenerated:
    """`Generated response X: output: …, output_token_ids: […], finish_reason: R` — no text kept."""

    request_id: str
    finish_reason: str | None  # None on a streaming delta that did not end the request
    output_tokens: int | None
    streaming: str             # "", "delta" or "complete"


@dataclass(frozen=True, slots=True)
class SequencePreempted:
    """V0's preemption warning: logged on the 1st and every 50th preemption only."""

    request_id: str
    mode: str
    cumulative: int


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The periodic stats line, V0 or V1; a field is None when that version does not print it."""

    engine: str | None
    prompt_throughput: float | None
    generation_throughput: float | None
    running: int | None
    waiting: int | None        # V0 `Pending`
    swapped: int | None
    deferred: int | None
    preemptions: int | None
    corrupted: int | None
    gpu_kv_usage: float | None  # ratios, 0..1
    cpu_kv_usage: float | None
    prefix_cache_hit_rate: float | None
    external_prefix_cache_hit_rate: float | None
    mm_cache_hit_rate: float | None
    # `KV fetch: <a> waiting to start, <b> in progress, <c> completed waiting` (0.32+, a KV
    # connector's requests by stage of their remote load; printed only when one is non-zero)
    kv_fetch_waiting: int | None = None
    kv_fetch_in_progress: int | None = None
    kv_fetch_completed: int | None = None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The startup banner: `Initializing a V1 LLM engine (v0.11.0) with config: model='…', …`."""

    version: str
    engine: str  # "V0", "V1" or "" (≤ v0.7 did not say)
    model: str | None
    data_parallel: int = 1  # data_parallel_size: engines that each log their own stats lines


@dataclass(frozen=True, slots=True)
class StartupFact:
    """A startup line's numbers, as attribute names of the `vllm.startup` span."""

    facts: tuple[tuple[str, str | int | float], ...]
    #: the API server's line as it begins to listen: the end of a start, which opens a span only
    #: where no start was read before it (a second API server's, after requests came, opens none)
    listening: bool = False


#: The fact that names the model as clients send it (`--served-model-name`, the API server's
#: args): it wins over a model named otherwise (the logo's `args.model`), whatever came first.
SERVED_MODEL = "vllm.startup.served_model_name"
#: The loader's time to read the weights (`Loading weights took … seconds`): the start's load time
#: (`vllm.startup.load_s`) only where the model runner's whole-load line was never said.
WEIGHTS_READ_S = "vllm.startup.weights_read_s"


@dataclass(frozen=True, slots=True)
class EngineError:
    """An error line or a joined traceback / C++ block, classified into `error.type`."""

    error_type: str       # oom | timeout | aborted | engine_dead | input | distributed | model_load | other
    exception_type: str
    message: str
    fatal: bool           # the engine (or a worker it needs) is gone: requests in flight are lost
    stacktrace: str
    exited: bool = False  # ENGINE_EXITED: the engine core process died, even amid a stop
    #: what the type rests on: `said` (the error's own words), `signal` (a death by a signal:
    #: a negative exit code, SIG…, a fatal signal), `frames` (only where its traceback was raised),
    #: `rpc` (a worker's call raised, no cause said: the batch's while serving, the start's while
    #: the engine starts, which the assembler knows)
    basis: str = "said"
    #: the worker process the line says died, as vLLM names it (the executor's monitor:
    #: `Worker proc VllmWorker-1 died …` → "VllmWorker-1"; V0: `VllmWorkerProcess pid=1159`)
    worker: str = ""
    #: the writer repeats the line every this many seconds while the condition lasts (vLLM's
    #: shm_broadcast warns again at each interval of a hang): no quiet of that length ends it.
    repeats_s: float = 0.0
    #: the engine core process the line says died, as vLLM names it (the client's monitor,
    #: core_client.py: `Engine core proc EngineCore_DP1 died unexpectedly, shutting down client.`
    #: → "EngineCore_DP1"): the API server writes it, often with no prefix to say so
    core: str = ""


#: What vLLM's API server logs when its engine core process died under it (core_client.py:818):
#: a death even when a `[shutdown]` line came first (the process manager's clean-up can print
#: before the monitor's warning), never part of a deliberate stop.
ENGINE_EXITED = "[shutdown] MPClient: engine core exited unexpectedly"


@dataclass(frozen=True, slots=True)
class ServerStop:
    """A line of the server's shutdown sequence (vLLM's `[shutdown] …`, uvicorn's `Shutting down`).

    `phase`: `signal`, a stop was asked for (SIGTERM/SIGINT reached the API server or the engine
    core); `in_flight`, the engine core counts the requests it aborts or drains (`in_flight`);
    `drained`, the engine core holds no request any more (finished, or aborted in `abort` mode); `server`, the HTTP server or the process
    manager winds down, which is a deliberate stop only when no engine death came before it
    (vLLM also stops the server after its engine died)."""

    phase: str
    in_flight: int | None = None
    mode: str = ""  # `abort` or `drain` (vLLM's shutdown_timeout 0 or not), when the line says


@dataclass(frozen=True, slots=True)
class AccessLog:
    """uvicorn's access line. No request id and no timestamp: recognised, not joined."""

    method: str
    path: str
    status: int


@dataclass(frozen=True, slots=True)
class Notice:
    """A recognised line with nothing to assemble: startup chatter, progress bars, server noise."""

    kind: str


@dataclass(frozen=True, slots=True)
class RuleEvent:
    """A line a user rule (`--rules`) took as a span event: on its request, or, with no request
    id, on every request in flight; `span_attributes` go on the request's root span."""

    request_id: str | None
    name: str
    attributes: tuple[tuple[str, str | int | float | bool], ...]
    span_attributes: tuple[tuple[str, str | int | float | bool], ...] = ()


@dataclass(frozen=True, slots=True)
class Stamped:
    """An event whose line carried its own time (a rule's `time` group): it replaces the record's
    stamp, which for a foreign line is only the last vLLM header seen."""

    ts_ns: int
    event: object


Event = (
    RequestSummary
    | RequestEnded
    | Scheduled
    | Preempted
    | QueueState
    | BlockAllocated
    | BlockFreed
    | GpuMemory
    | CudaOom
    | AllocationFailed
    | RequestTimedOut
    | ModelLoadFailed
    | NcclTimeout
    | NcclHint
    | KvReceived
    | KvReleased
    | KvLeaseExpired
    | KvBlocksInvalid
    | KvTransferFailed
    | KvLoadFailed
    | KvTransferMetrics
    | RequestReceived
    | RequestDetails
    | RequestAdded
    | RequestFinished
    | RequestsAborted
    | RequestFailed
    | RequestWaiting
    | ResponseGenerated
    | SequencePreempted
    | EngineStats
    | EngineConfig
    | StartupFact
    | EngineError
    | ServerStop
    | AccessLog
    | Notice
    | RuleEvent
    | Stamped
)

#: The stable name of each kind, used in counters and reports.
KIND = {
    RequestSummary: "request_summary",
    RequestEnded: "request_ended",
    Scheduled: "scheduling",
    Preempted: "preemption",
    QueueState: "queue_state",
    BlockAllocated: "block_alloc",
    BlockFreed: "block_free",
    GpuMemory: "gpu_memory",
    CudaOom: "cuda_oom",
    AllocationFailed: "alloc_failed",
    RequestTimedOut: "request_timeout",
    ModelLoadFailed: "model_load",
    NcclTimeout: "nccl_timeout",
    NcclHint: "nccl_hint",
    KvReceived: "kv_received",
    KvReleased: "kv_released",
    KvLeaseExpired: "kv_lease_expired",
    KvBlocksInvalid: "kv_blocks_invalid",
    KvTransferFailed: "kv_transfer_failed",
    KvLoadFailed: "kv_load_failed",
    KvTransferMetrics: "kv_transfer_metrics",
    RequestReceived: "request_received",
    RequestDetails: "request_details",
    RequestAdded: "request_added",
    RequestFinished: "request_finished",
    RequestsAborted: "request_aborted",
    RequestFailed: "request_failed",
    RequestWaiting: "request_waiting",
    ResponseGenerated: "response_generated",
    SequencePreempted: "sequence_preempted",
    EngineStats: "engine_stats",
    EngineConfig: "engine_config",
    StartupFact: "startup",
    EngineError: "engine_error",
    ServerStop: "server_stop",
    AccessLog: "http_access",
    RuleEvent: "rule_event",
    # Notice counts under its own `kind`: startup_info, http_server, noise, …
}
