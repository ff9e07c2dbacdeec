"""The C span writer (`_fastwire.c`) against the one statement of the mapping (`mapping.py`).

The C writes a request's spans straight from its timeline, for speed, without building
`mapping`'s records; these tests hold it to those records on every saved input (the fixtures
and the corpus), and check that it takes the mapping's names from Python rather than spelling
them (renamed in `mapping`, the C follows).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bridge.assemble.timeline import RequestTimeline
from bridge.export import mapping, otlp
from bridge.export.wire import FAST_REQUEST, WireEncoder
from bridge.pipeline import replay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
native = pytest.mark.skipif(FAST_REQUEST is None, reason="the C paths are not built (or VLLM_TRACE_BRIDGE_PURE)")


def saved_inputs() -> list[tuple[str, list[str]]]:
    """Every saved log, a directory's files together (rotations and restarts are one stream)."""
    files = [p for root in ("tests/fixtures", "tests/corpus")
             for p in glob.glob(os.path.join(ROOT, root, "**", "*"), recursive=True)
             if os.path.isfile(p) and not p.endswith((".json", ".md", ".yaml", ".yml", ".txt", ".py"))]
    by_dir: dict[str, list[str]] = {}
    for f in sorted(files):
        by_dir.setdefault(os.path.relpath(os.path.dirname(f), ROOT), []).append(f)
    return sorted(by_dir.items())


INPUTS = saved_inputs()


def _spans(payload: bytes) -> list:
    return [s for rs in ExportTraceServiceRequest.FromString(payload).resource_spans
            for ss in rs.scope_spans for s in ss.spans]


def test_the_saved_inputs_are_found():
    assert len(INPUTS) >= 40 and any("corpus" in d for d, _ in INPUTS) and any("fixtures" in d for d, _ in INPUTS)


@native
@pytest.mark.parametrize("where,paths", INPUTS, ids=[d for d, _ in INPUTS])
def test_c_writes_the_mapping_records_of_every_saved_input(where, paths):
    timelines: list = []
    replay(paths, [timelines.append])
    requests = [t for t in timelines if isinstance(t, RequestTimeline)]
    for t in requests:
        fast = WireEncoder({"service.name": "vllm"})
        fast.add(t)
        c_bytes = FAST_REQUEST(t, {})
        assert c_bytes is not None, f"{where}: the C declined {t.request_id}: nothing compared"
        want = [otlp.span(r) for r in mapping.request_spans(t)]
        assert _spans(fast.take().payload) == want, f"{where}: {t.request_id}"
        pure = WireEncoder({"service.name": "vllm"}, fast=None)
        pure.add(t)
        fast.add(t)
        assert fast.take().payload == pure.take().payload, f"{where}: {t.request_id}: C and Python bytes differ"
        chunks: list[bytes] = []
        pure._request(t, chunks)
        assert c_bytes == b"".join(chunks), f"{where}: {t.request_id}: the C's own bytes differ"


def test_the_saved_inputs_hold_both_halves_of_disaggregated_requests():
    """The comparison above covers P/D: the recorded prefill/decode runs give halves of each role
    (mapping.pd_key) and decodes that link to their prefill."""
    paths = dict(INPUTS)[os.path.join("tests", "fixtures", "distributed")]
    timelines: list = []
    replay(paths, [timelines.append])
    roles = [mapping.pd_key(t)[0] for t in timelines if isinstance(t, RequestTimeline) and mapping.pd_key(t)]
    assert roles.count(mapping.PD_PREFILL) >= 5 and roles.count(mapping.PD_DECODE) >= 5, roles


