"""Containers found by what they log (bridge/detect.py), whatever their names (issue #33).

The vLLM files are real vLLM 0.32 CRI logs (tests/fixtures/scenarios); the requests that must
come out are the ones the client that drove vLLM recorded (truth.json, through the rules of
tests/scenario_truth.py), never a count the bridge produced. The sidecars are lines in the
formats those programs write: Envoy's default access log (istio-proxy), Knative's zap JSON
(queue-proxy), and a Python FastAPI app (a KServe transformer: uvicorn lines and a traceback,
which any Python server prints, so they must not be taken for vLLM).
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from agentkit import AgentProc, Receiver, free_port, wait_for

from bridge.detect import Detector, evidence
from bridge.decode import Decoder
from bridge.synth import SynthConfig, generate, write
from bridge.tail.source import source_for
from waits import deadline

SCENARIOS = Path(__file__).parent / "fixtures" / "scenarios"
UID = "3f2a9c1e-1111-2222-3333-444455556666"


def cri(lines: list[str], start_ns: int = 1796162000_000000000) -> str:
    """Lines as containerd writes them (RFC 3339 nanosecond stamp, stream, full-line tag)."""
    from datetime import datetime, timezone
    out = []
    for i, line in enumerate(lines):
        ns = start_ns + i * 1_000_000
        stamp = datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        out.append(f"{stamp}.{ns % 10**9:09d}Z stdout F {line}\n")
    return "".join(out)


def envoy(n: int) -> list[str]:
    """Envoy's default access-log format, as istio-proxy prints it for each request it proxies."""
    return [f'[2026-12-01T21:56:{i % 60:02d}.{i % 1000:03d}Z] "POST /v1/completions HTTP/1.1" 200 - via_upstream - '
            f'"-" 120 812 2035 2034 "-" "python-httpx/0.27" "5f1c{i:08x}" "llm.example.com" "127.0.0.1:8080" '
            f'inbound|8080|| 127.0.0.6:41233 10.0.0.12:8080 10.0.0.1:0 - default' for i in range(n)]


def queue_proxy(n: int) -> list[str]:
    """Knative's queue-proxy: zap JSON (no `levelname`, a Go caller)."""
    return [json.dumps({"severity": "INFO", "timestamp": "2026-12-01T21:56:03.1315Z", "logger": "queueproxy",
                        "caller": "sharedmain/main.go:282", "message": f"Starting queue-proxy {i}",
                        "knative.dev/key": "llm/vllm-predictor"}) for i in range(n)]


def transformer() -> list[str]:
    """A Python FastAPI sidecar: uvicorn's lines and a traceback, what any Python server prints."""
    return ["INFO:     Started server process [7]", "INFO:     Waiting for application startup.",
            "INFO:     Application startup complete.",
            "INFO:     Uvicorn running on http://0.0.0.0:8080 (Press CTRL+C to quit)",
            'INFO:     10.0.0.1:5050 - "POST /v1/models/m:predict HTTP/1.1" 200 OK',
            "Traceback (most recent call last):", '  File "/app/t.py", line 3, in <module>',
            "ValueError: bad input",
            'INFO:     10.0.0.1:5051 - "POST /v1/models/m:predict HTTP/1.1" 500 Internal Server Error']


def kubelet_file(root: Path, pod: str, container: str, text: str = "") -> Path:
    d = root / "pods" / f"llm_{pod}_{UID}" / container
    d.mkdir(parents=True, exist_ok=True)
    (d / "0.log").write_text(text, encoding="utf-8")
    return d / "0.log"


def wanted_roots(name: str) -> Counter:
    """The request ids vLLM logged for the client's requests (tests/scenario_truth.py's rule:
    one root per client request whose id the log names), counted."""
    from scenario_truth import id_in_log, logged_id
    truth = json.loads((SCENARIOS / name / "truth.json").read_text())
    text = (SCENARIOS / name / "server.log").read_text(encoding="utf-8")
    return Counter(rid for r in truth["requests"] if (rid := logged_id(r)) is not None and id_in_log(text, rid))


# -- the rule, line by line --------------------------------------------------------------------

