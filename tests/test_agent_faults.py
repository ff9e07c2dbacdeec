"""Fault injection against the real agent process (`python -m bridge run`), a real gRPC
receiver and a writer that knows the truth (bridge.synth, ~5 % reused ids, CRI-framed, kubelet
path): kill -9 at random points across create and copytruncate rotations, poison lines, quiet
restarts, corrupt and truncated checkpoints, a collector outage, an unwritable state dir.

Per request (each occurrence of an id) against the writer's truth: none lost, none split
into two traces, no span re-sent with different content; identical re-sends are counted.
The fast variant runs by default; the long one (2,500 requests) is `-m faults`.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import sys
import time

import pytest
from agentkit import AgentProc, Receiver, free_port, pod_log, start_writer, wait_for, wait_while_progressing
from agentkit import checkpointed_to_end, saved_checkpoint

from bridge.config import AgentConfig
from waits import deadline

POISON = {"VLLM_TRACE_BRIDGE_INJECT_FAULT": "decode:POISON-DECODE,parse:POISON-PARSE,assemble:poison_assemble.py"}


def audit(truth_path: str, spans) -> dict:
    """Figures per truth request: lost (no trace starts at its start), split (more traces than
    requests for an id, or a trace matching no request), changed (a span id received with two
    contents), identical re-sends (a span id received again, byte for byte)."""
    from receivers import attrs
    with open(truth_path) as f:
        truth = json.load(f)["requests"]
    content: dict[bytes, set[bytes]] = {}
    received = 0
    for s in spans:
        received += 1
        content.setdefault(s.span_id, set()).add(s.SerializeToString(deterministic=True))
    changed = sum(1 for v in content.values() if len(v) > 1)
    roots: dict[bytes, object] = {}
    for s in spans:
        if s.name == "vllm.request":
            roots.setdefault(s.trace_id, s)
    starts: dict[str, list[int]] = {}
    for s in roots.values():
        starts.setdefault(attrs(s.attributes)["vllm.request.id"], []).append(s.start_time_unix_nano)
    lost = split = 0
    lost_examples = []
    wanted: dict[str, list[int]] = {}
    for r in truth:
        wanted.setdefault(r["id"], []).append(r["start"])
    for rid, want in wanted.items():
        got = sorted(starts.get(rid, []))
        matched = [w for w in want if any(abs(g - w) <= 1_000_000 for g in got)]
        lost += len(want) - len(matched)
        if len(matched) < len(want):
            lost_examples.append(rid)
        split += max(0, len(got) - len(matched))
    split += sum(len(v) for k, v in starts.items() if k not in wanted)
    return {"requests": len(truth), "reused": len(truth) - len(wanted), "lost": lost, "split": split,
            "changed": changed, "spans_received": received, "distinct_spans": len(content),
            "identical_resends": received - len(content), "lost_examples": lost_examples[:5]}


def roots_received(rx: Receiver) -> int:
    return len({s.trace_id for s in rx.spans() if s.name == "vllm.request"})


def truth_count(path: str) -> int:
    with open(path) as f:
        return len(json.load(f)["requests"])


def damage(state: str, how: str) -> None:
    path = os.path.join(state, "checkpoints.json")
    if how == "corrupt":
        with open(path, "wb") as f:
            f.write(b'{"version": 1, "files": [{"path": \x00\xff garbage')
    elif how == "truncated":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    elif how == "unknown_version":
        with open(path) as f:
            doc = json.load(f)
        doc["version"] = 99
        with open(path, "w") as f:
            json.dump(doc, f)


def checkpoint_body(state: str) -> dict:
    with open(os.path.join(state, "checkpoints.json")) as f:
        doc = json.load(f)
    doc.pop("written_at", None)
    return doc


def drive(tmp_path, *, requests: int, rate: int, rotate_every: int, kills: int, seed: int,
          outage_s: float = 0.0, damages=("corrupt", "truncated"), quiet_restarts: int = 3) -> dict:
    """One run of the whole scenario; returns the audit's figures and what the run saw."""
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    state, include = str(tmp_path / "state"), str(tmp_path / "pods/*/*/*.log")
    port = free_port()
    rx = Receiver(port, str(tmp_path / "rx.bin")).start()
    rnd = random.Random(seed)
    extra = ("--shutdown-grace", "5")
    env = {**POISON, "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    figures: dict = {"kills": 0, "damaged_restarts": 0, "line_errors": 0}
    try:
        # The agent's first look comes before the writer's first line. Started after the
        # writer, a slow start (Python's imports on a loaded machine: seconds) finds files
        # already rotated, which a first start leaves unread by design (docs/agent.md): the
        # truth's requests in them were "lost" by the test, not by the agent.
        agent = AgentProc(include, state, rx.endpoint, *extra, env=env).start()
        assert wait_for(lambda: any(e.get("event") == "following_nothing" for e in agent.log_events()),
                        deadline(60)), "the agent's first look did not come"
        writer = start_writer(log, truth, requests=requests, rate=rate, rotate_every=rotate_every,
                              rotate="copytruncate,rename", seed=seed, reuse=0.05, poison_every=997)
        todo = list(damages)
        # kill -9 at random moments while the writer writes (and rotates)
        for _ in range(kills):
            time.sleep(rnd.uniform(0.8, 3.0))
            agent.kill9()
            figures["kills"] += 1
            _snap(state, figures["kills"], "killed")
            if todo and os.path.exists(os.path.join(state, "checkpoints.json")):
                damage(state, todo.pop(0))
                figures["damaged_restarts"] += 1
            agent = AgentProc(include, state, rx.endpoint, *extra, env=env).start()
        if outage_s:
            time.sleep(1.0)
            rx.stop()
            t0 = time.monotonic()
            # Ready all along (a rollout must not stall on the backend); the body names the outage.
            assert wait_for(lambda: "export failing" in agent.get("/readyz")[1], deadline(15)), "readyz did not show the outage"
            code, body = agent.get("/readyz")
            figures["readyz_during_outage"] = f"{code} {body.strip()}"
            assert code == 200
            assert agent.get("/healthz")[0] == 200
            time.sleep(max(0.0, outage_s - (time.monotonic() - t0)))
            figures["retried_during_outage"] = agent.metric("spans_retried")
            figures["queued_at_outage_end"] = agent.metric("export_queue_spans")
            figures["rss_mb_at_outage_end"] = round(agent.rss_mb())
            rx = Receiver(port, str(tmp_path / "rx.bin")).start()
            t_back = time.monotonic()
        assert writer.wait(deadline(240)) == 0
        n = truth_count(truth)
        assert wait_while_progressing(lambda: roots_received(rx) >= n, lambda: roots_received(rx)), \
            f"only {roots_received(rx)} of {n} arrived, none for {deadline(90):.0f} s"
        if outage_s:
            figures["catch_up_after_outage_s"] = round(time.monotonic() - t_back, 1)
            assert wait_for(lambda: agent.get("/readyz")[1] == "ready\n", deadline(30))
            figures["dropped"] = agent.metric("spans_dropped")
        time.sleep(deadline(2.5))  # an ack, a checkpoint; and any duplicate gets its chance to show
        figures["line_errors"] = agent.metric("line_errors")
        assert agent.get("/healthz")[0] == 200
        # Quiet restarts: nothing new written, nothing sent again, the same checkpoint saved.
        assert agent.term()[0] == 0
        before = len(rx.spans())
        body = checkpoint_body(state)
        assert body["files"], "the checkpoint names no file"
        for i in range(quiet_restarts):
            agent = AgentProc(include, state, rx.endpoint, *extra, env=env).start()
            time.sleep(2.0)
            if i % 2:
                agent.kill9()
            else:
                assert agent.term()[0] == 0
            assert checkpoint_body(state)["files"] == body["files"], "a quiet restart changed the checkpoint"
        time.sleep(deadline(0.5))
        figures["quiet_restart_resends"] = len(rx.spans()) - before
        figures.update(audit(truth, rx.spans()))
        return figures
    except BaseException:
        # What each agent process said, its last lines, with the failure (a stall under load
        # left nothing to go on): the processes' own logs, oldest first.
        _print_agent_logs(state)
        raise
    finally:
        rx.stop()


def _snap(state: str, n: int, what: str) -> None:
    """With FAULTS_SNAP=1: the checkpoints and the pod's files (inode, size) at the n-th kill,
    kept in the state dir (`snap-<n>-<what>`), so a loss can be traced to the restart that lost it."""
    if not os.environ.get("FAULTS_SNAP"):
        return
    d = os.path.join(state, f"snap-{n}-{what}")
    os.makedirs(d, exist_ok=True)
    for name in ("checkpoints.json", "checkpoints.json.prev"):
        if os.path.exists(os.path.join(state, name)):
            shutil.copy(os.path.join(state, name), d)
    pods = os.path.dirname(state) + "/pods"
    with open(os.path.join(d, "files.txt"), "w") as f:
        for p in sorted(glob.glob(pods + "/*/*/*")):
            st = os.stat(p)
            f.write(f"{p} {st.st_ino} {st.st_size}\n")


def _print_agent_logs(state: str, lines: int = 40) -> None:
    paths = sorted(glob.glob(os.path.join(state, "agent-*.err")), key=os.path.getmtime)
    for path in paths:
        with open(path, errors="replace") as f:
            tail = f.readlines()[-lines:]
        print(f"--- {os.path.basename(path)}: its last {len(tail)} lines ---", file=sys.stderr)
        sys.stderr.writelines(tail)


def _assert_exact(f: dict) -> None:
    assert f["lost"] == 0, f
    assert f["split"] == 0, f
    assert f["changed"] == 0, f
    assert f["quiet_restart_resends"] == 0, f


def test_faults_fast_kill9_rotations_poison_damaged_checkpoints_quiet_restarts(tmp_path, capsys):
    f = drive(tmp_path, requests=500, rate=1000, rotate_every=2500, kills=4, seed=11)
    with capsys.disabled():
        print(f"\nfaults (fast): {f}")
    _assert_exact(f)
    assert f["kills"] == 4 and f["damaged_restarts"] == 2


@pytest.mark.faults
def test_faults_long_2500_requests_two_rotations_kill9_and_a_30s_outage(tmp_path, capsys):
    """The issue's workload. Checkpoints are left whole here: a damaged one costs the re-send
    of what the previous good one had not recorded yet (a batch; see the fast variant)."""
    f = drive(tmp_path, requests=2500, rate=800, rotate_every=12000, kills=2, seed=17, outage_s=30.0, damages=())
    with capsys.disabled():
        print(f"\nfaults (long, 2,500 requests, 2 rotations, 2 kill -9, 30 s outage): {f}")
    _assert_exact(f)
    assert f["dropped"] == 0
    # What a kill -9 costs is re-sending, identically, at most the batch in flight when it
    # landed (acked, not yet checkpointed): the bound. The goal of <= 1 % of spans is
    # reported above, not asserted: it depends on where each kill lands (0-1.25 % measured).
    assert f["identical_resends"] <= f["kills"] * AgentConfig().max_batch_spans, f


@pytest.mark.faults
@pytest.mark.parametrize("seed", [23, 29, 31])
def test_faults_many_kill_points(tmp_path, capsys, seed):
    """Five kill -9 per run at random moments, over create and copytruncate rotations."""
    f = drive(tmp_path, requests=800, rate=3000, rotate_every=3000, kills=5, seed=seed,
              damages=("unknown_version",), quiet_restarts=1)
    with capsys.disabled():
        print(f"\nfaults (kill points, seed {seed}): {f}")
    _assert_exact(f)


def test_poison_lines_are_counted_by_stage_logged_once_without_content(tmp_path):
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint, env=POISON).start()
    try:
        writer = start_writer(log, truth, requests=150, rate=3000, seed=5, reuse=0.05, poison_every=101)
        assert writer.wait(deadline(60)) == 0
        poisons = int(writer.stdout.read().split(", ")[2].split()[0])
        assert poisons >= 9
        assert wait_for(lambda: roots_received(rx) >= truth_count(truth), deadline(30))
        per_stage = {k: -(-(poisons - i) // 3) for i, k in enumerate(("decode", "parse", "assemble"))}
        for stage, n in per_stage.items():
            assert agent.metric("line_errors", f'stage="{stage}"') == n, stage
        assert agent.get("/healthz")[0] == 200 and agent.get("/readyz")[0] == 200
        errors = [e for e in agent.log_events() if e.get("event") == "line_error"]
        assert sorted(e["stage"] for e in errors) == ["assemble", "decode", "parse"]  # once per file and kind
        assert all(e["file"] == log and isinstance(e["offset"], int) for e in errors)
        with open(log, "rb") as fh:
            data = fh.read()
        for e in errors:  # the offset is where the poison line starts
            assert data[e["offset"]:].split(b"\n", 1)[0].count(b"POISON") + data[e["offset"]:].split(
                b"\n", 1)[0].count(b"poison_assemble") == 1
        with open(agent.stderr_path) as fh:
            assert "user text" not in fh.read()
        time.sleep(deadline(1))
        f = audit(truth, rx.spans())
        assert (f["lost"], f["split"], f["changed"]) == (0, 0, 0), f
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_replay_skips_a_line_a_stage_raises_on_and_counts_it(tmp_path, monkeypatch):
    """In process: each stage raising on its own marked line costs that line only."""
    import bridge.pipeline as pipeline
    from bridge.synth import SynthConfig, generate, write

    cfg = SynthConfig(requests=40, seed=3, cri=True, model_load_failure=False, incomplete_tail=0)
    lines, truth = generate(cfg)
    path = tmp_path / "vllm.log"
    with open(path, "w") as f:
        write(lines, f, cfg)
    with open(path, "a") as f:
        for marker in ("DECODE-BOOM", "PARSE-BOOM", "ASSEMBLE-BOOM"):
            f.write(f"2025-02-15T11:00:00.000000000Z stdout F INFO 02-15 11:00:00 x.py:1] {marker} "
                    f"Running queue: 1 requests, waiting queue: 0 requests, free blocks: 5/512\n")

    class Decoder(pipeline.Decoder):
        def __call__(self, raw, offset):
            if b"DECODE-BOOM" in raw:
                raise ValueError("boom")
            return super().__call__(raw, offset)

    class Parser(pipeline.Parser):
        def __init__(self, **kw):
            super().__init__(**kw)
            inner = self.parse  # the C fast path when built, set per instance

            def parse(message, level, origin):
                if "PARSE-BOOM" in message:
                    raise KeyError("boom")
                return inner(message, level, origin)
            self.parse = parse

    class Assembler(pipeline.Assembler):
        def feed(self, record, event):
            if "ASSEMBLE-BOOM" in record.message:
                raise IndexError("boom")
            return super().feed(record, event)

    monkeypatch.setattr(pipeline, "Decoder", Decoder)
    monkeypatch.setattr(pipeline, "Parser", Parser)
    monkeypatch.setattr(pipeline, "Assembler", Assembler)
    got = []
    stats = pipeline.replay([str(path)], [got.append])
    assert stats.line_errors == {"decode": 1, "parse": 1, "assemble": 1}
    ids = sorted(t.request_id for t in got if hasattr(t, "request_id"))
    assert ids == sorted(r.request_id for r in truth.requests)


def test_unwritable_state_dir_is_one_clear_error_at_start(tmp_path):
    from test_agent import _without_dac_override
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(state, 0o555)
    agent = AgentProc(str(tmp_path / "*.log"), str(state), "http://127.0.0.1:1")
    if os.getuid() == 0:
        agent.preexec = _without_dac_override
    with pytest.raises(AssertionError) as e:
        agent.start()
    assert "state_dir" in str(e.value) and "not writable" in str(e.value) and "--state-dir" in str(e.value)
    assert "Traceback" not in str(e.value)


def test_a_collector_outage_leaves_the_agent_ready_and_names_the_outage(tmp_path):
    """A DaemonSet rollout waits for each new pod's readiness: were a backend outage to make
    the agents unready, no rollout could pass while the collector is down (when a fix to the
    agent may be what is rolling out). The agent queues, pauses reading and catches up, so it
    stays ready; /readyz's body and the logs name the outage. A save that fails (this node's
    disk) still makes it unready (the test below)."""
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    port = free_port()
    writer = start_writer(log, truth, requests=50, rate=3000, seed=3)
    assert writer.wait(deadline(60)) == 0
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), f"http://127.0.0.1:{port}",
                      "--start-at", "beginning",
                      env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}).start()
    try:
        assert wait_for(lambda: "export failing" in agent.get("/readyz")[1], deadline(60)), agent.get("/readyz")
        code, body = agent.get("/readyz")
        assert code == 200 and body.startswith("ready; export failing: http://127.0.0.1:") and "(retrying)" in body
        assert agent.get("/healthz")[0] == 200
        rx = Receiver(port, str(tmp_path / "rx.bin")).start()
        try:
            assert wait_for(lambda: agent.get("/readyz") == (200, "ready\n"), deadline(60)), agent.get("/readyz")
            assert wait_for(lambda: roots_received(rx) >= truth_count(truth), deadline(60))
            assert agent.term()[0] == 0
        finally:
            rx.stop()
    finally:
        if agent.proc.poll() is None:
            agent.kill9()


