"""End to end against a real trace backend: Arize Phoenix, searched through its own query API.

A log written by bridge.synth (whose ground truth says which requests exist, how they ended and
how long vLLM said they took) is replayed with OTLP/HTTP to a Phoenix started here on 127.0.0.1;
then requests are found the way a user would look for them: by request id, by error type and by
latency (Phoenix's GraphQL API with its span filter language). Every expected value comes from
the generator's truth, none from the bridge.

Phoenix lives in a virtualenv of its own (tests/phoenix_env/install.sh, ~850 MB, cached outside
the repository; .ci/run installs it). Marker `phoenix`.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bridge.cli import main
from bridge.synth import SynthConfig, write_file
from waits import deadline

pytestmark = pytest.mark.phoenix

HERE = Path(__file__).resolve().parent
CACHE = Path(os.path.expanduser(os.environ.get("VLLM_TRACE_BRIDGE_CACHE", "~/.cache/vllm-trace-bridge")))
VENV = Path(os.environ.get("PHOENIX_VENV", CACHE / "phoenix-venv"))
SYNTH = SynthConfig(requests=60, seed=11)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Phoenix:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def gql(self, query: str, **variables) -> dict:
        req = urllib.request.Request(self.base + "/graphql", data=json.dumps(
            {"query": query, "variables": variables}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=deadline(30)) as r:
            body = json.load(r)
        assert "errors" not in body, body["errors"]
        return body["data"]

    def spans(self, condition: str, project: str = "default", since_s: float | None = None) -> list[dict]:
        """Spans of a project matching Phoenix's filter condition, attributes as a dict; with
        `since_s`, only those that started in the last `since_s` seconds (the UI's time window)."""
        out: list[dict] = []
        after = None
        window = None
        if since_s is not None:
            now = time.time()
            window = {"start": _iso(now - since_s), "end": _iso(now + 60)}
        while True:
            data = self.gql("""query($f: String!, $after: String, $t: TimeRange) { projects { edges { node { name
                spans(first: 1000, after: $after, filterCondition: $f, timeRange: $t) {
                    pageInfo { hasNextPage endCursor }
                    edges { node { name statusCode latencyMs attributes context { traceId spanId } } } }
                } } } }""", f=condition, after=after, t=window)
            found = [e["node"] for e in data["projects"]["edges"] if e["node"]["name"] == project]
            if not found:
                return out
            (project_node,) = found
            project = project_node["name"]
            for edge in project_node["spans"]["edges"]:
                node = dict(edge["node"])
                node["attributes"] = json.loads(node["attributes"])
                out.append(node)
            page = project_node["spans"]["pageInfo"]
            if not page["hasNextPage"]:
                return out
            after = page["endCursor"]

    def wait_for(self, condition: str, count: int, timeout: float | None = None, **where) -> list[dict]:
        """Phoenix stores spans in the background: poll until `count` match (or the scaled cap passes)."""
        until = time.monotonic() + (deadline(60) if timeout is None else timeout)
        while True:
            found = self.spans(condition, **where)
            if len(found) >= count or time.monotonic() > until:
                return found
            time.sleep(0.5)


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    phoenix_bin = VENV / "bin" / "phoenix"
    t0 = time.monotonic()
    if not phoenix_bin.exists():  # a test run never installs: .ci/run does, before the tests
        pytest.skip(f"no Phoenix venv at {VENV}: bash tests/phoenix_env/install.sh (about 2 min, 850 MB, once)")
    work = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = _free_port(), _free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(work), "PHOENIX_HOST": "127.0.0.1",
           "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(grpc_port),
           "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = open(work / "phoenix.log", "wb")
    # Through tests/phoenix_env/serve.py: Phoenix's own gRPC listener binds every interface.
    proc = subprocess.Popen([str(VENV / "bin" / "python"), str(HERE / "phoenix_env" / "serve.py"), "serve"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        server = Phoenix(port)
        server.ports = (port, grpc_port)
        until = time.monotonic() + deadline(120)
        while time.monotonic() < until:
            assert proc.poll() is None, (work / "phoenix.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(server.base + "/healthz", timeout=deadline(2)) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"Phoenix did not come up in {deadline(120):.0f} s (scaled cap):\n" + (work / "phoenix.log").read_text()[-3000:])
        server.startup_s = time.monotonic() - t0
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(deadline(30))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(deadline(10))
        log.close()


@pytest.fixture(scope="module")
def replayed(phoenix, tmp_path_factory):
    """The synthetic log replayed to Phoenix once; its truth, and the roots Phoenix stored."""
    path = tmp_path_factory.mktemp("log") / "vllm.log"
    truth = write_file(str(path), SYNTH)
    year = int(SYNTH.start[:4])
    argv = ["replay", str(path), "--otlp-endpoint", phoenix.base, "--protocol", "http/protobuf",
            "--waterfalls", "0", "--year", str(year)]
    assert main(argv, env={}, out=io.StringIO()) == 0
    roots = phoenix.wait_for("name == 'vllm.request'", len(truth.requests))
    return truth, roots, argv


def _ids(spans: list[dict]) -> Counter:
    return Counter(s["attributes"]["vllm"]["request"]["id"] for s in spans)


def _listening(port: int) -> set[str]:
    """The local addresses listening on TCP `port`, from the kernel's own tables (/proc/net)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                if width == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1]))
                else:
                    words = bytes.fromhex(address)
                    raw = b"".join(words[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, raw).removeprefix("::ffff:"))  # v4-mapped
    return found


def test_phoenix_listens_on_the_loopback_only(phoenix):
    """Servers the tests start bind to 127.0.0.1: Phoenix's HTTP port and its gRPC port too."""
    for port in phoenix.ports:
        assert _listening(port) == {"127.0.0.1"}, (port, _listening(port))


def test_every_request_of_the_log_is_one_root_span_in_phoenix(replayed):
    truth, roots, _ = replayed
    assert _ids(roots) == Counter(r.request_id for r in truth.requests)


def test_a_request_is_found_by_its_id(phoenix, replayed):
    truth, _, _ = replayed
    occurrences = Counter(r.request_id for r in truth.requests)
    # An id vLLM used once and one it reused (the seed dialect's ids are object addresses).
    once = next(r for r in truth.requests if occurrences[r.request_id] == 1 and r.outcome == "finished")
    reused = next((rid for rid, n in occurrences.items() if n > 1), None)
    (span,) = phoenix.spans(f"name == 'vllm.request' and attributes['vllm']['request']['id'] == '{once.request_id}'")
    a = span["attributes"]
    assert a["gen_ai"]["usage"]["input_tokens"] == once.prompt_tokens
    assert a["gen_ai"]["usage"]["output_tokens"] == once.generated_tokens
    assert a["vllm"]["e2e_s"] == pytest.approx(once.e2e_s)
    assert a["vllm"]["ttft_s"] == pytest.approx(once.ttft_s)
    assert span["statusCode"] != "ERROR"
    if reused is not None:
        found = phoenix.spans(f"name == 'vllm.request' and attributes['vllm']['request']['id'] == '{reused}'")
        assert len(found) == occurrences[reused]
        assert len({s["context"]["traceId"] for s in found}) == len(found)  # never merged


def test_requests_are_found_by_error_type(phoenix, replayed):
    truth, _, _ = replayed
    kinds = {r.error_type for r in truth.requests if r.error_type}
    assert {"oom", "timeout"} <= kinds, "the generator's config should produce both"
    for kind in sorted(kinds):
        found = phoenix.spans(f"name == 'vllm.request' and attributes['error']['type'] == '{kind}'")
        expected = Counter(r.request_id for r in truth.requests if r.error_type == kind)
        assert _ids(found) == expected, kind
        assert {s["statusCode"] for s in found} == {"ERROR"}
    errors = phoenix.spans("name == 'vllm.request' and status_code == 'ERROR'")
    assert _ids(errors) >= Counter(r.request_id for r in truth.requests if r.error_type)


def test_slow_requests_are_found_by_latency(phoenix, replayed):
    truth, _, _ = replayed
    e2e = sorted(r.e2e_s for r in truth.requests if r.e2e_s is not None)
    threshold = e2e[len(e2e) * 3 // 4]  # the slowest quarter, by what vLLM reported
    slow = Counter(r.request_id for r in truth.requests if r.e2e_s is not None and r.e2e_s > threshold)
    assert slow
    by_attr = phoenix.spans(f"name == 'vllm.request' and attributes['vllm']['e2e_s'] > {threshold}")
    assert _ids(by_attr) == slow
    # Phoenix's own latency is the root span's duration: arrival to last evidence, so at least
    # vLLM's end-to-end time. Every slow request is in the backend's latency search too.
    by_latency = phoenix.spans(f"name == 'vllm.request' and latency_ms > {threshold * 1000}")
    assert _ids(by_latency) >= slow
    for s in by_attr:
        assert s["latencyMs"] >= s["attributes"]["vllm"]["e2e_s"] * 1000 - 1


def test_a_second_replay_is_deduplicated_by_the_backend(phoenix, replayed, tmp_path):
    """Deterministic span ids: sending the same log again adds no span. A different log sent
    after it is the marker that Phoenix has stored everything sent before."""
    truth, _, argv = replayed
    before = phoenix.spans("latency_ms >= 0")
    traces = {s["context"]["traceId"] for s in before}
    assert main(argv, env={}, out=io.StringIO()) == 0
    marker = write_file(str(tmp_path / "other-pod.log"), SynthConfig(requests=3, seed=5, model_load_failure=False,
                                                                   nccl_incidents=0, oom_failures=0))
    marker_argv = [*argv[:1], str(tmp_path / "other-pod.log"), *argv[2:]]
    assert main(marker_argv, env={}, out=io.StringIO()) == 0
    expected = len(truth.requests) + len(marker.requests)
    assert len(phoenix.wait_for("name == 'vllm.request'", expected)) == expected
    after = phoenix.spans("latency_ms >= 0")
    assert len([s for s in after if s["context"]["traceId"] in traces]) == len(before)
    assert len(after) > len(before)  # the marker's spans


# -- the queries of docs/backends.md, on data moved to now, in a project of its own ---------------------

WEEK = 7 * 86400  # the window a backend opens on: the bundled sample (2025) is outside it unshifted


@pytest.fixture(scope="module")
def shifted(phoenix, tmp_path_factory):
    """A CRI log of the generator (ns stamps) in a kubelet pod directory, and a real vLLM 0.32
    run's log with its client's record, both replayed with --shift-to-now and
    --k8s-attributes-on-spans into the Phoenix project `docs`."""
    pods = tmp_path_factory.mktemp("node") / "pods"  # kubelet's layout: /…/pods/<ns>_<pod>_<uid>/<container>/
    pod = pods / "serving_demo-pod_0e4c3f1a-1111-2222-3333-444455556666" / "vllm"
    pod.mkdir(parents=True)
    truth = write_file(str(pod / "0.log"), SynthConfig(requests=60, seed=23, cri=True))
    fixture = HERE / "fixtures" / "scenarios" / "queue_pressure"
    client = json.loads((fixture / "truth.json").read_text())
    with pytest.MonkeyPatch.context() as mp:  # the resource detector reads the process environment
        mp.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=docs")
        for path in (pod / "0.log", fixture / "server.log"):
            argv = ["replay", str(path), "--otlp-endpoint", phoenix.base, "--protocol", "http/protobuf",
                    "--waterfalls", "0", "--shift-to-now", "--k8s-attributes-on-spans"]
            assert main(argv, env=dict(os.environ), out=io.StringIO()) == 0
    named = [r for r in client["requests"] if r["response_id"]]
    phoenix.wait_for("name == 'vllm.request'", len(truth.requests) + len(named), project="docs")
    return truth, client


def test_shifted_data_is_in_the_last_week_and_the_sample_unshifted_is_not(phoenix, shifted, replayed):
    truth, client = shifted
    named = [r for r in client["requests"] if r["response_id"]]
    recent = phoenix.spans("name == 'vllm.request'", project="docs", since_s=WEEK)
    assert len(recent) == len(truth.requests) + len(named)
    assert phoenix.spans("name == 'vllm.request'", since_s=WEEK) == []  # the 2025 log, not shifted


def test_documented_query_by_the_id_the_client_received(phoenix, shifted):
    _truth, client = shifted
    for r in (r for r in client["requests"] if r["response_id"]):
        (span,) = phoenix.spans(f"attributes['gen_ai']['response']['id'] == '{r['response_id']}'",
                                project="docs", since_s=WEEK)
        assert span["name"] == "vllm.request"


def test_documented_queries_by_error_queue_time_preemption_and_pod(phoenix, shifted):
    truth, _client = shifted
    ids = lambda spans: Counter(s["attributes"]["vllm"]["request"]["id"] for s in spans)  # noqa: E731
    q = lambda cond: phoenix.spans(f"name == 'vllm.request' and {cond}", project="docs", since_s=WEEK)  # noqa: E731
    for kind in sorted({r.error_type for r in truth.requests if r.error_type}):
        assert ids(q(f"attributes['error']['type'] == '{kind}'")) == Counter(
            r.request_id for r in truth.requests if r.error_type == kind)
    preempted = Counter(r.request_id for r in truth.requests if r.preemptions)
    assert preempted and ids(q("attributes['vllm']['preemptions'] > 0")) == preempted
    waits = sorted((r.schedules[0] - r.arrival_ns) / 1e9 for r in truth.requests if r.schedules)
    # a threshold between two of the truth's waits, well clear of both (the CRI stamps are exact)
    gaps = [(b - a, (a + b) / 2) for a, b in zip(waits[len(waits) // 2:], waits[len(waits) // 2 + 1:])]
    _gap, threshold = max(gaps)
    slow = Counter(r.request_id for r in truth.requests if r.schedules and (r.schedules[0] - r.arrival_ns) / 1e9 > threshold)
    assert slow and ids(q(f"attributes['vllm']['queue_s'] > {threshold}")) == slow
    pod = q("attributes['k8s']['pod']['name'] == 'demo-pod'")
    assert ids(pod) == Counter(r.request_id for r in truth.requests)