def _first_evidence(text: str) -> str | None:
    from bridge.parse import Parser
    dec, parser = Decoder(), Parser()
    pos = 0
    for raw in text.encode().splitlines(keepends=True):
        record = dec(raw, pos)
        pos += len(raw)
        if record is not None:
            why = evidence(record, parser.parse(record.message, record.level, record.origin))
            if why:
                return why
    return None


@pytest.mark.parametrize("name", sorted(p.name for p in SCENARIOS.iterdir() if (p / "server.log").exists()))
def test_every_real_vllm_log_is_recognised_within_its_first_lines(name):
    """Each real vLLM 0.32 log (text and JSON formats) is told apart by a line near its start."""
    text = (SCENARIOS / name / "server.log").read_text(encoding="utf-8")
    head = "".join(text.splitlines(keepends=True)[:5])
    assert _first_evidence(head), name


def test_a_vllm_log_read_after_rotation_is_recognised_by_any_of_its_lines():
    """A file that starts mid-run (kubelet rotated away the banner) still reads as vLLM: every
    line vLLM's processes wrote carries its header or its process prefix, uvicorn's included."""
    lines = (SCENARIOS / "queue_pressure" / "server.log").read_text(encoding="utf-8").splitlines(keepends=True)
    # vllm/logger.py `_FORMAT`: `(<process> pid=N) LEVEL MM-DD HH:MM:SS [file:line] message`
    written = re.compile(r"\S+ std(?:out|err) F (?:\(\w+ pid=\d+\) |(?:DEBUG|INFO|WARNING|ERROR) \d\d-\d\d )")
    vllm_lines = [ln for ln in lines if written.match(ln)]
    assert len(vllm_lines) > 40
    for ln in vllm_lines[-40:]:
        assert _first_evidence(ln), ln
    # uvicorn's own line, written by the APIServer process: its prefix tells (vllm/utils/system_utils.py)
    assert "process prefix" in _first_evidence(
        cri(['(APIServer pid=1) INFO:     10.0.0.1:5050 - "POST /v1/completions HTTP/1.1" 200 OK']))


def test_the_seed_dialects_lines_are_vllm_from_the_first():
    """The project's own contract (the seed dialect the generator writes: a header with a bare
    `file.py:N]` origin) is told from its first line, `Scheduling request`, so a file the
    generator writes is admitted at the look that first sees a line."""
    assert _first_evidence(cri(["INFO 02-15 10:23:00 scheduler.py:234] Scheduling request 0x7f8c4a001000: "
                                "priority=0, num_scheduled_blocks=1, remaining_blocks=10"]))
    cfg = SynthConfig(requests=3, seed=1, cri=True, model_load_failure=False)
    buf = io.StringIO()
    write(generate(cfg)[0], buf, cfg)
    assert _first_evidence(buf.getvalue().splitlines(keepends=True)[0])


@pytest.mark.parametrize("lines", [envoy(20), queue_proxy(20), transformer(),
                                   ["+ exec python -m server", "Downloading model from s3://models/llama"]],
                         ids=["envoy", "queue-proxy", "python-app", "shell"])
def test_sidecar_lines_are_not_vllm(lines):
    assert _first_evidence(cri(lines)) is None


# -- the detector over files -----------------------------------------------------------------

def test_quiet_start_is_looked_at_again_and_a_full_head_without_vllm_is_refused(tmp_path):
    det = Detector(limit=4096)
    quiet = kubelet_file(tmp_path, "p", "model", cri(["+ exec python -m server", "waiting for the model"]))
    src = source_for(str(quiet))
    kind, why = det(str(quiet), src)
    assert kind == "not_vllm" and "yet" in why
    assert det(str(quiet), src) == (kind, why)  # unchanged: the same answer, nothing read again
    with open(quiet, "a", encoding="utf-8") as f:  # vLLM starts
        f.write("".join((SCENARIOS / "idle_shutdown" / "server.log").read_text().splitlines(keepends=True)[:3]))
    assert det(str(quiet), src) is None
    assert det.take_found()[0].line == 4  # the banner's first line, after the two quiet ones and Triton's
    side = kubelet_file(tmp_path, "p", "istio-proxy", cri(envoy(100)))
    kind, why = det(str(side), source_for(str(side)))
    assert kind == "not_vllm" and "first 4096 bytes" in why and "yet" not in why
    assert det.stats.not_vllm == 1 and det.stats.vllm == 1


