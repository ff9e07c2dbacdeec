"""A container's rotated files are one log in `replay` and `check` (tail.source.streams).

Truth: the ground-truth generator's requests (bridge.synth), and where this test itself put
each line (which file, after which rotation); never the bridge's own output.
"""

from __future__ import annotations

import gzip
import io
import os
import random
import time

import pytest
from receivers import GrpcReceiver, attrs
from replay_equiv import closing_line, synth_cri_lines

from bridge.cli import main
from bridge.tail.source import source_for, streams

POD = "pods/llm_vllm-0_3f2a9c1e-1111-2222-3333-444455556666/vllm"
STAMPS = ("20260215-100100", "20260215-100200", "20260215-100300")


def _lines(seed: int, requests: int = 40) -> tuple[list[str], object]:
    return synth_cri_lines(seed, requests, reuse=0.0)


def _kubelet_dir(tmp_path, lines: list[str], seed: int) -> tuple[str, dict[str, str]]:
    """The lines cut at three random points into what kubelet leaves: the two older rotated files
    gzipped, the last plain, then `0.log`. Returns the directory and, per line, its file."""
    d = tmp_path / POD
    d.mkdir(parents=True)
    cuts = sorted(random.Random(seed).sample(range(1, len(lines)), 3))
    names = [f"0.log.{STAMPS[0]}.gz", f"0.log.{STAMPS[1]}.gz", f"0.log.{STAMPS[2]}", "0.log"]
    where: dict[str, str] = {}
    for name, a, b in zip(names, [0, *cuts], [*cuts, len(lines)]):
        data = "".join(lines[a:b]).encode()
        opener = gzip.open if name.endswith(".gz") else open
        with opener(d / name, "wb") as f:
            f.write(data)
        for line in lines[a:b]:
            where.setdefault(line, str(d / name))
    for i, name in enumerate(reversed(names)):  # kubelet gzips at the next rotation: .gz files look newest
        os.utime(d / name, (1_771_000_000 + i, 1_771_000_000 + i))
    return str(d), where


def _replay(paths: list[str]) -> tuple[list, str]:
    with GrpcReceiver() as rx:
        out = io.StringIO()
        assert main(["replay", *paths, "--otlp-endpoint", rx.endpoint], env={"PATH": os.environ["PATH"]},
                    out=out) == 0, out.getvalue()
        return rx.spans(), out.getvalue()


def test_replay_of_a_pod_directory_gives_one_root_per_request_named_after_its_first_lines_file(tmp_path):
    lines, truth = _lines(5)
    d, where = _kubelet_dir(tmp_path, lines, 5)
    spans, stdout = _replay([d])
    roots = [(res, s) for res, s in spans if s.name == "vllm.request"]
    assert sorted(attrs(s.attributes)["vllm.request.id"] for _, s in roots) == sorted(
        r.request_id for r in truth.requests)
    assert not [s for _, s in roots if attrs(s.attributes).get("vllm.start_unknown")]
    assert f"requests     {len(truth.requests)} " in stdout
    first_file = {}
    for line in lines:  # each request's first line, in write order
        for r in truth.requests:
            if r.request_id in line and r.request_id not in first_file:
                first_file[r.request_id] = where[line]
    named = {attrs(s.attributes)["vllm.request.id"]: res["log.file.path"] for res, s in roots}
    assert named == first_file
    assert len(set(named.values())) > 1  # the cuts put first lines in several files
    # one stream: every span of a request under one trace id, whatever file its lines are in
    assert len({s.trace_id for _, s in spans if s.name == "vllm.request"}) == len(truth.requests)


def test_the_files_given_in_any_order_are_the_directory(tmp_path):
    lines, _ = _lines(6)
    d, _ = _kubelet_dir(tmp_path, lines, 6)
    names = sorted(os.listdir(d))  # what a shell's `0.log*` gives: the live file first
    assert names[0] == "0.log"
    by_dir, _ = _replay([d])
    by_files, _ = _replay([os.path.join(d, n) for n in reversed(names)])
    key = lambda spans: sorted(s.SerializeToString(deterministic=True) for _, s in spans)  # noqa: E731
    assert key(by_dir) == key(by_files)


