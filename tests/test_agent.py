"""The node agent as a real process, with a real writer and a real receiver in their own
processes. Every check is against the writer's ground truth."""

from __future__ import annotations

import os
import random
import time

import pytest
from agentkit import AgentProc, Receiver, check_exactly_once, free_port, pod_log, start_writer, wait_for
from agentkit import delivered_listed

from bridge.cli import main
from bridge.config import AgentConfig
from waits import deadline


def received_all(rx: Receiver, n: int) -> bool:
    return len({s.trace_id for s in rx.spans() if s.name == "vllm.request"}) >= n


def truth_count(path) -> int:
    import json
    with open(path) as f:
        return len(json.load(f)["requests"])


@pytest.mark.parametrize("rotate", ["rename", "gzip", "copytruncate"])
def test_rotation_while_writing_delivers_every_request_exactly_once(tmp_path, rotate):
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint).start()
    try:
        writer = start_writer(log, truth, requests=500, rate=2000, rotate_every=1500, rotate=rotate, seed=3)
        assert writer.wait(deadline(60)) == 0
        assert wait_for(lambda: received_all(rx, truth_count(truth)), deadline(30))
        time.sleep(deadline(1))  # anything more would be a duplicate: give it the chance to show
        figures = check_exactly_once(truth, rx.spans())
        assert figures["spans_received"] == figures["distinct_span_ids"]
        assert agent.metric("file_rotations") >= 3
        code, took = agent.term()
        assert code == 0
    finally:
        rx.stop()


