"""What a backend needs from `replay` (docs/backends.md): demo data moved into its search window
(`--shift-to-now`) and the pod's identity on the spans for backends that drop resources
(`--k8s-attributes-on-spans`). Against a real in-process OTLP receiver; expected values come from
the wall clock and the path the test made, never from the bridge."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from receivers import GrpcReceiver, attrs
from waits import deadline

ROOT = Path(__file__).parent.parent
SAMPLE = ROOT / "bridge" / "samples" / "seed.log"


def _replay(*args: str) -> list:
    with GrpcReceiver() as rx:
        p = subprocess.run([sys.executable, "-m", "bridge", "replay", *args, "--otlp-endpoint", rx.endpoint,
                            "--otlp-protocol", "grpc"], capture_output=True, text=True, cwd=ROOT, timeout=deadline(300))
        assert p.returncode == 0, p.stderr
        return rx.spans()


def test_shift_to_now_moves_the_log_to_now_and_changes_nothing_else():
    plain = {s.span_id: s for _res, s in _replay(str(SAMPLE), "--year", "2025")}
    before = time.time_ns()
    shifted = {s.span_id: s for _res, s in _replay(str(SAMPLE), "--year", "2025", "--shift-to-now")}
    after = time.time_ns()
    assert shifted.keys() == plain.keys()  # the same spans (ids do not depend on time): a backend dedups them
    last = max(s.end_time_unix_nano for s in shifted.values())
    assert before <= last <= after  # the log's last event is now
    offsets = {shifted[k].start_time_unix_nano - plain[k].start_time_unix_nano for k in plain}
    offsets |= {shifted[k].end_time_unix_nano - plain[k].end_time_unix_nano for k in plain}
    assert len(offsets) == 1  # every time moved by the same amount: durations and order unchanged
    assert min(s.start_time_unix_nano for s in shifted.values()) > after - 365 * 86400 * 10**9


def test_k8s_identity_on_spans_when_asked(tmp_path):
    pod_dir = tmp_path / "pods" / "serving_llama-7b-5d9f_0e4c3f1a-1111-2222-3333-444455556666" / "vllm"
    pod_dir.mkdir(parents=True)
    shutil.copy(SAMPLE, pod_dir / "0.log")
    want = {"k8s.namespace.name": "serving", "k8s.pod.name": "llama-7b-5d9f",
            "k8s.pod.uid": "0e4c3f1a-1111-2222-3333-444455556666", "k8s.container.name": "vllm"}
    spans = _replay(str(pod_dir / "0.log"), "--year", "2025")
    for res, s in spans:
        assert {k: res[k] for k in want} == want  # on the resource, always
        assert not set(want) & set(attrs(s.attributes))  # and only there by default
    spans = _replay(str(pod_dir / "0.log"), "--year", "2025", "--k8s-attributes-on-spans")
    roots = [s for _res, s in spans if s.name in ("vllm.request", "vllm.engine", "vllm.startup")]
    assert roots
    for s in roots:
        a = attrs(s.attributes)
        assert {k: a[k] for k in want} == want, s.name
