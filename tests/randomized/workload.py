"""One randomized run: a real vLLM with a drawn set-up, a drawn request mix sent at it, its
kubelet-style CRI log and the client's truth saved side by side (`server.log`, `truth.json`),
then the bridge's `replay` of that log exported over OTLP to a real in-process receiver."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agentkit import free_port
from receivers import GrpcReceiver, attrs
from vllm_server import VllmServer, ensure_vllm, plugin_path

from .client import run_workload
from .generator import Setup, draw_requests, draw_setup
from waits import deadline

ROOT = Path(__file__).resolve().parents[2]
IDLE_S = 2.5   # > VLLM_LOG_STATS_INTERVAL (1 s): a stats line shows the engine idle before the stop


def plan(seed: int, count: int) -> tuple[Setup, list]:
    """The set-up and requests of `seed`: one Random, set-up first, so a seed names both."""
    rng = random.Random(seed)
    setup = draw_setup(rng)
    return setup, draw_requests(rng, setup, count, str(seed))


def run(seed: int, count: int, out: Path, setup: Setup | None = None) -> dict:
    """Start vLLM for `seed`'s set-up, send its requests, stop it; writes out/server.log and
    out/truth.json and returns the truth. A given `setup` overrides the drawn one (the requests
    are still drawn from the seed)."""
    drawn, _ = plan(seed, count)
    setup = setup or drawn
    rng = random.Random(seed)
    draw_setup(rng)   # the same stream as plan(): requests follow the set-up's draw
    specs = draw_requests(rng, setup, count, str(seed))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    install = ensure_vllm()
    args, env = setup.server_args()
    # The plugin as users get it (`plugin install --target` + PYTHONPATH, tests/vllm_server.py
    # plugin_path): the venv holds none, and this checkout on PYTHONPATH declares no entry point,
    # so without it a `plugin` set-up ran stock vLLM (soak 4009: not one plugin line).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT),
                                                    plugin_path() if setup.plugin else None) if p)
    port = free_port()
    server = VllmServer(install, str(log), port, *args, env=env)
    drop = set()
    if not setup.log_requests:
        drop |= {"--enable-log-requests", "--enable-log-outputs"}
    elif not setup.log_outputs:
        drop.add("--enable-log-outputs")
    server.args = [a for a in server.args if a not in drop]
    truth: dict = {"seed": seed, "setup": setup.to_json(), "setup_name": setup.name,
                   "server_args": server.args[2:], "max_model_len": setup.max_model_len}
    with _machine_lock():
        _serve(server, port, setup, specs, truth)
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


@contextlib.contextmanager
def _machine_lock():
    """RANDOMIZED_LOCK names a lock file held while vLLM runs (one vLLM at a time on a shared
    machine), taken per run so that a long soak never holds it for long."""
    path = os.environ.get("RANDOMIZED_LOCK")
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _serve(server: VllmServer, port: int, setup: Setup, specs: list, truth: dict) -> None:
    server.start()
    try:
        truth["healthy_ns"] = time.time_ns()
        records = run_workload(port, setup, specs)
        time.sleep(IDLE_S)   # the stats logger reports the idle engine: an end no line states is bounded
        truth["sigterm_ns"] = time.time_ns()
        os.kill(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(deadline(30))
        except subprocess.TimeoutExpired:
            pass
    finally:
        server.stop()
    truth["requests"] = [asdict(r) for r in records]


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent: str
    name: str
    start_ns: int
    end_ns: int
    attrs: dict


def replay_spans(log: Path) -> tuple[list[Span], bytes]:
    """`python -m bridge replay` of `log`, exported over OTLP/gRPC to an in-process receiver:
    the spans as received, and every raw request body (for the privacy scan)."""
    with GrpcReceiver() as rx:
        proc = subprocess.run([sys.executable, "-m", "bridge", "replay", "--otlp-endpoint", rx.endpoint,
                               "--waterfalls", "0", str(Path(log).resolve())], cwd=str(ROOT), capture_output=True, text=True,
                              timeout=deadline(600), env={**os.environ, "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"})
        assert proc.returncode == 0, f"replay exited {proc.returncode}: {proc.stderr[-2000:]}"
        spans = [Span(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                      s.start_time_unix_nano, s.end_time_unix_nano, attrs(s.attributes)) for _, s in rx.spans()]
        return spans, b"".join(rx.raw)


def log_of(d: Path) -> Path:
    """A run's log: server.log, or server.log.gz as the fixtures keep it (replay reads both)."""
    return d / "server.log" if (d / "server.log").exists() else d / "server.log.gz"


def check_dir(d: Path) -> list:
    """Replay d's log and hold its spans to d/truth.json: the violations."""
    from .invariants import check
    truth = json.loads((d / "truth.json").read_text())
    log = log_of(d)
    spans, raw = replay_spans(log)
    with (gzip.open(log, "rt", errors="replace") if log.suffix == ".gz" else open(log, errors="replace")) as f:
        text = f.read()
    return check(truth, spans, raw, text)


def save_fixture(run_dir: Path, dest: Path) -> None:
    """Keep a run for the fast suite: its truth, and its log gzipped (DEBUG logs are large)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(run_dir / "truth.json", dest / "truth.json")
    with open(run_dir / "server.log", "rb") as src, gzip.open(dest / "server.log.gz", "wb") as out:
        shutil.copyfileobj(src, out)
