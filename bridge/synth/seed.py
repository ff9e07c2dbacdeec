"""Seed-dialect logs written from a known ground truth, for tests, benchmarks and the sample.

The generator decides every request's true lifecycle first (arrival, scheduling, preemptions,
first token, finish, block frees, errors) and only then writes the lines that lifecycle would
produce. Tests compare what the bridge rebuilds from the lines against this truth, so the
truth never comes from the code under test.
"""

from __future__ import annotations

import calendar
import random
import time
from dataclasses import dataclass, field
from typing import TextIO

_NS = 1_000_000_000
_MS = 1_000_000


@dataclass(slots=True)
class TruthRequest:
    request_id: str
    arrival_ns: int
    outcome: str                     # finished | timeout | failed | incomplete
    error_type: str | None = None
    schedules: list[int] = field(default_factory=list)
    preemptions: list[tuple[int, int]] = field(default_factory=list)  # (preempted, rescheduled)
    first_token_ns: int | None = None
    finish_ns: int | None = None      # the summary line / the timeout / the failure
    last_free_ns: int | None = None
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None
    blocks_allocated: int = 0
    blocks_freed: int = 0
    first_line_ns: int = 0

    @property
    def queue_s(self) -> float | None:
        return (self.schedules[0] - self.arrival_ns) / _NS if self.schedules else None


@dataclass(slots=True)
class TruthIncident:
    kind: str       # nccl_timeout | cuda_oom | model_load
    start_ns: int
    ts_ns: int


@dataclass(slots=True)
class Truth:
    requests: list[TruthRequest]
    incidents: list[TruthIncident]
    lines: int
    year: int


@dataclass(frozen=True, slots=True)
class SynthConfig:
    requests: int = 60
    seed: int = 1
    start: str = "2025-02-15T10:23:00"   # UTC
    mean_interarrival_s: float = 0.25
    preempt_ratio: float = 0.2
    timeout_ratio: float = 0.03
    oom_failures: int = 1
    nccl_incidents: int = 1
    model_load_failure: bool = True
    incomplete_tail: int = 2            # requests still running when the log ends
    cri: bool = False                   # CRI-framed (containerd) with nanosecond stamps
    cri_partial_ratio: float = 0.05     # CRI lines split into a P and an F part
    noise_ratio: float = 0.02           # unrelated lines (uvicorn access lines) mixed in
    total_blocks: int = 512
    timeout_s: int = 30
    reuse_ratio: float = 0.5            # chance a new request takes a freed address (when one is free)


class _Lines:
    def __init__(self) -> None:
        self.items: list[tuple[int, int, str, str, str]] = []
        self._seq = 0

    def add(self, ts: int, level: str, origin: str, message: str) -> None:
        self._seq += 1
        self.items.append((ts, self._seq, level, origin, message))


def _fmt_dur_ms(s: float) -> str:
    return f"{s * 1000:.1f}ms"