def test_streams_order_by_the_name_rotation_gave_and_restarts_in_order(tmp_path):
    d = tmp_path / POD
    d.mkdir(parents=True)
    written = ["0.log.20260215-090000.gz", "0.log.20260215-100000.gz", "0.log.20260215-110000", "0.log",
               "1.log.20260215-120000", "1.log", "2.log", "10.log"]
    for i, name in enumerate(written):
        (d / name).write_text("x\n")
        os.utime(d / name, (2_000_000_000 - i, 2_000_000_000 - i))  # mtimes say the opposite
    other = tmp_path / "plain"
    other.mkdir()
    for name in ("vllm.log.2.gz", "vllm.log.1", "vllm.log"):  # logrotate: .1 is the newest
        (other / name).write_text("x\n")
    given = [str(other / "vllm.log"), *(str(d / n) for n in sorted(written)), str(other / "vllm.log.1"),
             str(other / "vllm.log.2.gz")]
    got = [[os.path.basename(p) for p in s] for s in streams(given)]
    assert got == [["vllm.log.2.gz", "vllm.log.1", "vllm.log"], written]
    assert source_for(str(other / "vllm.log.2.gz")).key == source_for(str(other / "vllm.log")).key
    assert source_for(str(d / "1.log.20260215-120000")).resource["k8s.container.restart_count"] == 1


def test_check_reads_a_container_as_one_log_its_banner_in_the_oldest_file(tmp_path):
    d = tmp_path / POD
    d.mkdir(parents=True)
    banner = ("2026-02-15T10:00:00.000000000Z stdout F (EngineCore_DP0 pid=7) INFO 02-15 10:00:00 [core.py:93] "
              "Initializing a V1 LLM engine (v0.14.0) with config: model='m', speculative_config=None\n")
    later = ("2026-02-15T10:05:00.000000000Z stdout F INFO 02-15 10:05:00 [logger.py:39] Received request "
             "cmpl-1: prompt: 'x', params: SamplingParams(n=1), prompt_token_ids: None, lora_request: None.\n")
    with gzip.open(d / "0.log.20260215-100100.gz", "wt") as f:
        f.write(banner)
    (d / "0.log").write_text(later)
    out = io.StringIO()
    assert main(["check", str(d)], env={}, out=out) == 0
    text = out.getvalue()
    assert text.startswith(str(d / "0.log") + "  (and 1 rotated file(s) before it: 0.log.20260215-100100.gz)"), text
    assert "V1 (vLLM 0.14.0)" in text, text
    assert "records       2 from 2 lines" in text, text


# -- the live follower and checkpoint, each rule replay ≡ agent needed (tests/test_replay_equiv.py found them)


def test_a_closed_file_after_the_one_an_open_request_began_in_resumes_from_its_start(tmp_path):
    """A request open since generation 0 holds the checkpoint there; a later file, read to its
    end and closed meanwhile (a gzipped rotation), must resume from its start, not its end:
    its lines (other requests' too) were skipped after a kill -9."""
    import json

    from bridge.resume import Checkpointer
    from bridge.sources import Pending, SourceState
    from bridge.tail.checkpoint import FileCheckpoint
    from bridge.core.position import GEN_SHIFT
    from bridge.tail.follow import Filters, Follower

    follower = Follower(Filters((str(tmp_path / "*.log"),)))
    src = source_for(str(tmp_path / "0.log"))
    st = SourceState(src)
    st.pending[0] = Pending((0 << GEN_SHIFT) + 300, "open-since-gen-0", (2 << GEN_SHIFT) + 5)
    st.retired = [FileCheckpoint(str(tmp_path / "0.log.20260215-100100.gz"), src.key, 1, 7, "fp", 256, 4100)]
    ckpt = Checkpointer(str(tmp_path / "state"), None)
    os.makedirs(ckpt.store.state_dir)
    assert ckpt.save(follower, {src.key: st}, (), lambda key: st)
    with open(ckpt.store.path) as f:
        files = json.load(f)["files"]
    assert [(f["generation"], f["offset"]) for f in files] == [(1, 0)]
    assert st.retired[0].offset == 4100  # kept: where the file ends


