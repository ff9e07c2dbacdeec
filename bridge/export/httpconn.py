"""OTLP/HTTP through the SDK's own client over the standard library's `http.client`.

The SDK's `_OTLPHTTPClient` keeps doing what users rely on: retry with jittered backoff and
`Retry-After`, compression, headers, the timeout, and every `OTEL_EXPORTER_OTLP_*` variable
(read by the SDK's own resolvers). Only the HTTP transport underneath it is swapped, through
the SDK's pluggable `BaseHTTPTransport`: its default, `requests`, costs ~50 ms of CPU to import
at every start and reads the proxy variables from the environment twice per request, for
nothing when no proxy is set (#22, docs/performance.md).

Where `requests` would do more than open a connection — a proxy or `.netrc` credentials read
from the environment, a credential-provider session, credentials in the endpoint URL — or
would fail in its own words (no scheme, a CA or client certificate it cannot load),
`lean_http_client` returns None and the caller keeps the SDK exporter as it comes, so nothing a
user configured is lost. The CA bundle `requests` would trust is trusted here too:
`REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE`, else certifi's; but an
`OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE` wins over those variables here, where `requests` lets
them override it.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

# What else `requests` takes from the environment (trust_env): any of these and it is used
# instead. Its CA bundle variables are read here (`_tls_files`).
_REQUESTS_ENV = ("NETRC",
                 "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
                 "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER")


def needs_requests(env: Mapping[str, str]) -> str | None:
    """Why this connection would differ from the SDK's `requests` transport, or None."""
    for key, value in env.items():
        low = key.lower()
        if value and low.endswith("_proxy") and low != "no_proxy":
            return key
    for key in _REQUESTS_ENV:
        if env.get(key):
            return key
    home = os.path.expanduser("~")
    for name in (".netrc", "_netrc"):
        if os.path.exists(os.path.join(home, name)):
            return name
    return None


@dataclass(frozen=True, slots=True)
class _Result(BaseHTTPResult):
    body: bytes = b""
    response_headers: Mapping[str, str] | None = field(default=None, compare=False, hash=False)

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        return self.response_headers if self.response_headers is not None else {}  # case-insensitive get


class StdlibTransport(BaseHTTPTransport):
    """One kept-alive connection to the endpoint's host, reopened when the server closed it.

    `verify`: a CA file or directory, True for certifi's bundle (the system's without certifi),
    False for none; `cert`: a client certificate path, or (certificate, key)."""

    def __init__(self, *, verify: bool | str = True, cert: str | tuple[str, str] | None = None) -> None:
        self._verify = verify
        self._cert = cert
        self._conn: http.client.HTTPConnection | None = None
        self._key: tuple[str, str, int | None] | None = None
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            verify = self._verify
            if verify is False:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            elif isinstance(verify, str):
                ctx = ssl.create_default_context(capath=verify) if os.path.isdir(verify) else \
                    ssl.create_default_context(cafile=verify)
            else:
                try:
                    import certifi
                    ctx = ssl.create_default_context(cafile=certifi.where())
                except ImportError:
                    ctx = ssl.create_default_context()
            if isinstance(self._cert, tuple):
                ctx.load_cert_chain(self._cert[0], self._cert[1])
            elif self._cert:
                ctx.load_cert_chain(self._cert)
            self._context = ctx
        return self._context

    def _connection(self, scheme: str, host: str, port: int | None, timeout: float | None):
        key = (scheme, host, port)
        if self._conn is None or self._key != key:
            self._drop()
            if scheme == "https":
                self._conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl_context())
            else:
                self._conn = http.client.HTTPConnection(host, port, timeout=timeout)
            self._key = key
        conn = self._conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                timeout: float | None = None, data: bytes | None = None) -> BaseHTTPResult:
        parts = urlsplit(url)
        # Percent-encoded as `requests` does (requote_uri): a space or non-ASCII in the path is sent.
        path = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe="!#$%&'()*+,/:;=?@[]~")
        with self._lock:
            if self._closed:  # shut down: the SDK's immediate retry must not open a new connection
                return _Result(error=ConnectionAbortedError("transport closed"))
            try:
                conn = self._connection(parts.scheme, parts.hostname or "", parts.port, timeout)
                try:
                    conn.request(method, path, body=data, headers=headers or {})
                except (BrokenPipeError, ConnectionResetError):
                    # A receiver may answer before it has read the body (413 for a batch over its
                    # limit) and close: its answer is what counts, as urllib3 reads it too.
                    pass
                response = conn.getresponse()
                body = response.read()
                if response.will_close:
                    self._drop()
            except Exception as exc:  # the SDK's client decides: retry (connection errors) or give up
                self._drop()
                return _Result(error=exc)
        return _Result(response.status, response.reason, body=body, response_headers=response.headers)

    def is_connection_error(self, exception: Exception | None) -> bool:
        # ssl.SSLError and timeouts are OSErrors: `requests` counts them as connection errors too.
        return isinstance(exception, (OSError, http.client.HTTPException))

    def close(self) -> None:
        """Also ends a request in flight at once (a receiver that accepted and never answers
        would hold a shutdown for the whole timeout): shutting the socket down wakes the
        thread waiting on it, as closing it would not."""
        self._closed = True
        for _ in range(8):  # a request may be connecting: its socket appears, and is shut down too
            conn = self._conn
            sock = conn.sock if conn is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if self._lock.acquire(timeout=0.25):
                try:
                    self._drop()
                finally:
                    self._lock.release()
                return


