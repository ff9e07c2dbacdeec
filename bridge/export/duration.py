"""How a request's end-to-end duration is known, for what a person reads (waterfall, summary).

A duration is a measurement only where lines state both its ends: vLLM reported it, or two
lines' stamps bound it. Where no line states the end (a V1 completion without the plugin) or the
start, only the range it lies in is known, and it is shown as that range, never as a number.
"""

from __future__ import annotations

from bridge.assemble.timeline import INFERRED, RequestTimeline

REPORTED_E2E, STAMPED_E2E, BOUNDED_E2E = "reported", "stamped", "bounded"


def e2e(t: RequestTimeline) -> tuple[str, int, int]:
    """How the request's duration is known, and its bounds in ns (equal unless `bounded`).

    `bounded`: no line states the end (a V1 completion logs none; its end is where the engine
    next showed it gone) or the start. The lower bound is the last thing a line states about the
    request (a phase boundary; engine snapshots name no request), the upper bound the span's
    inferred end; -1 when there is none (the start is unknown: it may have begun any time
    before)."""
    reported = t.attrs.get("vllm.e2e_s")
    if isinstance(reported, (int, float)) and not isinstance(reported, bool) and reported >= 0:
        ns = round(reported * 1e9)
        return REPORTED_E2E, ns, ns
    span = t.end_ns - t.start_ns
    if INFERRED not in (t.end_timing, t.start_timing):
        return STAMPED_E2E, span, span
    if t.end_timing != INFERRED:  # the start is unknown (its first line is no arrival): at least this
        return BOUNDED_E2E, span, -1
    last = t.start_ns
    for p in t.phases:
        last = max(last, p.start_ns if p.start_timing != INFERRED else last,
                   p.end_ns if p.end_timing != INFERRED else last)
    return BOUNDED_E2E, min(last, t.end_ns) - t.start_ns, (span if t.start_timing != INFERRED else -1)
