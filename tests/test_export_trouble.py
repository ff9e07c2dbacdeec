"""A failed export says what to do by its cause. Against real receivers on 127.0.0.1, over TLS
with certificates this test makes (openssl): an untrusted CA gets "trust the CA" (and following
that advice delivers every request), a certificate for another name gets the name, TLS to a
plain-text receiver gets http://; only a closed port gets "start an OTLP receiver". The same,
for OTLP/HTTP and for gRPC: their errors are worded by different TLS stacks."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from receivers import GrpcReceiver, HttpReceiver

from bridge.synth import SynthConfig, write_file
from waits import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECEIVERS = {"http/protobuf": HttpReceiver, "grpc": GrpcReceiver}


def _cert(tmp_path, name: str, subject: str, san: str) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl (Debian package) is not installed")
    cert, key = str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", subject,
                    "-addext", f"subjectAltName={san}", "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def certs(tmp_path):
    """A self-signed certificate for 127.0.0.1 (its own CA, trusted by nobody), and one for a
    name that is not the endpoint's."""
    return {"ours": _cert(tmp_path, "ours", "/CN=127.0.0.1", "IP:127.0.0.1"),
            "elsewhere": _cert(tmp_path, "elsewhere", "/CN=elsewhere.example", "DNS:elsewhere.example")}


@pytest.fixture
def seed(tmp_path):
    path = str(tmp_path / "seed.log")
    return path, write_file(path, SynthConfig(requests=4, seed=5))


def _replay(tmp_path, path: str, endpoint: str, protocol: str, **env) -> tuple[int, dict[str, dict]]:
    """`python -m bridge replay` → (exit code, its log lines by event)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and not k.lower().endswith("_proxy")}
    # 3 s: room for a retry, whose line carries the error (the last attempt's line does not)
    environ.update(HOME=str(tmp_path), OTEL_EXPORTER_OTLP_TIMEOUT="3", **env)
    done = subprocess.run([sys.executable, "-m", "bridge", "replay", path, "--otlp-endpoint", endpoint,
                           "--otlp-protocol", protocol, "--waterfalls", "0"],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=deadline(120))
    events = {}
    for line in done.stderr.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            events.setdefault(rec.get("event"), rec)
    return done.returncode, events


@pytest.mark.parametrize("protocol", RECEIVERS)
def test_an_untrusted_ca_says_trust_the_ca_and_trusting_it_delivers(protocol, certs, seed, tmp_path):
    path, truth = seed
    cert, key = certs["ours"]
    with RECEIVERS[protocol](tls=(cert, key)) as rx:
        code, said = _replay(tmp_path, path, rx.endpoint, protocol)
        assert code == 1 and not rx.requests
        for event in ("export_retrying", "export_failed"):
            assert "OTEL_EXPORTER_OTLP_CERTIFICATE" in said[event]["fix"], said[event]
            assert "start an OTLP receiver" not in said[event]["fix"]
        assert "CERTIFICATE_VERIFY_FAILED" in said["export_retrying"]["error"]
        # The advice, followed: the CA's file in the variable it names.
        code, said = _replay(tmp_path, path, rx.endpoint, protocol, OTEL_EXPORTER_OTLP_CERTIFICATE=cert)
    assert code == 0, said
    assert len([s for _, s in rx.spans() if s.name == "vllm.request"]) == len(truth.requests)


@pytest.mark.parametrize("protocol", RECEIVERS)
def test_a_certificate_for_another_name_says_so(protocol, certs, seed, tmp_path):
    cert, key = certs["elsewhere"]
    with RECEIVERS[protocol](tls=(cert, key)) as rx:
        code, said = _replay(tmp_path, seed[0], rx.endpoint, protocol, OTEL_EXPORTER_OTLP_CERTIFICATE=cert)
    assert code == 1 and not rx.requests
    assert "not issued for the host name" in said["export_retrying"]["fix"], said


@pytest.mark.parametrize("protocol", RECEIVERS)
def test_tls_to_a_plain_text_receiver_says_use_http(protocol, seed, tmp_path):
    with RECEIVERS[protocol]() as rx:
        code, said = _replay(tmp_path, seed[0], rx.endpoint.replace("http://", "https://"), protocol)
    assert code == 1 and not rx.requests
    assert "plain text" in said["export_retrying"]["fix"] and "http://" in said["export_retrying"]["fix"], said


@pytest.mark.parametrize("protocol", RECEIVERS)
def test_nothing_listening_still_says_start_a_receiver(protocol, seed, tmp_path):
    with socket.socket() as s:  # a port just freed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, said = _replay(tmp_path, seed[0], f"http://127.0.0.1:{port}", protocol)
    assert code == 1
    assert said["export_retrying"]["fix"].startswith("start an OTLP receiver there"), said


@pytest.mark.parametrize("protocol", RECEIVERS)
def test_the_agents_line_for_the_exporters_tls_error_carries_the_fix(protocol, certs, monkeypatch, tmp_path):
    """The agent logs the SDK's own error line (its own `export_retrying` cannot see the error):
    that line carries the fix when it names a TLS cause."""
    import io

    from bridge.export.transport import destination, make_transport
    from bridge.export.wire import EncodedRequest
    from bridge.logs import make_logger, route_library_logs

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3")
    for key in [k for k in os.environ if k.startswith("OTEL_EXPORTER_OTLP_CERT") or k.lower().endswith("_proxy")]:
        monkeypatch.delenv(key)
    out = io.StringIO()
    with RECEIVERS[protocol](tls=certs["ours"]) as rx, route_library_logs(make_logger(out, json=True)):
        transport = make_transport(destination({}, rx.endpoint, protocol))
        try:
            assert transport.send(EncodedRequest(b"", 0)) is False
        finally:
            transport.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines and all(rec["event"] == "opentelemetry_log" for rec in lines)
    assert any("OTEL_EXPORTER_OTLP_CERTIFICATE" in rec.get("fix", "") for rec in lines), lines
