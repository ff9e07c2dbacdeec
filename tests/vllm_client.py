"""Drives a real vLLM server like production clients do, and remembers what each request was.

Every request records the id vLLM logs for it (taken from the response), the outcome it must
get, and the texts that must never leave the bridge (the prompt and the generated output).
Requests with trace context are sent inside a client span made by the OpenTelemetry SDK; its
W3C `traceparent` goes into `X-Request-Id`, exactly as a propagator writes it.
"""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from waits import deadline

MODEL = "tiny"


@dataclass
class Sent:
    kind: str                 # completion | chat
    stream: bool
    expect: str               # finished | aborted | rejected (never reaches the engine)
    prompt: str
    logged_id: str = ""       # the id vLLM logs: `chatcmpl-…`, `cmpl-…-0`
    status: int = 0
    output: str = ""
    completion_tokens: int | None = None
    finish_reason: str | None = None
    trace_id: bytes | None = None   # the client span's context, when the request carried it
    span_id: bytes | None = None
    headers: dict = field(default_factory=dict)


class Client:
    def __init__(self, base: str) -> None:
        u = urlsplit(base)
        self.host, self.port, self.prefix = u.hostname, u.port, u.path.rstrip("/")
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        self.tracer = TracerProvider().get_tracer("vllm-trace-bridge-tests")

    def _new(self, kind: str, stream: bool, expect: str) -> Sent:
        s = Sent(kind, stream, expect, f"SECRET-PROMPT-{uuid.uuid4().hex[:12]} tell me about traces")
        with self._lock:
            self.sent.append(s)
        return s

    def _body(self, s: Sent, max_tokens: int, extra: dict) -> dict:
        body = {"model": MODEL, "max_tokens": max_tokens, "stream": s.stream, **extra}
        if s.kind == "chat":
            body["messages"] = [{"role": "user", "content": s.prompt}]
        else:
            body["prompt"] = s.prompt
        return body

    def request(self, kind: str = "completion", stream: bool = False, max_tokens: int = 8,
                request_id: str | None = None, expect: str = "finished", **extra) -> Sent:
        s = self._new(kind, stream, expect)
        if request_id is not None:
            s.headers["X-Request-Id"] = request_id
        self._send(s, max_tokens, extra)
        return s

    def traced(self, kind: str = "chat", stream: bool = False, form: str = "traceparent") -> Sent:
        """A request sent inside a client span, its context in `X-Request-Id` (`form`:
        traceparent, trace-span, trace), or `header`: the standard `traceparent` header only,
        for a gateway to carry on."""
        s = self._new(kind, stream, "finished")
        with self.tracer.start_as_current_span(f"client {kind}") as span:
            carrier: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(carrier)
            ctx = span.get_span_context()
            s.trace_id, s.span_id = ctx.trace_id.to_bytes(16, "big"), ctx.span_id.to_bytes(8, "big")
            if form == "header":
                s.headers["traceparent"] = carrier["traceparent"]
            else:
                s.headers["X-Request-Id"] = {"traceparent": carrier["traceparent"],
                                             "trace-span": f"{ctx.trace_id:032x}-{ctx.span_id:016x}",
                                             "trace": f"{ctx.trace_id:032x}"}[form]
            if form == "trace":
                s.span_id = None
            self._send(s, 8, {})
        return s

    def disconnect(self) -> Sent:
        """A streaming completion the client drops after its first chunk."""
        s = self._new("completion", True, "aborted")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=deadline(60))
        conn.request("POST", self.prefix + "/v1/completions", json.dumps(self._body(s, 4000, {"ignore_eos": True})),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        s.status = resp.status
        line = resp.fp.readline()
        while line and not line.startswith(b"data: {"):
            line = resp.fp.readline()
        s.logged_id = json.loads(line[6:])["id"] + "-0"
        conn.sock.shutdown(2)
        conn.close()
        return s

    def _send(self, s: Sent, max_tokens: int, extra: dict) -> None:
        path = self.prefix + ("/v1/chat/completions" if s.kind == "chat" else "/v1/completions")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=deadline(120))
        conn.request("POST", path, json.dumps(self._body(s, max_tokens, extra)),
                     {"Content-Type": "application/json", **s.headers})
        resp = conn.getresponse()
        s.status = resp.status
        data = resp.read()
        conn.close()
        if resp.status != 200:
            return
        if s.stream:
            rid, texts = "", []
            for line in data.split(b"\n"):
                if line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    rid = chunk["id"]
                    for c in chunk.get("choices", []):
                        texts.append((c.get("delta") or {}).get("content") or c.get("text") or "")
                        s.finish_reason = c.get("finish_reason") or s.finish_reason
            s.output = "".join(texts)
        else:
            obj = json.loads(data)
            rid = obj["id"]
            c = obj["choices"][0]
            s.output = c["message"]["content"] if s.kind == "chat" else c["text"]
            s.completion_tokens = obj["usage"]["completion_tokens"]
            s.finish_reason = c["finish_reason"]
        s.logged_id = rid + "-0" if s.kind == "completion" else rid

    def concurrently(self, n: int) -> None:
        """n requests at once, alternating completions and chats, streaming and not."""
        threads = [threading.Thread(target=self.request, kwargs={
            "kind": ("completion", "chat")[i % 2], "stream": bool(i // 2 % 2), "max_tokens": 16})
            for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