def test_kill_9_five_times_loses_nothing_and_never_makes_two_traces(tmp_path, capsys):
    """20,000 requests; the agent is killed at 5 random moments and restarted each time."""
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    state = str(tmp_path / "state")
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    include = str(tmp_path / "pods/*/*/*.log")
    rnd = random.Random(2024)
    try:
        # The agent first: started after the writer, a slow start (a loaded machine) could find
        # a file already rotated, which a first start leaves unread (docs/agent.md).
        agent = AgentProc(include, state, rx.endpoint).start()
        writer = start_writer(log, truth, requests=20000, rate=8000, rotate_every=60000, rotate="rename", seed=9)
        for _ in range(5):
            time.sleep(rnd.uniform(1.5, 4.5))
            agent.kill9()
            agent = AgentProc(include, state, rx.endpoint).start()
        assert writer.wait(deadline(120)) == 0
        n = truth_count(truth)
        assert wait_for(lambda: received_all(rx, n), deadline(90)), "not everything arrived"
        time.sleep(deadline(1))
        figures = check_exactly_once(truth, rx.spans())
        resent = figures["spans_received"] - figures["distinct_span_ids"]
        with capsys.disabled():
            print(f"\nkill -9 x5 over {n} requests: {figures['spans_received']} spans received, "
                  f"{figures['distinct_span_ids']} distinct span ids, {resent} re-sent")
        # What a kill -9 can make the agent send again is what the receiver had taken but the
        # checkpoint had not yet recorded: the batch in flight, and the batches acked since the
        # last save (the agent saves after the acks of each loop round). Two batches a kill:
        # measured ~one (2,975-4,893 in all over the five kills); a checkpoint that stopped
        # advancing would re-send far more.
        kills, batch = 5, AgentConfig().max_batch_spans
        assert resent <= kills * 2 * batch, f"{resent} re-sent over {kills} kills of {batch}-span batches"
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_receiver_down_30s_loses_nothing_and_memory_stays_bounded(tmp_path):
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    port = free_port()
    rx = Receiver(port, str(tmp_path / "rx.bin")).start()
    limit_mb = 200
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint,
                      "--max-queue-spans", "2000", "--memory-limit-mb", str(limit_mb),
                      env={"OTEL_EXPORTER_OTLP_TIMEOUT": "2"}).start()
    try:
        writer = start_writer(log, truth, requests=6000, rate=1500, seed=5)
        time.sleep(3)
        rx.stop()
        peak = 0.0
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end:
            peak = max(peak, agent.rss_mb())
            time.sleep(0.5)
        assert agent.metric("spans_retried") > 0
        rx = Receiver(port, str(tmp_path / "rx.bin")).start()
        assert writer.wait(deadline(120)) == 0
        assert wait_for(lambda: received_all(rx, truth_count(truth)), deadline(90))
        figures = check_exactly_once(truth, rx.spans())
        assert peak < limit_mb, f"agent RSS peaked at {peak:.0f} MB"
        assert agent.metric("spans_dropped") == 0
        assert figures["requests"] == truth_count(truth)
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_sigterm_exits_0_within_grace_and_loses_nothing(tmp_path):
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    state = str(tmp_path / "state")
    include = str(tmp_path / "pods/*/*/*.log")
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    try:
        writer = start_writer(log, truth, requests=3000, rate=4000, seed=4)
        agent = AgentProc(include, state, rx.endpoint, "--shutdown-grace", "5").start()
        time.sleep(2.5)
        code, took = agent.term()
        # within its grace (5 s) and a scaled allowance for the process's own exit
        assert code == 0 and took < 5 + deadline(1)
        assert any(e.get("event") == "agent_stopped" for e in agent.log_events())
        assert writer.wait(deadline(60)) == 0
        agent = AgentProc(include, state, rx.endpoint).start()  # picks up where the checkpoint says
        assert wait_for(lambda: received_all(rx, truth_count(truth)), deadline(60))
        time.sleep(deadline(1))
        check_exactly_once(truth, rx.spans())
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def _without_dac_override():
    """Root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: a locked directory stays locked."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: gone from the bounding set at exec


def test_bad_input_and_bad_files_keep_it_running_and_show_in_metrics(tmp_path):
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    os.chmod(tmp_path, 0o755)
    log = pod_log(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    for d in (tmp_path / "pods", os.path.dirname(os.path.dirname(log)), os.path.dirname(log)):
        os.chmod(d, 0o777)
    locked = tmp_path / "pods" / "llm_locked-0_3f2a9c1e-aaaa-bbbb-cccc-444455556666"
    (locked / "vllm").mkdir(parents=True)
    os.chmod(locked, 0o000)
    vanishing = pod_log(tmp_path, name="gone-0")
    os.chmod(os.path.dirname(vanishing), 0o777)
    with open(vanishing, "w") as f:
        f.write("2025-02-15T10:23:00.000000000Z stdout F INFO 02-15 10:23:00 a.py:1] hello\n")
    os.chmod(vanishing, 0o666)
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(state), rx.endpoint)
    if os.getuid() == 0:  # root reads anything unless it gives up the override
        agent.preexec = _without_dac_override
    agent.start()
    try:
        stamp = "2025-02-15T10:23:01.000000000Z"
        head = "INFO 02-15 10:23:01 scheduler.py:234] "
        with open(log, "ab") as f:
            f.write(f"{stamp} stdout P {head}Scheduling request 0xabc: prio".encode())
            f.flush()
            time.sleep(1.0)  # the agent reads the first part alone
            f.write(f"{stamp} stdout F rity=0, num_scheduled_blocks=1, remaining_blocks=0\n".encode())
            f.write(f"{stamp} stdout F {head}".encode() + b"x" * (1 << 20) + b"\n")
            f.write(f"{stamp} stdout F {head}caf\xe9 \xff\xfe\n".encode("latin-1"))
            f.write(f"{stamp} stdout F INFO 02-15 10:23:02 scheduler.py:789] Request 0xabc: prompt_tokens=1, "
                    f"generated_tokens=2, ttft=1.0ms, itl=1.0ms, total_latency=0.5s\n".encode())
        os.unlink(vanishing)
        assert wait_for(lambda: agent.metric("lines_invalid_utf8") >= 1, deadline(10))
        assert wait_for(lambda: agent.metric("lines_long") == 1, deadline(10))  # the 1 MiB line, read whole
        assert wait_for(lambda: agent.metric("partial_lines_joined") >= 1, deadline(10))
        assert wait_for(lambda: agent.metric("requests_finished") >= 1, deadline(10))
        assert wait_for(lambda: agent.metric("file_errors", 'reason="permission"') >= 1, deadline(10))
        assert wait_for(lambda: agent.metric("file_rotations", 'kind="deleted"') >= 1, deadline(10))
        assert agent.metric("lines_read") >= 5
        assert agent.get("/healthz")[0] == 200 and agent.get("/readyz")[0] == 200
        assert agent.proc.poll() is None
        assert agent.term()[0] == 0
        roots = [s for s in rx.spans() if s.name == "vllm.request"]
        assert len(roots) == 1
    finally:
        os.chmod(locked, 0o755)
        rx.stop()


@pytest.mark.parametrize("argv,env,needle", [
    (["--poll-interval", "soon"], {}, "poll_interval (from --poll-interval): expected a number"),
    (["--start-at", "middle"], {}, "start_at (from --start-at): 'middle' is not allowed"),
    ([], {"VLLM_TRACE_BRIDGE_MAX_QUEUE_SPANS": "-5"}, "max_queue_spans (from VLLM_TRACE_BRIDGE_MAX_QUEUE_SPANS)"),
    (["--listen", "nowhere"], {}, "listen (from --listen)"),
    (["--timezone", "Mars/Base"], {}, "timezone (from --timezone)"),
    (["--otlp-protocol", "pigeon"], {}, "otlp_protocol (from --otlp-protocol)"),
])
def test_invalid_config_fails_fast_naming_the_field(tmp_path, capsys, argv, env, needle):
    code = main(["run", "--state-dir", str(tmp_path), "--otlp-endpoint", "http://127.0.0.1:1", *argv], env=env)
    assert code == 2
    assert needle in capsys.readouterr().err


def test_config_file_errors_name_the_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("include: [/x/*.log]\npoll_intervall: 1\n")
    assert main(["run", "--config", str(cfg)], env={}) == 2
    assert "unknown key 'poll_intervall'" in capsys.readouterr().err
    cfg.write_text("ttl: forever\n")
    assert main(["run", "--config", str(cfg)], env={}) == 2
    assert f"ttl (from {cfg})" in capsys.readouterr().err


def test_print_config_shows_precedence(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ttl: 100\npoll_interval: 2\nstate_dir: /from/file\n")
    code = main(["run", "--config", str(cfg), "--print-config", "--state-dir", "/from/flag"],
                env={"VLLM_TRACE_BRIDGE_TTL": "200", "VLLM_TRACE_BRIDGE_STATE_DIR": "/from/env"})
    assert code == 0
    out = capsys.readouterr().out
    assert "ttl: 200.0" in out and "poll_interval: 2.0" in out and "state_dir: /from/flag" in out


def _v1_lines(t0: float, n: int) -> tuple[list[str], list[str]]:
    """A V1 API-server log (CRI-framed): one long chat request around n short ones."""
    import datetime

    def cri(t: float, text: str) -> str:
        stamp = datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
        hdr = datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%m-%d %H:%M:%S")
        return f"{stamp} stdout F (APIServer pid=1) INFO {hdr} [{text}\n"

    def request(t: float, rid: str) -> list[str]:
        return [cri(t, f"logger.py:49] Received request {rid}: params: SamplingParams(n=1, temperature=0.0, "
                       "top_p=1.0, max_tokens=8), lora_request: None."),
                cri(t + 0.001, f"async_llm.py:368] Added request {rid}-{abs(hash(rid)) % 16**8:08x}."),
                cri(t + 0.5, f"logger.py:71] Generated response {rid}: output: 'x', output_token_ids: [1], "
                             "finish_reason: stop")]
    ids = [f"chatcmpl-{i:016x}" for i in range(1, n + 1)]
    long_id = "chatcmpl-ffffffffffffffff"
    first = request(t0, long_id)[:2]
    for i, rid in enumerate(ids):
        first += request(t0 + 1 + i, rid)
    last = [request(t0, long_id)[2].replace(cri(t0 + 0.5, "")[:30], cri(t0 + n + 5, "")[:30])]
    half = len(first) // 2
    return first[:half], first[half:] + last, [long_id, *ids]


def test_upstream_requests_survive_a_crash_exactly_once(tmp_path):
    """A long request holds the checkpoint back while others are delivered: after kill -9,
    those are skipped on resume (by their upstream id spellings), the long one completes."""
    log = pod_log(tmp_path)
    state, include = str(tmp_path / "state"), str(tmp_path / "pods/*/*/*.log")
    part1, part2, ids = _v1_lines(1767225600.0, 30)
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    try:
        agent = AgentProc(include, state, rx.endpoint).start()
        with open(log, "a") as f:
            f.writelines(part1)
        assert wait_for(lambda: len({s.trace_id for s in rx.spans() if s.name == "vllm.request"}) >= 10, deadline(20))
        seen = len({s.trace_id for s in rx.spans() if s.name == "vllm.request"})
        assert wait_for(lambda: delivered_listed(state) >= seen, deadline(10))  # acked, and listed in a saved checkpoint
        agent.kill9()
        with open(log, "a") as f:
            f.writelines(part2)
        agent = AgentProc(include, state, rx.endpoint).start()
        assert wait_for(lambda: len({s.trace_id for s in rx.spans() if s.name == "vllm.request"}) >= len(ids), deadline(20))
        time.sleep(deadline(1.5))
        from receivers import attrs
        traces: dict[str, set] = {}
        for s in rx.spans():
            if s.name == "vllm.request":
                traces.setdefault(attrs(s.attributes)["vllm.request.id"], set()).add(s.trace_id)
        assert sorted(traces) == sorted(ids)
        assert all(len(t) == 1 for t in traces.values()), {k: len(v) for k, v in traces.items() if len(v) > 1}
        assert agent.metric("spans_skipped_delivered") > 0
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_resume_skips_every_spelling_of_a_delivered_request_and_nothing_else():
    from bridge.parse.events import RequestAdded, RequestsAborted, Scheduled
    from bridge.skip import unsent

    skip = {"chatcmpl-aa": 500, "cmpl-bb-0": 500, "engine@40": 40}

    def not_delivered(offset, event):
        return unsent(skip, offset, event)

    assert not_delivered(100, RequestAdded("chatcmpl-aa-0a1b2c3d")) is None   # V1 suffix
    assert not_delivered(100, RequestAdded("1_chatcmpl-aa-0a1b2c3d")) is None  # n>1 child
    assert not_delivered(600, RequestAdded("chatcmpl-aa-0a1b2c3d")) is not None  # past it
    assert not_delivered(100, RequestAdded("chatcmpl-cc")) is not None  # another request
    both = RequestsAborted(("cmpl-bb-0-0f1e2d3c", "chatcmpl-cc-11223344"))
    assert not_delivered(100, both).request_ids == ("chatcmpl-cc-11223344",)
    assert not_delivered(40, Scheduled("0x1", 0, 1, 0)) is not None
    assert not_delivered(40, RequestsAborted(("cmpl-bb-0",))) is None


def test_two_pods_at_once_each_exactly_once_with_their_own_identity(tmp_path):
    logs = [pod_log(tmp_path, name="vllm-a"), pod_log(tmp_path, name="vllm-b")]
    truths = [str(tmp_path / "truth-a.json"), str(tmp_path / "truth-b.json")]
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint).start()
    try:
        writers = [start_writer(logs[0], truths[0], requests=300, rate=1500, rotate_every=1200, seed=21),
                   start_writer(logs[1], truths[1], requests=300, rate=1500, seed=22)]
        assert all(w.wait(deadline(60)) == 0 for w in writers)
        assert wait_for(lambda: received_all(rx, truth_count(truths[0]) + truth_count(truths[1])), deadline(30))
        time.sleep(deadline(1))
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        from receiver_proc import read_requests
        from receivers import attrs
        by_pod: dict[str, list] = {"vllm-a": [], "vllm-b": []}
        for raw in read_requests(rx.out):
            for rs in ExportTraceServiceRequest.FromString(raw).resource_spans:
                pod = attrs(rs.resource.attributes)["k8s.pod.name"]
                for ss in rs.scope_spans:
                    by_pod[pod].extend(ss.spans)
        for pod, truth in zip(("vllm-a", "vllm-b"), truths):
            check_exactly_once(truth, by_pod[pod])
        assert agent.term()[0] == 0
    finally:
        rx.stop()


@pytest.mark.parametrize("fast", [True, False], ids=["c", "python"])
def test_a_line_the_decoder_raises_on_costs_that_line_only(tmp_path, monkeypatch, fast):
    """The agent reads a batch through the C paths as replay does; a decoder that raises on one
    line mid-batch skips that line (counted, logged with its own offset) and reads on."""
    import functools
    from types import SimpleNamespace

    from bridge import agent as agent_mod
    from bridge.config import AgentConfig
    from bridge.decode.stream import RecordStream
    from bridge.export.transport import Destination
    from bridge.tail.source import Source

    if not fast:
        monkeypatch.setattr(agent_mod, "RecordStream", functools.partial(RecordStream, fast=None))
    python = RecordStream._python

    def raising(self, raw, offset):
        if b"BAD" in raw:
            raise ValueError("a decoder bug")
        return python(self, raw, offset)

    monkeypatch.setattr(RecordStream, "_python", raising)
    lines = [b"INFO 02-15 10:23:00 [request_logger.py:1] Received request cmpl-a-0: params: None.\n",
             b"BAD line the C path leaves to Python\n",
             b"INFO 02-15 10:23:01 [request_logger.py:1] Received request cmpl-b-0: params: None.\n"]
    path = tmp_path / "0.log"
    path.write_bytes(b"".join(lines))
    offsets = [0, len(lines[0]), len(lines[0]) + len(lines[1])]
    logged = []
    log = SimpleNamespace(warning=lambda event, **kw: logged.append((event, kw)), info=lambda *a, **k: None,
                          error=lambda *a, **k: None, debug=lambda *a, **k: None)
    agent = agent_mod.Agent(AgentConfig(), Destination("http://127.0.0.1:1", "grpc"), {}, log)
    with open(path, "rb") as fh:
        tf = SimpleNamespace(source=Source("s", str(path)), fh=fh, path=str(path), generation=0)
        agent._process(tf, list(zip(offsets, lines)))
    assert agent.counters.line_errors == {"decode": 1}
    assert [kw["offset"] for event, kw in logged if event == "line_error"] == [offsets[1]]
    assert agent._sources["s"].assembler.open_requests == 2  # the lines before and after it


def _three_requests_file(tmp_path):
    lines = [f"INFO 02-15 10:23:0{i} [request_logger.py:1] Received request cmpl-{c}-0: params: None.\n".encode()
             for i, c in enumerate("abc")]
    path = tmp_path / "0.log"
    path.write_bytes(b"".join(lines))
    offsets = [0, len(lines[0]), len(lines[0]) + len(lines[1])]
    return str(path), list(zip(offsets, lines))


def test_a_resumed_source_skips_delivered_requests_in_the_same_loop_and_error_policy(tmp_path):
    """After a restart, a source with requests delivered before (cmpl-a here) goes through the
    same loop as any other: the delivered request's line is not fed, a line a stage raises on
    (the parse stage, through hooks given at construction as the fault tests give them) costs
    that line only, and the third request is rebuilt."""
    from types import SimpleNamespace

    from bridge.agent import Agent
    from bridge.export.transport import Destination
    from bridge.faults import FaultyStages
    from bridge.tail.source import Source

    path, batch = _three_requests_file(tmp_path)
    agent = Agent(AgentConfig(), Destination("http://127.0.0.1:1", "grpc"), {}, None,
                  FaultyStages({"parse": "cmpl-b-0"}))
    agent._state("s", None).skip = {"cmpl-a-0": batch[0][0]}  # as the checkpoint lists it
    with open(path, "rb") as fh:
        tf = SimpleNamespace(source=Source("s", path), fh=fh, path=path, generation=0)
        agent._process(tf, batch)
    assert agent.counters.line_errors == {"parse": 1}
    assert agent.counters.skipped_delivered == 1
    assert agent._sources["s"].assembler.open_requests == 1  # cmpl-c only


def test_requests_an_unfinished_one_holds_back_are_listed_in_the_checkpoint_and_counted(tmp_path):
    """One request never finishes; the 20 after it do. Their spans go out, and each stays listed
    in the checkpoint (so a restart skips their lines), which `checkpoint_delivered_listed`
    shows: the operator's sign that one request is holding the checkpoint back."""
    import json

    log = pod_log(tmp_path)
    lines = ["INFO 02-15 10:00:00 scheduler.py:234] Scheduling request 0xdead: priority=0, "
             "num_scheduled_blocks=6, remaining_blocks=4"]  # no summary line: open until its TTL
    for i in range(20):
        rid = f"0x{0x1000 + i:x}"
        lines += [f"INFO 02-15 10:00:{1 + i:02d} scheduler.py:234] Scheduling request {rid}: priority=0, "
                  "num_scheduled_blocks=6, remaining_blocks=4",
                  f"INFO 02-15 10:00:{2 + i:02d} api_server.py:120] Request {rid}: prompt_tokens=128, "
                  "generated_tokens=64, ttft=300.0ms, itl=20.0ms, total_latency=1.0s"]
    with open(log, "w") as f:
        f.write("\n".join(lines) + "\n")
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint,
                      "--start-at", "beginning").start()
    try:
        assert wait_for(lambda: received_all(rx, 20), deadline(30))
        assert wait_for(lambda: agent.metric("checkpoint_delivered_listed") == 20, deadline(15)), \
            agent.metric("checkpoint_delivered_listed")
        assert agent.metric("requests_open") == 1
        with open(tmp_path / "state" / "checkpoints.json") as f:
            (source,) = json.load(f)["sources"]
        assert sorted(d["key"] for d in source["delivered"]) == sorted(f"0x{0x1000 + i:x}" for i in range(20))
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_a_restart_past_the_banner_keeps_the_engine_facts_and_resends_identically(tmp_path):
    """vLLM names its model and version once, in the startup banner. An agent stopped between
    two requests and started again resumes past the banner; the requests after that must still
    carry the banner's model and version (the checkpoint keeps them), and a request sent by both
    runs must be sent identically. Truth: the banner in the log and the client's model name.
    (Found by a review: the facts were in memory only, so every span after a restart lost them.)"""
    import json
    import re

    from receivers import attrs

    src = os.path.join(os.path.dirname(__file__), "fixtures", "scenarios", "reused_id")
    with open(os.path.join(src, "server.log"), encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    with open(os.path.join(src, "truth.json")) as f:
        model = json.load(f)["model_name"]
    version = re.search(r"Initializing a V1 LLM engine \(v(\d+\.\d+\.\d+)\)", "".join(lines))[1]
    received = [i for i, line in enumerate(lines) if "Received request" in line]
    split = received[len(received) // 2]  # between two requests, long after the banner
    log = pod_log(tmp_path)
    with open(log, "w", encoding="utf-8") as f:
        f.writelines(lines[:split])
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    args = (str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint, "--start-at", "beginning",
            "--linger", "0")
    try:
        agent = AgentProc(*args).start()
        assert wait_for(lambda: any(s.name == "vllm.request" for s in rx.spans()), deadline(30))
        time.sleep(deadline(3))
        assert agent.term()[0] == 0
        first = len(rx.spans())
        with open(log, "a", encoding="utf-8") as f:
            f.writelines(lines[split:])
        agent = AgentProc(*args).start()
        assert wait_for(lambda: len(rx.spans()) > first, deadline(30))
        time.sleep(deadline(4))
        assert agent.term()[0] == 0
    finally:
        rx.stop()
    roots = [s for s in rx.spans() if s.name == "vllm.request"]
    after = [s for s in rx.spans()[first:] if s.name == "vllm.request"]
    assert after, "the second run sent no request"
    for s in roots:
        a = attrs(s.attributes)
        assert (a.get("gen_ai.request.model"), a.get("vllm.version")) == (model, version), a["vllm.request.id"]
    by_id: dict = {}
    for s in rx.spans():
        by_id.setdefault(s.span_id, set()).add(s.SerializeToString(deterministic=True))
    assert all(len(copies) == 1 for copies in by_id.values()), "a span sent twice with different content"
