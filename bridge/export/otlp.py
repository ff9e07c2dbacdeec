"""Span records (`mapping`) → OTLP protobuf messages, built with the `opentelemetry-proto` stubs.

The reference encoder (`reference.ProtoEncoder`): what a span holds is `mapping`'s, this module
only spells it in the stubs' messages; `wire` writes the same records straight to bytes, and
tests decode those bytes with these stubs and compare. The SDK's span objects are not used:
they would pick their own ids, and ids here are deterministic (see `ids`).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from bridge.assemble.timeline import EngineTimeline, RequestTimeline, SpanEvent
from bridge.core.source import Source
from bridge.export import mapping
from bridge.export.ids import big_float as _big_float
from bridge.export.mapping import SCOPE_NAME, SCOPE_VERSION, SpanRecord


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


def span(r: SpanRecord) -> Span:
    """One record as a Span message."""
    return Span(
        trace_id=r.trace_id, span_id=r.span_id, parent_span_id=r.parent_span_id, name=r.name, kind=r.kind,
        start_time_unix_nano=r.start_ns, end_time_unix_nano=r.end_ns, attributes=key_values(r.attributes()),
        events=_events(r.events), dropped_events_count=r.dropped_events,
        links=[Span.Link(trace_id=x.trace_id, span_id=x.span_id, attributes=key_values(x.attrs)) for x in r.links],
        status=None if r.error is None else Status(code=mapping.STATUS_ERROR, message=r.error),
    )


def request_spans(t: RequestTimeline) -> list[Span]:
    """`mapping.request_spans` as messages: the root `vllm.request` and one child per phase."""
    return [span(r) for r in mapping.request_spans(t)]


def engine_spans(t: EngineTimeline) -> list[Span]:
    """`mapping.engine_spans` as messages: `vllm.engine` or `vllm.startup`."""
    return [span(r) for r in mapping.engine_spans(t)]


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
