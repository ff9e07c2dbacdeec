"""Real OTLP receivers for tests: a gRPC TraceService built from the opentelemetry-proto stubs
and an OTLP/HTTP endpoint, both in-process on 127.0.0.1, both decoding what went over the wire."""

from __future__ import annotations

import gzip
import threading
import zlib
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bridge.export.transport import Transport


class CapturingTransport(Transport):
    """The bytes an exporter would send, kept in memory: a `bridge.export.transport.Transport`
    that accepts every request (no server), for tests that compare encodings."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def send(self, request) -> bool:
        self.payloads.append(request.payload)
        return True


class _Store:
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.raw: list[bytes] = []
        self._lock = threading.Lock()

    def add(self, raw: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(raw)
        with self._lock:
            self.raw.append(raw)
            self.requests.append(req)

    def spans(self) -> list[tuple[dict, object]]:
        """(resource attributes, span) for every span received."""
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                res = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((res, s) for s in ss.spans)
        return out


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


class GrpcReceiver(_Store, trace_service_pb2_grpc.TraceServiceServicer):
    """`fail_first` requests are answered UNAVAILABLE (retryable) before any is accepted;
    `tls`: (certificate, key) files, served over TLS (https:// endpoint)."""

    def __init__(self, fail_first: int = 0, port: int = 0, tls: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.fail_first = fail_first
        self.rejected = 0
        self._scheme = "https" if tls else "http"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        if tls:
            cert, key = (open(f, "rb").read() for f in tls)
            creds = grpc.ssl_server_credentials([(key, cert)])
            self.port = self._server.add_secure_port(f"127.0.0.1:{port}", creds)
        else:
            self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        if self.rejected < self.fail_first:
            self.rejected += 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        self.add(request.SerializeToString())
        return ExportTraceServiceResponse()

    @property
    def endpoint(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> GrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(grace=None)


class HttpReceiver(_Store):
    """OTLP/HTTP on 127.0.0.1. `fail_first`: answer that many requests 503 (with
    `retry_after`, if given, as a Retry-After header); `keep_alive`: HTTP/1.1 persistent
    connections (else HTTP/1.0, one request per connection); `tls`: (certificate, key) files,
    served as https; `silent_close`: HTTP/1.1, but each connection is closed after one answer
    without saying so (a keep-alive connection the server timed out). Each request's headers
    are kept in `headers`, connections counted."""

    def __init__(self, fail_first: int = 0, retry_after: str | None = None, keep_alive: bool = False,
                 tls: tuple[str, str] | None = None, silent_close: bool = False) -> None:
        super().__init__()
        store = self
        self.rejected = 0
        self.headers: list[dict[str, str]] = []
        self.connections = 0
        self._scheme = "https" if tls else "http"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive or silent_close else "HTTP/1.0"

            def setup(self):
                super().setup()
                with store._lock:
                    store.connections += 1

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with store._lock:
                    store.headers.append({k.lower(): v for k, v in self.headers.items()})
                    fail = store.rejected < fail_first
                    if fail:
                        store.rejected += 1
                if fail:
                    self.send_response(503)
                    if retry_after is not None:
                        self.send_header("Retry-After", retry_after)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                enc = self.headers.get("Content-Encoding", "")
                if enc == "gzip":
                    body = gzip.decompress(body)
                elif enc == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                store.add(body)
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                if silent_close:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
