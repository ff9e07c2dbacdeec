"""The seed dialect's lines (DESIGN.md §1) → the events they state, written out by hand."""

from dataclasses import astuple

import pytest

from bridge.parse import MALFORMED, Parser, parse_message
from bridge.parse.events import (
    AllocationFailed, BlockAllocated, BlockFreed, CudaOom, GpuMemory, ModelLoadFailed, NcclHint,
    NcclTimeout, Preempted, QueueState, RequestSummary, RequestTimedOut, Scheduled,
)

CASES = [
    ("Request 0x7f8c4a001b20: prompt_tokens=128, generated_tokens=256, ttft=45.2ms, itl=12.3ms, total_latency=3.2s",
     RequestSummary("0x7f8c4a001b20", 128, 256, 0.0452, 0.0123, 3.2)),
    ("Scheduling request 0x7f8c4a001b20: priority=0, num_scheduled_blocks=4, remaining_blocks=2",
     Scheduled("0x7f8c4a001b20", 0, 4, 2)),
    # the vLLM plugin adds the engine's own queue time
    ("Scheduling request cmpl-a-0: priority=0, num_scheduled_blocks=1, remaining_blocks=10, queued=0.020ms",
     Scheduled("cmpl-a-0", 0, 1, 10, 0.02 / 1000)),
    ("Preempting request 0x7f8c4a001b30: reason=long_context, preempted_blocks=3",
     Preempted("0x7f8c4a001b30", "long_context", 3)),
    ("Running queue: 3 requests, waiting queue: 5 requests, free blocks: 12/64", QueueState(3, 5, 12, 64)),
    ("Allocated block 0x7f8c4a003200 for request 0x7f8c4a001b20, size=16KB",
     BlockAllocated("0x7f8c4a003200", "0x7f8c4a001b20", 16000)),
    ("Freed block 0x7f8c4a003200 for request 0x7f8c4a001b20, reason=completed",
     BlockFreed("0x7f8c4a003200", "0x7f8c4a001b20", "completed")),
    # the vLLM plugin's one line per finished request when per-block lines are off
    ("Freed 25 blocks for request cmpl-a-0, reason=completed", BlockFreed("", "cmpl-a-0", "completed", 25)),
    ("GPU memory usage: 14.2GB/16.0GB (88.75%), cache usage: 8.1GB, kv_cache blocks: 512/640",
     GpuMemory(14_200_000_000, 16_000_000_000, 0.8875, 8_100_000_000, 512, 640)),
    ("CUDA out of memory. Tried to allocate 256MB for kv_cache block",
     CudaOom(256_000_000, "CUDA out of memory. Tried to allocate 256MB for kv_cache block")),
    ("Failed to allocate memory for request 0x7f8c4a001b20",
     AllocationFailed("0x7f8c4a001b20", "Failed to allocate memory for request 0x7f8c4a001b20")),
    ("Request 0x7f8c4a001b20 timed out after 30s",
     RequestTimedOut("0x7f8c4a001b20", 30.0, "Request 0x7f8c4a001b20 timed out after 30s")),
    ("Request timeout: 0x7f8c4a001b20", RequestTimedOut("0x7f8c4a001b20", None, "Request timeout: 0x7f8c4a001b20")),
    ("Failed to load model: FileNotFoundError: No such file or directory: '/models/llama-2-7b/pytorch_model.bin'",
     ModelLoadFailed("FileNotFoundError", "No such file or directory: '/models/llama-2-7b/pytorch_model.bin'")),
    ("NCCL timeout: rank 2 failed to synchronize after 30s",
     NcclTimeout(2, 30.0, "NCCL timeout: rank 2 failed to synchronize after 30s")),
    ("Possible causes: network congestion, GPU hang, or NCCL version mismatch",
     NcclHint("network congestion, GPU hang, or NCCL version mismatch")),
]


@pytest.mark.parametrize("message,expected", CASES, ids=[type(e).__name__ for _, e in CASES])
def test_seed_lines(message, expected):
    got = parse_message(message)
    assert type(got) is type(expected)
    assert astuple(got) == pytest.approx(astuple(expected))


def test_units_are_normalised():
    ev = parse_message("Request r1: prompt_tokens=1, generated_tokens=2, ttft=1500us, itl=0.02s, total_latency=3200ms")
    assert (ev.ttft_s, ev.itl_s, ev.e2e_s) == pytest.approx((0.0015, 0.02, 3.2))
    assert parse_message("Allocated block b for request r, size=2MiB").size_bytes == 2 * 1024 * 1024


def test_near_misses_are_malformed_and_others_unrecognised():
    assert parse_message("Scheduling request 0x1: priority=high") is MALFORMED
    assert parse_message("Freed some blocks for request r") is MALFORMED
    assert parse_message("Avg prompt throughput: 1.0 tokens/s") is None
    assert parse_message("") is None


def test_parser_counts_add_up():
    p = Parser()
    for message, _ in CASES:
        p(message)
    p("Scheduling request x: nonsense")
    p("hello")
    s = p.snapshot()
    assert s.lines == len(CASES) + 2
    assert s.recognised == len(CASES) and s.unrecognised == 1 and sum(s.malformed.values()) == 1
    assert s.by_kind["request_timeout"] == 2


@pytest.mark.parametrize("fast", [True, False], ids=["default", "python"])
def test_numbers_too_big_for_a_float_are_malformed_not_a_crash(fast):
    big = "9" * 400
    p = Parser() if fast else Parser(fast=None)
    for msg in (f"Allocated block b for request r, size={big}KB",
                f"Request r: prompt_tokens=1, generated_tokens=2, ttft={big}ms, itl=1ms, total_latency=1s",
                f"GPU memory usage: {big}GB/16.0GB (88.75%), cache usage: 8.1GB, kv_cache blocks: 512/640",
                f"NCCL timeout: rank 2 failed to synchronize after {big}s"):
        assert p(msg) is None, msg
    assert sum(p.snapshot().malformed.values()) == 4 and p.stats.lines == 4
