"""OTLP/HTTP over the standard library's http.client under the SDK's own client (`httpconn`):
what users rely on from the SDK exporter still holds — retry and Retry-After, headers, TLS with
the variables' certificates, reconnecting — and where `requests` would read more from the
environment (a proxy), the SDK exporter as it comes is used. Every check is against what a real
receiver on 127.0.0.1 got, decoded from the wire, and the requests the test itself wrote."""

from __future__ import annotations

import io
import shutil
import subprocess

import pytest
from receivers import HttpReceiver

from bridge.cli import main
from bridge.export.httpconn import needs_requests
from bridge.export.transport import Destination, LeanHttpTransport, make_transport
from bridge.synth import SynthConfig, write_file
from waits import deadline


def _replay(path: str, endpoint: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["replay", path, "--otlp-endpoint", endpoint, "--protocol", "http/protobuf"], env={}, out=out)
    return code, out.getvalue()


def _roots(rx) -> list[str]:
    return [s.name for _, s in rx.spans() if s.name == "vllm.request"]


@pytest.fixture
def log(tmp_path):
    path = str(tmp_path / "seed.log")
    return path, write_file(path, SynthConfig(requests=40, seed=3))


@pytest.fixture
def no_proxy_env(monkeypatch, tmp_path):
    """Nothing `requests` would read instead: no proxy variable, no NETRC, a home without .netrc."""
    for key in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def test_the_lean_transport_is_the_one_used_with_this_sdk(no_proxy_env):
    """If the SDK's client changed shape, the bridge would silently fall back to `requests`
    (correct, but ~50 ms more at every start): this fails instead, so the change is seen."""
    t = make_transport(Destination("http://127.0.0.1:1/v1/traces", "http/protobuf"))
    try:
        assert type(t) is LeanHttpTransport
    finally:
        t.close()


def test_a_proxy_in_the_environment_keeps_the_sdk_exporter(monkeypatch, no_proxy_env):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert needs_requests({"HTTPS_PROXY": "http://proxy.invalid:3128"}) == "HTTPS_PROXY"
    assert needs_requests({"no_proxy": "10.0.0.0/8"}) is None
    t = make_transport(Destination("http://127.0.0.1:1/v1/traces", "http/protobuf"))
    try:
        assert type(t) is not LeanHttpTransport
    finally:
        t.close()


def test_netrc_credentials_keep_the_sdk_exporter(no_proxy_env, tmp_path):
    """`requests` sends a `.netrc` login for the host: the lean transport would not."""
    assert needs_requests({}) is None
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login u password p\n")
    assert needs_requests({}) == ".netrc"
    assert needs_requests({"NETRC": "/etc/other-netrc"}) in ("NETRC", ".netrc")


@pytest.mark.parametrize("keep_alive", [False, True])
def test_every_batch_arrives_over_one_or_many_connections(tmp_path, no_proxy_env, keep_alive):
    """HTTP/1.0 closes after each answer; HTTP/1.1 keeps the connection: both deliver all."""
    path = str(tmp_path / "seed.log")
    truth = write_file(path, SynthConfig(requests=700, seed=8))  # several 1024-span batches
    with HttpReceiver(keep_alive=keep_alive) as rx:
        code, out = _replay(path, rx.endpoint)
    assert code == 0, out
    assert len(rx.requests) >= 2
    assert len(_roots(rx)) == len(truth.requests)
    assert rx.connections == (1 if keep_alive else len(rx.requests))


def test_a_connection_the_server_closed_unannounced_is_reopened(tmp_path, no_proxy_env):
    path = str(tmp_path / "seed.log")
    truth = write_file(path, SynthConfig(requests=700, seed=9))
    with HttpReceiver(silent_close=True) as rx:
        code, out = _replay(path, rx.endpoint)
    assert code == 0, out
    assert len(rx.requests) >= 2 and rx.connections == len(rx.requests)
    assert len(_roots(rx)) == len(truth.requests)


def test_a_503_with_retry_after_is_retried_and_nothing_is_lost(log, no_proxy_env):
    path, truth = log
    with HttpReceiver(fail_first=2, retry_after="0", keep_alive=True) as rx:
        code, out = _replay(path, rx.endpoint)
    assert code == 0, out
    assert rx.rejected == 2
    assert len(_roots(rx)) == len(truth.requests)


def test_headers_from_the_standard_variable_reach_the_receiver(log, monkeypatch, no_proxy_env):
    path, _ = log
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=Bearer%20t0k,x-tenant=a")
    with HttpReceiver() as rx:
        code, out = _replay(path, rx.endpoint)
    assert code == 0, out
    assert rx.headers and all(h["authorization"] == "Bearer t0k" and h["x-tenant"] == "a" for h in rx.headers)
    assert all(h["content-type"] == "application/x-protobuf" for h in rx.headers)


def test_a_receiver_that_went_away_fails_with_exit_1(log, monkeypatch, no_proxy_env):
    path, _ = log
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    with HttpReceiver() as rx:
        endpoint = rx.endpoint
    code, out = _replay(path, endpoint)
    assert code == 1
    assert "NOT delivered" in out


