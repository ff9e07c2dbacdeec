"""The seed dialect's grammar: one vLLM message (header already removed) → one typed event.

`parse_message` is pure. A dispatch on the message's first four characters is the cheap
prefilter: most lines of a busy log are answered by one dict lookup, and only a candidate
line meets a regex. A candidate whose regex fails is *malformed*; anything else is
*unrecognised*. Neither is an error.
"""

from __future__ import annotations

import re

from bridge.decode.clock import MAX_NS
from bridge.parse.events import (
    AllocationFailed,
    BlockAllocated,
    BlockFreed,
    CudaOom,
    Event,
    GpuMemory,
    KvReceived,
    KvReleased,
    ModelLoadFailed,
    NcclHint,
    NcclTimeout,
    Preempted,
    QueueState,
    PluginTimes,
    RequestEnded,
    RequestSummary,
    RequestTimedOut,
    Scheduled,
)
from bridge.parse.context import TraceContext
from bridge.parse.numbers import count, fits, seconds

_ID = r"([^\s:,]+)"
_NUM = r"(\d+(?:\.\d+)?)"

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
# Divisors, not factors: 45.2 / 1000 is the float nearest 0.0452, 45.2 * 1e-3 is not.
_DURATION_DIVISORS = {"ns": 1e9, "us": 1e6, "µs": 1e6, "ms": 1e3, "s": 1.0, "": 1.0, "m": 1 / 60, "min": 1 / 60}


def size_bytes(number: str, unit: str) -> int:
    """`16`, `KB` → 16000. The seed writes KB/MB/GB; binary units are accepted too. ValueError
    beyond int64 (`numbers`), OverflowError when not finite."""
    return fits(int(float(number) * _SIZE_UNITS[unit.lower()]))


_SIZE_MEMO: dict[tuple[str, str], int] = {}  # a log repeats a handful of block sizes


def _size(number: str, unit: str | None) -> int:
    """`size_bytes`, remembered (bounded: cleared when full)."""
    key = (number, unit or "")
    n = _SIZE_MEMO.get(key)
    if n is None:
        if len(_SIZE_MEMO) >= 4096:
            _SIZE_MEMO.clear()
        n = _SIZE_MEMO[key] = size_bytes(number, unit or "")
    return n


def duration_s(number: str, unit: str) -> float:
    """Seconds; ValueError beyond `numbers.MAX_DURATION_S` (hundreds of digits: not finite)."""
    return seconds(float(number) / _DURATION_DIVISORS[unit])


_DUR = _NUM + r"\s*(ns|us|µs|ms|min|s|m)?"
_SIZE = _NUM + r"\s*([KMGT]i?B|B)?"
# The vLLM plugin's exact time of the event, after a line's last field: `, t=<unix seconds>.<µs>`.
_AT = r"(?:, t=(\d{1,12})(?:\.(\d{1,9}))?)?"


def _at_ns(seconds: str | None, fraction: str | None) -> int | None:
    """`1733090885`, `123456` → 1733090885123456000: exact, no float in between."""
    if seconds is None:
        return None
    ns = int(seconds) * 1_000_000_000 + (int(fraction.ljust(9, "0")) if fraction else 0)
    if ns > MAX_NS:  # a time OTLP cannot carry: the line is malformed (numbers.py's rule)
        raise ValueError(f"t={seconds}: beyond what a span can carry")
    return ns


