"""Credentials never printed (issue 37, point 4): the endpoint URL's user:password and the OTLP
header values, in the start line, every exporter error, /readyz and --print-config."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentkit import AgentProc, free_port, wait_for
from bridge.export.secrets import Redactor, redact_url, secrets_from
from waits import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSWORD, TOKEN, KEY = "hunter2-pw", "s3cr3t-T0ken", "k3y-k3y-k3y"
HEADERS = {"OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{TOKEN},x-api-key={KEY}"}
BASIC = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()  # the Authorization an HTTP client makes of the URL
SECRETS = (PASSWORD, TOKEN, KEY, BASIC)


def _clean(text: str) -> bool:
    return not any(s in text for s in SECRETS)


@pytest.mark.parametrize("url,shown", [
    ("http://alice:hunter2@collector:4318", "http://***@collector:4318"),
    ("https://tok3n@collector", "https://***@collector"),
    ("http://collector:4318/v1/traces?api_key=abc&x=1", "http://collector:4318/v1/traces?api_key=***&x=1"),
    ("http://collector:4317", "http://collector:4317"),
    ("collector:4317", "collector:4317"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_the_redactor_scrubs_header_values_and_urls_anywhere_in_a_line():
    secrets = secrets_from(HEADERS, f"http://alice:{PASSWORD}@h:1")
    event = {"event": "x", "message": f"401 for Bearer {TOKEN} at http://alice:{PASSWORD}@h:1/v1/traces",
             "nested": [{"k": KEY}], "n": 3}
    out = Redactor(secrets)(None, "error", event)
    assert _clean(repr(out)) and out["n"] == 3 and "***" in out["message"]


def test_print_config_shows_no_password(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bridge", "run", "--otlp-endpoint", f"http://alice:{PASSWORD}@h:4318",
                        "--print-config"], cwd=ROOT, capture_output=True, text=True, timeout=deadline(120),
                       env={**os.environ, **HEADERS})
    assert r.returncode == 0, r.stderr
    assert "otlp_endpoint: http://***@h:4318" in r.stdout
    assert _clean(r.stdout + r.stderr)


class _Echo(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that refuses every export, quoting the credentials it was sent
    (as a misconfigured proxy's error page does)."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        reason = f"refused: authorization={self.headers.get('authorization')} key={self.headers.get('x-api-key')}"
        body = reason.encode()
        self.send_response(400, reason)  # the SDK's error line quotes the reason phrase
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _pod(tmp_path) -> str:
    d = tmp_path / "pods" / "llm_vllm-0_3f2a9c1e-1111-2222-3333-444455556666" / "vllm"
    d.mkdir(parents=True)
    (d / "0.log").write_text(
        "2025-02-15T10:23:01.000000000Z stdout F INFO 02-15 10:23:02 scheduler.py:789] Request 0xa: prompt_tokens=1, "
        "generated_tokens=2, ttft=1.0ms, itl=1.0ms, total_latency=0.5s\n")
    return str(tmp_path / "pods/*/*/*.log")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_agent_never_prints_the_credentials(tmp_path, protocol):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1] if protocol == "http/protobuf" else free_port()  # grpc: nothing listens
    agent = AgentProc(_pod(tmp_path), str(tmp_path / "state"), f"http://alice:{PASSWORD}@127.0.0.1:{port}",
                      "--otlp-protocol", protocol, "--start-at", "beginning", "--export-give-up", "2",
                      env=HEADERS)
    agent.start()
    try:
        started = next(e for e in agent.log_events() if e.get("event") == "agent_started")
        assert started["endpoint"].startswith("http://***@127.0.0.1:")
        if protocol == "http/protobuf":  # refused at once: /readyz says export is failing, and where
            assert wait_for(lambda: "export failing" in agent.get("/readyz")[1], deadline(60))
            status, body = agent.get("/readyz")
            assert "***@127.0.0.1" in body and _clean(body)
        # an exporter error was logged (and, over HTTP, it quoted what the server was sent)
        assert wait_for(lambda: any(e.get("level") in ("warning", "error") and e.get("event") != "agent_started"
                                    for e in agent.log_events()), deadline(60))
        assert agent.term(deadline(30))[0] == 0
    finally:
        server.shutdown()
    text = open(agent.stderr_path).read()
    if protocol == "http/protobuf":
        assert "refused: authorization=Basic *** key=***" in text  # the receiver's message kept, its secrets not
    assert _clean(text), [line for line in text.splitlines() if not _clean(line)][:3]


def test_replay_never_prints_the_credentials(tmp_path):
    path = _pod(tmp_path).replace("pods/*/*/*.log", "pods/llm_vllm-0_3f2a9c1e-1111-2222-3333-444455556666/vllm/0.log")
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "bridge", "replay", path, "--otlp-endpoint",
                        f"http://alice:{PASSWORD}@127.0.0.1:{port}", "--otlp-protocol", "http/protobuf"],
                       cwd=ROOT, capture_output=True, text=True, timeout=deadline(300), env={**os.environ, **HEADERS})
    assert "http://***@127.0.0.1" in r.stdout + r.stderr
    assert _clean(r.stdout + r.stderr)
