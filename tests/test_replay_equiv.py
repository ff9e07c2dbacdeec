"""Replay ≡ agent on generated workloads (bridge.synth, fixed seeds) written as a container's CRI
log with kubelet rotations at random lines and a kill -9 of the agent at a random line
(tests/replay_equiv.py). A few seeds in the fast suite; more behind `-m faults`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from replay_equiv import assert_agent_equals_replay
from replay_equiv import synth_cri_lines as synth_lines


def _requests_line(stdout: str) -> int:
    """The roots replay's summary counts (`requests     N (...)`)."""
    m = re.search(r"^requests\s+(\d+)", stdout, re.M)
    assert m, stdout
    return int(m[1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_agent_through_rotations_and_kill9_sends_what_replay_of_the_files_sends(tmp_path, seed):
    lines, truth = synth_lines(seed)
    out = assert_agent_equals_replay(tmp_path, lines, seed, rotations=3)
    assert len([f for f in out.files if f.endswith(".gz")]) == 2  # kubelet gzipped the older ones
    # replay of the directory, as a user runs it: one root per request the generator wrote
    assert _requests_line(out.replay_stdout) == len(truth.requests), out.replay_stdout


def test_a_container_restart_and_rotations_of_both_logs_agent_equals_replay(tmp_path):
    """`0.log`, its rotated files, then `1.log` (the container restarted) and its own."""
    lines, truth = synth_lines(4)
    out = assert_agent_equals_replay(tmp_path, lines, 4, rotations=3, restarts=1)
    assert "1.log" in out.files, out.files
    assert _requests_line(out.replay_stdout) == len(truth.requests), out.replay_stdout  # one stream: none cut


@pytest.mark.faults
@pytest.mark.parametrize("seed", range(10, 40))
def test_faults_agent_equals_replay_many_seeds(tmp_path, seed):
    lines, truth = synth_lines(seed, requests=150)
    out = assert_agent_equals_replay(tmp_path, lines, seed, rotations=1 + seed % 5, restarts=seed % 3 == 0,
                                     chunk=(1, 120))
    assert _requests_line(out.replay_stdout) == len(truth.requests), out.replay_stdout


RANDOMIZED = sorted((Path(__file__).parent / "fixtures" / "randomized").glob("*/server.log.gz"))
#: Runs where the agent and a replay still differ, and why (expected to fail; not strict: the
#: agent's timing on a loaded machine decides whether the race shows). None now: 31003 (an
#: aborted n>1 request of a plugin-only log) differed because a sibling's `ended` line after the
#: first one did not move the request's last offset, so a resumed agent read it again as a new
#: root (test_a_siblings_ended_line_is_the_requests_last_line below).
EQUIV_GAPS: dict[str, str] = {}


def _run_id(p: Path) -> str:
    return p.parent.name.split("-")[0]


def _randomized_lines(log: Path) -> list[str]:
    import gzip

    return gzip.open(log, "rt", encoding="utf-8", errors="surrogateescape").read().splitlines(keepends=True)


@pytest.mark.parametrize("log", [pytest.param(p, id=_run_id(p), marks=[pytest.mark.xfail(
    reason=EQUIV_GAPS[_run_id(p)], strict=False)] if _run_id(p) in EQUIV_GAPS else []) for p in RANDOMIZED])
def test_agent_equals_replay_on_the_randomized_real_vllm_runs(tmp_path, log):
    """The randomized workloads' real vLLM 0.32 logs (tests/randomized, saved runs), written again
    with kubelet rotations and a kill -9 of the agent: the agent sends exactly what a replay of
    the files sends, with `detect: vllm` (the default) deciding when the file is followed."""
    out = assert_agent_equals_replay(tmp_path, _randomized_lines(log), int(_run_id(log)), rotations=2,
                                     chunk=(1, 120))
    assert out.agent_spans == out.replay_spans > 0


def test_agent_equals_replay_with_detection_through_an_early_rotation_real_vllm(tmp_path):
    """No kill, detection on: kubelet rotates the new `0.log` (and gzips the older file) early,
    before detection admits it or before the agent's first look at it: every rotated file is
    still read (the listing before held no `0.log`, so none of them is history)."""
    log = next(p for p in RANDOMIZED if _run_id(p) == "2000")
    assert_agent_equals_replay(tmp_path, _randomized_lines(log), 2000, rotations=2, kill=False, chunk=(1, 120))


def test_agent_equals_replay_with_detection_through_an_early_rotation_generated(tmp_path):
    """As above, on the generator's lines (its first line, `Scheduling request`, is vLLM's header)."""
    lines, _truth = synth_lines(1)
    assert_agent_equals_replay(tmp_path, lines, 1, rotations=3, kill=False)


def test_a_siblings_ended_line_is_the_requests_last_line():
    """The n>1 children's `ended` lines (the plugin's, one per child, seed 31003's request 17)
    all belong to the one root, and the last of them is its last line: what a resumed agent
    skips up to once the root is delivered (`Delivered.last_offset`)."""
    from bridge.assemble import Assembler
    from bridge.decode import Decoder
    from bridge.tail.source import source_for
    from bridge.parse import Parser

    rid = "chatcmpl-rnd-31003-017-da4b870d"
    tail = (", prompt_tokens=66, generated_tokens={g}, total_latency=0.025011s, t=1796319200.548221, "
            "arrival=1796319200.523211, n=3\n")
    lines = [f"2026-12-03T17:33:20.5483{i}Z stdout F (APIServer pid=1) INFO 12-03 17:33:20 [trace_bridge.py:1] "
             f"Request {k}_{rid} ended: finish=abort" + tail.format(g=1 if k < 2 else 0)
             for i, k in enumerate((1, 0, 2))]
    out: list = []
    asm, decode, parser = Assembler(source_for("x.log"), out.append), Decoder(year=2026), Parser()
    offsets = []
    offset = 0
    for line in lines:
        r = decode(line.encode(), offset)
        offsets.append(offset)
        asm.feed(r, parser.parse(r.message, r.level, r.origin))
        offset += len(line.encode())
    asm.flush()
    roots = [t for t in out if getattr(t, "request_id", None) == rid]
    assert len(roots) == 1 and (roots[0].first_offset, roots[0].last_offset) == (offsets[0], offsets[2])
