"""A real OTLP gRPC receiver in its own process, so a benchmark measures only the bridge.

Prints its port on stdout, counts spans, and on SIGTERM prints `spans=<n> requests=<n>`.
"""

import os
import signal
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from receivers import GrpcReceiver  # noqa: E402


class CountingReceiver(GrpcReceiver):
    """Counts instead of keeping every request, so a million-line run stays small."""

    def __init__(self):
        super().__init__()
        self.span_count = 0
        self.request_count = 0
        self._lock2 = threading.Lock()

    def add(self, raw):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        req = ExportTraceServiceRequest.FromString(raw)
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        with self._lock2:
            self.span_count += n
            self.request_count += 1


def main():
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with CountingReceiver() as rx:
        print(rx.port, flush=True)
        done.wait()
        print(f"spans={rx.span_count} requests={rx.request_count}", flush=True)


if __name__ == "__main__":
    main()