def test_a_restarts_logs_are_numbered_in_the_order_written(tmp_path):
    from bridge.tail.follow import Filters, Follower

    d = tmp_path / POD
    d.mkdir(parents=True)
    for name in ("10.log", "2.log", "1.log", "0.log"):
        (d / name).write_text(f"{name}\n")
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)))
    follower.discover(first_round=True)
    gens = {os.path.basename(tf.path): tf.generation for tf in follower.files}
    assert sorted(gens, key=gens.get) == ["0.log", "1.log", "2.log", "10.log"]


def test_a_directory_changed_in_the_tick_of_its_listing_is_listed_again(tmp_path):
    """A change that leaves the directory's mtime as it was listed (coarse file times) must not
    hide a new file until the directory's next change."""
    from bridge.tail.follow import TailStats, expand

    (tmp_path / "0.log").write_text("x\n")
    listings: dict = {}
    stats = TailStats()
    assert [os.path.basename(p) for p, _ in expand(str(tmp_path / "*.log"), stats, listings)] == ["0.log"]
    mtime = os.stat(tmp_path).st_mtime_ns
    (tmp_path / "1.log").write_text("y\n")
    os.utime(tmp_path, ns=(mtime, mtime))  # the same tick
    assert sorted(os.path.basename(p) for p, _ in expand(str(tmp_path / "*.log"), stats, listings)) == [
        "0.log", "1.log"]


def test_a_new_log_rotated_and_gzipped_before_the_first_look_is_read_whole(tmp_path):
    """kubelet's `1.log` (the container restarted) came, rotated twice and was gzipped between
    two looks: the directory was listed without it, so every file rotated from it is new."""
    from bridge.tail.follow import Filters, Follower

    d = tmp_path / POD
    d.mkdir(parents=True)
    (d / "0.log").write_text("a\n")
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)))
    follower.discover(first_round=True)
    follower.poll()
    with gzip.open(d / "1.log.20260215-100100.gz", "wt") as f:
        f.write("b1\n")
    (d / "1.log.20260215-100200").write_text("b2\n")
    (d / "1.log").write_text("b3\n")
    later = os.stat(d).st_mtime + 5
    os.utime(d, (later, later))  # a change the listing cannot miss
    follower.discover()
    got = [raw for _ in range(3) for _, lines in follower.poll() for _, raw in lines]
    assert got == [b"b1\n", b"b2\n", b"b3\n"]


def test_the_agent_hands_on_what_an_older_files_decoder_holds_before_the_newer_files_lines(tmp_path):
    """A rotated file's last record waits in its decoder for a continuation; the newer file's
    lines come next. Fed after them (when the file is closed), it came after a line 10 s later
    that had ended its request: one request became two. Truth: replay of the same files."""
    from types import SimpleNamespace

    from bridge import agent as agent_mod
    from bridge.config import AgentConfig
    from bridge.export.transport import Destination
    from bridge.pipeline import replay
    from bridge.core.position import GEN_SHIFT

    d = tmp_path / POD
    d.mkdir(parents=True)
    old = ["2025-02-15T10:23:00.000000000Z stdout F INFO 02-15 10:23:00 scheduler.py:234] Scheduling request "
           "0x7f8c4a001000: priority=0, num_scheduled_blocks=1, remaining_blocks=10\n",
           "2025-02-15T10:23:30.000000000Z stdout F WARNING 02-15 10:23:30 scheduler.py:450] Request 0x7f8c4a001000 "
           "timed out after 30s\n",
           "2025-02-15T10:23:30.000200000Z stdout F ERROR 02-15 10:23:30 api_server.py:200] Request timeout: "
           "0x7f8c4a001000\n"]
    new = ["2025-02-15T10:23:40.000000000Z stdout F INFO 02-15 10:23:40 scheduler.py:312] Running queue: 0 requests, "
           "waiting queue: 0 requests, free blocks: 512/512\n"]
    (d / "0.log.20260215-100100").write_text("".join(old))
    (d / "0.log").write_text("".join(new))

    want = []
    replay([str(d / "0.log"), str(d / "0.log.20260215-100100")], [want.append])
    got = []
    agent = agent_mod.Agent(AgentConfig(), Destination("http://127.0.0.1:1", "grpc"), {}, None)
    agent._batch = lambda t, token: got.append(t)
    live = source_for(str(d / "0.log"))
    for gen, lines in enumerate((old, new)):
        path = str(d / ("0.log.20260215-100100" if gen == 0 else "0.log"))
        with open(path, "rb") as fh:
            tf = SimpleNamespace(source=live, fh=fh, path=str(d / "0.log"), generation=gen, at_eof=True)
            positions, at = [], gen << GEN_SHIFT
            for line in lines:
                positions.append(at)
                at += len(line.encode())
            agent._process(tf, list(zip(positions, (line.encode() for line in lines))))
    agent._sources[live.key].assembler.flush()

    def shape(ts):
        return sorted((t.request_id, t.occurrence, t.end_ns) for t in ts if hasattr(t, "request_id"))

    assert len(shape(want)) == 1
    assert shape(got) == shape(want)


