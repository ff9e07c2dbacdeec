"""The batcher (timelines in, encoded ExportTraceServiceRequests out) and replay's sink.

Batching and sending are separate, as in the OpenTelemetry SDK (`BatchSpanProcessor` /
`SpanExporter`): `Batcher` makes batches; a `transport.Transport` ships one; `OtlpSink` (here,
synchronous, for replay) or `sender.Sender` (background thread, for the agent) decides when.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from bridge.assemble.timeline import Timeline
from bridge.export.transport import Transport
from bridge.export.wire import EncodedRequest, WireEncoder, span_count

# The OpenTelemetry Collector's OTLP receiver refuses a gRPC message over 4 MiB by default
# (`max_recv_msg_size_mib`): a batch stops growing at 3 MiB, leaving room for its last request.
DEFAULT_BATCH_BYTES = 3 << 20


@dataclass(slots=True)
class Batch:
    request: EncodedRequest
    spans: int
    tokens: list            # opaque delivery tokens, handed back with the ack
    created: float


class Batcher:
    """The one batcher: encodes timelines into the current batch; `take()` when it is full or old
    enough. Who sends a batch is separate and swappable, as in the OpenTelemetry SDK's span
    processor / exporter split: `OtlpSink` below sends in the caller's thread (replay),
    `sender.Sender` from a background thread with retries and acks (the agent); both go through
    a `transport.Transport`."""

    def __init__(self, resource, max_spans: int, encoder=WireEncoder, max_bytes: int = DEFAULT_BATCH_BYTES) -> None:
        """A batch is full at `max_spans` spans or `max_bytes` bytes, whichever comes first. The
        bytes bound is soft (one request's spans are never split across batches; a request is
        tens of KB at most, its events capped): keep it under the receiver's message limit."""
        self._builder = encoder(resource)
        self._tokens: list = []
        self._max = max_spans
        self._max_bytes = max_bytes
        self._since: float | None = None

    def add(self, timeline: Timeline, token=None) -> None:
        """`token`: an opaque delivery token handed back with the batch's ack (None: none kept)."""
        if self._since is None:
            self._since = time.monotonic()
        self._builder.add(timeline)
        if token is not None:
            self._tokens.append(token)

    def due(self, max_delay: float) -> bool:
        return self.full or (self._since is not None and time.monotonic() - self._since >= max_delay)

    @property
    def full(self) -> bool:
        return self._builder.count >= self._max or self._builder.size >= self._max_bytes

    @property
    def count(self) -> int:
        """Spans in the current batch."""
        return self._builder.count

    @property
    def empty(self) -> bool:
        return self._builder.count == 0 and not self._tokens

    def take(self) -> Batch:
        request = self._builder.take()
        batch = Batch(request, request.spans, self._tokens, self._since or time.monotonic())
        self._tokens = []
        self._since = None
        return batch


@dataclass(slots=True)
class ExportStats:
    spans_sent: int = 0
    spans_failed: int = 0   # not acknowledged after the transport's retries: never silent
    batches_sent: int = 0
    batches_failed: int = 0


class OtlpSink:
    """Replay's exporter: a `Batcher` whose batch is sent, in the caller's thread, every
    `max_batch` spans.

    After a batch fails (the transport has already retried with backoff) nothing more is sent:
    the spans still queued and those that follow are counted in `spans_failed`, so the caller
    can report exactly what was not delivered instead of hammering a dead receiver.
    """

    def __init__(self, transport: Transport, resource: Mapping[str, str], max_batch: int = 1024,
                 encoder=WireEncoder, max_bytes: int = DEFAULT_BATCH_BYTES):
        self.stats = ExportStats()
        self._transport = transport
        self._batcher = Batcher(resource, max_batch, encoder, max_bytes)  # wire.WireEncoder, or reference.ProtoEncoder
        self._failed = False

    @property
    def failed(self) -> bool:
        return self._failed

    def __call__(self, timeline: Timeline) -> None:
        if self._failed:
            self.stats.spans_failed += span_count(timeline)
            return
        self._batcher.add(timeline)
        if self._batcher.full:
            self.flush()

    def flush(self) -> bool:
        n = self._batcher.count
        if n == 0:
            return not self._failed
        request = self._batcher.take().request
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
