"""The client's own record of each request: what it sent and what it saw on the wire, in
wall-clock nanoseconds (the clock of the CRI stamps in the server's log). Nothing here reads
the log or the bridge's output."""

from __future__ import annotations

import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from waits import deadline

from .generator import RequestSpec, Setup

MODEL_NAME = "tiny"   # tests/vllm_server.py's --served-model-name
PATHS = {"completion": "/v1/completions", "chat": "/v1/chat/completions", "responses": "/v1/responses"}


@dataclass
class Record:
    spec: dict
    status: int = 0                 # 0: no status line (connection died first)
    response_id: str = ""           # the body's or first chunk's `id`
    t_send_ns: int = 0
    t_first_byte_ns: int = 0        # first byte of the body (a stream's first line)
    t_first_token_ns: int = 0       # first chunk carrying generated text (a whole body: its first byte)
    t_end_ns: int = 0
    ended: str = ""                 # complete | aborted (the client closed) | cut (the server did) | error
    chunks: int = 0                 # data chunks read
    finish_reasons: list = field(default_factory=list)   # by choice index
    empty_choices: list = field(default_factory=list)    # a chat choice with no text: vLLM logs no line for it
    usage: dict = field(default_factory=dict)            # prompt_tokens / completion_tokens as the server said
    error: str = ""                 # the error body's type (never the prompt)


def body_of(spec: RequestSpec, setup: Setup) -> dict:
    words = list(spec.words)
    if spec.bad == "too_long":   # more words than the model's context, each at least one token
        words = (words * (setup.max_model_len // len(words) + 2))[:setup.max_model_len + 50]
    prompt = " ".join(words)
    body: dict = {"model": "no-such-model" if spec.bad == "unknown_model" else MODEL_NAME, "stream": spec.stream}
    max_tokens: object = spec.max_tokens
    if spec.bad == "wrong_type":
        max_tokens = "many"
    elif spec.bad == "negative_max_tokens":
        max_tokens = -5
    if spec.api == "responses":
        body.update(input=prompt, max_output_tokens=max_tokens)
    else:
        body["max_tokens"] = max_tokens
        if spec.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if spec.n != 1:
            body["n"] = spec.n
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        if spec.ignore_eos:
            body["ignore_eos"] = True
    if spec.priority:
        body["priority"] = spec.priority
    return body


def send(port: int, spec: RequestSpec, setup: Setup) -> Record:
    rec = Record(spec=asdict(spec))
    headers = {"Content-Type": "application/json", "X-Request-Id": spec.sent_id}
    payload = json.dumps(body_of(spec, setup))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline(300))
    rec.t_send_ns = time.time_ns()
    try:
        conn.request("POST", PATHS[spec.api], payload, headers)
        resp = conn.getresponse()
        rec.status = resp.status
        if spec.stream and resp.status == 200:
            _read_stream(rec, spec, resp, conn)
        else:
            data = resp.read(1)
            rec.t_first_byte_ns = rec.t_first_token_ns = time.time_ns()
            data += resp.read()
            rec.t_end_ns = time.time_ns()
            obj = json.loads(data)
            if resp.status == 200:
                _whole(rec, spec, obj)
            else:
                err = obj.get("error", obj) if isinstance(obj, dict) else {}
                rec.error = str(err.get("type", "")) if isinstance(err, dict) else ""
            rec.ended = "complete"
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec.t_end_ns = rec.t_end_ns or time.time_ns()
        rec.ended = rec.ended or ("cut" if rec.t_first_byte_ns else "error")
        rec.error = rec.error or type(e).__name__
    finally:
        conn.close()
    return rec


def _usage(u: dict | None) -> dict:
    if not u:
        return {}
    return {"prompt_tokens": u.get("prompt_tokens", u.get("input_tokens")),
            "completion_tokens": u.get("completion_tokens", u.get("output_tokens"))}


def _whole(rec: Record, spec: RequestSpec, obj: dict) -> None:
    rec.response_id = obj.get("id", "")
    rec.usage = _usage(obj.get("usage"))
    if spec.api == "responses":
        return   # status/incomplete_details, not per-choice finish reasons
    rec.finish_reasons = [c["finish_reason"] for c in obj["choices"]]
    if spec.api == "chat":
        rec.empty_choices = [not (c["message"].get("content") or c["message"].get("tool_calls")) for c in obj["choices"]]


def _read_stream(rec: Record, spec: RequestSpec, resp, conn) -> None:
    reasons: dict[int, str] = {}
    said: dict[int, bool] = {}
    done = False
    while True:
        line = resp.fp.readline()
        if not line:
            break
        if not rec.t_first_byte_ns:
            rec.t_first_byte_ns = time.time_ns()
        if line.startswith(b"data: [DONE]"):
            done = True
            break
        if not line.startswith(b"data: {"):
            continue
        rec.chunks += 1
        chunk = json.loads(line[6:])
        if not rec.t_first_token_ns and _has_token(chunk):
            rec.t_first_token_ns = time.time_ns()
        if spec.api == "responses":
            r = chunk.get("response") or {}
            rec.response_id = rec.response_id or r.get("id", "")
            if chunk.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                rec.usage = _usage(r.get("usage"))
                done = True
        else:
            rec.response_id = rec.response_id or chunk.get("id", "")
            if chunk.get("usage"):
                rec.usage = _usage(chunk["usage"])
            for c in chunk.get("choices", []):
                i = c.get("index", 0)
                delta = c.get("delta") or {}
                said[i] = said.get(i, False) or bool(delta.get("content") or delta.get("tool_calls") or c.get("text"))
                if c.get("finish_reason"):
                    reasons[i] = c["finish_reason"]
        if spec.abort_after is not None and rec.chunks >= spec.abort_after and not done:
            try:   # the client goes away mid-stream: a hard close, as a killed client does
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            rec.t_end_ns = time.time_ns()
            rec.ended = "aborted"
            break
    rec.t_end_ns = rec.t_end_ns or time.time_ns()
    rec.finish_reasons = [reasons[i] for i in sorted(reasons)]
    if spec.api == "chat":
        rec.empty_choices = [not said.get(i, False) for i in sorted(reasons)]
    rec.ended = rec.ended or ("complete" if done else "cut")


def _has_token(chunk: dict) -> bool:
    """Whether a stream chunk carries generated text (a chat's first chunk carries only the
    role, a Responses stream starts with `response.created`: both come before any token)."""
    if chunk.get("type", "").endswith(".delta"):
        return bool(chunk.get("delta"))
    return any(c.get("text") or (c.get("delta") or {}).get("content") for c in chunk.get("choices") or [])


def run_workload(port: int, setup: Setup, specs: list[RequestSpec], workers: int = 6) -> list[Record]:
    """Send each request at its `at_s` (concurrently, up to `workers` in flight); the records in
    the specs' order."""
    t0 = time.monotonic()
    records: list[Record | None] = [None] * len(specs)

    def one(spec: RequestSpec) -> None:
        delay = t0 + spec.at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        records[spec.index] = send(port, spec, setup)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, specs))
    return [r for r in records if r is not None]