def _pod_rotated_between_looks(tmp_path, follower) -> None:
    """After the follower's first look: a pod's directory appears holding `0.log`, a plain
    rotated file and a gzipped older one (lines a3, a2, a1), its parent's time moved on."""
    follower.discover(first_round=True)
    d = tmp_path / POD
    d.mkdir(parents=True)
    with gzip.open(d / "0.log.20260215-100100.gz", "wt") as f:
        f.write("a1\n")
    (d / "0.log.20260215-100200").write_text("a2\n")
    (d / "0.log").write_text("a3\n")
    later = os.stat(tmp_path / "pods").st_mtime + 5
    os.utime(tmp_path / "pods", (later, later))


def test_a_new_pods_log_rotated_and_gzipped_before_the_first_look_is_read_whole(tmp_path):
    """A pod that started and rotated between two looks: its directory was not there at the
    last look, so nothing in it is history."""
    from bridge.tail.follow import Filters, Follower

    (tmp_path / "pods").mkdir()
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)))
    _pod_rotated_between_looks(tmp_path, follower)
    follower.discover()
    got = [raw for _ in range(3) for _, lines in follower.poll() for _, raw in lines]
    assert got == [b"a1\n", b"a2\n", b"a3\n"]


def test_a_new_pods_log_held_at_first_sight_then_admitted_is_read_whole(tmp_path):
    """As above, but the check above the follower (`detect: vllm`) holds the new `0.log` at the
    look that first sees it (no vLLM line yet) and admits it at the next: its directory was
    not there at the last look, so its rotated files, gzipped ones too, are new, not history."""
    from bridge.tail.follow import Filters, Follower

    asked: list[str] = []

    def admit(path, source):  # holds a file the first time it is asked about it
        asked.append(path)
        return None if asked.count(path) > 1 else ("not_vllm", "no vLLM line yet")

    (tmp_path / "pods").mkdir()
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)), admit=admit)
    _pod_rotated_between_looks(tmp_path, follower)
    follower.discover()
    assert [raw for _ in range(3) for _, lines in follower.poll() for _, raw in lines] == []  # held
    follower.discover()
    got = [raw for _ in range(3) for _, lines in follower.poll() for _, raw in lines]
    assert asked == [str(tmp_path / POD / "0.log")] * 2
    assert got == [b"a1\n", b"a2\n", b"a3\n"]


def test_ids_do_not_depend_on_which_of_a_containers_files_are_there(tmp_path):
    """kubelet deletes a container's oldest rotated file (and an agent started late never read
    it): a request whose first line is in the files left keeps its ids. They come from the
    stream and where the line is in its own file, not from how many files came before it."""
    lines, truth = _lines(8)
    d, where = _kubelet_dir(tmp_path, lines, 8)
    whole, _ = _replay([d])
    oldest = os.path.join(d, f"0.log.{STAMPS[0]}.gz")
    first_file = {}
    for line in lines:
        for r in truth.requests:
            if r.request_id in line:
                first_file.setdefault(r.request_id, where[line])
    kept = {rid for rid, f in first_file.items() if f != oldest}
    assert 0 < len(kept) < len(truth.requests)
    os.remove(oldest)
    left, _ = _replay([d])

    def roots(spans):
        return {(attrs(s.attributes)["vllm.request.id"], s.trace_id, s.span_id) for _, s in spans
                if s.name == "vllm.request" and attrs(s.attributes)["vllm.request.id"] in kept}

    assert len(roots(whole)) == len(kept)
    assert roots(left) == roots(whole)