def test_named_container_gateway_and_plain_files_are_not_looked_at(tmp_path):
    det = Detector(limit=4096, containers=("*", "istio-proxy"), gateway=(str(tmp_path / "gw" / "*"),))
    side = kubelet_file(tmp_path, "p", "istio-proxy", cri(envoy(100)))
    assert det(str(side), source_for(str(side))) is None and det.stats.named == 1
    other = kubelet_file(tmp_path, "p", "queue-proxy", cri(queue_proxy(100)))
    assert det(str(other), source_for(str(other)))[0] == "not_vllm"
    (tmp_path / "gw").mkdir()
    plain = tmp_path / "gw" / "access.log"
    plain.write_text("\n".join(envoy(100)))
    assert det(str(plain), source_for(str(plain))) is None
    plain2 = tmp_path / "app.log"
    plain2.write_text("\n".join(envoy(100)))
    assert det(str(plain2), source_for(str(plain2))) is None  # not a container: the include named it


# -- the agent, a real process ---------------------------------------------------------------

def _roots_by_container(rx: Receiver) -> dict[str, Counter]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from receiver_proc import read_requests
    from receivers import attrs
    out: dict[str, Counter] = {}
    if not os.path.exists(rx.out):
        return out
    seen = set()
    for raw in read_requests(rx.out):
        for rs in ExportTraceServiceRequest.FromString(raw).resource_spans:
            container = attrs(rs.resource.attributes).get("k8s.container.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    if s.span_id in seen:
                        continue
                    seen.add(s.span_id)
                    out.setdefault(container, Counter())
                    if s.name == "vllm.request":
                        out[container][attrs(s.attributes)["vllm.request.id"]] += 1
    return out


def test_agent_finds_vllm_by_what_it_logs_and_skips_the_sidecars(tmp_path):
    """A KServe-like pod (`kserve-container` beside istio-proxy, queue-proxy and a Python
    transformer), a pod whose vLLM (JSON format) is in `server`, and one whose container `model`
    starts quietly: the default settings export every request the clients saw, and nothing of
    the sidecars; the skipped files are in /metrics and the log."""
    read = lambda n: (SCENARIOS / n / "server.log").read_text(encoding="utf-8")  # noqa: E731
    kubelet_file(tmp_path, "vllm-predictor-0", "kserve-container", read("queue_pressure"))
    kubelet_file(tmp_path, "vllm-predictor-0", "istio-proxy", cri(envoy(800)))   # > detect_bytes: refused
    kubelet_file(tmp_path, "vllm-predictor-0", "queue-proxy", cri(queue_proxy(20)))  # short: still waiting
    kubelet_file(tmp_path, "vllm-predictor-0", "transformer", cri(transformer()))
    kubelet_file(tmp_path, "chat-0", "server", read("json_logging"))
    quiet = kubelet_file(tmp_path, "quiet-0", "model", cri(["+ exec vllm serve /models/tiny",
                                                            "fetching /models/tiny from s3://bucket/tiny"]))
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint,
                      "--linger", "0").start()
    try:
        def skipped(path: Path):
            return [e for e in agent.log_events() if e.get("event") == "file_skipped" and e["path"] == str(path)]
        assert wait_for(lambda: skipped(quiet), deadline(120))
        assert skipped(quiet)[0]["kind"] == "not_vllm"
        with open(quiet, "a", encoding="utf-8") as f:  # vLLM starts, after the agent looked
            f.write(read("idle_shutdown"))
        want = {"kserve-container": wanted_roots("queue_pressure"), "server": wanted_roots("json_logging"),
                "model": wanted_roots("idle_shutdown")}
        assert all(want.values())
        assert wait_for(lambda: {k: v for k, v in _roots_by_container(rx).items() if v} == want, deadline(120)), \
            _roots_by_container(rx)
        time.sleep(deadline(2))  # anything more (a sidecar's span, a duplicate) would show by now
        got = _roots_by_container(rx)
        assert set(got) == {"kserve-container", "server", "model"}, set(got)  # no span of a sidecar
        assert {k: v for k, v in got.items()} == want
        assert agent.metric("files_skipped", 'reason="not_vllm"') == 3
        assert agent.metric("files_detected", 'verdict="vllm"') == 3
        assert agent.metric("files_detected", 'verdict="not_vllm"') == 1
        assert agent.metric("files_watched") == 3
        events = agent.log_events()
        detected = {Path(e["path"]).parent.name for e in events if e.get("event") == "vllm_detected"}
        assert detected == {"kserve-container", "server", "model"}
        refused = [e for e in events if e.get("event") == "file_skipped" and "istio-proxy" in e["path"]]
        assert refused[-1]["kind"] == "not_vllm" and "first 65536 bytes" in refused[-1]["reason"]
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_detect_off_and_name_patterns_still_decide(tmp_path):
    """`containers` still narrows (the old default, `*vllm*`, skips kserve-container by name)
    and `detect: off` follows what the names admit, sidecar or not."""
    read = (SCENARIOS / "queue_pressure" / "server.log").read_text(encoding="utf-8")
    kubelet_file(tmp_path, "p-0", "kserve-container", read)
    kubelet_file(tmp_path, "p-0", "istio-proxy", cri(envoy(50)))
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    try:
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "s1"), rx.endpoint,
                          "--containers", "*vllm*").start()
        assert wait_for(lambda: agent.metric("files_skipped", 'reason="filter"') == 2, deadline(60))
        assert agent.metric("files_watched") == 0
        assert agent.term()[0] == 0
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "s2"), rx.endpoint,
                          "--detect", "off").start()
        assert wait_for(lambda: agent.metric("files_watched") == 2, deadline(60))
        assert agent.metric("files_detected") == 0 and agent.metric("files_skipped", 'reason="not_vllm"') == 0
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_detect_setting_reads_a_bare_yaml_off_and_names_a_bad_value():
    """PyYAML and Helm read YAML 1.1, where a bare `off` is false: the setting takes it as `off`."""
    import yaml

    from bridge.config import ConfigError, load
    cfg, _ = load(yaml.safe_load("detect: off\n"), {}, {})
    assert cfg.detect == "off"
    assert load(None, {"VLLM_TRACE_BRIDGE_DETECT": "off"}, {})[0].detect == "off"
    assert load(None, {}, {})[0].detect == "vllm" and load(None, {}, {})[0].containers == ("*",)
    with pytest.raises(ConfigError, match="detect .*'names'.*vllm, off"):
        load({"detect": "names"}, {}, {})
    with pytest.raises(ConfigError, match="detect_bytes"):
        load({"detect_bytes": 0}, {}, {})