_SUMMARY = re.compile(
    r"Request " + _ID + r": prompt_tokens=(\d+), generated_tokens=(\d+), "
    r"ttft=" + _DUR + r", itl=" + _DUR + r", total_latency=" + _DUR + _AT
)
_TIMED_OUT = re.compile(r"Request " + _ID + r" timed out(?: after " + _DUR + r")?")
_TIMEOUT_API = re.compile(r"Request timeout: " + _ID)
_SCHEDULING = re.compile(
    r"Scheduling request " + _ID + r": priority=(-?\d+), num_scheduled_blocks=(\d+), remaining_blocks=(\d+)"
    r"(?:, queued=" + _DUR + r")?" + _AT
)
_PREEMPTING = re.compile(r"Preempting request " + _ID + r": reason=([^,\s]+), preempted_blocks=(\d+)" + _AT)
_QUEUE = re.compile(
    r"Running queue: (\d+) requests?, waiting queue: (\d+) requests?, free blocks: (\d+)/(\d+)"
)
_ALLOCATED = re.compile(r"Allocated block " + _ID + r" for request " + _ID + r", size=" + _SIZE + _AT)
# The reason runs to the next space, as it always did, unless the plugin's `, t=` ends it.
_REASON = r"(?:, reason=(\S+?)(?=, t=\d|\s|$))?"
_FREED = re.compile(r"Freed block " + _ID + r" for request " + _ID + _REASON + _AT)
_FREED_MANY = re.compile(r"Freed (\d+) blocks for request " + _ID + _REASON + _AT)
_GPU = re.compile(
    r"GPU memory usage: " + _SIZE + r"\s*/\s*" + _SIZE + r" \((\d+(?:\.\d+)?)%\), "
    r"cache usage: " + _SIZE + r", kv_cache blocks: (\d+)/(\d+)"
)
_CUDA_OOM = re.compile(r"CUDA out of memory\.(?: Tried to allocate " + _SIZE + r")?")
_ALLOC_FAILED = re.compile(r"Failed to allocate memory for request " + _ID)
_LOAD_FAILED = re.compile(r"Failed to load model: (?:([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): )?(.*)")
_NCCL = re.compile(r"NCCL timeout: rank (\d+) failed to synchronize after " + _DUR)
_HINT = re.compile(r"Possible causes: (.*)")


# The vLLM plugin's fields after `t=` (docs/plugin.md): `, key=value` each; an unknown key (a
# newer plugin's) is skipped; `tracestate`, whose members are comma-separated, comes last.
_FIELD = re.compile(r", ([a-z_]{1,32})=([^,\s]*)")
_TRACESTATE = re.compile(r", tracestate=(\S{1,512})$")
_STAMP = re.compile(r"(\d{1,12})(?:\.(\d{1,9}))?")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_TIME_KEYS = ("arrival", "queued_at", "scheduled_at", "first_token_at", "last_token_at")
#: The plugin's engine id of the request on an engine core's line, after `t=` (docs/plugin.md).
_INTERNAL = re.compile(r", internal_id=([^\s:,]{1,256})(?=,|$)")


def _internal(msg: str, end: int, at_s: str | None) -> str | None:
    """The `, internal_id=` a plugin line states after its `t=` (`end`: where `t=` ends), else None."""
    if at_s is None or end >= len(msg):
        return None
    m = _INTERNAL.match(msg, end)
    return m[1] if m else None


def _stamp(text: str) -> int:
    m = _STAMP.fullmatch(text)
    if m is None:
        raise ValueError(f"not a time: {text!r}")
    return _at_ns(m[1], m[2])


def caller_context(traceparent: str) -> TraceContext | None:
    """A W3C traceparent (version 00, or a later one's first four fields; lower-case hex, ids
    not all zero, version not ff) → its context; anything else → None: ignored, never kept."""
    m = _TRACEPARENT.fullmatch(traceparent)
    if m is None or m[1] == "ff" or m[2] == "0" * 32 or m[3] == "0" * 16:
        return None
    return TraceContext(bytes.fromhex(m[2]), bytes.fromhex(m[3]), "traceparent")


def _times(tail: str) -> PluginTimes | None:
    """The plugin's trailing fields (`tail` starts at the `, ` after `t=`); None when they are
    not that (the line's own fields still stand). A bad traceparent is dropped, never kept."""
    try:
        return _fields(tail)
    except ValueError:
        return None