# -- a kubelet rotation between a line's `P` parts and its `F` end, live (issue 37) ----------------

def _cri(sec: float, stream: str, tag: str, text: str) -> str:
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(int(sec)))}.{int(sec % 1 * 1e9):09d}Z {stream} {tag} {text}\n"


T0 = 1_771_149_600  # 2026-02-15 10:00:00


def _head(sec: float, level: str = "INFO", origin: str = "scheduler.py:789") -> str:
    return f"{level} {time.strftime('%m-%d %H:%M:%S', time.gmtime(int(sec)))} {origin}] "


def _summary_of(rid: str, tokens: int) -> str:
    return (f"Request {rid}: prompt_tokens=7, generated_tokens={tokens}, ttft=12.0ms, itl=3.0ms, "
            "total_latency=0.5s")


def _split_lines():
    """What the container wrote, as the kubelet framed it: before the rotation a whole request
    (0xa), a stderr warning's `P` part and a stdout summary's `P` part (request 0xb, which has
    no other line: nothing but the parts holds the checkpoint); after it their `F` ends, then a
    closing line hours later. Truth: 0xb's summary says generated_tokens=29."""
    summary_b = _head(T0 + 2) + _summary_of("0x7f0000000b00", 29)
    before = [_cri(T0 + 1, "stdout", "F", _head(T0 + 1) + "Scheduling request 0x7f0000000a00: priority=0, "
                                                       "num_scheduled_blocks=1, remaining_blocks=10"),
              _cri(T0 + 1.5, "stdout", "F", _head(T0 + 1) + _summary_of("0x7f0000000a00", 11)),
              _cri(T0 + 1.7, "stderr", "P", _head(T0 + 1, "WARNING", "x.py:1") + "a warning cut "),
              _cri(T0 + 2, "stdout", "P", summary_b[:60])]
    after = [_cri(T0 + 2.1, "stdout", "F", summary_b[60:]),
             _cri(T0 + 2.2, "stderr", "F", "in two by a rotation"),
             closing_line([_cri(T0 + 3, "stdout", "F", "x")])]
    return before, after


def _roots(rx) -> dict:
    out: dict[str, list] = {}
    for _, s in rx.spans():
        if s.name == "vllm.request":
            a = attrs(s.attributes)
            out.setdefault(a["vllm.request.id"], []).append((s.span_id, a.get("gen_ai.usage.output_tokens"),
                                                              a["vllm.outcome"]))
    return out


def _files_watched(agent) -> float:
    return agent.metric("files_watched")


@pytest.mark.parametrize("kill", [None, "before_rotation", "after_rotation_seen", "after_retired",
                                  "after_retired_then_gzipped"])
