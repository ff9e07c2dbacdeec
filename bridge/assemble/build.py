"""A finished request's state → its timeline: which phases the lines prove, and their bounds.

Reported durations (ttft, total_latency, the timeout's "after") fix boundaries relative to the
line that reported them; observed boundaries are line timestamps. When one-second header
stamps put an observed boundary on the wrong side of a reported one, the observed one is
moved to keep the phases in order and marked `inferred`. No phase is made up: each needs a
line that proves it began.

The phases mean what vLLM's own do (its `gen_ai.latency.*` attributes and the child spans of
its PR #44402): `preprocess` API receipt → engine arrival, `queued` engine arrival → first
scheduled (`time_in_queue`), `prefill` first scheduled → first token, `decode` first token →
finish, `preempted` inside them, `freed` the release. docs/phases.md maps them.
"""

from __future__ import annotations

import os
from operator import attrgetter

from bridge.parse.context import TraceContext
from bridge.assemble.diagnosis import Thresholds, diagnose
from bridge.assemble.timeline import INFERRED, OBSERVED, REPORTED, EngineTimeline, Phase, RequestTimeline, SpanEvent
from bridge.core.source import Source
from bridge.assemble.state import EVENT_CAP, RequestState

_NS = 1_000_000_000

# Where a KV block event lands: the most specific phase whose span holds its timestamp.
_BLOCK_PLACEMENT = ("freed", "preempted", "decode", "prefill", "queued")


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


def _clamp(value: int, timing: str, low: int | None, high: int | None) -> tuple[int, str]:
    if low is not None and value < low:
        return low, INFERRED
    if high is not None and value > high:
        return high, INFERRED
    return value, timing


def _load_fast():
    """The C fast path (`_fastbuild.c`): `_request_timeline` below, statement for statement;
    or None: not built (no compiler at install), or VLLM_TRACE_BRIDGE_PURE=1. The C declines
    (returns None) any state holding something but the plain types the pipeline puts there,
    and the Python function, the reference, then builds the timeline."""
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return None
    try:
        from bridge.assemble import _fastbuild
    except ImportError:
        return None
    _fastbuild.init(Phase, RequestTimeline, REPORTED, OBSERVED, INFERRED, EVENT_CAP)  # the cap from state.py
    return _fastbuild.request_timeline


FAST_REQUEST_TIMELINE = _load_fast()


def request_timeline(r: RequestState, source: Source, thresholds: Thresholds,
                     parent: TraceContext | None = None, _fast=FAST_REQUEST_TIMELINE) -> RequestTimeline:
    if _fast is not None:
        t = _fast(r, source, thresholds, parent)
        if t is not None:
            return t
    return _request_timeline(r, source, thresholds, parent)


