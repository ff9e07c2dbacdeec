"""A container's rotated files are one log in `replay` and `check` (tail.source.streams).

Truth: the ground-truth generator's requests (bridge.synth), and where this test itself put
each line (which file, after which rotation); never the bridge's own output.
"""

from __future__ import annotations

import gzip
import io
import os
import random

from receivers import GrpcReceiver, attrs
from replay_equiv import synth_cri_lines

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