def test_failed_checkpoint_saves_are_retried_and_shown_in_readyz(tmp_path):
    from test_agent import _without_dac_override
    os.chmod(tmp_path, 0o755)
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    for d in (tmp_path / "pods", os.path.dirname(os.path.dirname(log)), os.path.dirname(log)):
        os.chmod(d, 0o777)
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(state), rx.endpoint)
    if os.getuid() == 0:
        agent.preexec = _without_dac_override
    agent.start()
    try:
        os.chmod(state, 0o555)
        writer = start_writer(log, truth, requests=100, rate=3000, seed=8, reuse=0.05)
        assert writer.wait(deadline(60)) == 0
        os.chmod(log, 0o644)
        assert wait_for(lambda: agent.metric("checkpoint_failures") >= 2, deadline(20))  # retried
        code, body = agent.get("/readyz")
        assert code == 503 and "checkpoint not saved" in body
        assert sum(e.get("event") == "checkpoint_failed" for e in agent.log_events()) == 1
        os.chmod(state, 0o777)
        assert wait_for(lambda: agent.get("/readyz")[0] == 200, deadline(10))
        assert any(e.get("event") == "checkpoint_recovered" for e in agent.log_events())
        assert checkpoint_body(str(state))["files"]
        assert agent.term()[0] == 0
    finally:
        os.chmod(state, 0o777)
        rx.stop()