def _fields(tail: str) -> PluginTimes:
    state = None
    m = _TRACESTATE.search(tail)
    if m is not None:
        state, tail = m[1], tail[:m.start()]
    found: dict[str, str] = {}
    pos = 0
    while pos < len(tail):
        f = _FIELD.match(tail, pos)
        if f is None:
            raise ValueError("not a field")
        found.setdefault(f[1], f[2])
        pos = f.end()
    stamps = [_stamp(found[k]) if k in found else None for k in _TIME_KEYS]
    preempted = []
    for span in filter(None, found.get("preempted", "").split("/")):
        start, sep, end = span.partition("~")
        if not sep:
            raise ValueError("not a preemption")
        preempted.append((_stamp(start), _stamp(end) if end else None))
    caller = caller_context(found["traceparent"]) if "traceparent" in found else None
    n = found.get("n", "")
    internal = found.get("internal_id") or None
    return PluginTimes(*stamps, tuple(preempted), caller, state if caller is not None else None,
                       int(n) if n.isdigit() and 1 <= len(n) <= 6 else None,
                       internal if internal is None or len(internal) <= 256 and ":" not in internal else None)


def _summary(m: re.Match[str], msg: str) -> Event:
    rid, prompt, generated, ttft, ttft_unit, itl, itl_unit, e2e, e2e_unit, at_s, at_f = m.groups()
    tail = msg[m.end():]
    return RequestSummary(
        rid, count(prompt), count(generated),
        duration_s(ttft, ttft_unit or "s"), duration_s(itl, itl_unit or "s"), duration_s(e2e, e2e_unit or "s"),
        _at_ns(at_s, at_f), _times(tail) if tail.startswith(", ") and at_s is not None else None,
    )


_ENDED = re.compile(
    r"Request " + _ID + r" ended: finish=([a-z_]{1,32}), prompt_tokens=(\d+), generated_tokens=(\d+), "
    r"total_latency=" + _DUR + r", t=(\d{1,12})(?:\.(\d{1,9}))?"
)


def _ended(m: re.Match[str], msg: str) -> Event:
    rid, finish, prompt, generated, e2e, e2e_unit, at_s, at_f = m.groups()
    tail = msg[m.end():]
    return RequestEnded(rid, finish, count(prompt), count(generated), duration_s(e2e, e2e_unit or "s"),
                        _at_ns(at_s, at_f), _times(tail) if tail.startswith(", ") else None)


def _request(msg: str) -> Event | None:
    # Four families share the word "Request": summary, the plugin's `ended`, scheduler timeout,
    # API timeout.
    m = _SUMMARY.match(msg)
    if m:
        return _summary(m, msg)
    m = _ENDED.match(msg)
    if m:
        return _ended(m, msg)
    m = _TIMEOUT_API.match(msg)
    if m:
        return RequestTimedOut(m[1], None, msg)
    m = _TIMED_OUT.match(msg)
    if m:
        after = duration_s(m[2], m[3] or "s") if m[2] else None
        return RequestTimedOut(m[1], after, msg)
    return None


def _scheduling(msg: str) -> Event | None:
    m = _SCHEDULING.match(msg)
    if m is None:
        return None
    rid, priority, blocks, remaining, queued, unit, at_s, at_f = m.groups()
    return Scheduled(rid, count(priority), count(blocks), count(remaining),
                     duration_s(queued, unit or "s") if queued is not None else None, _at_ns(at_s, at_f),
                     _internal(msg, m.end(), at_s))


def _preempting(msg: str) -> Event | None:
    m = _PREEMPTING.match(msg)
    return Preempted(m[1], m[2], count(m[3]), _at_ns(m[4], m[5]), _internal(msg, m.end(), m[4])) if m else None


def _queue(msg: str) -> Event | None:
    m = _QUEUE.match(msg)
    return QueueState(count(m[1]), count(m[2]), count(m[3]), count(m[4])) if m else None


def _allocated(msg: str) -> Event | None:
    m = _ALLOCATED.match(msg)
    if m is None:
        return None
    block, rid, number, unit, at_s, at_f = m.groups()
    return BlockAllocated(block, rid, _size(number, unit), _at_ns(at_s, at_f))


def _freed(msg: str) -> Event | None:
    m = _FREED.match(msg)
    if m is None:
        m = _FREED_MANY.match(msg)
        if m is None:
            return None
        n, rid, reason, at_s, at_f = m.groups()
        return BlockFreed("", rid, reason or "", count(n), _at_ns(at_s, at_f), _internal(msg, m.end(), at_s))
    block, rid, reason, at_s, at_f = m.groups()
    return BlockFreed(block, rid, reason or "", 1, _at_ns(at_s, at_f), _internal(msg, m.end(), at_s))


