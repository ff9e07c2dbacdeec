"""Scenarios against a real vLLM server, each driven by a client that records its OWN truth.

The truth of a request is what the client saw on the wire: the `X-Request-Id` it sent, the id
vLLM answered with, the status code, when it sent, when the first byte came back, when it ended
and how (finished, refused, cut). Times are wall-clock nanoseconds, the clock the CRI stamps of
the server's log use. A scenario also records what it did to the server (SIGTERM, kill -9 of the
EngineCore) and when. Nothing here reads the bridge's output: the truth is independent of it.

`run(name, install, log_path)` runs one scenario and returns its truth (a JSON-able dict);
tests/scenarios/record.py saves the log and the truth as fixtures, and
tests/test_real_scenarios.py runs them live.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

from vllm_server import MODEL_NAME, VllmServer, plugin_path
from waits import deadline

HERE = os.path.dirname(os.path.abspath(__file__))

# What the bridge must say about a request, from the client's and the scenario's truth:
#   ok           the server answered 200 and the body (or stream) ended normally
#   shutdown     in flight when the server was stopped on purpose (SIGTERM)
#   engine_dead  in flight when the EngineCore process was killed
#   input        refused with HTTP 400 before the engine
#   not_found    refused with HTTP 404: a model the server does not serve (logged at ERROR)
# (`aborted` is for a client that went away; no scenario here cuts its own requests.)


@dataclass
class Truth:
    kind: str                   # completion | chat
    stream: bool
    n: int
    max_tokens: int
    sent_id: str | None         # the X-Request-Id header sent, if any
    expect: str = ""            # ok | shutdown | engine_dead | input | not_found
    status: int = 0             # 0: no status line (the connection died first)
    response_id: str = ""       # the `id` of the body or of the first chunk
    t_send_ns: int = 0
    t_first_byte_ns: int = 0    # first byte of the body (a stream's first chunk)
    t_end_ns: int = 0
    ended: str = ""             # complete | cut (connection closed early) | error
    finish_reasons: list = field(default_factory=list)
    # Per choice of a chat: whether its content (or tool calls) came back empty. vLLM logs no
    # `Generated response` line for an empty one (serving.py: `if output_text:`).
    empty_choices: list = field(default_factory=list)
    error: str = ""             # the error body's `type`/`message` head (400s), never the prompt
    # The response's own `usage` (a stream's with `stream_options.include_usage`): vLLM counts
    # the prompt once and sums the completion tokens over the n choices.
    usage: dict = field(default_factory=dict)
    abort_after: int = 0        # >0: the client closed the stream after this many data chunks


def _body(t: Truth, prompt: str, extra: dict) -> dict:
    body = {"model": MODEL_NAME, "max_tokens": t.max_tokens, "stream": t.stream, **extra}
    if t.n != 1:
        body["n"] = t.n
    if t.kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


class Recorder:
    """Sends requests and keeps each one's truth; thread-safe."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.truths: list[Truth] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def send(self, kind: str = "completion", stream: bool = False, max_tokens: int = 8, n: int = 1,
             sent_id: str | None = None, expect: str = "ok", abort_after: int = 0, **extra) -> Truth:
        t = Truth(kind, stream, n, max_tokens, sent_id, "aborted" if abort_after else expect, abort_after=abort_after)
        if stream and not abort_after:
            extra.setdefault("stream_options", {"include_usage": True})
        with self._lock:
            self.truths.append(t)
        prompt = f"SECRET-PROMPT-{uuid.uuid4().hex[:12]} tell me about traces"
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        headers = {"Content-Type": "application/json"}
        if sent_id is not None:
            headers["X-Request-Id"] = sent_id
        t.t_send_ns = time.time_ns()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=deadline(300))
            conn.request("POST", path, json.dumps(_body(t, prompt, extra)), headers)
            resp = conn.getresponse()
            t.status = resp.status
            if stream and resp.status == 200:
                self._read_stream(t, resp)
            else:
                data = resp.read(1)
                t.t_first_byte_ns = time.time_ns()
                data += resp.read()
                t.t_end_ns = time.time_ns()
                obj = json.loads(data)
                if resp.status == 200:
                    t.response_id = obj["id"]
                    t.usage = obj.get("usage") or {}
                    t.finish_reasons = [c["finish_reason"] for c in obj["choices"]]
                    if kind == "chat":
                        t.empty_choices = [not (c["message"].get("content") or c["message"].get("tool_calls"))
                                           for c in obj["choices"]]
                else:
                    err = obj.get("error", obj)
                    t.error = f"{err.get('type', '')}: {str(err.get('message', ''))[:60]}"
                t.ended = "complete"
            conn.close()
        except (OSError, http.client.HTTPException, ValueError) as e:
            t.t_end_ns = t.t_end_ns or time.time_ns()
            t.ended = t.ended or ("cut" if t.t_first_byte_ns else "error")
            t.error = t.error or type(e).__name__
        return t

    def _read_stream(self, t: Truth, resp) -> None:
        reasons: dict[int, str] = {}
        said: dict[int, bool] = {}
        done = False
        chunks = 0
        while True:
            line = resp.fp.readline()
            if not line:
                break
            if not t.t_first_byte_ns:
                t.t_first_byte_ns = time.time_ns()
            if line.startswith(b"data: [DONE]"):
                done = True
                break
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                chunks += 1
                t.response_id = t.response_id or chunk.get("id", "")
                if chunk.get("usage"):
                    t.usage = chunk["usage"]
                if t.abort_after and chunks >= t.abort_after:
                    # The client goes away mid-stream: the socket is closed under the response.
                    resp.fp.close()
                    resp.close()
                    t.t_end_ns = time.time_ns()
                    t.ended = "aborted"
                    return
                for c in chunk.get("choices", []):
                    delta = c.get("delta") or {}
                    said[c.get("index", 0)] = said.get(c.get("index", 0), False) or \
                        bool(delta.get("content") or delta.get("tool_calls") or c.get("text"))
                    if c.get("finish_reason"):
                        reasons[c.get("index", 0)] = c["finish_reason"]
        t.t_end_ns = time.time_ns()
        t.finish_reasons = [reasons[i] for i in sorted(reasons)]
        if t.kind == "chat":
            t.empty_choices = [not said.get(i, False) for i in sorted(reasons)]
        t.ended = "complete" if done else "cut"

    def background(self, **kw) -> threading.Thread:
        th = threading.Thread(target=self.send, kwargs=kw, daemon=True)
        th.start()
        self._threads.append(th)
        return th

    def join(self, timeout: float | None = None) -> None:
        for th in self._threads:
            th.join(deadline(120) if timeout is None else timeout)
        self._threads.clear()

    def wait_streaming(self, count: int, timeout: float | None = None) -> None:
        """Until `count` streams have their first chunk: the requests are in the engine."""
        t0 = time.monotonic()
        timeout = deadline(60) if timeout is None else timeout
        while time.monotonic() - t0 < timeout:
            with self._lock:
                if sum(1 for t in self.truths if t.stream and t.t_first_byte_ns) >= count:
                    return
            time.sleep(0.05)
        raise AssertionError(f"streams did not start: fewer than {count} first chunks in {timeout:.0f} s (scaled cap)")


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def engine_core_pid(root: int) -> int:
    """The EngineCore process under the server (setproctitle names it `VLLM::EngineCore`)."""
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += _children(pid)
    for pid in seen:
        if "EngineCore" in _cmdline(pid):
            return pid
    raise AssertionError(f"no EngineCore among {[(p, _cmdline(p)) for p in seen]}")