def _request_timeline(r: RequestState, source: Source, thresholds: Thresholds,
                      parent: TraceContext | None = None) -> RequestTimeline:
    s = r.summary
    end = r.terminal_ns if r.terminal_ns is not None else r.last_ns
    end_timing = OBSERVED if r.terminal_ns is not None else INFERRED

    arrival = first_token = None
    ft_timing = REPORTED
    if s is not None:
        arrival = max(0, r.terminal_ns - _ns(s.e2e_s))
        first_token, ft_timing = _clamp(arrival + _ns(s.ttft_s), REPORTED, None, r.terminal_ns)
    elif r.outcome == "timeout" and r.timeout_after_s is not None:
        arrival = max(0, r.terminal_ns - _ns(r.timeout_after_s))
    times = r.times  # vLLM's own stamps (the plugin's end line): exact boundaries
    last_token = None
    if times is not None:
        if times.arrival_ns is not None and (r.terminal_ns is None or times.arrival_ns <= r.terminal_ns):
            arrival = times.arrival_ns
        if times.first_token_ns is not None:
            # vLLM's first NEW_TOKEN stamp (engine core): prefill ends there, as its
            # time_in_model_prefill; the ttft attribute stays the API server's, as vLLM's.
            first_token, ft_timing = _clamp(times.first_token_ns, OBSERVED, None, r.terminal_ns)
            if times.last_token_ns is not None:
                last_token = _clamp(times.last_token_ns, OBSERVED, first_token, r.terminal_ns)[0]

    sched0 = sched_timing = None
    if r.schedules:
        sched0, sched_timing = _clamp(r.schedules[0][0], OBSERVED, arrival, first_token if first_token is not None else end)

    # The engine's own arrival: the plugin's exact time of the first schedule less the engine's
    # own queue time (vLLM's QUEUED → SCHEDULED), both from vLLM's request state.
    engine_in = None
    if sched0 is not None and sched_timing == OBSERVED:
        first = r.schedules[0][1]
        if first.at_ns is not None and first.queued_s is not None:
            engine_in = _clamp(sched0 - _ns(first.queued_s), OBSERVED, arrival, sched0)

    phases: list[Phase] = []
    first_ns = r.first_ns
    start_inferred = False
    if arrival is None and r.coarse_start and engine_in is not None and first_ns <= engine_in[0] < first_ns + _NS:
        # The receipt line says only its second; the engine's arrival, stated to the µs, came
        # after the receipt and within that second: the receipt lies between the two, and the
        # root starts at the later (the header's second start can be up to 1 s before the
        # client even sent it). Tokenising in between is ms: no `preprocess` is drawn.
        first_ns, start_inferred = engine_in[0], True
    if engine_in is not None:
        # API receipt → the engine's arrival: rendering, tokenising, the hand-off to the engine
        # core. The receipt is vLLM's own arrival_time (set as rendering starts; its spans and
        # TTFT count from it), else a receipt line's stamp.
        pre = (arrival, REPORTED) if arrival is not None else (first_ns, OBSERVED) if r.seen else None
        if pre is not None and pre[0] < engine_in[0]:
            phases.append(Phase("preprocess", 0, pre[0], engine_in[0], pre[1], engine_in[1]))
        if arrival is not None and arrival - _NS < first_ns:
            first_ns = arrival  # a line stamped in arrival's second or after: its header, not earlier evidence
        phases.append(Phase("queued", 0, engine_in[0], sched0, engine_in[1], sched_timing))
    elif arrival is not None and (sched0 is not None or r.outcome in ("timeout", "failed")):
        q_end, q_timing = (sched0, sched_timing) if sched0 is not None else (end, INFERRED)
        phases.append(Phase("queued", 0, arrival, q_end, REPORTED, q_timing))
    if sched0 is not None:
        first = r.schedules[0][1]
        # blocks None: the plugin's end line (the engine core's lines, which count them, off)
        attrs = {"vllm.scheduling.priority": first.priority} if first.blocks is None else {
            "vllm.scheduling.priority": first.priority, "vllm.scheduling.blocks": first.blocks,
            "vllm.scheduling.remaining_blocks": first.remaining_blocks}
        if len(r.schedules) > 1:
            attrs["vllm.scheduling.count"] = len(r.schedules)
        if first_token is not None:
            phases.append(Phase("prefill", 0, sched0, first_token, sched_timing, ft_timing, attrs))
        else:
            phases.append(Phase("prefill", 0, sched0, max(sched0, end), sched_timing, INFERRED, attrs))
    low = arrival if arrival is not None else first_ns
    for i, (p_start, p_end, ev) in enumerate(r.preemptions or ()):
        start, st = _clamp(p_start, OBSERVED, low, end)
        if p_end is None:
            stop, et = max(start, end), INFERRED
        else:
            stop, et = _clamp(p_end, OBSERVED, start, None)
        phases.append(Phase("preempted", i, start, stop, st, et, {} if ev.blocks is None else
                            {"vllm.preemption.reason": ev.reason, "vllm.preemption.blocks": ev.blocks}))
    if s is not None:
        # to vLLM's last NEW_TOKEN stamp when the plugin gave it (its time_in_model_decode)
        phases.append(Phase("decode", 0, first_token, r.terminal_ns if last_token is None else last_token,
                            ft_timing, OBSERVED,
                            {"gen_ai.usage.output_tokens": s.generated_tokens, "vllm.itl_s": s.itl_s}))
    elif first_token is not None and last_token is not None:  # ended (aborted) after its first token
        phases.append(Phase("decode", 0, first_token, last_token, ft_timing, OBSERVED))
    if r.terminal_ns is not None and r.last_free_ns is not None:
        # Freed after the end's line (the seed's order), or, when the engine released the
        # blocks before the API server logged the end (V1 with the vLLM plugin), from the
        # first of those frees: either way the span is the release itself.
        free_start = r.release_ns if r.release_ns is not None and r.release_ns < r.terminal_ns else r.terminal_ns
        phases.append(Phase("freed", 0, free_start, r.last_free_ns, OBSERVED, OBSERVED))

    # A first line stamped in the whole second before the reported arrival is that second
    # truncated, not evidence of an earlier start: the root keeps vLLM's total_latency.
    if arrival is not None and first_ns % _NS == 0 and arrival - _NS < first_ns < arrival:
        first_ns = arrival
    start, stop = min(low, first_ns), max(end, r.last_ns)
    for p in phases:
        if p.start_ns < start:
            start = p.start_ns
        if p.end_ns > stop:
            stop = p.end_ns
    for p in phases:  # lines whose stamps run backwards must not turn a span inside out
        if p.end_ns < p.start_ns:
            p.end_ns, p.end_timing = p.start_ns, INFERRED
    root_events = list(r.events or ())
    dropped = r.dropped + _place_block_events(r.block_events or (), phases, root_events)
    dropped += r.block_dropped

    attrs = _request_attrs(r, thresholds, arrival, sched0)
    inferred = start_inferred or end_timing == INFERRED or any(
        p.start_timing == INFERRED or p.end_timing == INFERRED for p in phases)
    attrs["vllm.timing"] = INFERRED if inferred else (REPORTED if arrival is not None else OBSERVED)
    root_events.sort(key=_event_ts)
    if parent is not None:
        attrs["vllm.trace_context"] = parent.source
    return RequestTimeline(
        source=source, request_id=r.request_id, occurrence=r.occurrence,
        start_ns=start, end_ns=stop,
        start_timing=INFERRED if start_inferred else REPORTED if arrival is not None and arrival <= first_ns else OBSERVED,
        end_timing=end_timing, outcome=r.outcome, error_type=r.error_type,
        error_message=r.error_message, attrs=attrs, events=root_events, dropped_events=dropped,
        phases=phases, first_offset=r.first_offset, last_offset=r.last_offset, parent=parent,
    )