def test_the_agent_joins_a_line_a_rotation_cut_through_a_kill9_anywhere_between_its_parts(tmp_path, kill):
    """The `P` parts are at the end of the rotated file, the `F` ends at the start of the next
    `0.log`. Wherever the agent is killed (-9) between them — before it saw the rotation, after,
    after it closed the rotated file (the parts waiting for the next file's first line), and
    with the rotated file gzipped by the next rotation while it was down — each request is sent
    once, whole (0xb's summary: 29 tokens), and the spans are what `replay` of the files sends."""
    from agentkit import AgentProc, pod_log, saved_checkpoint, wait_for
    from replay_equiv import kubelet_rotate
    from waits import deadline

    before, after = _split_lines()
    log = pod_log(tmp_path)
    state = str(tmp_path / "state")
    with GrpcReceiver() as rx:
        args = (str(tmp_path / "pods/*/*/*.log"), state, rx.endpoint, "--start-at", "beginning",
                "--poll-interval", "0.2")
        agent = AgentProc(*args).start()
        with open(log, "a") as f:
            f.writelines(before)
        pending_at = len("".join(before[:2]).encode())  # the stderr part: where a resume must re-read
        assert wait_for(lambda: "0x7f0000000a00" in _roots(rx), deadline(30))
        assert wait_for(lambda: [(e["path"], e["offset"]) for e in saved_checkpoint(state).get("files", [])]
                        == [(log, pending_at)], deadline(30)), saved_checkpoint(state)
        if kill == "before_rotation":
            agent.kill9()
        kubelet_rotate(log, "20260215-100100")
        open(log, "a").close()  # containerd reopens the log: the new 0.log, empty so far
        if kill is not None and kill != "before_rotation":
            assert wait_for(lambda: _files_watched(agent) == 2, deadline(30))
            if kill.startswith("after_retired"):
                assert wait_for(lambda: _files_watched(agent) == 1, deadline(60))  # the rotated file closed
                closed = time.time()
                ckpt = os.path.join(state, "checkpoints.json")
                assert wait_for(lambda: os.stat(ckpt).st_mtime > closed + 0.01, deadline(30))  # saved since
                assert sorted(e["offset"] for e in saved_checkpoint(state)["files"]) == [0, pending_at]
            agent.kill9()
        if kill == "after_retired_then_gzipped":  # down while the F ends come and the next rotation gzips
            with open(log, "a") as f:
                f.writelines(after)
            kubelet_rotate(log, "20260215-100200")
            open(log, "a").close()
        if kill is not None:
            agent = AgentProc(*args).start()
        if kill != "after_retired_then_gzipped":
            if kill is None:  # the parts wait for the next file's first line with the rotated file closed
                assert wait_for(lambda: _files_watched(agent) == 1, deadline(60))
            with open(log, "a") as f:
                f.writelines(after)
        assert wait_for(lambda: "0x7f0000000b00" in _roots(rx) and agent.metric("requests_open") == 0
                        and agent.metric("export_queue_spans") == 0, deadline(60))
        assert agent.term()[0] == 0
        roots = _roots(rx)
    assert {rid: {(t, o) for _, t, o in v} for rid, v in roots.items()} == {
        "0x7f0000000a00": {(11, "finished")}, "0x7f0000000b00": {(29, "finished")}}
    assert all(len({sid for sid, _, _ in v}) == 1 for v in roots.values()), roots  # re-sent at most, never anew
    replayed, _ = _replay([os.path.dirname(log)])
    got = {s.span_id: s.SerializeToString(deterministic=True) for _, s in rx.spans()}
    want = {s.span_id: s.SerializeToString(deterministic=True) for _, s in replayed}
    assert got == want


def _unended_lines():
    """Request 0xb's whole summary written as a `P` part (its writer never wrote the newline:
    the container ended), and the lines a next container writes, a request 0xc of its own."""
    before = [_cri(T0 + 1, "stdout", "F", _head(T0 + 1) + _summary_of("0x7f0000000a00", 11)),
              _cri(T0 + 2, "stdout", "P", _head(T0 + 2) + _summary_of("0x7f0000000b00", 29))]
    after = [_cri(T0 + 30, "stdout", "F", _head(T0 + 30) + _summary_of("0x7f0000000c00", 5)),
             closing_line([_cri(T0 + 31, "stdout", "F", "x")])]
    return before, after


def test_replay_ends_a_line_its_container_left_unfinished_at_the_restart(tmp_path):
    """`0.log` ends in a `P` part; `1.log` is the restarted container's: another process, which
    never goes on with it. The part is a line of its own (0xb's summary), before 1.log's lines."""
    before, after = _unended_lines()
    d = tmp_path / POD
    d.mkdir(parents=True)
    (d / "0.log").write_text("".join(before))
    (d / "1.log").write_text("".join(after))
    spans, _ = _replay([str(d)])
    got = {attrs(s.attributes)["vllm.request.id"]: (attrs(s.attributes).get("gen_ai.usage.output_tokens"),
                                                    attrs(s.attributes)["vllm.outcome"])
           for _, s in spans if s.name == "vllm.request"}
    assert got == {"0x7f0000000a00": (11, "finished"), "0x7f0000000b00": (29, "finished"),
                   "0x7f0000000c00": (5, "finished")}


