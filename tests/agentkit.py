"""Real processes for agent tests: the agent, a writer, and a receiver, each in its own process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from receiver_proc import read_requests
from waits import deadline, wait_for, wait_while_progressing  # noqa: F401 (the tests import them from here)

HERE = os.path.dirname(os.path.abspath(__file__))
SPAWNED: list[subprocess.Popen] = []  # every process a test started; conftest stops leftovers


def spawn(*args, **kw) -> subprocess.Popen:
    proc = subprocess.Popen(*args, **kw)
    SPAWNED.append(proc)
    return proc
ROOT = os.path.dirname(HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_log(tmp, name="vllm-0", container="vllm") -> str:
    d = tmp / "pods" / f"llm_{name}_3f2a9c1e-1111-2222-3333-444455556666" / container
    d.mkdir(parents=True, exist_ok=True)
    return str(d / "0.log")


class Receiver:
    def __init__(self, port: int, out: str) -> None:
        self.port, self.out = port, out
        self.proc: subprocess.Popen | None = None

    def start(self) -> Receiver:
        self.proc = spawn([sys.executable, os.path.join(HERE, "receiver_proc.py"), str(self.port),
                                      self.out], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(deadline(10))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list:
        out = []
        if not os.path.exists(self.out):
            return out
        for raw in read_requests(self.out):
            for rs in ExportTraceServiceRequest.FromString(raw).resource_spans:
                for ss in rs.scope_spans:
                    out.extend(ss.spans)
        return out


class AgentProc:
    def __init__(self, include: str, state_dir: str, endpoint: str, *extra: str, env: dict | None = None) -> None:
        self.args = [sys.executable, "-m", "bridge", "run", "--include", include, "--state-dir", state_dir,
                     "--otlp-endpoint", endpoint, "--listen", "127.0.0.1:0", "--log-format", "json", *extra]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.preexec = None
        os.makedirs(state_dir, exist_ok=True)
        self.stderr_path = os.path.join(state_dir, f"agent-{time.monotonic_ns()}.err")

    def start(self) -> AgentProc:
        self._err = open(self.stderr_path, "w")
        self.proc = spawn(self.args, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=self._err,
                          preexec_fn=self.preexec)
        # Wait on the event, not a clock: a loaded machine can take long to start Python. The
        # cap only keeps a hung start from hanging the suite.
        until = time.monotonic() + deadline(600)
        while time.monotonic() < until and self.port is None:
            for event in self.log_events():
                if event.get("event") == "agent_started":
                    self.port = event["telemetry_port"]
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}: {open(self.stderr_path).read()}")
            time.sleep(0.05)
        assert self.port, f"agent did not start: no agent_started in {deadline(600):.0f} s (scaled cap)"
        return self

    def log_events(self) -> list[dict]:
        events = []
        with open(self.stderr_path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
        return events

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=deadline(5)) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        _, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(f"vllm_trace_bridge_{name}") and (not labels or labels in line):
                head, value = line.rsplit(" ", 1)
                if head.split("{")[0] in (f"vllm_trace_bridge_{name}", f"vllm_trace_bridge_{name}_total"):
                    total += float(value)
        return total

    def caught_up(self, path: str) -> bool:
        """The agent follows `path` and has read it to its current end (`file_bytes_behind` 0)."""
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith("vllm_trace_bridge_file_bytes_behind{") and f'path="{path}"' in line:
                return float(line.rsplit(" ", 1)[1]) == 0
        return False

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(deadline(10))

    def term(self, timeout: float | None = None) -> tuple[int, float]:
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(deadline(15) if timeout is None else timeout)
        return code, time.monotonic() - t


def start_writer(path: str, truth: str, **kw) -> subprocess.Popen:
    args = [sys.executable, os.path.join(HERE, "writer_proc.py"), path, "--truth", truth]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return spawn(args, stdout=subprocess.PIPE, text=True)


def saved_checkpoint(state_dir: str) -> dict:
    """The agent's last saved `checkpoints.json` ({} before its first save; it is replaced whole)."""
    try:
        with open(os.path.join(state_dir, "checkpoints.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def delivered_listed(state_dir: str) -> int:
    """Requests the saved checkpoint lists as delivered (past a position an open request holds)."""
    return sum(len(s.get("delivered", [])) for s in saved_checkpoint(state_dir).get("sources", []))


def checkpointed_to_end(state_dir: str, *paths: str, only: bool = False) -> bool:
    """The saved checkpoint resumes each file now at `paths` (matched by inode: a renamed file
    keeps its old path there until closed) at its current end: every line read, every request in
    it acked (no open or unacked one holds the position back), and saved. `only`: and it names no
    other file (a rotated file was read to its end and closed)."""
    entries = [(f["path"], f["inode"], f["offset"]) for f in saved_checkpoint(state_dir).get("files", [])]
    now = set()
    for p in paths:
        st = os.stat(p)
        now.add((p, st.st_ino, st.st_size))
    return now <= set(entries) and (not only or len(entries) == len(now))


def roots_by_request(spans) -> Counter:
    """(request id, trace id) pairs of every root span received, counted."""
    from receivers import attrs
    return Counter((attrs(s.attributes)["vllm.request.id"], s.trace_id) for s in spans if s.name == "vllm.request")


def check_exactly_once(truth_path: str, spans) -> dict:
    """Every truth request arrived, as exactly one trace; returns figures for the report."""
    from receivers import attrs
    with open(truth_path) as f:
        truth = json.load(f)
    roots = [s for s in spans if s.name == "vllm.request"]
    by_trace: dict[bytes, list] = {}
    for s in roots:
        by_trace.setdefault(s.trace_id, []).append(s)
    distinct_roots = [v[0] for v in by_trace.values()]
    # A re-sent root must be byte-identical to the first copy.
    for copies in by_trace.values():
        assert len({c.SerializeToString(deterministic=True) for c in copies}) == 1, "re-sent span differs"
    by_id: dict[str, list] = {}
    for s in distinct_roots:
        by_id.setdefault(attrs(s.attributes)["vllm.request.id"], []).append(s.start_time_unix_nano)
    missing = []
    for r in truth["requests"]:
        starts = by_id.get(r["id"], [])
        hits = [t for t in starts if abs(t - r["start"]) <= 1_000_000]
        if len(hits) != 1:
            missing.append((r["id"], r["outcome"], len(hits)))
    assert not missing, f"{len(missing)} requests not exactly once, e.g. {missing[:5]}"
    assert len(distinct_roots) == len(truth["requests"]), (len(distinct_roots), len(truth["requests"]))
    ids = [s.span_id for s in spans]
    return {"spans_received": len(ids), "distinct_span_ids": len(set(ids)), "requests": len(truth["requests"])}