def _gpu(msg: str) -> Event | None:
    m = _GPU.match(msg)
    if not m:
        return None
    return GpuMemory(
        size_bytes(m[1], m[2] or ""), size_bytes(m[3], m[4] or ""), float(m[5]) / 100.0,
        size_bytes(m[6], m[7] or ""), count(m[8]), count(m[9]),
    )


def _cuda(msg: str) -> Event | None:
    m = _CUDA_OOM.match(msg)
    if not m:
        return None
    return CudaOom(size_bytes(m[1], m[2] or "") if m[1] else None, msg)


def _failed(msg: str) -> Event | None:
    m = _ALLOC_FAILED.match(msg)
    if m:
        return AllocationFailed(m[1], msg)
    m = _LOAD_FAILED.match(msg)
    if m:
        return ModelLoadFailed(m[1] or "", m[2])
    return None


def _nccl(msg: str) -> Event | None:
    m = _NCCL.match(msg)
    return NcclTimeout(count(m[1]), duration_s(m[2], m[3] or "s"), msg) if m else None


def _hint(msg: str) -> Event | None:
    m = _HINT.match(msg)
    return NcclHint(m[1]) if m else None


# The vLLM plugin's KV lines on a disaggregated engine (bridge/vllm_plugin/kv.py). Ids are
# whole fields (the plugin writes `-` for one it does not know); the optional stamps come in a
# fixed order before `t=`.
_KV_ID = r"([^\s:,]+)"
_OPT_STAMP = r"(?:, {}=(\d{{1,12}})(?:\.(\d{{1,9}}))?)?"
_KV_RECEIVED = re.compile(
    r"KV received for request " + _KV_ID + r": engine_request_id=" + _KV_ID + r", remote_request_id=" + _KV_ID
    + r", remote_engine_id=" + _KV_ID + r", blocks=(\d+), status=(ok|failed)"
    + _OPT_STAMP.format("waiting_since") + _OPT_STAMP.format("arrived_at") + _AT)
_KV_RELEASED = re.compile(
    r"KV blocks released for request " + _KV_ID + r": engine_request_id=" + _KV_ID + r", blocks=(\d+)"
    + r"(?:, engine_id=" + _KV_ID + r")?" + _OPT_STAMP.format("held_since") + _AT)


def _kv_received(msg: str) -> Event | None:
    m = _KV_RECEIVED.match(msg)
    if m is None:
        return None
    rid, eid, remote, engine, blocks, status, w_s, w_f, a_s, a_f, at_s, at_f = m.groups()
    return KvReceived(rid, eid, None if remote == "-" else remote, None if engine == "-" else engine, count(blocks),
                      status == "ok", _at_ns(w_s, w_f), _at_ns(a_s, a_f), _at_ns(at_s, at_f))


def _kv_released(msg: str) -> Event | None:
    m = _KV_RELEASED.match(msg)
    if m is None:
        return None
    rid, eid, blocks, engine, h_s, h_f, at_s, at_f = m.groups()
    return KvReleased(rid, eid, count(blocks), _at_ns(h_s, h_f), _at_ns(at_s, at_f),
                      None if engine in (None, "-") else engine)


#: First four characters of a message → the rule that may match it.
PREFILTER = {
    "Requ": _request,
    "Sche": _scheduling,
    "Pree": _preempting,
    "Runn": _queue,
    "Allo": _allocated,
    "Free": _freed,
    "GPU ": _gpu,
    "CUDA": _cuda,
    "Fail": _failed,
    "NCCL": _nccl,
    "Poss": _hint,
    "KV r": _kv_received,
    "KV b": _kv_released,
}

MALFORMED = object()
"""Returned for a line that looked like a seed line but did not fit its grammar."""


def parse_message(msg: str, _rules=PREFILTER) -> Event | None | object:
    """Event for a recognised message, `MALFORMED` for a near miss, None otherwise."""
    rule = _rules.get(msg[:4])
    if rule is None:
        return None
    try:
        event = rule(msg)
    except (ValueError, OverflowError):  # the grammar fits but a number does not (1e400 bytes)
        return MALFORMED
    return MALFORMED if event is None else event
