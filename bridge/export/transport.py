"""Ship ready-made, already serialised ExportTraceServiceRequests through the OpenTelemetry
SDK's OTLP exporters.

The SDK exporters already do what users rely on: retry with backoff on retryable codes, TLS
and client certificates, headers, compression, timeouts, and every `OTEL_EXPORTER_OTLP_*`
variable. They expect SDK span objects, though; these thin subclasses hand them the encoded
bytes instead (`wire.EncodedRequest`), so none of that delivery logic is written twice and the
request is never turned back into a protobuf object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from bridge.export.secrets import redact_url
from bridge.export.wire import EncodedRequest

GRPC, HTTP = "grpc", "http/protobuf"
PROTOCOLS = (GRPC, HTTP)


@dataclass(frozen=True, slots=True)
class Destination:
    endpoint: str | None  # None: nowhere to send, the terminal report only
    protocol: str


def destination(env: Mapping[str, str], endpoint: str | None = None, protocol: str | None = None) -> Destination:
    """Flags win over `OTEL_EXPORTER_OTLP_TRACES_*`, which win over `OTEL_EXPORTER_OTLP_*`."""
    proto = (protocol or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
             or GRPC).strip().lower()
    if proto == "http":
        proto = HTTP
    if proto not in PROTOCOLS:
        raise ValueError(f"protocol {proto!r} is not supported: use grpc or http/protobuf")
    # The flag and OTEL_EXPORTER_OTLP_ENDPOINT are base URLs; the signal-specific variable is
    # used as given (OpenTelemetry exporter specification).
    signal_ep = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if endpoint:
        ep, is_base = endpoint, True
    elif signal_ep:
        ep, is_base = signal_ep, False
    else:
        ep, is_base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT"), True
    if ep:
        parsed = urlparse(ep if "://" in ep else f"http://{ep}")
        if not parsed.hostname:
            raise ValueError(f"OTLP endpoint {redact_url(ep)!r} has no host: use e.g. http://127.0.0.1:4317")
        if proto == HTTP and is_base and (endpoint is None or parsed.path in ("", "/")):
            ep = ep.rstrip("/") + "/v1/traces"
    return Destination(ep or None, proto)


class Transport:
    """`send(request) -> bool`: True once the receiver acknowledged it, after the SDK's retries."""

    def send(self, request: EncodedRequest) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        pass


def _bytes_stub(channel):
    """TraceServiceStub's Export method, sending bytes that are already the serialised request
    (the stock stub would call ExportTraceServiceRequest.SerializeToString on them)."""
    from types import SimpleNamespace

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    return SimpleNamespace(Export=channel.unary_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        request_serializer=_payload,
        response_deserializer=ExportTraceServiceResponse.FromString,
        _registered_method=True,
    ))


def _payload(request: EncodedRequest) -> bytes:
    return request.payload


def _grpc_transport(endpoint: str) -> Transport:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    class GrpcTransport(OTLPSpanExporter, Transport):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            # The exporter builds its stub from `_stub`, now and on every reconnect.
            self._stub = _bytes_stub
            self._client = self._stub(self._channel)

        def _translate_data(self, data: EncodedRequest) -> EncodedRequest:  # already encoded
            return data

        def _count_data(self, data: EncodedRequest) -> int:
            return data.spans

        def send(self, request: EncodedRequest) -> bool:
            return self._export(request) == SpanExportResult.SUCCESS

        def close(self) -> None:
            self.shutdown()

    # As everywhere in OpenTelemetry: `http://` means plaintext, `https://` or no scheme TLS
    # (unless OTEL_EXPORTER_OTLP_[TRACES_]INSECURE=true).
    return GrpcTransport(endpoint=endpoint)


class LeanHttpTransport(Transport):
    """The SDK's OTLP/HTTP client over the standard library's http.client (`httpconn`)."""

    def __init__(self, client) -> None:
        self._client = client

    def send(self, request: EncodedRequest) -> bool:
        return self._client.export(request.payload).success

    def close(self) -> None:
        self._client.shutdown()


def _http_transport(endpoint: str) -> Transport:
    from bridge.export.httpconn import lean_http_client

    client = lean_http_client(endpoint)
    if client is not None:
        return LeanHttpTransport(client)

    # What `requests` handles in its own way (httpconn.needs_requests and the endpoint's
    # checks): the SDK exporter as it comes.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    class HttpTransport(OTLPSpanExporter, Transport):
        def send(self, request: EncodedRequest) -> bool:
            return self._client.export(request.payload).success

        def close(self) -> None:
            self.shutdown()

    return HttpTransport(endpoint=endpoint)


def make_transport(dest: Destination) -> Transport:
    if dest.endpoint is None:
        raise ValueError("no OTLP endpoint configured")
    return _grpc_transport(dest.endpoint) if dest.protocol == GRPC else _http_transport(dest.endpoint)
