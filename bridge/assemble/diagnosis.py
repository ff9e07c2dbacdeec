"""The seed guide's rules of thumb, as named findings on a request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Thresholds:
    ttft_s: float = 0.200           # above: scheduling or memory bottleneck
    itl_s: float = 0.050            # above: compute bound
    free_blocks_ratio: float = 0.10  # below: KV-cache memory pressure
    gpu_memory_ratio: float = 0.90   # above: GPU memory nearly full

    def __post_init__(self) -> None:
        for name in ("ttft_s", "itl_s", "free_blocks_ratio", "gpu_memory_ratio"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"threshold {name} must be a number >= 0, got {getattr(self, name)!r}")


def diagnose(
    t: Thresholds,
    ttft_s: float | None,
    itl_s: float | None,
    min_free_ratio: float | None,
    max_gpu_ratio: float | None,
    preemptions: int,
) -> list[str]:
    found = []
    if ttft_s is not None and ttft_s > t.ttft_s:
        found.append("slow_ttft")
    if itl_s is not None and itl_s > t.itl_s:
        found.append("slow_itl")
    if min_free_ratio is not None and min_free_ratio < t.free_blocks_ratio:
        found.append("memory_pressure")
    if max_gpu_ratio is not None and max_gpu_ratio > t.gpu_memory_ratio:
        found.append("gpu_memory_high")
    if preemptions:
        found.append("preempted")
    return found