def test_a_vllm_line_longer_than_the_head_or_held_partial_still_tells(tmp_path):
    """The head may end inside a line: a vLLM line cut there (a long prompt logged) and a
    CRI partial (`P`) line the runtime split still show vLLM's header."""
    det = Detector(limit=4096)
    head = "INFO 12-01 21:56:56 [logger.py:41] Received request cmpl-1-0: prompt: '"
    long_line = kubelet_file(tmp_path, "p", "a", cri([head + "x" * 10000 + "'"]))
    assert det(str(long_line), source_for(str(long_line))) is None
    partial = kubelet_file(tmp_path, "p", "b", "2026-12-01T21:56:56.000000000Z stdout P " + head + "y" * 8000 + "\n")
    assert det(str(partial), source_for(str(partial))) is None


def test_an_empty_file_after_rotation_is_told_by_the_file_rotated_from_it(tmp_path):
    """An idle vLLM (no stats, no requests) after kubelet rotated its log: the new 0.log is
    empty, 0.log.<stamp> is full of vLLM's lines."""
    det = Detector(limit=4096)
    path = kubelet_file(tmp_path, "p", "model", "")
    src = source_for(str(path))
    assert det(str(path), src)[0] == "not_vllm"
    rotated = str(path) + ".20261201-215656"
    with open(rotated, "w", encoding="utf-8") as f:
        f.write("".join((SCENARIOS / "idle_shutdown" / "server.log").read_text().splitlines(keepends=True)[:3]))
    assert det(str(path), src) is None
    assert "0.log.20261201-215656" in det.take_found()[0].evidence
