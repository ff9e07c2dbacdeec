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

# A half of a disaggregated request (docs/distributed.md): its role, and the ids both halves
# have from their own lines. The prefill's engine request id is `vllm.request.internal_id` on
# the prefill and `vllm.pd.remote_request_id` on the decode; the prefill's engine id is
# `vllm.pd.engine_id` on the prefill (the plugin's release line) and `vllm.pd.remote_engine_id`
# on the decode.
PD_ROLE, PD_PREFILL, PD_DECODE = "vllm.pd.role", "prefill", "decode"
PD_REMOTE_REQUEST, PD_REMOTE_ENGINE, PD_ENGINE = "vllm.pd.remote_request_id", "vllm.pd.remote_engine_id", "vllm.pd.engine_id"
INTERNAL_ID = "vllm.request.internal_id"


def pd_key_id(attrs: Attrs, request_id: str) -> str | None:
    """The prefill's engine request id as this half knows it, or None (not a P/D half). A
    prefill without an internal id has its API id as engine id (request id randomization off:
    vLLM added it under that id)."""
    role = attrs.get(PD_ROLE)
    if role == PD_PREFILL:
        key = attrs.get(INTERNAL_ID, request_id)
    elif role == PD_DECODE:
        key = attrs.get(PD_REMOTE_REQUEST)
    else:
        return None
    return key if isinstance(key, str) and key else None


def pd_engine_id(attrs: Attrs) -> str | None:
    """The prefill's engine id (`kv_transfer_config.engine_id`, `_dp<n>` added under DP) as this
    half knows it, or None."""
    eng = attrs.get(PD_ENGINE if attrs.get(PD_ROLE) == PD_PREFILL else PD_REMOTE_ENGINE)
    return eng if isinstance(eng, str) and eng else None


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
    # A half of a disaggregated request: the caller's context read from the prefill's engine
    # request id (the P/D key), the one context both halves can read (docs/distributed.md)
    pd_context: TraceContext | None = None


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