_event_ts = attrgetter("ts_ns")


def _place_block_events(events, phases: list[Phase], root_events: list[SpanEvent]) -> int:
    """Put each KV block event on its phase (EVENT_CAP per span); return how many were dropped."""
    candidates = [p for name in _BLOCK_PLACEMENT for p in phases if p.name == name]  # in placement order
    root_blocks = 0
    dropped = 0
    for e in events:
        ts = e.ts_ns
        for p in candidates:
            if p.start_ns <= ts < p.end_ns or (ts == p.end_ns and p.name == "freed"):
                target = p
                break
        else:
            target = None
        if target is None:
            if root_blocks < EVENT_CAP:
                root_events.append(e)
                root_blocks += 1
            else:
                dropped += 1
        elif len(target.events) < EVENT_CAP:
            target.events.append(e)
        else:
            target.dropped_events += 1
    return dropped


#: A snapshot's fields as the root's attributes, (key, field) in the order they are set: the
#: summary's (and vLLM's own native-tracing keys, so dashboards built for them keep working),
#: the queue's and the GPU's when the request was scheduled.
_SUMMARY_KEYS = (("gen_ai.usage.input_tokens", "prompt_tokens"), ("gen_ai.usage.output_tokens", "generated_tokens"),
                 ("vllm.ttft_s", "ttft_s"), ("vllm.itl_s", "itl_s"), ("vllm.e2e_s", "e2e_s"),
                 ("gen_ai.latency.time_to_first_token", "ttft_s"), ("gen_ai.latency.e2e", "e2e_s"))