def _wait_exit(server: VllmServer, timeout: float) -> bool:
    try:
        server.proc.wait(timeout)
        return True
    except Exception:  # noqa: BLE001 — TimeoutExpired; the caller kills the group
        return False


IDLE_S = 2.5     # > VLLM_LOG_STATS_INTERVAL (1 s): a stats line shows the engine idle
GRACE_S = 10.0   # kubelet's grace period, shortened: then SIGKILL to the whole pod


def _grace(server: VllmServer, events: dict) -> None:
    """After SIGTERM, vLLM's HTTP server waits for open streams whose engine is gone: like
    kubelet at the end of the grace period, kill what is left (recorded as `grace_kill_ns`)."""
    if _wait_exit(server, GRACE_S):
        events.setdefault("exited_cleanly", True)
        return
    events["exited_cleanly"] = False
    events["grace_kill_ns"] = time.time_ns()
    try:
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.proc.wait(deadline(10))


LONG = dict(max_tokens=3000, ignore_eos=True)   # a stream that runs for seconds on the tiny model
# The project's vLLM plugin on, from this checkout, laid out as `inject` does (plugin install
# --target + PYTHONPATH; tests/vllm_server.py plugin_path), never a copy in the venv.
PLUGIN = {"VLLM_TRACE_BRIDGE_PLUGIN": "1",
          "PYTHONPATH": lambda: os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), plugin_path()) if p)}
