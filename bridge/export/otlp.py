"""Timelines → OTLP protobuf messages, built directly from the `opentelemetry-proto` stubs.

The SDK's span objects would cost several times more per span and would pick their own ids;
here ids are deterministic (see `ids`) and a timeline maps onto spans in one pass. Shipping
the messages is `transport`'s job, so the encoding can change without touching delivery.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from bridge.assemble.timeline import EngineTimeline, IncidentEvent, RequestTimeline, SpanEvent
from bridge.core.source import Source
from bridge.export.ids import big_float as _big_float, incident_ids, span_id, trace_id

SCOPE_NAME, SCOPE_VERSION = "vllm-trace-bridge", "0.1.0"
_SERVER, _INTERNAL = Span.SpanKind.SPAN_KIND_SERVER, Span.SpanKind.SPAN_KIND_INTERNAL
_ERROR = Status.StatusCode.STATUS_CODE_ERROR


def any_value(v) -> AnyValue:
    if isinstance(v, str):
        return AnyValue(string_value=v)
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):  # beyond int64: the nearest double, as the wire encoder
        return AnyValue(int_value=v) if -(1 << 63) <= v < (1 << 63) else AnyValue(double_value=_big_float(v))
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[any_value(x) for x in v]))
    return AnyValue(string_value=str(v))


def key_values(attrs: Mapping) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def _events(events: list[SpanEvent]) -> list[Span.Event]:
    return [Span.Event(time_unix_nano=e.ts_ns, name=e.name, attributes=key_values(e.attrs)) for e in events]


def incident_links(t: RequestTimeline) -> list[Span.Link]:
    """A link from a request to each engine incident it was in flight for (the incident's
    `vllm.engine` span), in the order of their events."""
    links = []
    for e in t.events:
        if type(e) is IncidentEvent and e.incident is not None:
            tid, sid = incident_ids(t.source.key, e.incident.kind, e.incident.occurrence)
            links.append(Span.Link(trace_id=tid, span_id=sid,
                                   attributes=key_values({"vllm.incident.kind": e.incident.kind})))
    return links


def request_spans(t: RequestTimeline) -> list[Span]:
    """The root `vllm.request` span and one child per phase. With the caller's trace context
    (`t.parent`) the spans go into the caller's trace, the root under the caller's span when
    its id is known. Span ids derive from the bridge's own trace id either way, so they stay
    deterministic and distinct even when two requests carry the same context."""
    own = trace_id(t.source.key, "request", t.request_id, t.occurrence)
    root_id = span_id(own + t.occurrence.encode(), "vllm.request")
    tid, parent_id = own, b""
    if t.parent is not None:
        tid, parent_id = t.parent.trace_id, t.parent.span_id or b""
    root_attrs = dict(t.attrs)
    root_attrs["vllm.timing.start"] = t.start_timing
    root_attrs["vllm.timing.end"] = t.end_timing
    status = Status(code=_ERROR, message=t.error_message) if t.error_type else None
    spans = [Span(
        trace_id=tid, span_id=root_id, parent_span_id=parent_id, name="vllm.request", kind=_SERVER,
        start_time_unix_nano=t.start_ns, end_time_unix_nano=t.end_ns,
        attributes=key_values(root_attrs), events=_events(t.events),
        dropped_events_count=t.dropped_events, links=incident_links(t), status=status,
    )]
    for p in t.phases:
        attrs = dict(p.attrs)
        attrs["vllm.timing"] = p.start_timing if p.start_timing == p.end_timing else (
            "inferred" if "inferred" in (p.start_timing, p.end_timing) else "observed")
        attrs["vllm.timing.start"] = p.start_timing
        attrs["vllm.timing.end"] = p.end_timing
        spans.append(Span(
            trace_id=tid, span_id=span_id(root_id, p.name, p.index), parent_span_id=root_id,
            name=p.name, kind=_INTERNAL, start_time_unix_nano=p.start_ns, end_time_unix_nano=p.end_ns,
            attributes=key_values(attrs), events=_events(p.events), dropped_events_count=p.dropped_events,
        ))
    return spans


def engine_spans(t: EngineTimeline) -> list[Span]:
    """`vllm.engine` for an incident (status ERROR), `vllm.startup` for an engine's startup
    (ERROR only when an error ended it)."""
    tid = trace_id(t.source.key, "engine", t.kind, t.occurrence)
    name = "vllm.startup" if t.kind == "startup" else "vllm.engine"
    events, status = [], None
    if t.error_type:
        exc = {"exception.type": t.attrs.get("exception.type", t.kind), "exception.message": t.message}
        if "exception.stacktrace" in t.attrs:
            exc["exception.stacktrace"] = t.attrs["exception.stacktrace"]
        events.append(Span.Event(time_unix_nano=t.end_ns, name="exception", attributes=key_values(exc)))
        status = Status(code=_ERROR, message=t.message)
    attrs = {k: v for k, v in t.attrs.items() if k != "exception.stacktrace"}
    return [Span(
        trace_id=tid, span_id=span_id(tid, name), name=name, kind=_INTERNAL,
        start_time_unix_nano=t.start_ns, end_time_unix_nano=t.end_ns,
        attributes=key_values(attrs), events=events, status=status,
    )]


class RequestBuilder:
    """Accumulates spans per source and turns them into one ExportTraceServiceRequest.

    No message outlives its request: upb fuses the memory arenas of messages put together,
    so one cached Resource shared by every request would keep every request alive.
    """

    __slots__ = ("_base", "_by_source", "count")

    def __init__(self, base: Mapping[str, str]):
        self._base = dict(base)
        self._by_source: dict[Source, tuple[Source, list[Span]]] = {}
        self.count = 0

    def add(self, source: Source, spans: list[Span]) -> None:
        entry = self._by_source.get(source)  # one resource per file (ids are the stream's)
        if entry is None:
            entry = self._by_source[source] = (source, [])
        entry[1].extend(spans)
        self.count += len(spans)

    def take(self) -> ExportTraceServiceRequest:
        req = ExportTraceServiceRequest(resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=key_values({**self._base, **src.resource})),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name=SCOPE_NAME, version=SCOPE_VERSION),
                                        spans=spans)])
            for src, spans in self._by_source.values()
        ])
        self._by_source = {}
        self.count = 0
        return req
