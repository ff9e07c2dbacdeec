"""What a GPU node's file system holds never stops the agent (issue 37, point 1).

Run as a non-root user where root would hide the case (root reads a mode-000 file and lists a
mode-000 directory): the agent's process drops to `nobody` before exec. The truth is what the
test wrote: the request ids in the healthy pods' files.
"""

from __future__ import annotations

import os
import resource
import time
import shutil
import tempfile

import pytest

from agentkit import AgentProc, Receiver, free_port, wait_for
from receivers import attrs
from waits import deadline

NOBODY = 65534
POD = "llm_{name}_3f2a9c1e-1111-2222-3333-{n:012d}"


SETPRIV = shutil.which("setpriv")
AS_NOBODY = [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _can_drop() -> str | None:
    if os.getuid() != 0:
        return None  # already not root: the cases hold as they are
    if SETPRIV is None:
        return "runs as root, and setpriv (util-linux) is not there to run the agent as nobody"
    try:
        import pwd
        pwd.getpwuid(NOBODY)
    except (ImportError, KeyError):
        return "runs as root, and there is no user 'nobody' (uid 65534) to run the agent as"
    return None


@pytest.fixture
def world(tmp_path):
    """A directory every user may enter (pytest's tmp_path is root's, mode 0700)."""
    d = tempfile.mkdtemp(prefix="node-hostile-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    for root, dirs, _ in os.walk(d):
        for x in dirs:
            try:
                os.chmod(os.path.join(root, x), 0o755, follow_symlinks=False)
            except OSError:
                pass
    shutil.rmtree(d, ignore_errors=True)


def _summary(rid: str, sec: int = 2) -> str:
    return (f"2025-02-15T10:23:0{sec}.000000000Z stdout F INFO 02-15 10:23:0{sec} scheduler.py:789] "
            f"Request {rid}: prompt_tokens=1, generated_tokens=2, ttft=1.0ms, itl=1.0ms, total_latency=0.5s\n")


def _pod(root: str, name: str, n: int) -> str:
    d = os.path.join(root, "pods", POD.format(name=name, n=n), "vllm")
    os.makedirs(d, exist_ok=True)
    for x in (os.path.join(root, "pods"), os.path.dirname(d), d):
        os.chmod(x, 0o755)
    return os.path.join(d, "0.log")


def _write(path: str, text: str, mode: int = 0o644) -> None:
    with open(path, "a") as f:
        f.write(text)
    os.chmod(path, mode)


def _request_ids(rx: Receiver) -> set[str]:
    return {attrs(s.attributes)["vllm.request.id"] for s in rx.spans() if s.name == "vllm.request"}


def _agent(world: str, rx: Receiver, *extra: str) -> AgentProc:
    state = os.path.join(world, "state")
    os.makedirs(state, exist_ok=True)
    os.chmod(state, 0o777)
    agent = AgentProc(os.path.join(world, "pods/*/*/*.log"), state, rx.endpoint, "--poll-interval", "0.2",
                      *extra)
    return agent


def test_loops_locked_directories_and_unreadable_files_are_skipped_reported_once_and_retried(world, tmp_path):
    why = _can_drop()
    if why:
        pytest.skip(why)
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    healthy = _pod(world, "good-0", 1)
    _write(healthy, _summary("0xa1"))
    loop = os.path.dirname(_pod(world, "loop-0", 2))
    os.symlink("1.log", os.path.join(loop, "0.log"))  # 0.log → 1.log → 0.log
    os.symlink("0.log", os.path.join(loop, "1.log"))
    dloop = os.path.join(world, "pods", POD.format(name="dloop-0", n=3))
    os.makedirs(dloop)
    os.chmod(dloop, 0o755)
    os.symlink("vllm", os.path.join(dloop, "vllm"))  # a directory link to itself
    locked_file = _pod(world, "locked-0", 4)
    _write(locked_file, _summary("0xb2"))
    locked = os.path.dirname(os.path.dirname(locked_file))
    os.chmod(locked, 0o000)  # may not be listed or searched
    unreadable = _pod(world, "unread-0", 5)
    _write(unreadable, _summary("0xc3"), mode=0o000)
    agent = _agent(world, rx)
    if os.getuid() == 0:  # root would read the mode-000 file and list the mode-000 directory
        agent.args = AS_NOBODY + agent.args
    agent.start()
    try:
        assert wait_for(lambda: "0xa1" in _request_ids(rx), deadline(30)), "the healthy pod beside them was not served"
        assert wait_for(lambda: agent.metric("files_skipped", 'reason="loop"') == 3, deadline(10))
        assert agent.metric("files_skipped", 'reason="unreadable"') == 2
        # Several looks and retries later: still one report and one count per entry.
        assert wait_for(lambda: agent.metric("file_errors", 'reason="loop"') == 3, deadline(10))
        assert agent.metric("file_errors", 'reason="permission"') == 2
        # Made readable: the next try (backoff) follows them, the request in each is sent.
        os.chmod(unreadable, 0o644)
        os.chmod(locked, 0o755)
        assert wait_for(lambda: {"0xb2", "0xc3"} <= _request_ids(rx), deadline(60)), _request_ids(rx)
        skipped = [e for e in agent.log_events() if e.get("event") == "file_skipped"]
        paths = [e["path"] for e in skipped]
        assert len(paths) == len(set(paths)) == 5, paths  # each reported once
        assert {e["kind"] for e in skipped} == {"loop", "unreadable"}
        assert wait_for(lambda: agent.metric("files_skipped", 'reason="unreadable"') == 0, deadline(10))
        assert agent.get("/healthz")[0] == 200 and agent.get("/readyz")[0] == 200
        assert agent.proc.poll() is None
        assert agent.term()[0] == 0
        assert not [e for e in agent.log_events() if e.get("level") == "error"]
    finally:
        os.chmod(locked, 0o755)
        rx.stop()


def _nofile(limit: int):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return set_limit


def test_2000_files_under_a_1024_open_files_limit_are_all_sent_and_the_agent_stays_ready(world, tmp_path):
    n = 2000
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    want = set()
    paths = []
    for i in range(n):
        path = _pod(world, f"vllm-{i}", i)
        rid = f"0x{i + 1:x}0000"
        _write(path, _summary(rid))
        want.add(rid)
        paths.append(path)
    agent = _agent(world, rx, "--start-at", "beginning")
    agent.preexec = _nofile(1024)
    agent.start()
    try:
        assert wait_for(lambda: agent.get("/readyz")[0] == 200, deadline(120))
        assert wait_for(lambda: len(_request_ids(rx)) >= n, deadline(300)), len(_request_ids(rx))
        assert _request_ids(rx) == want
        assert agent.metric("files_open") <= agent.metric("files_open_budget") < 1024
        assert agent.metric("files_watched") == n
        # A parked file written again is reopened by identity and its new request sent.
        _write(paths[7], _summary("0xfeed", sec=3))
        _write(paths[1500], _summary("0xbeef", sec=3))
        assert wait_for(lambda: {"0xfeed", "0xbeef"} <= _request_ids(rx), deadline(60))
        assert agent.metric("files_reopened") >= 1
        assert agent.metric("line_errors") == 0
        assert agent.metric("checkpoint_failures") == 0
        assert agent.get("/healthz")[0] == 200 and agent.get("/readyz")[0] == 200
        assert agent.term(deadline(60))[0] == 0
        assert not [e for e in agent.log_events() if e.get("level") == "error"]
    finally:
        rx.stop()


def test_healthz_fails_when_the_main_loop_stops_turning(world, tmp_path):
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    log = _pod(world, "vllm-0", 1)
    _write(log, _summary("0xa1"))
    agent = _agent(world, rx, "--start-at", "beginning", "--stall-timeout", "3")
    agent.env["VLLM_TRACE_BRIDGE_INJECT_FAULT"] = "hang:HANG-HERE"  # reading that line never returns
    agent.start()
    try:
        assert wait_for(lambda: "0xa1" in _request_ids(rx), deadline(60))
        time.sleep(4)  # longer than stall_timeout: a loop that turns stays healthy
        assert agent.get("/healthz") == (200, "ok\n")
        _write(log, "2025-02-15T10:23:03.000000000Z stdout F INFO 02-15 10:23:03 a.py:1] HANG-HERE\n")
        assert wait_for(lambda: agent.get("/healthz")[0] == 503, deadline(60))
        assert "main loop stuck" in agent.get("/healthz")[1]
        assert agent.get("/metrics")[0] == 200  # the telemetry thread still answers
    finally:
        agent.kill9()
        rx.stop()