DEBUG = {"VLLM_LOGGING_LEVEL": "DEBUG"}

# name -> (extra server args, env, whether --enable-log-requests/--enable-log-outputs are dropped)
SERVER = {
    "sigterm_inflight": ((), None, False),
    "idle_shutdown": ((), None, False),
    "reused_id": ((), None, False),
    "queue_pressure": (("--max-num-seqs", "2"), None, False),
    "n_gt_1": ((), None, False),
    "bad_requests": ((), None, False),
    "client_errors": ((), None, False),
    "no_log_requests": ((), None, True),
    "json_logging": (("--logging-config.formatter", "json"), None, False),
    "engine_kill9": ((), None, False),
    "api_server_count_2": (("--api-server-count", "2"), None, False),
    "json_debug_400": (("--log-level", "DEBUG", "--logging-config.formatter", "json"), {"VLLM_LOGGING_LEVEL": "DEBUG"},
                       False),
    # issue 31: what real deployments combine
    "plugin_n_gt_1": ((), PLUGIN, False),
    "plugin_client_abort": ((), PLUGIN, False),
    "plugin_api_server_count_2": (("--api-server-count", "2"), PLUGIN, False),
    "plugin_debug": (("--log-level", "DEBUG"), {**PLUGIN, **DEBUG}, False),
    "api_server_count_2_busy": (("--api-server-count", "2"), None, False),
    "debug_text": (("--log-level", "DEBUG"), DEBUG, False),
}