@pytest.mark.parametrize("rotate", ["rename", "gzip"])
def test_a_kill_right_after_the_first_look_leaves_a_checkpoint_and_rotations_after_it_are_read(tmp_path, rotate):
    """A kill -9 after the agent's first look but before a line is read: the restart resumes
    (not a first run), so a file rotated away while it was down is read, not left as history.
    The first checkpoint is saved before the look is reported, so the kill below, at the
    report, always comes after it (before, the first save came a second later).
    `gzip`: the rotated files are gzipped too (kubelet's). The checkpoint names no file (there
    was none), so only its directory listing says the file and all rotated from it are new
    (without it, a gzipped file of a name never seen was taken for history: CI, seed 2000)."""
    log, truth = pod_log(tmp_path), str(tmp_path / "truth.json")
    state, include = str(tmp_path / "state"), str(tmp_path / "pods/*/*/*.log")
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    try:
        agent = AgentProc(include, state, rx.endpoint).start()
        assert wait_for(lambda: any(e.get("event") == "following_nothing" for e in agent.log_events()),
                        deadline(30), every=0.01)
        agent.kill9()
        assert os.path.exists(os.path.join(state, "checkpoints.json")), "no checkpoint after the first look"
        # While it is down: a file written, rotated (rename), and the next one written.
        writer = start_writer(log, truth, requests=60, rate=100000, rotate_every=300, rotate=rotate, seed=7)
        assert writer.wait(deadline(60)) == 0
        assert glob.glob(log + (".*.gz" if rotate == "gzip" else ".*")), "the writer did not rotate"
        agent = AgentProc(include, state, rx.endpoint).start()
        n = truth_count(truth)
        assert wait_while_progressing(lambda: roots_received(rx) >= n, lambda: roots_received(rx)), \
            f"only {roots_received(rx)} of {n} arrived"
        f = audit(truth, rx.spans())
        assert f["lost"] == 0 and f["split"] == 0 and f["changed"] == 0, f
        assert agent.term()[0] == 0
    finally:
        rx.stop()


def test_a_checkpoint_lists_files_oldest_first_whatever_order_they_were_opened_or_retired_in(tmp_path):
    """A rotated file read to its end and closed (kept while a request from it is pending) was
    listed after the live file; a quiet restart opens it first and listed it first: the same
    checkpoint, in another order ("a quiet restart changed the checkpoint", under load)."""
    from bridge.core.source import Source
    from bridge.resume import Checkpointer
    from bridge.sources import Pending, SourceState
    from bridge.tail.follow import Filters, Follower
    from bridge.tail.source import source_for
    log = pod_log(tmp_path)
    for path in (log + ".1", log):
        with open(path, "w") as f:
            f.writelines(f"2025-02-15T10:23:0{i}.000000000Z stdout F line {i} of {path[-5:]}\n" for i in range(9))
    key = source_for(log).key
    rotated, live = _checkpoints(key, [(log + ".1", 0, 0), (log, 1, 0)])
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)))
    follower.restore([live], {key: 2})
    follower.discover()
    assert [tf.path for tf in follower.files] == [log]
    st = SourceState(Source(key, log), retired=[rotated], pending={1: Pending(5, "r", 9)})
    state = tmp_path / "state"
    state.mkdir()
    assert Checkpointer(str(state), log=None).save(follower, {key: st}, (), lambda k: st)
    saved = saved_checkpoint(str(state))["files"]
    assert [(f["path"], f["generation"]) for f in saved] == [(log + ".1", 0), (log, 1)]


def test_the_first_checkpoint_is_also_the_previous_one(tmp_path):
    """Damaged before a second save, the first checkpoint still leaves a good one to resume
    from (not a first run, which leaves rotated files unread)."""
    from bridge.tail.checkpoint import CheckpointStore, FileCheckpoint, SourceCheckpoint
    store = CheckpointStore(str(tmp_path))
    first = [FileCheckpoint("/a.log", "s", 0, 1, "ab", 2, 100)]
    store.save(first, [SourceCheckpoint("s", 1)])
    damage(str(tmp_path), "unknown_version")
    loaded = CheckpointStore(str(tmp_path)).load()
    assert loaded.used == "previous" and loaded.files == first


@pytest.mark.parametrize("how", ["corrupt", "truncated", "unknown_version", "wrong_shape"])
def test_damaged_checkpoint_falls_back_to_the_previous_good_one(tmp_path, how):
    from bridge.tail.checkpoint import CheckpointStore, FileCheckpoint, SourceCheckpoint
    store = CheckpointStore(str(tmp_path))
    first = [FileCheckpoint("/a.log", "s", 0, 1, "ab", 2, 100)]
    second = [FileCheckpoint("/a.log", "s", 0, 1, "ab", 2, 200)]
    store.save(first, [SourceCheckpoint("s", 1)])
    store.save(second, [SourceCheckpoint("s", 1)])
    assert store.load().files == second
    if how == "wrong_shape":
        with open(store.path, "w") as f:
            json.dump({"version": 1, "files": [{"path": 3}], "sources": []}, f)
    else:
        damage(str(tmp_path), how)
    loaded = CheckpointStore(str(tmp_path)).load()
    assert loaded.used == "previous" and loaded.files == first
    assert loaded.damaged and loaded.damaged[0].startswith(store.path)
    os.unlink(store.prev_path)
    loaded = CheckpointStore(str(tmp_path)).load()
    assert loaded.used == "none" and loaded.files is None and loaded.damaged


def test_damaged_checkpoints_at_start_are_one_log_line_and_the_agent_runs(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "checkpoints.json").write_bytes(b"\x00not json")
    (state / "checkpoints.json.prev").write_text('{"version": 7}')
    agent = AgentProc(str(tmp_path / "*.log"), str(state), "http://127.0.0.1:1", "--start-at", "end").start()
    try:
        events = [e for e in agent.log_events() if e.get("event") == "checkpoint_damaged"]
        assert len(events) == 1
        assert events[0]["file"] == str(state / "checkpoints.json")
        assert "start_at=end" in events[0]["action"] and len(events[0]["problems"]) == 2
        assert agent.metric("checkpoint_recoveries", 'used="none"') == 1
        assert agent.get("/healthz")[0] == 200
        assert agent.term()[0] == 0
    finally:
        pass


