"""What the assemble stage hands to exporters: finished request and engine timelines.

Plain data, no OpenTelemetry types: an exporter maps these onto spans (OTLP, the terminal
waterfall, the summary) and nothing here knows how.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.parse.context import TraceContext
from bridge.core.source import Source

#: How a boundary is known. `reported`: vLLM printed the duration it derives from;
#: `observed`: a line's own timestamp; `inferred`: no line proves it (clamped, or the end of
#: the evidence stands in for it).
REPORTED, OBSERVED, INFERRED = "reported", "observed", "inferred"

Attrs = dict[str, "str | int | float | bool | list[str]"]


@dataclass(slots=True)
class SpanEvent:
    name: str
    ts_ns: int
    attrs: Attrs = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IncidentRef:
    """Which engine incident: enough for an exporter to name its span (ids derive from these)."""

    kind: str
    occurrence: str


@dataclass(slots=True)
class IncidentEvent(SpanEvent):
    """An engine incident as a request in flight saw it: its type and time, and a reference an
    exporter turns into a span link to the incident's own span. Never the incident's text: that
    stays on the incident span, where it is redacted by default."""

    incident: IncidentRef | None = None


@dataclass(slots=True)
class Phase:
    """A child span of the request: preprocess, queued, prefill, preempted, decode or freed."""

    name: str
    index: int  # which one of that name (preemptions repeat)
    start_ns: int
    end_ns: int
    start_timing: str
    end_timing: str
    attrs: Attrs = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    dropped_events: int = 0


@dataclass(slots=True)
class RequestTimeline:
    source: Source
    request_id: str
    occurrence: str          # distinguishes reuses of the same id within one source
    start_ns: int
    end_ns: int
    start_timing: str
    end_timing: str
    outcome: str             # finished | timeout | failed | aborted | incomplete
    error_type: str | None
    error_message: str
    attrs: Attrs
    events: list[SpanEvent]
    dropped_events: int
    phases: list[Phase]
    first_offset: int        # earliest byte of the source that this request depends on
    last_offset: int
    parent: TraceContext | None = None  # the caller's trace context, when the request carried it


@dataclass(slots=True)
class EngineTimeline:
    """An engine-wide incident (NCCL timeout, OOM with no request, model load failure)."""

    source: Source
    kind: str                # nccl_timeout | cuda_oom | model_load
    occurrence: str
    start_ns: int
    end_ns: int
    error_type: str
    message: str
    attrs: Attrs
    affected: list[str]      # request ids in flight when it happened
    first_offset: int
    last_offset: int


Timeline = RequestTimeline | EngineTimeline
