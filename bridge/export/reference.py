"""The reference encoder: `otlp`'s proto messages, serialised by the protobuf runtime.

`otlp.request_spans` / `otlp.engine_spans` are the readable statement of how a timeline maps
onto spans. `wire.WireEncoder` writes the same spans straight to wire bytes at a fraction of
the cost and is what the bridge sends; tests decode its bytes and compare them with what this
encoder produces. It has WireEncoder's interface, so `OtlpSink(..., encoder=ProtoEncoder)`
selects it. Slow (~120 µs per span).
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.assemble.timeline import RequestTimeline, Timeline
from bridge.export.otlp import RequestBuilder, engine_spans, request_spans
from bridge.export.wire import EncodedRequest


class ProtoEncoder:
    __slots__ = ("_builder", "size")

    def __init__(self, base: Mapping[str, str]):
        self._builder = RequestBuilder(base)
        self.size = 0

    @property
    def count(self) -> int:
        return self._builder.count

    def add(self, timeline: Timeline) -> int:
        spans = request_spans(timeline) if isinstance(timeline, RequestTimeline) else engine_spans(timeline)
        self._builder.add(timeline.source, spans)
        self.size += sum(s.ByteSize() for s in spans)
        return len(spans)

    def take(self) -> EncodedRequest:
        n = self._builder.count
        self.size = 0
        return EncodedRequest(self._builder.take().SerializeToString(), n)
