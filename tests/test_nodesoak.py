"""The node-scale soak (bench/nodesoak.py) in its quick mode: 8 containers, kubelet rotations, a
receiver outage and two kill -9 of the agent; every request the generator wrote arrives as
exactly one trace with the truth's outcome, and nothing is sent twice with other content.
Behaviour only: the figures it prints are not asserted (docs/performance.md has them).

Also the case the soak found: a kubelet rotation between a CRI `P` part and its `F` end."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from agentkit import ROOT
from receivers import GrpcReceiver, attrs
from replay_equiv import synth_cri_lines


@pytest.mark.faults
def test_node_soak_quick_loses_splits_and_changes_no_request(tmp_path):
    out = tmp_path / "figures.json"
    # 8 containers at 300 lines/s (not the 1,000 of the full run: the suite shares the machine),
    # rotated every 0.25 MiB so each container's log rotates several times, the kills and the
    # outage as in --quick.
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "nodesoak.py"), "--quick", "--rate", "300",
                           "--rotate-mib", "0.25", "--json", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    f = json.loads(out.read_text())
    print("\n" + proc.stdout)
    assert f["requests"] > 1000 and f["spans"] > f["requests"], f
    assert (f["lost"], f["split"], f["changed"], f["extra"]) == (0, 0, 0, 0), proc.stdout
    assert f["agents"] == 3 and f["exit_code"] == 0, f["events"]        # two kill -9, then a clean stop
    assert all(r >= 3 for r in f["rotations"]), f["rotations"]           # every container's log rotated
    assert f["latency"]["outage"], "no request written during the outage was delivered"


def _replay_spans(tmp_path, d: str) -> dict:
    from bridge.cli import main

    with GrpcReceiver() as rx:
        buf = io.StringIO()
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
        assert main(["replay", d, "--otlp-endpoint", rx.endpoint, "--otlp-protocol", "grpc"], env=env, out=buf) == 0
        return {(attrs(s.attributes)["vllm.request.id"], s.start_time_unix_nano): attrs(s.attributes)["vllm.outcome"]
                for _, s in rx.spans() if s.name == "vllm.request"}


@pytest.mark.xfail(strict=True, reason="a P part at the end of a rotated file and its F end at the head of the next "
                                       "are read as two lines (found by bench/nodesoak.py; see docs/performance.md)")
def test_a_rotation_between_a_p_part_and_its_f_end_keeps_the_line_whole(tmp_path):
    """containerd writes a long line as `P` parts and an `F` end, one write each; the kubelet's
    rotation (rename, then ReopenContainerLog) can fall between two of them, so the `F` end is
    the first line of the new `0.log`. The container's files are one stream: the line is the
    same as when no rotation cut it (the same log in one file is the reference)."""
    lines, _ = synth_cri_lines(5, requests=40)
    cut = next(i for i, line in enumerate(lines[:-1])
               if " stdout P " in line and "prompt_tokens" in line.split(" ", 3)[3] + lines[i + 1].split(" ", 3)[3])
    rid = (lines[cut].split(" ", 3)[3] + lines[cut + 1].split(" ", 3)[3]).split("Request ", 1)[1].split(":")[0]
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "0.log").write_text("".join(lines))
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    (rotated / "0.log.20260215-100100").write_text("".join(lines[:cut + 1]))
    (rotated / "0.log").write_text("".join(lines[cut + 1:]))
    reference = _replay_spans(tmp_path, str(whole))
    assert [o for (r, _), o in reference.items() if r == rid] == ["finished"], rid
    assert _replay_spans(tmp_path, str(rotated)) == reference
