"""For the long-lived agent: send the batches `batch.Batcher` made from a background thread, report acks.

Reading never waits for the network unless the bounded queue is full; then it waits, which
is the backpressure that keeps memory bounded while a receiver is down. A batch is retried
with backoff until acknowledged; only after `give_up_s` of refusals is it dropped, counted,
and reported, so nothing disappears silently.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import field

from bridge.core.counts import counts
from bridge.export.batch import Batch
from bridge.export.transport import Transport


SenderStats = counts("SenderStats", __name__, """What the sender delivered, by count; the queue's size and the latencies now.

    spans_sent: spans the receiver acknowledged
    spans_retried: spans sent again after a failed attempt
    spans_dropped: spans given up on after `give_up_s` (never silent)
    batches_sent: batches the receiver acknowledged
    send_failures: failed attempts
    queued_spans: spans waiting to be sent (a gauge: it goes down as batches go out)
""", ("latencies", deque, field(default_factory=lambda: deque(maxlen=4096))))  # seconds per acked batch


class Sender:
    """Delivers batches in order from one thread, retrying each until acknowledged or `give_up_s`
    passes; `on_ack(batch, ok)` reports each outcome so the caller can advance checkpoints."""

    def __init__(self, transport: Transport, max_queue_spans: int, give_up_s: float,
                 on_ack: Callable[[Batch, bool], None], log, backoff_max_s: float = 30.0) -> None:
        self.stats = SenderStats()
        self._transport = transport
        self._max = max_queue_spans
        self._give_up = give_up_s
        self._on_ack = on_ack
        self._log = log
        self._backoff_max = backoff_max_s
        self._queue: deque[Batch] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._abort = threading.Event()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="otlp-sender", daemon=True)
        self._warned = False

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: Batch, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Queue a batch; blocks while the queue is full (unless it is empty: a batch larger
        than the whole queue still goes through, alone)."""
        with self._cond:
            while self.stats.queued_spans and self.stats.queued_spans + batch.spans > self._max:
                if should_stop() or self._abort.is_set():
                    break
                self._cond.wait(0.1)
            self._queue.append(batch)
            self.stats.queued_spans += batch.spans
            self._cond.notify_all()

    @property
    def failing(self) -> bool:
        """The last export attempt failed and none has succeeded since (the receiver is down)."""
        return self._warned

    @property
    def full(self) -> bool:
        return self.stats.queued_spans >= self._max

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._busy

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = self._queue[0]
                self._busy = True
            ok = self._deliver(batch)
            with self._cond:
                self._queue.popleft()
                self.stats.queued_spans -= batch.spans
                self._busy = False
                self._cond.notify_all()
            if ok is not None:
                self._on_ack(batch, ok)

    def _deliver(self, batch: Batch) -> bool | None:
        """True: acknowledged. False: given up (dropped). None: aborted at shutdown (kept in
        the log for the next run: the checkpoint has not moved past it)."""
        first_try = time.monotonic()
        backoff = 0.5
        while True:
            start = time.monotonic()
            try:
                sent = self._transport.send(batch.request)
            except Exception as exc:  # a bug or an odd transport error must not kill the sender
                self._log.error("export_error", error=repr(exc))
                sent = False
            if sent:
                self.stats.spans_sent += batch.spans
                self.stats.batches_sent += 1
                self.stats.latencies.append(time.monotonic() - start)
                if self._warned:
                    self._log.info("export_recovered")
                    self._warned = False
                return True
            self.stats.send_failures += 1
            if self._abort.is_set():
                return None
            if time.monotonic() - first_try >= self._give_up:
                self.stats.spans_dropped += batch.spans
                self._log.error("export_gave_up", spans=batch.spans, after_s=round(self._give_up),
                                fix="check the receiver; these spans are counted in spans_dropped")
                return False
            self.stats.spans_retried += batch.spans
            if not self._warned:
                self._log.warning("export_retrying", spans=batch.spans,
                                  fix="is the OTLP receiver up? reading pauses when the queue is full")
                self._warned = True
            if self._abort.wait(backoff):
                return None
            backoff = min(backoff * 2, self._backoff_max)

    def close(self, deadline: float) -> bool:
        """Send what is queued until `deadline` (monotonic); then abort. True if all went."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        drained = not self._thread.is_alive()
        if not drained:
            self._abort.set()
            self._transport.close()  # cancels the exporter's own retry waits
            self._thread.join(2.0)
        else:
            self._transport.close()
        return drained