def _drive(name: str, server: VllmServer, rec: Recorder, events: dict) -> None:
    if name == "sigterm_inflight":
        rec.send("completion")
        rec.send("chat")
        time.sleep(IDLE_S)   # the engine reports itself idle: V1 logs no end for the completion
        rec.background(kind="completion", stream=True, sent_id="inflight-cmpl", expect="shutdown", **LONG)
        rec.background(kind="chat", stream=True, sent_id="inflight-chat", expect="shutdown", **LONG)
        rec.wait_streaming(2)
        time.sleep(1.0)
        events["sigterm_ns"] = time.time_ns()
        os.kill(server.proc.pid, signal.SIGTERM)   # what kubelet does: SIGTERM to the main process
        _grace(server, events)
        rec.join(deadline(30))
    elif name == "idle_shutdown":
        rec.send("completion")
        rec.send("chat")
        rec.send("chat", stream=True)
        rec.send("completion", stream=True)
        time.sleep(3.0)   # the engine reports itself idle
        events["sigterm_ns"] = time.time_ns()
        os.kill(server.proc.pid, signal.SIGTERM)
    elif name == "reused_id":
        rec.send("completion", sent_id="same-seq")
        rec.send("completion", sent_id="same-seq")
        rec.send("chat", sent_id="same-chat-seq")
        rec.send("chat", sent_id="same-chat-seq")
        for _ in range(2):
            rec.background(kind="completion", stream=True, sent_id="same-conc", max_tokens=64)
        rec.join()
        for _ in range(2):
            rec.background(kind="chat", sent_id="same-chat-conc", max_tokens=64)
        rec.join()
    elif name == "queue_pressure":
        for i in range(6):
            rec.background(kind=("completion", "chat")[i % 2], stream=bool(i // 2 % 2), max_tokens=200,
                           ignore_eos=True)
        rec.join()
    elif name == "n_gt_1":
        rec.send("completion", n=3, max_tokens=16)
        rec.send("chat", n=2, max_tokens=16)
        rec.send("completion", stream=True, n=2, max_tokens=16)
        rec.send("chat", stream=True, n=3, max_tokens=16)
    elif name == "bad_requests":
        rec.send("completion")
        rec.send("completion", max_tokens=100_000, expect="input")                     # over max-model-len
        rec.send("chat", max_tokens=100_000, sent_id="bad-max-tokens", expect="input")
        rec.send("completion", temperature=-1.0, sent_id="bad-temperature", expect="input")
        rec.send("chat", n=0, expect="input")
        rec.send("completion", logprobs=1000, sent_id="bad-logprobs", expect="input")
        rec.send("chat")
    elif name == "client_errors":
        # Clients' mistakes while others are served: vLLM logs an unknown model at ERROR, and a
        # json_schema it cannot compile fails that request; the engine is fine throughout. The
        # model's name says `died`, as a client may name anything.
        rec.background(kind="completion", stream=True, sent_id="served-cmpl", max_tokens=300, ignore_eos=True)
        rec.background(kind="chat", stream=True, sent_id="served-chat", max_tokens=300, ignore_eos=True)
        rec.wait_streaming(2)
        rec.send("chat", model="tiny-died", sent_id="gone-model", expect="not_found")
        rec.send("completion", model="engine-died-fatal-error", expect="not_found")
        rec.send("chat", sent_id="bad-schema", expect="input", response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "not-a-type"}}})
        rec.join()
        rec.send("completion")
    elif name == "no_log_requests":
        rec.send("completion")
        rec.send("chat")
        rec.send("chat", stream=True)
        rec.send("completion", stream=True)
        rec.send("completion", max_tokens=100_000, expect="input")
    elif name == "json_logging":
        rec.send("completion")
        rec.send("chat")
        rec.send("chat", stream=True)
        rec.send("completion", stream=True)
        rec.send("chat", max_tokens=5, ignore_eos=True)
        rec.send("chat", max_tokens=100_000, sent_id="json-bad", expect="input")
    elif name == "engine_kill9":
        rec.send("completion")
        rec.send("chat")
        time.sleep(IDLE_S)   # the engine reports itself idle: V1 logs no end for the completion
        rec.background(kind="completion", stream=True, sent_id="dying-cmpl", expect="engine_dead", **LONG)
        rec.background(kind="chat", stream=True, sent_id="dying-chat", expect="engine_dead", **LONG)
        rec.wait_streaming(2)
        time.sleep(0.5)   # (each streamed token of a chat is a log line: keep the log small)
        pid = engine_core_pid(server.proc.pid)
        events["kill9_ns"] = time.time_ns()
        events["kill9_pid"] = pid
        os.kill(pid, signal.SIGKILL)
        rec.join(deadline(30))
    elif name == "json_debug_400":   # what DEBUG adds to a 400: does any line name the request?
        rec.send("chat")
        rec.send("chat", max_tokens=100_000, sent_id="dbg-max-tokens", expect="input")
        rec.send("completion", temperature=-1.0, sent_id="dbg-temperature", expect="input")
        rec.send("completion", logprobs=1000, sent_id="dbg-logprobs", expect="input")
        rec.send("completion")
    elif name == "api_server_count_2":
        for i in range(4):
            rec.background(kind=("completion", "chat")[i % 2], max_tokens=16)
        rec.join()
        rec.send("chat", stream=True)
    elif name == "plugin_n_gt_1":
        rec.send("completion", n=2, max_tokens=40, ignore_eos=True)
        rec.send("chat", n=2, max_tokens=40, ignore_eos=True)
        rec.send("completion", stream=True, n=2, max_tokens=16)
        rec.send("chat", stream=True, n=3, max_tokens=16)
        rec.send("completion", max_tokens=8)
        for i in range(4):   # concurrent, the children of each interleaved with the others'
            rec.background(kind=("completion", "chat")[i % 2], n=2 + i // 2, stream=bool(i // 2),
                           max_tokens=24, ignore_eos=True)
        rec.join()
    elif name == "plugin_client_abort":
        _aborts(rec)
    elif name in ("plugin_api_server_count_2", "api_server_count_2_busy", "plugin_debug", "debug_text"):
        for i in range(10):   # enough at once that both API servers take some
            rec.background(kind=("completion", "chat")[i % 2], stream=bool(i // 2 % 2), max_tokens=12 + i,
                           n=2 if i % 5 == 4 else 1)
        rec.join()
        rec.send("chat", max_tokens=5, ignore_eos=True)
        rec.send("chat", stream=True, max_tokens=5, ignore_eos=True)
        if name.startswith("plugin"):
            _aborts(rec)
    else:
        raise KeyError(name)


def _aborts(rec: Recorder) -> None:
    """Streams the client closes mid-way (each after a pause that puts its send anywhere in a
    second: a header's whole second must not show before it), between whole ones."""
    import random
    rnd = random.Random(31)
    rec.send("completion", max_tokens=8)
    for kind, after, n in (("completion", 5, 1), ("chat", 3, 1), ("chat", 1, 1), ("completion", 4, 2)):
        time.sleep(rnd.uniform(0.1, 0.9))
        rec.send(kind, stream=True, n=n, abort_after=after, **LONG)
    time.sleep(IDLE_S)   # idle, then an abort as the first request after it
    time.sleep(rnd.uniform(0.1, 0.9))
    rec.send("chat", stream=True, abort_after=6, **LONG)
    rec.background(kind="completion", stream=True, abort_after=8, **LONG)
    rec.background(kind="chat", stream=True, max_tokens=20)
    rec.join()
    rec.send("chat", max_tokens=8)


def run(name: str, install, log_path: str, port: int) -> dict:
    """Start a server for `name`, drive it, stop it; the truth of everything that happened."""
    extra, env, quiet = SERVER[name]
    server = VllmServer(install, log_path, port, *extra, env=env)
    if quiet:
        server.args = [a for a in server.args if a not in ("--enable-log-requests", "--enable-log-outputs")]
    events: dict = {"scenario": name, "server_args": server.args[2:], "model_name": MODEL_NAME,
                    "env": {k: v for k, v in (env or {}).items() if k != "PYTHONPATH"}}
    rec = Recorder(port)
    server.start()
    events["healthy_ns"] = time.time_ns()
    try:
        _drive(name, server, rec, events)
        if "sigterm_ns" not in events and "kill9_ns" not in events:
            time.sleep(2.0)   # let the stats logger report the idle engine
            events["sigterm_ns"] = time.time_ns()
            os.kill(server.proc.pid, signal.SIGTERM)
        if "sigterm_ns" in events:
            _grace(server, events)
        else:   # the engine was killed: the API server notices, and exits or not
            events["exited_cleanly"] = _wait_exit(server, GRACE_S)
            if server.proc.poll() is None:
                events["sigterm_ns"] = time.time_ns()
                os.kill(server.proc.pid, signal.SIGTERM)
                _grace(server, events)
        events["exit_code"] = server.proc.poll()
        rec.join(deadline(30))
    finally:
        server.stop()   # the group: whatever is left
    events["requests"] = [asdict(t) for t in rec.truths]
    return events
