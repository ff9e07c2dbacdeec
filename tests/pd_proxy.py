"""A small prefill/decode proxy for the distributed tests, stdlib only (the test venv has no aiohttp).

The protocol is that of vLLM's own toy proxy (`toy_proxy_server.py`, beside its NIXL integration
tests), as vLLM 0.32's NIXL connector reads it (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
pull_scheduler.py, `request_finished` and the params it returns): the client's request goes
first to the prefill instance with `kv_transfer_params: {do_remote_decode: true}`, `max_tokens=1`
and no streaming; the prefill's response carries the `kv_transfer_params` its connector returned
when the request finished (`do_remote_prefill`, `remote_engine_id`, `remote_request_id` = the
prefill's engine request id, `remote_block_ids`, `remote_host`, `remote_port`); those go, unchanged,
with the client's original body to the decode instance, whose response goes back to the client.
Both halves get the one `X-Request-Id` (the client's, or one the proxy makes), as llm-d's
sidecar does.

Sequential by design (one request at a time through `ThreadingHTTPServer` is still fine): the
tests drive it one request after the other.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _post(url: str, body: dict, request_id: str, timeout: float) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {"error": str(e)}


def prefill_body(body: dict) -> dict:
    """The client's body as the prefill instance gets it (vLLM's toy proxy's rewrite)."""
    out = dict(body)
    out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return out


class PdProxy:
    """`with PdProxy(prefill_base, decode_base, timeout) as p: p.base` — forwards POST /v1/* ."""

    def __init__(self, prefill: str, decode: str, timeout: float) -> None:
        self.prefill, self.decode, self.timeout = prefill, decode, timeout
        self.seen: list[dict] = []  # per request: the id and the prefill's kv_transfer_params
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                rid = self.headers.get("X-Request-Id") or str(uuid.uuid4())
                code, out = proxy.forward(self.path, body, rid)
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Request-Id", rid)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="pd-proxy")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def forward(self, path: str, body: dict, rid: str) -> tuple[int, dict]:
        code, first = _post(self.prefill + path, prefill_body(body), rid, self.timeout)
        if code != 200:
            return code, first
        params = first.get("kv_transfer_params")
        self.seen.append({"x_request_id": rid, "prefill_id": first.get("id"), "kv_transfer_params": params})
        second = dict(body)
        second["kv_transfer_params"] = params
        return _post(self.decode + path, second, rid, self.timeout)

    def __enter__(self) -> "PdProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