def _checkpoints(key: str, files) -> list:
    """A checkpoint of each (path, generation, offset), as the agent writes them."""
    from bridge.tail.checkpoint import FileCheckpoint
    from bridge.tail.follow import fingerprint, read_head
    out = []
    for path, gen, offset in files:
        head = read_head(path)
        out.append(FileCheckpoint(path, key, gen, os.stat(path).st_ino, fingerprint(head), len(head), offset))
    return out


def _resume_and_read(tmp_path, cks, key: str, tag_len: int) -> tuple[list, object]:
    """A follower restored from `cks`, polled until quiet: (generation, line tag) in read order."""
    from bridge.core.position import GEN_SHIFT
    from bridge.tail.follow import Filters, Follower
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)), read_chunk=16 << 10)
    follower.restore(cks, {key: 2})
    follower.discover()
    got = []
    for _ in range(200):
        for tf, lines in follower.poll():
            got.extend((pos >> GEN_SHIFT, raw[:tag_len]) for pos, raw in lines)
    follower.close()
    return got, follower


def test_resume_reads_a_rotated_file_to_its_end_before_the_newer_one(tmp_path):
    """A checkpoint naming a rotated file (`0.log.1`, which discovery never lists) is read
    from where it was, and wholly before the file that replaced it: the lines reach assemble
    in the order they were written (interleaved, a request open across the rotation got
    gauge events from after its end)."""
    live = pod_log(tmp_path)
    old = live + ".1"
    with open(old, "w") as f:
        f.writelines(f"old {i:05d} " + "x" * 80 + "\n" for i in range(2000))
    with open(live, "w") as f:
        f.writelines(f"new {i:05d} " + "y" * 80 + "\n" for i in range(2000))
    key = "k8s/llm/vllm-0/3f2a9c1e-1111-2222-3333-444455556666/vllm"
    cks = _checkpoints(key, ((old, 0, 91 * 5), (live, 1, 0)))  # from the 6th line (91 bytes each)
    got, follower = _resume_and_read(tmp_path, cks, key, 3)
    assert follower.stats.errors.get("lost", 0) == 0
    assert [g for g, _ in got] == sorted(g for g, _ in got)  # never a newer generation first
    assert got[0][0] == 0 and sum(1 for _, k in got if k == b"old") == 1995
    assert sum(1 for _, k in got if k == b"new") == 2000


def test_a_checkpoint_is_written_as_its_dataclasses_are_and_read_back_whole(tmp_path):
    """The save writes each record field by field (asdict's deep copy was the agent's main own
    cost): the file must still hold exactly what `dataclasses.asdict` would, and load it back."""
    from dataclasses import asdict

    from bridge.tail.checkpoint import CheckpointStore, Delivered, FileCheckpoint, SourceCheckpoint
    store = CheckpointStore(str(tmp_path))
    files = [FileCheckpoint("/a.log", "s", 2, 11, "ab", 2, 100), FileCheckpoint("/b.log", "t", 0, 12, "cd", 2, 7)]
    sources = [SourceCheckpoint("s", 3, [Delivered("cmpl-1", 120), Delivered("engine@40", 40)]), SourceCheckpoint("t", 1)]
    store.save(files, sources)
    with open(store.path) as f:
        doc = json.load(f)
    assert doc["files"] == [asdict(x) for x in files] and doc["sources"] == [asdict(x) for x in sources]
    loaded = CheckpointStore(str(tmp_path)).load()
    assert loaded.files == files and loaded.sources == sources


@pytest.mark.parametrize("key", ["cmpl-é-\u2603", 'a"b\\c', "ctl\x00\x1f\x7f", "lone\udcff", "\U0001f600", ""])
def test_a_checkpoint_is_byte_for_byte_what_json_dumps_writes(tmp_path, key):
    """The save writes its JSON text by hand (no dict per delivered entry); the standard
    library's encoder, on the same records, is the truth, for any request id a log can hold."""
    from dataclasses import asdict

    from bridge.tail.checkpoint import CheckpointStore, Delivered, FileCheckpoint, SourceCheckpoint
    store = CheckpointStore(str(tmp_path))
    files = [FileCheckpoint(f"/p/{key}.log", key, 1, 5, "ff", 1, 9)]
    sources = [SourceCheckpoint(key, 2, [Delivered(key, 3), Delivered("x", 1 << 40)]), SourceCheckpoint("k", 0)]
    store.save(files, sources)
    with open(store.path, encoding="utf-8") as f:
        text = f.read()
    doc = json.loads(text)
    expected = {"version": 1, "written_at": doc["written_at"], "files": [asdict(x) for x in files],
                "sources": [asdict(x) for x in sources]}
    assert text == json.dumps(expected, separators=(",", ":"))
    loaded = CheckpointStore(str(tmp_path)).load()
    assert loaded.files == files and loaded.sources == sources


def test_a_checkpoint_saved_again_and_again_is_what_json_dumps_writes_each_time(tmp_path):
    """The delivered entries' text is kept between saves and extended: every way the list can
    change between two saves still writes what the standard library's encoder writes."""
    from dataclasses import asdict

    from bridge.tail.checkpoint import CheckpointStore, Delivered, FileCheckpoint, SourceCheckpoint
    store = CheckpointStore(str(tmp_path))
    files = [FileCheckpoint("/a.log", "s", 0, 1, "ab", 2, 0)]
    entries = [Delivered("a", 1)]
    other = [Delivered("o", 1)]

    def check(sources):
        store.save(files, sources)
        with open(store.path) as f:
            text = f.read()
        expected = {"version": 1, "written_at": json.loads(text)["written_at"], "files": [asdict(x) for x in files],
                    "sources": [asdict(x) for x in sources]}
        assert text == json.dumps(expected, separators=(",", ":"))

    check([SourceCheckpoint("s", 0, entries)])
    entries += [Delivered("b", 2), Delivered("c", 3)]  # appended
    check([SourceCheckpoint("s", 0, entries), SourceCheckpoint("t", 1, other)])
    entries[-1] = Delivered("c2", 4)  # the last one replaced
    check([SourceCheckpoint("s", 0, entries), SourceCheckpoint("t", 1, other)])
    entries = [Delivered("c2", 4), Delivered("d", 5)]  # pruned: a new list
    check([SourceCheckpoint("s", 0, entries), SourceCheckpoint("t", 1, other)])
    entries.clear()  # emptied in place
    check([SourceCheckpoint("s", 0, entries)])
    entries.append(Delivered("e", 6))
    check([SourceCheckpoint("t", 1, other), SourceCheckpoint("s", 0, entries)])


def test_delivered_entries_are_pruned_when_the_safe_position_moves_and_only_then(tmp_path):
    """An unfinished request holds the safe position still: every request acked after it stays
    listed (a restart skips their lines). Once it is delivered, the next save drops them all."""
    from bridge.resume import Checkpointer
    from bridge.sources import Pending, SourceState
    from bridge.tail.checkpoint import Delivered
    from bridge.tail.follow import Filters, Follower

    log = tmp_path / "a.log"
    log.write_bytes(b"x\n" * 1000)
    follower = Follower(Filters((str(log),)))
    follower.discover(first_round=True)
    for _ in follower.poll():
        pass
    (tf,) = follower.files
    st = SourceState(tf.source)
    sources = {tf.source.key: st}
    st.pending[0] = Pending(10, "stuck", 12)  # emitted, never acked: holds the floor at 10
    ckpt = Checkpointer(str(tmp_path / "state"), None)
    os.makedirs(ckpt.store.state_dir)

    def saved() -> list:
        assert ckpt.save(follower, sources, (), lambda key: st)
        with open(ckpt.store.path) as f:
            doc = json.load(f)
        (src,) = doc["sources"]
        return [(d["key"], d["last_offset"]) for d in src["delivered"]], doc["files"][0]["offset"]

    st.delivered.append(Delivered("early", 5))  # before the floor: pruned at the first save
    assert saved() == ([], 10)
    for i in range(3):
        st.delivered.append(Delivered(f"r{i}", 100 + i))
        assert saved() == ([(f"r{j}", 100 + j) for j in range(i + 1)], 10)
    del st.pending[0]
    st.delivered.append(Delivered("stuck", 12))
    assert saved() == ([], 2000)  # nothing open: the whole file is safe, nothing left to skip


