"""The OTLP sink: timelines in, batched encoded ExportTraceServiceRequests out through a Transport."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bridge.assemble.timeline import Timeline
from bridge.export.transport import Transport
from bridge.export.wire import WireEncoder, span_count


@dataclass(slots=True)
class ExportStats:
    spans_sent: int = 0
    spans_failed: int = 0   # not acknowledged after the transport's retries: never silent
    batches_sent: int = 0
    batches_failed: int = 0


class OtlpSink:
    """Encodes each timeline at once and sends a batch every `max_batch` spans.

    After a batch fails (the transport has already retried with backoff) nothing more is sent:
    the spans still queued and those that follow are counted in `spans_failed`, so the caller
    can report exactly what was not delivered instead of hammering a dead receiver.
    """

    def __init__(self, transport: Transport, resource: Mapping[str, str], max_batch: int = 1024,
                 encoder=WireEncoder):
        self.stats = ExportStats()
        self._transport = transport
        self._builder = encoder(resource)  # wire.WireEncoder, or reference.ProtoEncoder
        self._max_batch = max_batch
        self._failed = False

    @property
    def failed(self) -> bool:
        return self._failed

    def __call__(self, timeline: Timeline) -> None:
        if self._failed:
            self.stats.spans_failed += span_count(timeline)
            return
        self._builder.add(timeline)
        if self._builder.count >= self._max_batch:
            self.flush()

    def flush(self) -> bool:
        n = self._builder.count
        if n == 0:
            return not self._failed
        request = self._builder.take()
        if self._failed or not self._transport.send(request):
            self._failed = True
            self.stats.spans_failed += n
            self.stats.batches_failed += 1
            return False
        self.stats.spans_sent += n
        self.stats.batches_sent += 1
        return True

    def close(self) -> bool:
        ok = self.flush()
        self._transport.close()
        return ok