@native
def test_the_c_follows_the_names_the_mapping_gives(tmp_path):
    """Renamed in `mapping` before the encoder loads, every name shows up renamed in the C's bytes
    and they still decode to the mapping's records: nothing of the mapping is spelled in C."""
    code = """
import sys
from bridge.export import mapping
renamed = dict(REQUEST_SPAN="x.req", ENGINE_SPAN="x.eng", KIND_SERVER=5, KIND_INTERNAL=4, REQUEST_IDS="rq",
               ENGINE_IDS="en", TIMING="x.t", TIMING_START="x.t0", TIMING_END="x.t1", INCIDENT_KIND="x.ik",
               PD_IDS="x.pd", PD_ROLE="x.role", PD_PREFILL="x.pre", PD_DECODE="x.dec", INTERNAL_ID="x.iid",
               PD_REMOTE_REQUEST="x.rrid", PD_ENGINE="x.eid", PD_REMOTE_ENGINE="x.reid", PD_PREFILL_ROOT=7,
               PD_DECODE_ROOT=9)
was = {k: getattr(mapping, k) for k in renamed}
for k, v in renamed.items():
    setattr(mapping, k, v)
# The P/D attributes as the renamed mapping reads them (the assembler writes its own names)
keys = {was[k]: renamed[k] for k in ("PD_ROLE", "INTERNAL_ID", "PD_REMOTE_REQUEST", "PD_ENGINE", "PD_REMOTE_ENGINE")}
roles = {was[k]: renamed[k] for k in ("PD_PREFILL", "PD_DECODE")}
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from bridge.assemble.timeline import RequestTimeline
from bridge.export import otlp
from bridge.export.wire import FAST_REQUEST, WireEncoder
from bridge.pipeline import replay
assert FAST_REQUEST is not None
out = []
replay(sys.argv[1:], [out.append])
reqs = [t for t in out if isinstance(t, RequestTimeline)]
for t in reqs:
    t.attrs = {keys.get(k, k): roles.get(v, v) if k == was["PD_ROLE"] else v for k, v in t.attrs.items()}
links = phases = halves = pd_links = 0
for t in reqs:
    if mapping.pd_key(t) is not None:
        halves += 1
    assert FAST_REQUEST(t, {}) is not None
    enc = WireEncoder({})
    enc.add(t)
    got = [s for rs in ExportTraceServiceRequest.FromString(enc.take().payload).resource_spans
           for ss in rs.scope_spans for s in ss.spans]
    assert got == [otlp.span(r) for r in mapping.request_spans(t)], t.request_id
    assert got[0].name == "x.req" and got[0].kind == 5
    assert {"x.t0", "x.t1"} <= {kv.key for kv in got[0].attributes}
    for s in got[1:]:
        phases += 1
        assert s.kind == 4 and {"x.t", "x.t0", "x.t1"} <= {kv.key for kv in s.attributes}
    pd = mapping.pd_key(t)
    if pd is not None:  # its ids from the renamed P/D names, a decode's first link to its prefill
        assert got[0].span_id == mapping.pd_ids(pd[1], pd[0])[1]
        if pd[0] == "x.dec":
            assert got[0].links[0].span_id == mapping.pd_ids(pd[1], "x.pre")[1] and not got[0].links[0].attributes
            pd_links += 1
    for link in got[0].links[1 if pd is not None and pd[0] == "x.dec" else 0:]:
        links += 1
        assert [kv.key for kv in link.attributes] == ["x.ik"]
print(len(reqs), phases, links, halves, pd_links)
"""
    from bridge.synth import SynthConfig, write_file

    log = str(tmp_path / "synth.log")  # phases, preemptions, incidents with requests in flight
    write_file(log, SynthConfig(requests=80, seed=7, preempt_ratio=0.3, nccl_incidents=2, oom_failures=2))
    paths = [log, *sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "upstream", "*"))),
             *(os.path.join(ROOT, "tests", "fixtures", "distributed", f) for f in ("prefill.log", "decode.log"))]
    out = subprocess.run([sys.executable, "-c", code, *paths], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    reqs, phases, links, halves, pd_links = map(int, out.stdout.split())
    assert reqs > 10 and phases > 10 and links > 0 and halves >= 10 and pd_links >= 5  # every rule was exercised