def test_resume_finds_a_rotated_file_whose_number_shifted_while_the_agent_was_down(tmp_path):
    """Found under load (seed 31 of the kill-points run with both cores busy): the agent is
    killed while it reads `0.log.1`; the next rotation renames `0.log.1` to `0.log.2` and
    `0.log` to `0.log.1`. The checkpoint's `0.log.1` now holds the newer content: the file it
    named is found by its fingerprint under its new name, read from where it was, and nothing
    of it is lost."""
    live = pod_log(tmp_path)
    gen0, gen1 = live + ".1", live
    with open(gen0, "w") as f:
        f.writelines(f"g0 {i:05d} " + "x" * 80 + "\n" for i in range(1000))
    with open(gen1, "w") as f:
        f.writelines(f"g1 {i:05d} " + "y" * 80 + "\n" for i in range(1000))
    key = "k8s/llm/vllm-0/3f2a9c1e-1111-2222-3333-444455556666/vllm"
    cks = _checkpoints(key, ((gen0, 0, 90 * 7), (gen1, 1, 90 * 3)))
    # the agent is down; a numbered rotation shifts every file on, and a new live file starts
    os.rename(gen0, live + ".2")
    os.rename(gen1, live + ".1")
    with open(live, "w") as f:
        f.writelines(f"g2 {i:05d} " + "z" * 80 + "\n" for i in range(10))
    got, follower = _resume_and_read(tmp_path, cks, key, 2)
    assert follower.stats.errors.get("lost", 0) == 0
    assert [sum(1 for _, k in got if k == tag) for tag in (b"g0", b"g1", b"g2")] == [993, 997, 10]
    assert [g for g, _ in got] == sorted(g for g, _ in got)


def test_engine_facts_are_saved_with_the_checkpoint_and_read_back(tmp_path):
    """The banner's model and version in force at each source's saved position go into the
    checkpoint (a resume past the banner needs them); the file is still what json.dumps writes,
    and a checkpoint without them (older agents) reads as none."""
    from dataclasses import asdict

    from bridge.tail.checkpoint import CheckpointStore, Delivered, FileCheckpoint, SourceCheckpoint
    store = CheckpointStore(str(tmp_path))
    files = [FileCheckpoint("/a.log", "s", 0, 1, "ab", 2, 7)]
    sources = [SourceCheckpoint("s", 1, [Delivered("cmpl-1", 9)])]
    facts = {"s": {"gen_ai.request.model": "tiny \u2603", "vllm.version": "0.32.0"}}
    store.save(files, sources, facts)
    with open(store.path, encoding="utf-8") as f:
        text = f.read()
    expected = {"version": 1, "written_at": json.loads(text)["written_at"], "files": [asdict(x) for x in files],
                "sources": [asdict(x) for x in sources], "engine_facts": facts}
    assert text == json.dumps(expected, separators=(",", ":"))
    loaded = CheckpointStore(str(tmp_path)).load()
    assert (loaded.files, loaded.sources, loaded.facts) == (files, sources, facts)
    store.save(files, sources)
    assert CheckpointStore(str(tmp_path)).load().facts == {}


