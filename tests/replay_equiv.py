"""Replay ≡ agent: the agent that followed a container's log live (through kubelet rotations
and a `kill -9`) must have exported exactly the spans a `replay` of the files left behind
exports. Independent of what either rebuilds: the two are compared with each other, span for
span, on what a backend keeps (ids, name, times, attributes, events, status).

`assert_agent_equals_replay(tmp_path, lines, seed)` is the reusable check: `lines` are CRI log
lines (as containerd writes them) from any source, a generator's or a real vLLM run's.
"""

from __future__ import annotations

import gzip
import io
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field

from agentkit import AgentProc, pod_log, wait_for
from receivers import GrpcReceiver, attrs
from waits import deadline

def synth_cri_lines(seed: int, requests: int = 60, reuse: float = 0.05) -> tuple[list[str], object]:
    """CRI lines from the ground-truth generator (as tests/writer_proc.py writes them) and its truth."""
    from bridge.synth import SynthConfig, generate, write

    cfg = SynthConfig(requests=requests, seed=seed, cri=True, mean_interarrival_s=0.05, model_load_failure=False,
                      reuse_ratio=reuse)
    lines, truth = generate(cfg)
    buf = io.StringIO()
    write(lines, buf, cfg)
    return buf.getvalue().splitlines(keepends=True), truth


_CRI_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")


@dataclass
class Outcome:
    """What one run did, for the test's report."""

    lines: int
    rotations: list[int] = field(default_factory=list)  # line indexes a rotation came before
    restarts: list[int] = field(default_factory=list)   # line indexes a container restart came before
    killed_at: int | None = None                         # line index the agent was killed at
    agent_spans: int = 0        # distinct span ids the agent sent
    resent: int = 0             # spans the agent sent again, identical (after the kill)
    replay_spans: int = 0
    replay_stdout: str = ""
    files: list[str] = field(default_factory=list)


