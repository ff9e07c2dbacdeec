"""The agent joins vLLM's requests with a gateway's access log (fast: written logs, no vLLM).

The agent, the receiver and the writes are real (processes and files); the lines are vLLM
0.32's and nginx's (the README's `log_format`). Covers: gateway line first, request first, a
gateway line without traceparent, no gateway line at all (the window passes), and a request
whose id already carries a full traceparent (no waiting).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

from agentkit import AgentProc, Receiver, free_port, pod_log, wait_for
from receivers import attrs
from waits import deadline

T1, S1 = "11111111111111111111111111111111", "aaaaaaaaaaaaaaaa"
T2, S2 = "22222222222222222222222222222222", "bbbbbbbbbbbbbbbb"
T4, S4 = "44444444444444444444444444444444", "dddddddddddddddd"


def _cri(message: str) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
    return f"{now} stdout F (APIServer pid=1) INFO 11-30 08:00:00 [{message}\n"


def _chat(rid: str) -> list[str]:
    return [_cri(f"request_logger.py:65] Received request chatcmpl-{rid}: params: SamplingParams(n=1, "
                 "temperature=1.0, top_p=1.0, max_tokens=8), lora_request: None."),
            _cri(f"async_llm.py:578] Added request chatcmpl-{rid}-0a1b2c3d."),
            _cri(f"request_logger.py:108] Generated response chatcmpl-{rid}: output: 'x', finish_reason: length")]


def _nginx(rid: str, traceparent: str) -> str:
    return json.dumps({"time_iso8601": "2026-11-30T08:00:00+00:00", "request_id": rid, "http_x_request_id": "",
                       "http_traceparent": traceparent, "status": 200, "request_time": 0.01, "uri": "/v1/x"}) + "\n"


def test_agent_joins_the_gateway_access_log_either_side_first(tmp_path):
    log = pod_log(tmp_path)
    gw = tmp_path / "gateway"
    gw.mkdir()
    access = gw / "access.json"
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint, "--linger", "0.2",
                      "--gateway-include", str(gw / "*.json"), "--join-window", "3").start()
    try:
        with open(access, "a") as a, open(log, "a") as v:
            a.write(_nginx("gw-first", f"00-{T1}-{S1}-01"))
            a.flush()
            assert wait_for(lambda: agent.metric("gateway_lines", 'result="entry"') == 1, deadline(10))  # read first
            v.writelines(_chat("gw-first") + _chat("vllm-first") + _chat("no-context") + _chat("never-logged"))
            v.writelines(_chat(f"00-{T4}-{S4}-01"))  # context in the id: sent without waiting
            v.flush()
            assert wait_for(lambda: agent.caught_up(log), deadline(10))  # the vLLM lines read before theirs
            a.write(_nginx("vllm-first", f"00-{T2}-{S2}-01"))
            a.write(_nginx("no-context", ""))
            a.flush()
        want = {"chatcmpl-gw-first", "chatcmpl-vllm-first", "chatcmpl-no-context", "chatcmpl-never-logged",
                f"chatcmpl-00-{T4}-{S4}-01"}

        def roots() -> dict:
            return {attrs(s.attributes)["vllm.request.id"]: s for s in rx.spans() if s.name == "vllm.request"}
        assert wait_for(lambda: set(roots()) == want, deadline(20)), set(roots())
        r = roots()
        assert (r["chatcmpl-gw-first"].trace_id.hex(), r["chatcmpl-gw-first"].parent_span_id.hex()) == (T1, S1)
        assert (r["chatcmpl-vllm-first"].trace_id.hex(), r["chatcmpl-vllm-first"].parent_span_id.hex()) == (T2, S2)
        assert attrs(r["chatcmpl-vllm-first"].attributes)["vllm.trace_context"] == "access_log"
        for rid in ("chatcmpl-no-context", "chatcmpl-never-logged"):  # fallback: a trace of their own
            assert r[rid].parent_span_id == b"" and "vllm.trace_context" not in attrs(r[rid].attributes)
        t4 = r[f"chatcmpl-00-{T4}-{S4}-01"]
        assert (t4.trace_id.hex(), t4.parent_span_id.hex()) == (T4, S4)
        assert attrs(t4.attributes)["vllm.trace_context"] == "request_id"
        assert len([s for s in rx.spans() if s.name == "vllm.request"]) == 5  # each once
        assert agent.metric("join_requests", 'result="joined"') == 2
        assert agent.metric("join_requests", 'result="expired"') == 1  # never-logged
        assert agent.metric("gateway_lines", 'result="entry"') == 3
        code, _ = agent.term()
        assert code == 0
    finally:
        rx.stop()
    assert os.path.exists(access)


def test_a_gateway_line_still_waiting_for_its_request_survives_an_agent_crash(tmp_path):
    """The gateway wrote first and the agent was killed before vLLM's request ended: the
    gateway file's checkpoint must not pass that line, or the restarted agent never sees it
    and the request leaves without its caller."""
    log = pod_log(tmp_path)
    gw = tmp_path / "gateway"
    gw.mkdir()
    access = gw / "access.json"
    access.write_text("")
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    args = (str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint, "--linger", "0.2",
            "--gateway-include", str(gw / "*.json"), "--join-window", "3")
    agent = AgentProc(*args).start()
    try:
        with open(access, "a") as a:
            a.write(_nginx("before-crash", f"00-{T1}-{S1}-01"))
        assert wait_for(lambda: agent.metric("gateway_lines", 'result="entry"') == 1, deadline(10))
        with open(access, "a") as a:  # a later line the request does not need: read, checkpointed past
            a.write(_nginx("unrelated", ""))
        assert wait_for(lambda: agent.metric("gateway_lines", 'result="entry"') == 2, deadline(10))
        time.sleep(2.5)  # a checkpoint (once a second while anything moves); fixed: inside the 3 s join window
        agent.kill9()
        agent = AgentProc(*args).start()
        with open(log, "a") as v:
            v.writelines(_chat("before-crash"))
        roots = lambda: [s for s in rx.spans() if s.name == "vllm.request"]  # noqa: E731
        assert wait_for(lambda: len(roots()) == 1, deadline(20))
        root = roots()[0]
        assert (root.trace_id.hex(), root.parent_span_id.hex()) == (T1, S1)
        assert agent.metric("join_requests", 'result="joined"') == 1
        assert agent.term()[0] == 0
    finally:
        rx.stop()