def generate(cfg: SynthConfig) -> tuple[list[tuple[int, int, str, str, str]], Truth]:
    """Lines (ts, seq, level, origin, message) in write order, and the truth behind them."""
    rng = random.Random(cfg.seed)
    t0 = calendar.timegm(time.strptime(cfg.start, "%Y-%m-%dT%H:%M:%S")) * _NS
    out = _Lines()
    truth: list[TruthRequest] = []
    incidents: list[TruthIncident] = []
    free_ids: list[str] = []
    next_id = 0
    next_block = 0
    holds: list[tuple[int, int, int]] = []  # (from, to, blocks) for the gauges

    if cfg.model_load_failure:
        ts = t0 - 20 * _NS
        out.add(ts, "ERROR", "model_loader.py:150",
                "Failed to load model: FileNotFoundError: No such file or directory: '/models/llama-2-7b/pytorch_model.bin'")
        incidents.append(TruthIncident("model_load", ts, ts))

    n = cfg.requests
    special = list(range(n - cfg.incomplete_tail))
    rng.shuffle(special)
    n_timeout = max(1, round(n * cfg.timeout_ratio)) if cfg.timeout_ratio else 0
    timeouts = set(special[:n_timeout])
    failures = set(special[n_timeout:n_timeout + cfg.oom_failures])
    incomplete = set(range(n - cfg.incomplete_tail, n))

    arrival = t0
    pending_release: list[tuple[int, str]] = []  # (time the id is free again, id)
    for i in range(n):
        arrival += int(rng.expovariate(1 / cfg.mean_interarrival_s) * _NS) // 1000 * 1000
        pending_release.sort()
        while pending_release and pending_release[0][0] < arrival:
            free_ids.append(pending_release.pop(0)[1])
        if free_ids and rng.random() < cfg.reuse_ratio:
            rid = free_ids.pop()  # an address reused, as CPython reuses freed objects
        else:
            rid = f"0x7f8c4a{0x001000 + 0x10 * next_id:06x}"
            next_id += 1
        r = TruthRequest(rid, arrival, "finished")
        truth.append(r)

        def alloc(ts: int, k: int) -> list[str]:
            nonlocal next_block
            blocks = []
            for j in range(k):
                b = f"0x7f8c4b{(next_block % 0xFFFFF) * 0x10:06x}"
                next_block += 1
                out.add(ts + j * 1000, "INFO", "memory.py:123", f"Allocated block {b} for request {rid}, size=16KB")
                blocks.append(b)
            r.blocks_allocated += k
            return blocks

        def free(ts: int, blocks: list[str], reason: str) -> int:
            for j, b in enumerate(blocks):
                out.add(ts + j * 1000, "INFO", "memory.py:145", f"Freed block {b} for request {rid}, reason={reason}")
            r.blocks_freed += len(blocks)
            return ts + max(0, len(blocks) - 1) * 1000

        def schedule(ts: int, k: int) -> list[str]:
            r.schedules.append(ts)
            out.add(ts, "INFO", "scheduler.py:234",
                    f"Scheduling request {rid}: priority=0, num_scheduled_blocks={k}, remaining_blocks={rng.randint(0, 8)}")
            return alloc(ts + 1000, k)

        k = rng.randint(1, 6)
        r.prompt_tokens = rng.randint(16, 2048)

        if i in timeouts:
            # Stuck: maybe scheduled, never a first token; both timeout lines at arrival + timeout.
            held: list[str] = []
            if rng.random() < 0.5:
                held = schedule(arrival + rng.randint(10, 300) * _MS, k)
            end = arrival + cfg.timeout_s * _NS
            out.add(end, "WARNING", "scheduler.py:450", f"Request {rid} timed out after {cfg.timeout_s}s")
            out.add(end + 200_000, "ERROR", "api_server.py:200", f"Request timeout: {rid}")
            r.outcome, r.error_type, r.finish_ns = "timeout", "timeout", end
            if held:
                r.last_free_ns = free(end + _MS, held, "timeout")
            holds.append((r.schedules[0] if r.schedules else end, end, len(held)))
            pending_release.append((end + 10 * _NS, rid))
            r.first_line_ns = r.schedules[0] if r.schedules else end
            continue

        if i in failures:
            ts = arrival + rng.randint(10, 200) * _MS
            r.schedules.append(ts)
            out.add(ts, "INFO", "scheduler.py:234",
                    f"Scheduling request {rid}: priority=0, num_scheduled_blocks={k}, remaining_blocks=0")
            held = alloc(ts + 1000, 1)
            out.add(ts + 2 * _MS, "ERROR", "memory.py:300", "CUDA out of memory. Tried to allocate 256MB for kv_cache block")
            incidents.append(TruthIncident("cuda_oom", ts + 2 * _MS, ts + 2 * _MS))
            end = ts + 3 * _MS
            out.add(end, "ERROR", "scheduler.py:400", f"Failed to allocate memory for request {rid}")
            r.outcome, r.error_type, r.finish_ns = "failed", "oom", end
            r.last_free_ns = free(end + _MS, held, "failed")
            holds.append((ts, end, 1))
            pending_release.append((end + 10 * _NS, rid))
            r.first_line_ns = ts
            continue

        queue = rng.randint(5, 400) * _MS + rng.randint(0, 999) * 1000
        sched0 = arrival + queue
        prefill = rng.randint(10, 260) * _MS + rng.randint(0, 999) * 1000
        first_token = sched0 + prefill
        tokens = rng.randint(16, 384)
        itl_ns = rng.randint(8_000, 60_000) * 1000
        finish = first_token + itl_ns * (tokens - 1)
        held = schedule(sched0, k)
        r.first_line_ns = sched0

        if rng.random() < cfg.preempt_ratio:
            stall = rng.randint(50, 600) * _MS
            if rng.random() < 0.3:  # during prefill: the first token comes later
                p = sched0 + rng.randint(2, max(3, prefill // _MS - 1)) * _MS
                first_token += stall
            else:                   # during decode
                p = first_token + rng.randint(1, max(2, (finish - first_token) // _MS - 1)) * _MS
            finish += stall
            pb = rng.randint(1, len(held))
            out.add(p, "INFO", "scheduler.py:256", f"Preempting request {rid}: reason=long_context, preempted_blocks={pb}")
            free(p + 1000, held[-pb:], "preempted")
            del held[-pb:]
            back = p + stall
            r.preemptions.append((p, back))
            r.schedules.append(back)
            out.add(back, "INFO", "scheduler.py:234",
                    f"Scheduling request {rid}: priority=0, num_scheduled_blocks={pb}, remaining_blocks={rng.randint(0, 8)}")
            held += alloc(back + 1000, pb)

        r.first_token_ns = first_token
        r.generated_tokens = tokens
        r.ttft_s = round((first_token - arrival) / _NS, 4)
        r.itl_s = round((finish - first_token) / (tokens - 1) / _NS, 4)
        r.e2e_s = round((finish - arrival) / _NS, 4)
        if i in incomplete:
            r.outcome = "incomplete"
            holds.append((sched0, finish, len(held)))
            continue
        r.finish_ns = finish
        out.add(finish, "INFO", "scheduler.py:789",
                f"Request {rid}: prompt_tokens={r.prompt_tokens}, generated_tokens={tokens}, "
                f"ttft={_fmt_dur_ms(r.ttft_s)}, itl={_fmt_dur_ms(r.itl_s)}, total_latency={r.e2e_s:.4f}s")
        r.last_free_ns = free(finish + rng.randint(1, 5) * _MS, held, "completed")
        holds.append((sched0, finish, k))
        pending_release.append((r.last_free_ns + _MS, rid))

    ends = [r.finish_ns or r.arrival_ns for r in truth]
    log_end = max(ends) + _NS
    # Requests left running: their lines stop with the log.
    for r in truth:
        if r.outcome == "incomplete":
            log_end = max(log_end, r.schedules[-1] + 2 * _NS)

    nccl_at = [t0 + int((log_end - t0) * (j + 1) / (cfg.nccl_incidents + 1)) // _NS * _NS + 123_456_000
               for j in range(cfg.nccl_incidents)]
    for ts in nccl_at:
        out.add(ts, "ERROR", "distributed.py:120", "NCCL timeout: rank 2 failed to synchronize after 30s")
        out.add(ts + 1000, "ERROR", "distributed.py:121",
                "Possible causes: network congestion, GPU hang, or NCCL version mismatch")
        incidents.append(TruthIncident("nccl_timeout", ts - 30 * _NS, ts))

    # Engine gauges every second, from what requests hold at that moment (a sweep over
    # start/end changes, so a million-line log stays quick to write).
    total = cfg.total_blocks
    changes: list[tuple[int, int, int, int]] = []  # (ts, running, blocks, waiting) deltas
    for a, b, k in holds:
        changes += [(a, 1, k, 0), (b, -1, -k, 0)]
    for r in truth:
        if r.schedules:
            changes += [(r.arrival_ns, 0, 0, 1), (r.schedules[0], 0, 0, -1)]
    changes.sort()
    running = blocks = waiting = 0
    j = 0
    for sec in range(t0 // _NS, log_end // _NS + 1):
        ts = sec * _NS + 500 * _MS
        while j < len(changes) and changes[j][0] <= ts:
            running += changes[j][1]
            blocks += changes[j][2]
            waiting += changes[j][3]
            j += 1
        free_blocks = max(0, total - blocks * 4)
        out.add(ts, "INFO", "scheduler.py:312",
                f"Running queue: {running} requests, waiting queue: {waiting} requests, free blocks: {free_blocks}/{total}")
        used = 6.0 + 10.0 * (total - free_blocks) / total
        out.add(ts + 1000, "INFO", "memory.py:200",
                f"GPU memory usage: {used:.1f}GB/16.0GB ({used / 16 * 100:.2f}%), cache usage: {used - 6:.1f}GB, "
                f"kv_cache blocks: {total - free_blocks}/{total}")
        if rng.random() < cfg.noise_ratio * 10:
            out.add(ts + 2000, "", "", '127.0.0.1:51408 - "POST /v1/completions HTTP/1.1" 200 OK')

    out.items.sort()
    year = time.gmtime(t0 / _NS).tm_year
    return out.items, Truth(truth, incidents, len(out.items), year)


def _header(ts: int, level: str, origin: str, message: str) -> str:
    if not level:
        return f"INFO:     {message}"
    return f"{level} {time.strftime('%m-%d %H:%M:%S', time.gmtime(ts // _NS))} {origin}] {message}"


def _cri_stamp(ts: int) -> str:
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(ts // _NS))}.{ts % _NS:09d}Z"


def write(lines, out: TextIO, cfg: SynthConfig) -> None:
    """Write lines as vLLM would (plain), or as containerd stores them (CRI)."""
    rng = random.Random(cfg.seed + 1)
    for ts, _, level, origin, message in lines:
        text = _header(ts, level, origin, message)
        if not cfg.cri:
            out.write(text + "\n")
            continue
        stream = "stdout"
        stamp = _cri_stamp(ts)
        if len(text) > 20 and rng.random() < cfg.cri_partial_ratio:
            cut = rng.randint(1, len(text) - 1)
            out.write(f"{stamp} {stream} P {text[:cut]}\n")
            out.write(f"{_cri_stamp(ts + 1000)} {stream} F {text[cut:]}\n")
        else:
            out.write(f"{stamp} {stream} F {text}\n")


def write_file(path: str, cfg: SynthConfig) -> Truth:
    lines, truth = generate(cfg)
    with open(path, "w", encoding="utf-8") as f:
        write(lines, f, cfg)
    return truth