@pytest.fixture
def self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl (Debian package) is not installed")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def test_tls_trusts_the_certificate_the_variable_names(log, monkeypatch, no_proxy_env, self_signed):
    path, truth = log
    cert, key = self_signed
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    with HttpReceiver(tls=(cert, key), keep_alive=True) as rx:
        # Not trusted: no span goes to a server whose certificate nobody vouched for.
        code, out = _replay(path, rx.endpoint)
        assert code == 1 and not rx.requests
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", cert)
        code, out = _replay(path, rx.endpoint)
    assert code == 0, out
    assert rx.endpoint.startswith("https://")
    assert len(_roots(rx)) == len(truth.requests)


def _silent_receiver(call, close) -> tuple[float, list, int]:
    """`call(url)` in a thread against a receiver that accepts and never answers, then
    `close()`: (seconds `close` and the call took to end, the call's result, connections)."""
    import socket
    import threading
    import time

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list = []
    threading.Thread(target=lambda: [accepted.append(server.accept()) for _ in range(2)], daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/v1/traces"
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call(url)), daemon=True)
    try:
        worker.start()
        time.sleep(0.3)
        start = time.monotonic()
        close()
        worker.join(deadline(10))
        return (time.monotonic() - start if not worker.is_alive() else float("inf")), result, len(accepted)
    finally:
        server.close()
        for conn, _ in accepted:
            conn.close()


def test_close_ends_a_request_a_silent_receiver_holds():
    """A receiver that accepts and never answers must not hold a shutdown for the timeout (30 s)."""
    from bridge.export.httpconn import StdlibTransport

    transport = StdlibTransport()
    took, result, _ = _silent_receiver(lambda url: transport.request("POST", url, data=b"x", timeout=30),
                                       transport.close)
    assert took < 15  # half the request's 30 s timeout: close did not wait for it
    assert result[0].error is not None and transport.is_connection_error(result[0].error)


def _raw_server(answer: bytes, read_body: bool):
    """A bounded one-thread HTTP server on 127.0.0.1 answering every request with `answer`,
    after reading the body or (`read_body=False`) right after the headers, then closing."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    seen = {"requests": 0, "paths": [], "stop": False}

    def loop():
        while not seen["stop"]:
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                seen["requests"] += 1
                seen["paths"].append(head.split(b" ")[1].decode())
                length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                               if x.lower().startswith(b"content-length")), 0)
                while read_body and len(rest) < length:
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        break
                    rest += chunk
                conn.sendall(answer)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def stop():
        seen["stop"] = True
        thread.join(deadline(2))
        server.close()

    return f"http://127.0.0.1:{server.getsockname()[1]}", seen, stop


def _client(endpoint: str):
    from bridge.export.httpconn import lean_http_client

    client = lean_http_client(endpoint, {})
    assert client is not None
    return client


def test_an_answer_before_the_body_is_read_is_reported_not_retried(no_proxy_env):
    """The Collector answers 413 to a batch over its limit before reading it, and closes: the
    413 is what the exporter reports (not a reset it retries six times)."""
    base, seen, stop = _raw_server(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                                   read_body=False)
    client = _client(base + "/v1/traces")
    try:
        result = client.export(b"\x00" * (16 << 20))
    finally:
        client.shutdown()
        stop()
    assert (result.success, result.status_code, seen["requests"]) == (False, 413, 1)


def test_a_path_is_percent_encoded_as_requests_sends_it(no_proxy_env):
    base, seen, stop = _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", read_body=True)
    client = _client(base + "/otlp v1/tr\u00e4ces?tenant=a b")
    try:
        assert client.export(b"x").success
    finally:
        client.shutdown()
        stop()
    assert seen["paths"] == ["/otlp%20v1/tr%C3%A4ces?tenant=a%20b"]


def test_shutdown_is_not_held_by_the_sdks_retry_against_a_silent_receiver(no_proxy_env):
    """Shutting down wakes the request in flight; the SDK's client then retries a connection
    error at once, and that retry must not open a new connection and wait the timeout (20 s) out."""
    holder: list = []

    def start(url):
        holder.append(_client(url))
        holder[0]._timeout = 20.0
        return holder[0].export(b"x")

    took, result, connections = _silent_receiver(start, lambda: holder[0].shutdown())
    assert took < 10  # half the client's 20 s timeout: shutdown did not wait for it
    assert result and not result[0].success
    assert connections == 1  # no second connection after the shutdown


@pytest.mark.parametrize("endpoint,env", [
    ("http://user:s3cret@127.0.0.1:4318/v1/traces", {}),       # requests sends Basic auth from the URL
    ("127.0.0.1:4318/v1/traces", {}),                           # no scheme: requests' own error
    ("https://127.0.0.1:4318/v1/traces", {"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}),
])
def test_what_requests_handles_in_its_own_way_stays_with_it(endpoint, env):
    from bridge.export.httpconn import lean_http_client

    assert lean_http_client(endpoint, env) is None
