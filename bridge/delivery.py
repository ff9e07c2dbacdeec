"""The agent's export, one job: timelines into batches (`export.batch.Batcher`), batches to the
receiver from a background thread (`export.sender.Sender`), and the acknowledgements back to
the agent, which advances its checkpoints with them. Reading waits only when the bounded
queue is full: that is the backpressure that keeps memory bounded while a receiver is down."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping

from bridge.assemble import Timeline
from bridge.config import AgentConfig
from bridge.export.batch import Batch, Batcher
from bridge.export.sender import Sender, SenderStats
from bridge.export.transport import Transport


class Delivery:
    def __init__(self, resource: Mapping[str, str], transport: Transport, cfg: AgentConfig, log,
                 should_stop: Callable[[], bool]) -> None:
        self._batcher = Batcher(resource, cfg.max_batch_spans, max_bytes=cfg.max_batch_bytes)
        self._acks: deque[tuple[Batch, bool]] = deque()
        self._sender = Sender(transport, cfg.max_queue_spans, cfg.export_give_up,
                              lambda b, ok: self._acks.append((b, ok)), log)
        self._should_stop = should_stop
        self._sender.start()

    def add(self, t: Timeline, token) -> None:
        """Into the current batch; raises when the timeline cannot be encoded. `send_full`
        after it queues the batch once it is full."""
        self._batcher.add(t, token)

    def send_full(self) -> None:
        if self._batcher.full:
            self._sender.submit(self._batcher.take(), self._should_stop)

    def send_due(self, max_delay: float) -> None:
        """Queue the current batch if it is full or `max_delay` old."""
        if self._batcher.due(max_delay):
            self._sender.submit(self._batcher.take(), self._should_stop)

    @property
    def empty(self) -> bool:
        """No timeline waits in the current batch."""
        return self._batcher.empty

    @property
    def failing(self) -> bool:
        return self._sender.failing

    @property
    def stats(self) -> SenderStats:
        return self._sender.stats

    def acks(self) -> Iterator[tuple[Batch, bool]]:
        """Batches the sender is done with since the last call: (batch, acknowledged)."""
        while self._acks:
            yield self._acks.popleft()

    def close(self, deadline: float) -> bool:
        """Queue what is left and send until `deadline` (monotonic); True if all went."""
        if not self._batcher.empty:
            self._sender.submit(self._batcher.take())
        return self._sender.close(deadline)
