"""A counting OTLP sink in its own process, so a benchmark's CPU figure is only the process under test.

    python bench/sink.py

Serves OTLP on 127.0.0.1, free ports, both transports and both signals:
  gRPC  TraceService/Export and LogsService/Export (opentelemetry-proto stubs)
  HTTP  POST /v1/traces and POST /v1/logs, protobuf bodies (gzip/deflate Content-Encoding
        accepted), answered 200 with an empty Export*ServiceResponse;
        GET /counts -> {"spans", "logs", "trace_requests", "log_requests"} (cumulative).
Prints `grpc=<port> http=<port>` once it listens; on SIGTERM prints the counts JSON and exits.
Every request is parsed with the proto classes to count spans / log records; that cost is
this process's, not the sender's.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc  # noqa: E402
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (  # noqa: E402
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from receivers import GrpcReceiver  # noqa: E402


class Counts:
    def __init__(self) -> None:
        self.spans = 0
        self.logs = 0
        self.trace_requests = 0
        self.log_requests = 0
        self._lock = threading.Lock()

    def add_traces(self, raw: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(raw)
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        with self._lock:
            self.spans += n
            self.trace_requests += 1

    def add_logs(self, raw: bytes) -> None:
        req = ExportLogsServiceRequest.FromString(raw)
        n = sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)
        with self._lock:
            self.logs += n
            self.log_requests += 1

    def as_dict(self) -> dict:
        with self._lock:
            return {"spans": self.spans, "logs": self.logs,
                    "trace_requests": self.trace_requests, "log_requests": self.log_requests}


class _LogsServicer(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        self.counts.add_logs(request.SerializeToString())
        return ExportLogsServiceResponse()


class GrpcSink(GrpcReceiver):
    """The project's gRPC receiver (TraceService) with a LogsService beside it, counting only."""

    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_LogsServicer(counts), self._server)

    def add(self, raw: bytes) -> None:
        self.counts.add_traces(raw)


class HttpSink:
    def __init__(self, counts: Counts) -> None:
        routes = {
            "/v1/traces": (counts.add_traces, ExportTraceServiceResponse().SerializeToString()),
            "/v1/logs": (counts.add_logs, ExportLogsServiceResponse().SerializeToString()),
        }

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as OTLP/HTTP clients expect

            def _reply(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path == "/counts":
                    self._reply(200, json.dumps(counts.as_dict()).encode(), "application/json")
                else:
                    self._reply(404, b"", "text/plain")

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self._reply(404, b"", "text/plain")
                    return
                enc = self.headers.get("Content-Encoding", "").lower()
                try:
                    if enc == "gzip":
                        body = gzip.decompress(body)
                    elif enc == "deflate":
                        body = zlib.decompress(body)
                    route[0](body)
                except Exception as e:  # a malformed body is the sender's bug: say so, don't count it
                    self._reply(400, str(e).encode(), "text/plain")
                    return
                self._reply(200, route[1], "application/x-protobuf")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def main() -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    counts = Counts()
    with GrpcSink(counts) as g, HttpSink(counts) as h:
        print(f"grpc={g.port} http={h.port}", flush=True)
        done.wait()
        print(json.dumps(counts.as_dict()), flush=True)


if __name__ == "__main__":
    main()