_QUEUE_KEYS = (("vllm.queue.running", "running"), ("vllm.queue.waiting", "waiting"),
               ("vllm.kv.free_blocks", "free_blocks"), ("vllm.kv.total_blocks", "total_blocks"))
_GPU_KEYS = (("vllm.gpu.memory.used_bytes", "used_bytes"), ("vllm.gpu.memory.total_bytes", "total_bytes"),
             ("vllm.gpu.memory.utilization", "utilization"), ("vllm.kv_cache.blocks_used", "kv_blocks_used"),
             ("vllm.kv_cache.blocks_total", "kv_blocks_total"))


def _copy(a: dict, snapshot, keys: tuple) -> None:
    for key, name in keys:
        a[key] = getattr(snapshot, name)


def _request_attrs(r: RequestState, t: Thresholds, arrival: int | None, sched0: int | None) -> dict:
    s = r.summary
    a: dict = {"vllm.request.id": r.request_id, "vllm.outcome": r.outcome}
    if s is not None:
        _copy(a, s, _SUMMARY_KEYS)
    queue_s = (sched0 - arrival) / _NS if arrival is not None and sched0 is not None else None
    if queue_s is not None:
        a["vllm.queue_s"] = queue_s
    engine_queue = r.schedules[0][1].queued_s if r.schedules else None
    if engine_queue is not None:
        a["vllm.engine_queue_s"] = engine_queue
    # vLLM's own key means the engine queue; arrival → scheduled stands in when that is unknown.
    in_queue = engine_queue if engine_queue is not None else queue_s
    if in_queue is not None:
        a["gen_ai.latency.time_in_queue"] = in_queue
    times = r.times
    if times is not None and times.scheduled_ns is not None:
        # vLLM's native-tracing intervals, from the same stamps (engine core, monotonic)
        if times.first_token_ns is not None:
            a["gen_ai.latency.time_in_model_prefill"] = (times.first_token_ns - times.scheduled_ns) / _NS
            if times.last_token_ns is not None:
                a["gen_ai.latency.time_in_model_decode"] = (times.last_token_ns - times.first_token_ns) / _NS
                a["gen_ai.latency.time_in_model_inference"] = (times.last_token_ns - times.scheduled_ns) / _NS
    n_preempted = len(r.preemptions or ()) + r.sampled_preemptions
    a["vllm.preemptions"] = n_preempted
    a["vllm.kv_blocks"] = r.allocated
    a["vllm.kv_blocks.freed"] = r.freed
    if r.error_type is not None:
        a["error.type"] = r.error_type
    q, g = r.queue_at_schedule, r.gpu_at_schedule
    if q is not None:
        _copy(a, q, _QUEUE_KEYS)
    if g is not None:
        _copy(a, g, _GPU_KEYS)
    min_free = r.min_free_ratio
    if q is not None and q.total_blocks:
        ratio = q.free_blocks / q.total_blocks
        min_free = ratio if min_free is None else min(min_free, ratio)
    max_gpu = r.max_gpu_ratio
    if g is not None:
        max_gpu = g.utilization if max_gpu is None else max(max_gpu, g.utilization)
    found = diagnose(t, s.ttft_s if s else None, s.itl_s if s else None, min_free, max_gpu, n_preempted)
    if found:
        a["vllm.diagnosis"] = found
    if r.extra:
        a.update(r.extra)
    return a


def engine_timeline(source: Source, kind: str, occurrence: str, start_ns: int, end_ns: int,
                    error_type: str, message: str, attrs: dict, affected: list[str],
                    first_offset: int, last_offset: int) -> EngineTimeline:
    attrs = {"vllm.incident.kind": kind, "error.type": error_type,
             "vllm.requests_affected": len(affected), **attrs}
    return EngineTimeline(source, kind, occurrence, start_ns, end_ns, error_type, message, attrs,
                          affected, first_offset, last_offset)