def kubelet_rotate(log: str, stamp: str) -> None:
    """kubelet's rotation: `0.log` → `0.log.<stamp>`, and the file it rotated before gzipped
    (`compressLog`: a `.gz.tmp` written, renamed to `.gz`, the plain one removed)."""
    d = os.path.dirname(log)
    base = os.path.basename(log)
    plain = [n for n in os.listdir(d) if n.startswith(base + ".") and not n.endswith((".gz", ".tmp"))]
    os.rename(log, f"{log}.{stamp}")
    for name in plain:
        old = os.path.join(d, name)
        with open(old, "rb") as src, gzip.open(old + ".gz.tmp", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.rename(old + ".gz.tmp", old + ".gz")
        os.remove(old)


def closing_line(lines: list[str], after_s: float = 7200.0) -> str:
    """A gauge line stamped `after_s` after the last line: both the agent and the replay read it,
    and its time closes what is still open (TTL, linger) in both, as an idle hour would. Without
    it the agent would hold unended requests for `ttl` while a replay flushes them at once."""
    import calendar

    last = 0
    for line in lines:
        m = _CRI_STAMP.match(line)
        if m:
            ns = calendar.timegm(time.strptime(m[1], "%Y-%m-%dT%H:%M:%S")) * 10**9 + int((m[2] or "0").ljust(9, "0"))
            last = max(last, ns)
    if not last:
        raise ValueError("give CRI lines (`<RFC 3339 stamp> stdout F <line>`, as containerd writes them)")
    ts = last + int(after_s * 1e9)
    sec = ts // 10**9
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{ts % 10**9:09d}Z"
    header = time.strftime("%m-%d %H:%M:%S", time.gmtime(sec))
    return (f"{stamp} stdout F INFO {header} scheduler.py:1] Running queue: 0 requests, waiting queue: 0 "
            "requests, free blocks: 512/512\n")


def _span_key(s) -> bytes:
    return s.SerializeToString(deterministic=True)


def _describe(s) -> str:
    a = attrs(s.attributes)
    return (f"{s.name} span={s.span_id.hex()} trace={s.trace_id.hex()} start={s.start_time_unix_nano} "
            f"end={s.end_time_unix_nano} request={a.get('vllm.request.id')} outcome={a.get('vllm.outcome')} "
            f"attrs={sorted(a.items())} events={[(e.name, e.time_unix_nano) for e in s.events]}")


def diff_spans(agent: list, replay: list) -> str:
    """'' when the two span sets are equal (whole spans, by span id); else what differs."""
    a = {s.span_id: s for s in agent}
    r = {s.span_id: s for s in replay}
    only_a = [a[k] for k in a.keys() - r.keys()]
    only_r = [r[k] for k in r.keys() - a.keys()]
    changed = [(a[k], r[k]) for k in a.keys() & r.keys() if _span_key(a[k]) != _span_key(r[k])]
    if not (only_a or only_r or changed):
        return ""
    out = [f"agent {len(a)} spans, replay {len(r)}: {len(only_a)} only in the agent's, {len(only_r)} only in the "
           f"replay's, {len(changed)} with the same id and other content"]
    for s in sorted(only_a, key=lambda s: s.start_time_unix_nano)[:6]:
        out.append("  agent only:  " + _describe(s))
    for s in sorted(only_r, key=lambda s: s.start_time_unix_nano)[:6]:
        out.append("  replay only: " + _describe(s))
    for x, y in changed[:6]:
        out.append("  agent:  " + _describe(x))
        out.append("  replay: " + _describe(y))
    return "\n".join(out)


def run_agent_and_replay(tmp_path, lines: list[str], seed: int, *, rotations: int = 3, kill: bool = True,
                         restarts: int = 0, chunk: tuple[int, int] = (1, 40),
                         agent_args: tuple[str, ...] = ()) -> tuple[list, list, Outcome]:
    """Write `lines` (CRI) to a kubelet path while the agent follows it: `rotations` kubelet
    rotations at random lines (mid-request as often as not), `restarts` container restarts
    (the lines after one go to the next `<n>.log`, as kubelet names a restarted container's
    log), the agent killed with SIGKILL at a random line and started again while the writing
    goes on; then the files left behind are replayed (`vllm-trace-bridge replay <dir>`, as a
    user would). Returns the agent's distinct spans, the replay's, and what happened. Every
    choice comes from `seed`.

    One moment is left out on purpose: a kill before the agent's first checkpoint. Its restart
    is a first run, for which rotated files already there are history it was not asked to read
    (docs/agent.md), so the kill waits for the first checkpoint. The agent starts before the
    first line: what rotates before its first look at the new file is read (the directory was
    listed without it)."""
    from bridge.cli import main

    rng = random.Random(seed)
    lines = list(lines)
    if not lines or not lines[-1].endswith("\n"):
        raise ValueError("give whole CRI lines, each ending in a newline")
    lines.append(closing_line(lines))
    n = len(lines)
    log = pod_log(tmp_path)
    out = Outcome(lines=n)
    out.rotations = sorted(rng.sample(range(1, n - 1), min(rotations, max(0, n - 2))))
    out.killed_at = rng.randrange(1, n) if kill else None
    out.restarts = sorted(rng.sample(range(2, n - 1), min(restarts, max(0, n - 3))))
    include = str(tmp_path / "pods/*/*/*.log")
    state = str(tmp_path / "state")
    with GrpcReceiver() as rx:
        args = (include, state, rx.endpoint, "--start-at", "beginning", "--poll-interval", "0.2", *agent_args)
        agent = AgentProc(*args).start()
        restart_at: int | None = None
        f = open(log, "a", encoding="utf-8")
        try:
            i = 0
            stamp = 1_771_149_600  # 2026-02-15 10:00:00, one rotation a minute later each
            while i < n:
                step = rng.randint(*chunk)
                for j in range(i, min(n, i + step)):
                    if j in out.restarts:  # the container restarts: kubelet's next <n>.log
                        f.close()
                        log = os.path.join(os.path.dirname(log), f"{out.restarts.index(j) + 1}.log")
                        f = open(log, "a", encoding="utf-8")
                    if j in out.rotations:
                        f.close()
                        stamp += 60
                        kubelet_rotate(log, time.strftime("%Y%m%d-%H%M%S", time.gmtime(stamp)))
                        f = open(log, "a", encoding="utf-8")
                    if j == out.killed_at:
                        f.flush()
                        # Killed before its first checkpoint, an agent's restart is a first run:
                        # rotated files already there are history it was not asked to read.
                        assert wait_for(lambda: os.path.exists(os.path.join(state, "checkpoints.json")), deadline(30))
                        agent.kill9()
                        restart_at = min(n - 1, j + rng.randint(0, 200))
                    if j == restart_at:
                        f.flush()
                        agent = AgentProc(*args).start()
                        restart_at = None
                    f.write(lines[j])
                i = min(n, i + step)
                f.flush()
                time.sleep(rng.choice((0, 0, 0.001, 0.01)))
        finally:
            f.close()
        if restart_at is not None:
            agent = AgentProc(*args).start()

        def settled() -> bool:
            _, text = agent.get("/metrics")
            return all(_gauge(text, g) == 0 for g in ("requests_open", "export_queue_spans", "file_bytes_behind"))

        assert wait_for(settled, deadline(60), every=0.3), "the agent did not read and send everything"
        count = -1
        while count != len(rx.requests):  # nothing more comes in one more batch delay
            count = len(rx.requests)
            time.sleep(0.6)
        assert agent.term()[0] == 0
        agent_all = [s for _, s in rx.spans()]

    with GrpcReceiver() as rx2:
        d = os.path.dirname(log)
        out.files = sorted(os.listdir(d))
        buf = io.StringIO()
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
        code = main(["replay", d, "--otlp-endpoint", rx2.endpoint, "--otlp-protocol", "grpc"], env=env, out=buf)
        assert code == 0, buf.getvalue()
        out.replay_stdout = buf.getvalue()
        replay_all = [s for _, s in rx2.spans()]

    agent_spans = _distinct(agent_all, "agent")
    replay_spans = _distinct(replay_all, "replay")
    out.agent_spans, out.resent, out.replay_spans = len(agent_spans), len(agent_all) - len(agent_spans), len(replay_spans)
    return agent_spans, replay_spans, out


def _distinct(spans: list, who: str) -> list:
    """One copy of each span id; a span id sent twice with two contents fails here."""
    by_id: dict[bytes, object] = {}
    for s in spans:
        seen = by_id.setdefault(s.span_id, s)
        assert _span_key(seen) == _span_key(s), f"{who} sent span {s.span_id.hex()} twice, changed:\n" \
                                                f"{_describe(seen)}\n{_describe(s)}"
    return list(by_id.values())


def _gauge(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"vllm_trace_bridge_{name}") and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def assert_agent_equals_replay(tmp_path, lines: list[str], seed: int, **kw) -> Outcome:
    """The check: the agent's span set (through rotations and a kill -9) equals the replay's."""
    agent, replay, out = run_agent_and_replay(tmp_path, lines, seed, **kw)
    problem = diff_spans(agent, replay)
    assert not problem, (f"seed {seed}: agent ≠ replay (rotations before lines {out.rotations}, restarts before "
                         f"{out.restarts}, kill -9 at line {out.killed_at} of {out.lines}; files {out.files})\n{problem}")
    return out