@pytest.mark.parametrize("end", ["restart", "rotated_then_gone"])
def test_the_agent_ends_a_line_left_unfinished_when_no_file_goes_on_with_it(tmp_path, end):
    """A `P` part nothing finishes is a line of its own: at the first line of a restarted
    container's log (`1.log`: another process), or, when it waits at the end of a rotated file
    for the next `0.log`'s first line, once that file is gone with none (the pod deleted)."""
    from agentkit import AgentProc, pod_log, wait_for
    from replay_equiv import kubelet_rotate
    from waits import deadline

    before, after = _unended_lines()
    log = pod_log(tmp_path)
    state = str(tmp_path / "state")
    with GrpcReceiver() as rx:
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), state, rx.endpoint, "--start-at", "beginning",
                          "--poll-interval", "0.2").start()
        with open(log, "a") as f:
            f.writelines(before)
        assert wait_for(lambda: "0x7f0000000a00" in _roots(rx), deadline(30))
        if end == "restart":
            with open(os.path.join(os.path.dirname(log), "1.log"), "a") as f:
                f.writelines(after)
            want = {"0x7f0000000a00", "0x7f0000000b00", "0x7f0000000c00"}
        else:
            kubelet_rotate(log, "20260215-100100")
            open(log, "a").close()
            assert wait_for(lambda: _files_watched(agent) == 2, deadline(30))
            assert wait_for(lambda: _files_watched(agent) == 1, deadline(60))  # the rotated file closed: the part waits
            assert "0x7f0000000b00" not in _roots(rx)
            os.remove(log)
            want = {"0x7f0000000a00", "0x7f0000000b00"}
        assert wait_for(lambda: set(_roots(rx)) == want and agent.metric("requests_open") == 0, deadline(60)), \
            _roots(rx)
        assert agent.term()[0] == 0
        roots = _roots(rx)
    assert {rid: {(t, o) for _, t, o in v} for rid, v in roots.items()} == {
        "0x7f0000000a00": {(11, "finished")}, "0x7f0000000b00": {(29, "finished")},
        **({"0x7f0000000c00": {(5, "finished")}} if end == "restart" else {})}


def test_unread_counts_the_rotations_an_agent_held_back_has_not_reached(tmp_path):
    """`log_bytes_unread` (Follower.unread): while the agent neither reads nor looks for files
    (a collector outage: its export queue full), the kubelet rotates on. The backlog is what
    this test wrote after the agent's last read, in the file it was reading, the rotated files
    after it (one gzipped) and the new live file; `file_bytes_behind` saw only the first."""
    from replay_equiv import kubelet_rotate

    from bridge.tail.follow import Filters, Follower

    d = tmp_path / POD
    d.mkdir(parents=True)
    log = str(d / "0.log")

    def write(n: int, tag: str) -> int:
        with open(log, "a") as f:
            f.write("".join(f"{tag} line {i:04d} " + "x" * 30 + "\n" for i in range(n)))
        return n * len(f"{tag} line 0000 " + "x" * 30 + "\n")

    write(20, "a")
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)))
    follower.discover(first_round=True)
    assert sum(len(lines) for _, lines in follower.poll()) == 20
    assert follower.unread() == {log: 0}
    rest = written = write(7, "b")                 # the rest of the file being read
    kubelet_rotate(log, "20260215-100100")
    written += write(11, "c")                      # the next 0.log, rotated in turn ...
    kubelet_rotate(log, "20260215-100200")         # ... and the one before gzipped
    assert sorted(os.listdir(d)) == ["0.log.20260215-100100.gz", "0.log.20260215-100200"]
    written += write(5, "d")                       # the live file now
    assert follower.unread() == {log: written}
    assert follower.behind() == {log: rest}        # the open file only
    for _ in range(6):  # the agent goes on: finds the files and reads them
        follower.discover()
        follower.poll()
    assert follower.unread() == {log: 0}