def test_a_second_agent_on_the_same_state_dir_is_refused_and_a_kill_9_frees_it(tmp_path):
    """Two agents on one state directory would both export every line and write over each
    other's checkpoints (found by a review: 300 requests became 600 roots). The second one
    stops at start naming the setting and the holder; the first one's kill -9 frees the lock."""
    import subprocess
    import sys

    state = str(tmp_path / "state")
    first = AgentProc(str(tmp_path / "*.log"), state, "http://127.0.0.1:1").start()
    try:
        second = subprocess.run([sys.executable, "-m", "bridge", "run", "--include", str(tmp_path / "*.log"),
                                 "--state-dir", state, "--otlp-endpoint", "http://127.0.0.1:1",
                                 "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=deadline(60))
        assert second.returncode != 0
        assert f"state_dir {state}: in use by another agent (pid {first.proc.pid})" in second.stderr
        assert "--state-dir" in second.stderr
        first.kill9()
        again = AgentProc(str(tmp_path / "*.log"), state, "http://127.0.0.1:1").start()
        assert again.term()[0] == 0
    finally:
        if first.proc.poll() is None:
            first.kill9()


def test_a_lock_file_that_cannot_be_taken_is_one_clear_error_at_start(tmp_path):
    """A directory where the lock file goes (or one another user owns): a one-line usage error
    naming the file, not a traceback (found by a review)."""
    import subprocess
    import sys

    (tmp_path / "state" / "lock").mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "bridge", "run", "--include", str(tmp_path / "*.log"),
                        "--state-dir", str(tmp_path / "state"), "--otlp-endpoint", "http://127.0.0.1:1",
                        "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=deadline(60))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"cannot take its lock file {tmp_path / 'state' / 'lock'}" in r.stderr and "--state-dir" in r.stderr


def _seed_requests(base: int, n: int) -> tuple[list[str], list[str]]:
    lines, ids = [], []
    for i in range(n):
        rid = f"0x{base + i:x}"
        ids.append(rid)
        lines += [f"INFO 02-15 10:00:01 scheduler.py:234] Scheduling request {rid}: priority=0, "
                  "num_scheduled_blocks=6, remaining_blocks=4\n",
                  f"INFO 02-15 10:00:02 api_server.py:120] Request {rid}: prompt_tokens=128, generated_tokens=64, "
                  "ttft=300.0ms, itl=20.0ms, total_latency=1.0s\n"]
    return lines, ids


@pytest.mark.parametrize("kinds", [("rename", "rename"), ("copytruncate", "copytruncate"), ("copytruncate", "rename")])
def test_two_rotations_while_the_agent_is_down_lose_nothing(tmp_path, kinds):
    """The agent stopped; the file rotated twice (kubelet's rename, or logrotate's copytruncate)
    before it came back. The checkpointed file is found among the rotated ones by its
    fingerprint, and the one rotated after it must be read too, before the file there now
    (it was not: its requests were lost). Truth: the requests this test wrote."""
    from receivers import attrs

    log = pod_log(tmp_path)
    first, want = _seed_requests(0x1000, 10)
    with open(log, "w") as f:
        f.writelines(first)
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    args = (str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint, "--start-at", "beginning",
            "--linger", "0")

    def roots() -> set:
        return {attrs(s.attributes)["vllm.request.id"] for s in rx.spans() if s.name == "vllm.request"}

    try:
        agent = AgentProc(*args).start()
        assert wait_for(lambda: roots() >= set(want), deadline(30))
        wait_for(lambda: checkpointed_to_end(args[1], log), deadline(15))  # its ack and checkpoint
        assert agent.term()[0] == 0
        for n, kind in enumerate(kinds, 1):  # while it is down
            lines, ids = _seed_requests(0x2000 + 0x100 * n, 10)
            want += ids
            with open(log, "a") as f:
                f.writelines(lines)
            if kind == "rename":
                os.rename(log, f"{log}.{n}")
            else:
                shutil.copyfile(log, f"{log}.{n}")
                with open(log, "r+") as f:
                    f.truncate(0)
        lines, ids = _seed_requests(0x3000, 10)
        want += ids
        with open(log, "a") as f:
            f.writelines(lines)
        agent = AgentProc(*args).start()
        wait_for(lambda: roots() >= set(want), deadline(30))
        assert agent.term()[0] == 0
    finally:
        rx.stop()
    assert sorted(set(want) - roots()) == []


@pytest.mark.parametrize("while_down", [True, False])
def test_a_file_read_before_a_restart_and_gzipped_later_is_not_sent_again(tmp_path, while_down):
    """kubelet gzips the file it rotated before at its next rotation: a new `.gz` file with a
    new mtime, holding lines the agent read (and acked) before it stopped. Reading it again
    after the restart, at the next rotation while down or while running, would send its
    requests under new ids, a second trace each (found by a review of the catch-up above; the
    running case since a7972f6). Truth: the requests this test wrote, each sent once."""
    import gzip

    from receivers import attrs

    log = pod_log(tmp_path)
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    args = (str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint, "--start-at", "beginning",
            "--linger", "0")

    def roots() -> list:
        return [(attrs(s.attributes)["vllm.request.id"], s.trace_id) for s in rx.spans() if s.name == "vllm.request"]

    want: list[str] = []

    def write(base: int) -> None:
        lines, ids = _seed_requests(base, 10)
        want.extend(ids)
        with open(log, "a") as f:
            f.writelines(lines)

    try:
        write(0x1000)
        agent = AgentProc(*args).start()
        assert wait_for(lambda: {r for r, _ in roots()} >= set(want), deadline(30))
        os.rename(log, log + ".20260215-100000")  # kubelet's rotation, the agent running
        write(0x2000)
        assert wait_for(lambda: {r for r, _ in roots()} >= set(want), deadline(30))
        # the rotated file read to its end and closed, the checkpoint saved
        wait_for(lambda: checkpointed_to_end(args[1], log, only=True), deadline(20))
        assert agent.term()[0] == 0
        if not while_down:
            agent = AgentProc(*args).start()  # a plain restart, nothing rotated
            time.sleep(2.5)
        time.sleep(1.1)
        write(0x3000)
        os.rename(log, log + ".20260215-110000")  # the next rotation
        old = log + ".20260215-100000"
        with open(old, "rb") as src, gzip.open(old + ".gz.tmp", "wb") as dst:  # kubelet's compressLog
            shutil.copyfileobj(src, dst)
        os.rename(old + ".gz.tmp", old + ".gz")
        os.remove(old)
        write(0x4000)
        if while_down:
            agent = AgentProc(*args).start()
        wait_for(lambda: {r for r, _ in roots()} >= set(want), deadline(30))
        time.sleep(deadline(3))
        assert agent.term()[0] == 0
    finally:
        rx.stop()
    traces: dict[str, set] = {}
    for rid, tid in roots():
        traces.setdefault(rid, set()).add(tid)
    assert sorted(set(want) - set(traces)) == []
    assert {rid: len(t) for rid, t in traces.items() if len(t) > 1} == {}


def _kubelet_rotate(log: str, stamp: str) -> None:
    """kubelet's rotation: `0.log` → `0.log.<stamp>`, and the file it rotated before gzipped
    (`compressLog`: a `.gz.tmp` renamed to `.gz`, the plain one removed)."""
    import gzip

    plain = [p for p in os.listdir(os.path.dirname(log))
             if p.startswith("0.log.") and not p.endswith((".gz", ".tmp"))]
    os.rename(log, f"{log}.{stamp}")
    for name in plain:
        old = os.path.join(os.path.dirname(log), name)
        with open(old, "rb") as src, gzip.open(old + ".gz.tmp", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.rename(old + ".gz.tmp", old + ".gz")
        os.remove(old)


class _Roots:
    """The requests a receiver got, and the trace ids each came in."""

    def __init__(self, rx) -> None:
        self.rx = rx

    def traces(self) -> dict[str, set]:
        from receivers import attrs

        out: dict[str, set] = {}
        for s in self.rx.spans():
            if s.name == "vllm.request":
                out.setdefault(attrs(s.attributes)["vllm.request.id"], set()).add(s.trace_id)
        return out

    def have(self, want) -> bool:
        return set(self.traces()) >= set(want)


@pytest.mark.parametrize("clock", ["as_is", "stepped_back"])
def test_files_rotated_and_gzipped_while_the_agent_is_down_are_read_once(tmp_path, clock):
    """Three kubelet rotations while the agent is down: the checkpointed file and the next one
    are gzipped by the time it is back. Every request must arrive, once: the middle file was
    lost when it was gzipped (no catch-up read a `.gz`: an old one is a file read long ago), and
    with the clock stepped back across the downtime (the rotated files older than the
    checkpoint by mtime) every file rotated while down was lost. The checkpoint now keeps the
    heads of the files known at each path. Truth: the requests this test wrote."""
    p = _Pods(tmp_path)
    log = pod_log(tmp_path)
    try:
        p.write(log, 0x1000)
        p.run(1.5)
        for n, stamp in enumerate(("20260215-100000", "20260215-110000", "20260215-120000")):
            p.write(log, 0x2000 + 0x100 * n)
            _kubelet_rotate(log, stamp)
        p.write(log, 0x3000)
        if clock == "stepped_back":
            d = os.path.dirname(log)
            for name in os.listdir(d):
                os.utime(os.path.join(d, name), (time.time() - 86400, time.time() - 86400))
        assert sorted(os.listdir(os.path.dirname(log))) == [
            "0.log", "0.log.20260215-100000.gz", "0.log.20260215-110000.gz", "0.log.20260215-120000"]
        p.run()
    finally:
        p.check()


def test_files_rotated_before_the_agent_first_started_are_never_read(tmp_path):
    """A rotated file already there when the agent first starts is history it was not asked
    to read (its start reads the file at the path). kubelet gzips it at the next rotation, a
    new file by mtime: it must still not be read, not then and not after a restart."""
    p = _Pods(tmp_path)
    log = pod_log(tmp_path)
    old, _ = _seed_requests(0x9000, 10)
    with open(log + ".20260215-090000", "w") as f:
        f.writelines(old)
    try:
        p.write(log, 0x1000)
        p.agent = AgentProc(*p.args).start()
        assert wait_for(lambda: p.roots.have(p.want), deadline(30))
        time.sleep(1.1)
        p.write(log, 0x2000)
        _kubelet_rotate(log, "20260215-100000")  # the old file gzipped, the agent running
        p.write(log, 0x3000)
        assert wait_for(lambda: p.roots.have(p.want), deadline(30))
        time.sleep(deadline(1.5))
        assert p.agent.term()[0] == 0
        p.write(log, 0x4000)
        _kubelet_rotate(log, "20260215-110000")  # and again while it is down
        p.write(log, 0x5000)
        p.run()
    finally:
        p.check()  # none of the old file's 0x9000…: only what the test wants


@pytest.mark.parametrize("kind", ["rename", "copytruncate"])
def test_logrotate_dateext_names_are_siblings(tmp_path, kind):
    """logrotate's `dateext` names the rotated file `0.log-20260215`, not `0.log.<n>`. A copy
    made by copytruncate under that name holds the lines not read yet when the file was
    truncated, and a file renamed so while the agent is down holds lines not read at all:
    both were missed (only `0.log.*` was looked at). Truth: the requests this test wrote."""
    p = _Pods(tmp_path)
    log = pod_log(tmp_path)

    def rotate(suffix: str) -> None:
        if kind == "rename":
            os.rename(log, log + suffix)
        else:
            shutil.copyfile(log, log + suffix)
            with open(log, "r+") as f:
                f.truncate(0)

    try:
        p.write(log, 0x1000)
        p.run(1.5)
        p.write(log, 0x2000)
        rotate("-20260215")
        p.write(log, 0x3000)
        rotate("-20260216")
        p.write(log, 0x4000)
        p.run()
    finally:
        p.check()


def test_known_heads_round_trip_and_a_bad_entry_is_left_out(tmp_path):
    """The checkpoint keeps the follower's known heads per path; an older agent's checkpoint
    has none, and an entry of another shape is dropped alone (that path falls back to what a
    checkpoint without heads gets), the rest of the checkpoint trusted."""
    from bridge.tail.checkpoint import CheckpointStore, FileCheckpoint, SourceCheckpoint

    store = CheckpointStore(str(tmp_path))
    files = [FileCheckpoint("/a/0.log", "s", 0, 1, "ab", 2, 7)]
    heads = {"/a/0.log": (True, [(256, "f00d"), (100, "beef")]), "/b/0.log": (False, [(256, "cafe")])}
    store.save(files, [SourceCheckpoint("s", 1)], None, heads)
    assert CheckpointStore(str(tmp_path)).load().heads == heads
    with open(store.path) as f:
        doc = json.load(f)
    doc["known_heads"]["/b/0.log"] = {"complete": True, "heads": [["256", "cafe"]]}
    with open(store.path, "w") as f:
        json.dump(doc, f)
    loaded = CheckpointStore(str(tmp_path)).load()
    assert loaded.used == "current" and loaded.files == files
    assert loaded.heads == {"/a/0.log": heads["/a/0.log"]}
    store.save(files, [SourceCheckpoint("s", 1)])
    assert CheckpointStore(str(tmp_path)).load().heads == {}


class _Pods:
    """Pods' logs written by a test, an agent started and stopped over them, and what arrived."""

    def __init__(self, tmp_path, include: str | None = None) -> None:
        self.tmp = tmp_path
        self.rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
        self.roots = _Roots(self.rx)
        self.want: list[str] = []
        self.args = (include or str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), self.rx.endpoint,
                     "--start-at", "beginning", "--linger", "0")
        self.agent = None

    def write(self, log: str, base: int, n: int = 10) -> None:
        lines, ids = _seed_requests(base, n)
        self.want.extend(ids)
        with open(log, "a") as f:
            f.writelines(lines)

    def run(self, settle: float = 2.0) -> None:
        """Start the agent, wait for what was written, stop it (it must stop cleanly)."""
        self.agent = AgentProc(*self.args).start()
        wait_for(lambda: self.roots.have(self.want), deadline(30))
        time.sleep(deadline(settle))  # its ack and checkpoint; a second copy would show by now
        assert self.agent.proc.poll() is None, "the agent died"
        assert self.agent.term()[0] == 0

    def rotated_while_down(self, first: str, log: str, base: int) -> None:
        """A run over `first`; with the agent down, `log` written (`base`…), rotated as kubelet
        does and written on (`base + 0x1000`…); a run again."""
        self.write(first, 0x1000)
        self.run()
        self.write(log, base)
        _kubelet_rotate(log, "20260215-100000")
        self.write(log, base + 0x1000)
        self.run()

    def check(self) -> None:
        self.rx.stop()
        traces = self.roots.traces()
        assert sorted(set(self.want) - set(traces)) == []
        assert {rid: len(t) for rid, t in traces.items() if len(t) > 1} == {}
        assert set(traces) <= set(self.want)


@pytest.mark.parametrize("gzip_state", ["half_written", "written_plain_not_removed"])
def test_logrotate_compress_in_progress_at_a_restart(tmp_path, gzip_state):
    """logrotate with `compress` (no `delaycompress`) while the agent is down: it comes back
    while gzip writes `0.log.1.gz` from `0.log.1`, or after gzip wrote it and before it removed
    `0.log.1`. One file under two names: read once, from the plain one; a cut gzip file never
    stops the agent (a review: the half-written one raised EOFError out of the agent, which
    then died at every start; the whole one was read twice, two traces per request)."""
    import gzip

    p = _Pods(tmp_path)
    log = pod_log(tmp_path)
    try:
        p.write(log, 0x1000)
        p.run()
        p.write(log, 0x2000)
        os.rename(log, log + ".1")
        p.write(log, 0x3000, n=300)
        os.rename(log + ".1", log + ".2")
        os.rename(log, log + ".1")
        with open(log + ".1", "rb") as f:
            raw = gzip.compress(f.read())
        with open(log + ".1.gz", "wb") as f:
            f.write(raw if gzip_state == "written_plain_not_removed" else raw[:len(raw) // 2])
        p.write(log, 0x4000)
        p.run(3.0)
        p.run(1.0)  # and again: nothing is sent twice, nothing stops it
    finally:
        p.check()


def test_a_pod_that_started_and_rotated_while_the_agent_was_down_is_read_whole(tmp_path):
    """A pod created while the agent is down writes, is rotated, and writes on: its first
    file is not at the path any more when the agent comes back (a review: it was lost, as
    files already rotated when a path is first seen are history the agent was not asked for;
    on a restart, what was written since the checkpoint is not history)."""
    p = _Pods(tmp_path)
    try:
        p.rotated_while_down(pod_log(tmp_path), pod_log(tmp_path, "vllm-1"), 0x5000)
    finally:
        p.check()


def test_rotations_of_a_file_followed_by_its_containers_symlink(tmp_path):
    """Following `/var/log/containers/*.log` (symlinks into /var/log/pods): kubelet's rotated
    files sit beside the target, not beside the link (a review: a rotation while the agent was
    down lost the file between, looked for beside the link)."""
    log = pod_log(tmp_path)
    links = tmp_path / "containers"
    links.mkdir()
    os.symlink(log, links / ("vllm-0_llm_vllm-" + "ab" * 32 + ".log"))
    p = _Pods(tmp_path, str(links / "*.log"))
    try:
        p.rotated_while_down(log, log, 0x2000)
    finally:
        p.check()


def test_copytruncate_with_compress_while_running_loses_no_tail(tmp_path):
    """logrotate `copytruncate` + `compress` (no `delaycompress`) between two looks of the
    running agent: the copy is `0.log.1.gz` at once, smaller than the offset the agent had
    read to, so it was never taken for the copy, and the tail written before the truncation
    was lost (a review)."""
    import gzip
    import signal

    p = _Pods(tmp_path)
    log = pod_log(tmp_path)
    try:
        p.write(log, 0x1000)
        p.agent = AgentProc(*p.args).start()
        assert wait_for(lambda: p.roots.have(p.want), deadline(30))
        wait_for(lambda: checkpointed_to_end(p.args[1], log), deadline(15))  # acked and checkpointed
        os.kill(p.agent.proc.pid, signal.SIGSTOP)  # the tail written and rotated between two looks
        try:
            p.write(log, 0x2000)
            shutil.copyfile(log, log + ".1")
            with open(log, "r+") as f:
                f.truncate(0)
            with open(log + ".1", "rb") as src, gzip.open(log + ".1.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(log + ".1")
            p.write(log, 0x3000, n=3)
        finally:
            os.kill(p.agent.proc.pid, signal.SIGCONT)
        wait_for(lambda: p.roots.have(p.want), deadline(30))
        time.sleep(deadline(2))
        assert p.agent.term()[0] == 0
    finally:
        p.check()


def test_heads_of_a_path_gone_while_the_agent_was_down_are_not_kept(tmp_path):
    """A pod deleted while the agent was down: its path's known heads leave the checkpoint
    once a look finds it gone (a review: they stayed for ever, one more per pod deleted
    during a downtime)."""
    p = _Pods(tmp_path)
    logs = [pod_log(tmp_path, f"vllm-{i}") for i in range(3)]
    try:
        for i, log in enumerate(logs):
            p.write(log, 0x1000 * (i + 1))
        p.run()
        with open(tmp_path / "state" / "checkpoints.json") as f:
            assert len(json.load(f)["known_heads"]) == 3
        for log in logs[1:]:
            os.rename(log, log + ".20260215-100000")  # rotated while down, then the pod deleted
            shutil.rmtree(os.path.dirname(os.path.dirname(log)))
        p.write(logs[0], 0x9000)
        p.run()
        with open(tmp_path / "state" / "checkpoints.json") as f:
            assert list(json.load(f)["known_heads"]) == [logs[0]]
    finally:
        p.rx.stop()


def _follower_lines(follower) -> list[bytes]:
    """Discover and read until nothing more comes: every line handed out, in order."""
    out: list[bytes] = []
    for _ in range(20):
        follower.discover()
        got = [raw for _, lines in follower.poll() for _, raw in lines]
        out += got
        if not got:
            break
    return out


def test_a_fifo_named_like_a_rotated_file_is_never_opened(tmp_path):
    """Opening a FIFO blocks until a writer comes: a `0.log.<stamp>` FIFO beside a followed
    file hung the agent for good, `/healthz` still answering (a review). Only regular files
    are rotated siblings."""
    import threading

    from bridge.tail.follow import Filters, Follower, siblings

    log = tmp_path / "0.log"
    log.write_bytes(b"a\n")
    os.mkfifo(str(log) + ".20260215-090000")
    assert siblings(str(log)) == []
    follower = Follower(Filters((str(log),)))
    done = threading.Event()

    def run() -> None:
        follower.discover(first_round=True)
        os.rename(log, str(log) + ".20260215-100000")
        log.write_bytes(b"b\n")
        _follower_lines(follower)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(deadline(10)), "the follower blocked"


def _more_rotated_files_than_heads_kept(tmp_path, monkeypatch):
    """follow, with 8 heads kept per path, and `0.log`'s path beside 12 dateext files of history."""
    from bridge.tail import follow

    monkeypatch.setattr(follow, "_KNOWN_PER_PATH", 8)
    for i in range(12):
        (tmp_path / f"0.log-202501{i + 1:02d}").write_bytes(f"history {i}\n".encode())
    return follow, tmp_path / "0.log"


def test_a_path_with_more_rotated_files_than_heads_kept_reads_no_history(tmp_path, monkeypatch):
    """More rotated files than the heads kept per path (logrotate `rotate 365`): a head let
    go looked like a file that came and went, so history was read, and read again at each
    rotation (a review, with 260 files and 256 heads). Letting a head go makes the path's
    heads incomplete: it falls back to the files written since the last look."""
    follow, log = _more_rotated_files_than_heads_kept(tmp_path, monkeypatch)
    log.write_bytes(b"now 1\n")
    follower = follow.Follower(follow.Filters((str(log),)))
    follower.discover(first_round=True)
    first = _follower_lines(follower)
    os.rename(log, str(log) + "-20260301")
    log.write_bytes(b"now 2\n")
    later = _follower_lines(follower)
    assert first + later == [b"now 1\n", b"now 2\n"]


def test_a_file_that_came_and_went_after_a_look_found_none_is_read(tmp_path):
    """The file at a followed path renamed away, a look finds no file there; then B takes the
    name and is rotated away (gzipped), and C takes it, before the next look. B was lost: a
    path with complete heads skipped the catch-up when its name came back (a review)."""
    import gzip

    from bridge.tail.follow import Filters, Follower

    log = tmp_path / "0.log"
    log.write_bytes(b"a\n")
    follower = Follower(Filters((str(log),)))
    follower.discover(first_round=True)
    got = _follower_lines(follower)
    os.rename(log, str(log) + ".20260215-100001")
    got += _follower_lines(follower)  # a look: no file at the name
    with gzip.open(str(log) + ".20260215-100002.gz", "wb") as f:  # B came and went
        f.write(b"b\n")
    log.write_bytes(b"c\n")  # C
    got += _follower_lines(follower)
    assert got == [b"a\n", b"b\n", b"c\n"]


def test_a_checkpointed_file_deleted_while_down_is_not_found_in_a_live_file(tmp_path):
    """A container restarted while the agent was down and kubelet deleted `0.log`: the
    search for it among its directory's files took `1.log` (a live, followed file) when its
    first bytes were the same (plain-text logs opening on the same banner), and read it twice
    (a review). A followed file is never taken for a rotated one."""
    from bridge.tail.checkpoint import FileCheckpoint
    from bridge.tail.follow import Filters, Follower, fingerprint

    banner = b"INFO 02-15 10:00:00 api_server.py:1] vLLM API server version 0.32.0\n" * 4
    (tmp_path / "1.log").write_bytes(banner + b"second life\n")
    ck = FileCheckpoint(str(tmp_path / "0.log"), "s", 0, 1, fingerprint(banner[:256]), 256, len(banner))
    follower = Follower(Filters((str(tmp_path / "*.log"),)))
    follower.restore([ck], {"s": 1}, time.time() - 60, {})
    assert [tf.path for tf in follower.files] == []
    assert follower.stats.errors.get("lost") == 1


@pytest.mark.parametrize("restart", [False, True])
def test_a_path_over_the_heads_kept_never_counts_as_complete_again(tmp_path, monkeypatch, restart):
    """Once a path has more rotated files than heads kept, a later look (a restart with the
    file still there, or an empty file at the path) marked it complete again, with its oldest
    heads gone: the next rotation read them as history (a review of the first fix)."""
    follow, log = _more_rotated_files_than_heads_kept(tmp_path, monkeypatch)
    log.write_bytes(b"")
    f = follow.Follower(follow.Filters((str(log),)))
    f.discover(first_round=True)
    got = _follower_lines(f)
    if restart:
        heads = f.known_heads()
        f = follow.Follower(follow.Filters((str(log),)))
        f.restore([], {}, time.time(), heads)
    log.write_bytes(b"now 1\n")
    got += _follower_lines(f)
    os.rename(log, str(log) + "-20260301")
    log.write_bytes(b"now 2\n")
    got += _follower_lines(f)
    assert got == [b"now 1\n", b"now 2\n"]


def test_a_name_empty_for_longer_than_a_retirement_keeps_what_is_known_of_it(tmp_path):
    """The came-and-went case above, with the name empty for longer than a rotated file is
    kept open: its known heads were dropped with the closed file, and the gzipped file that
    came and went was then passed over (a review)."""
    import gzip

    from bridge.tail import follow

    now = [0.0]
    log = tmp_path / "0.log"
    log.write_bytes(b"a\n")
    f = follow.Follower(follow.Filters((str(log),)), clock=lambda: now[0])
    f.discover(first_round=True)
    got = _follower_lines(f)
    os.rename(log, str(log) + ".20260215-100001")
    for _ in range(3):
        got += _follower_lines(f)
        now[0] += follow.RETIRE_AFTER_S
    assert f.files == []  # the renamed file read to its end and closed
    with gzip.open(str(log) + ".20260215-100002.gz", "wb") as g:
        g.write(b"b\n")
    log.write_bytes(b"c\n")
    got += _follower_lines(f)
    assert got == [b"a\n", b"b\n", b"c\n"]


def test_a_relative_include_resumes_where_it_was(tmp_path):
    """`--include pods/*/*/*.log`, relative: discovery makes paths absolute, the globs were
    not, so a restart took the checkpointed file at its path for a rotated one and sent every
    request again, as a second trace (a review)."""
    from agentkit import ROOT

    p = _Pods(tmp_path, os.path.relpath(str(tmp_path / "pods/*/*/*.log"), ROOT))  # the agent runs in ROOT
    log = pod_log(tmp_path)
    try:
        p.write(log, 0x1000)
        p.run()
        p.write(log, 0x2000)
        p.run()
    finally:
        p.check()


def test_relative_exclude_and_gateway_globs_still_match_anywhere():
    """Only include globs are expanded from the working directory and made absolute; an
    exclude glob is matched, and `*istio-proxy*` matches a path anywhere (a review: made
    absolute, it matched only under the working directory and excluded nothing)."""
    from bridge.tail.follow import Filters, source_for

    f = Filters(("pods/*/*/*.log",), ("*istio-proxy*",), gateway=("*nginx*",))
    assert f.include == (os.path.abspath("pods/*/*/*.log"),)
    path = "/var/log/pods/ns_p_u/istio-proxy/0.log"
    assert f.refusal(path, source_for(path)) == "matches exclude '*istio-proxy*'"
    assert f.gateway == ("*nginx*",)


def test_heads_of_a_pod_whose_file_went_before_its_directory_are_dropped(tmp_path, monkeypatch):
    """kubelet's GC removes a container's file, and the pod's directory later: the heads were
    kept for good, in every checkpoint (a review). A look drops, once a minute, the heads of
    paths whose directory is gone."""
    from bridge.tail import follow

    clock = [1000.0]
    monkeypatch.setattr(follow.time, "time", lambda: clock[0])
    pod = tmp_path / "pod"
    pod.mkdir()
    log = pod / "0.log"
    log.write_bytes(b"a\n")
    f = follow.Follower(follow.Filters((str(tmp_path / "*" / "*.log"),)), clock=lambda: clock[0])
    f.discover(first_round=True)
    _follower_lines(f)
    assert list(f.known_heads()) == [str(log)]
    log.unlink()
    for _ in range(3):
        _follower_lines(f)
        clock[0] += follow.RETIRE_AFTER_S
    shutil.rmtree(pod)
    clock[0] += 61
    f.discover()
    assert f.known_heads() == {}


def test_an_include_glob_that_matches_rotated_files_is_warned_of(tmp_path):
    """`--include '.../*'` also matches rotated files, which are then followed as files of
    their own and sent again (a review): the agent says so at start, naming the fix."""
    log = pod_log(tmp_path)
    with open(log, "w") as f:
        f.write("INFO 02-15 10:00:00 x.py:1] hello\n")
    agent = AgentProc(str(tmp_path / "pods/*/*/*"), str(tmp_path / "state"), "http://127.0.0.1:1").start()
    try:
        assert wait_for(lambda: "include_matches_rotated_files" in open(agent.stderr_path).read(), deadline(20))
    finally:
        agent.term()
    text = open(agent.stderr_path).read()
    assert "/var/log/pods/*/*/*.log" in text
