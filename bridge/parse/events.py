"""Typed events: the seam between the parse stage and the assemble stage.

One frozen, slotted dataclass per kind of line. Events carry only what the line says; when and
where the line was written travels beside them in the decode stage's `Record`.
Sizes are in bytes and durations in seconds, whatever unit the line used.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """The request finished; vLLM measured its durations."""

    request_id: str
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    itl_s: float
    e2e_s: float


@dataclass(frozen=True, slots=True)
class Scheduled:
    request_id: str
    priority: int
    blocks: int
    remaining_blocks: int


@dataclass(frozen=True, slots=True)
class Preempted:
    request_id: str
    reason: str
    blocks: int


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


@dataclass(frozen=True, slots=True)
class BlockFreed:
    block: str
    request_id: str
    reason: str


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


Event = (
    RequestSummary
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
)

#: The stable name of each kind, used in counters and reports.
KIND = {
    RequestSummary: "request_summary",
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
}