def _tls_files(env: Mapping[str, str]) -> tuple[bool | str, str | tuple[str, str] | None]:
    """verify and cert as the SDK's OTLP/HTTP trace exporter resolves them from the environment,
    then, with no certificate given, the CA bundle variables `requests` reads."""
    verify = (env.get("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE") or env.get("OTEL_EXPORTER_OTLP_CERTIFICATE")
              or env.get("REQUESTS_CA_BUNDLE") or env.get("CURL_CA_BUNDLE") or True)
    key = env.get("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY") or env.get("OTEL_EXPORTER_OTLP_CLIENT_KEY")
    cert = env.get("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE") or env.get("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")
    return verify, ((cert, key) if cert and key else cert)


def lean_http_client(endpoint: str, env: Mapping[str, str] = os.environ):
    """The SDK's `_OTLPHTTPClient` for `endpoint` over `StdlibTransport`; None where `requests`
    would do more (see above) or where this SDK version's client is not the one this was written
    against. `env` is where the proxy and TLS variables are looked up (tests pass their own);
    the timeout, compression and headers are the SDK's resolvers', which read the process
    environment. The TLS variables are resolved here as the SDK's `_build_transport` does: it
    cannot be called without building a `requests` session."""
    if needs_requests(env):
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        return None  # no scheme, or credentials in the URL: `requests` says or sends what it always did
    try:
        from opentelemetry.exporter.otlp.common.http import _OTLPHTTPClient
        from opentelemetry.exporter.otlp.proto.http._common import (
            _resolve_compression,
            _resolve_headers,
            _resolve_timeout,
        )
    except ImportError:
        return None
    verify, cert = _tls_files(env)
    transport = StdlibTransport(verify=verify, cert=cert)
    if parts.scheme == "https":
        try:  # a missing or bad CA or client certificate: the SDK exporter reports it, as before
            transport._ssl_context()
        except (OSError, ValueError, ssl.SSLError):
            return None
    try:
        return _OTLPHTTPClient(
            transport=transport,
            endpoint=endpoint,
            kind="spans",
            timeout=_resolve_timeout("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"),
            compression=_resolve_compression("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"),
            headers=_resolve_headers(None, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
        )
    except TypeError:  # another signature: the SDK exporter as it comes
        return None
