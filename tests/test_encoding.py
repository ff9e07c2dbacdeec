"""The fast wire encoder against the reference: its bytes, decoded with the opentelemetry-proto
stubs, are the very messages `otlp.request_spans` / `engine_spans` build."""

from __future__ import annotations

import copy
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

import bridge
from bridge.assemble.timeline import SpanEvent
from bridge.export.otlp import any_value
from bridge.export.reference import ProtoEncoder
from bridge.export.wire import KeyValues, WireEncoder, span_count, varint
from bridge.pipeline import ReplayConfig, replay
from bridge.synth import SynthConfig, write_file

SAMPLE = os.path.join(os.path.dirname(bridge.__file__), "samples", "seed.log")
RESOURCE = {"service.name": "vllm", "host.name": "node-1", "k8s.node.name": "n1"}


def timelines(*paths: str) -> list:
    out: list = []
    replay(list(paths), [out.append], ReplayConfig(year=2025))
    return out


def encode_both(tls, batch: int | None = None) -> tuple[list[bytes], list[bytes]]:
    """Payloads from both encoders, one per batch of `batch` timelines (all in one if None)."""
    fast, ref = WireEncoder(RESOURCE), ProtoEncoder(RESOURCE)
    got, want = [], []
    for i, t in enumerate(tls, 1):
        assert fast.add(t) == ref.add(t) == span_count(t)
        if batch and i % batch == 0:
            got.append(fast.take())
            want.append(ref.take())
    if fast.count:
        got.append(fast.take())
        want.append(ref.take())
    for g, w in zip(got, want):
        assert g.spans == w.spans
    return [g.payload for g in got], [w.payload for w in want]


def assert_same(got: bytes, want: bytes) -> None:
    g, w = ExportTraceServiceRequest.FromString(got), ExportTraceServiceRequest.FromString(want)
    if g != w:  # find the first difference, for a readable failure
        for grs, wrs in zip(g.resource_spans, w.resource_spans):
            assert grs.resource == wrs.resource
            for gs, ws in zip(grs.scope_spans[0].spans, wrs.scope_spans[0].spans):
                assert gs == ws
    assert g == w
    assert g.SerializeToString(deterministic=True) == w.SerializeToString(deterministic=True)


def test_the_sample_log_encodes_to_the_reference_messages():
    tls = timelines(SAMPLE)
    assert len(tls) > 50
    (got,), (want,) = encode_both(tls)
    assert_same(got, want)
    # every shape is present: errors, engine spans, dropped events, preemptions
    req = ExportTraceServiceRequest.FromString(got)
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert {s.name for s in spans} >= {"vllm.request", "vllm.engine", "queued", "prefill", "decode", "freed",
                                       "preempted"}
    assert any(s.status.code == 2 for s in spans)


def test_generated_logs_in_batches_and_from_two_sources_match_the_reference(tmp_path):
    a, b = str(tmp_path / "a.log"), str(tmp_path / "b.log")
    write_file(a, SynthConfig(requests=300, seed=9, cri=True, preempt_ratio=0.4, mean_interarrival_s=0.02))
    write_file(b, SynthConfig(requests=80, seed=4, oom_failures=3, nccl_incidents=2))
    tls = timelines(a, b)
    interleaved = [t for pair in zip(tls[::2], tls[1::2]) for t in pair]  # sources alternate in a batch
    got, want = encode_both(interleaved, batch=37)
    assert len(got) > 5
    for g, w in zip(got, want):
        assert_same(g, w)
    assert any(len(ExportTraceServiceRequest.FromString(g).resource_spans) == 2 for g in got)


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def test_engine_spans_of_real_logs_and_odd_incidents_match_the_reference():
    """Startups (ok and failed), engine deaths, OOM, NCCL, timeouts from the fixtures (real vLLM
    captures among them), and incidents no fixture has: a stack trace, no message, attributes
    of every type."""
    import dataclasses
    import glob

    from bridge.assemble import EngineTimeline

    engines = [t for path in sorted(glob.glob(os.path.join(FIXTURES, "**", "*.log"), recursive=True))
               for t in timelines(path) if isinstance(t, EngineTimeline)]
    assert {t.kind for t in engines} >= {"startup", "engine_dead", "oom", "model_load"}
    assert any(t.error_type for t in engines) and any(not t.error_type for t in engines)
    base = next(t for t in engines if t.error_type)
    odd = [dataclasses.replace(base, attrs={**base.attrs, "exception.stacktrace": "Traceback …\n  x", "n": 3,
                                            "f": 0.5, "flag": True, "list": ["a", "b"]}),
           dataclasses.replace(base, message="", attrs={"exception.type": "X"}),
           dataclasses.replace(base, kind="startup", error_type="", message="", attrs={})]
    (got,), (want,) = encode_both(engines + odd)
    assert_same(got, want)


def test_dropped_events_and_attribute_corner_cases(tmp_path):
    tls = timelines(SAMPLE)
    t = copy.deepcopy(next(t for t in tls if t.__class__.__name__ == "RequestTimeline" and t.phases))
    t.dropped_events = 300
    t.phases[0].dropped_events = 5
    t.error_type, t.error_message = "other", ""  # status ERROR with no message
    t.attrs.update({"neg": -5, "zero": 0, "big": 2**63 - 1, "false": False, "true": True, "empty": "",
                    "unicode": "é→✓", "list": ["a", "b"], "ints": [1, -2], "mixed": [True, 1, 1.5, "x"],
                    "tuple": ("a", "b"), "flt": -0.0, "vllm.timing.start": "overridden"})
    t.phases[0].attrs["vllm.timing"] = "preset"
    shared = SpanEvent("vllm.queue_state", 5, {"vllm.queue.running": 1})
    t.events += [shared, shared, SpanEvent("e", 0, {})]
    t.phases[0].events.append(shared)
    (got,), (want,) = encode_both([t, t])
    assert_same(got, want)


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.one_of(st.text(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False)),
    lambda inner: st.lists(inner, max_size=4), max_leaves=8))
def test_any_value_matches_the_proto_stubs(value):
    kv = KeyValues(0x0A)
    first, again = kv.kv("k", value), kv.kv("k", value)  # the second comes from the cache
    assert first == again == kv.all({"k": value})[0]  # and the batch path's lookups agree
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    got = Resource.FromString(first).attributes[0]
    want = any_value(value)
    assert got.key == "k" and got.value == want
    assert isinstance(want, AnyValue)


def test_cached_values_never_confuse_types():
    kv = KeyValues(0x0A)
    assert kv.kv("k", 1) != kv.kv("k", True)
    assert kv.kv("k", ["1"]) != kv.kv("k", "1")
    assert kv.kv("k", [True]) != kv.kv("k", [1])
    one, true, one_float, text = kv.kv("k", 1), kv.kv("k", True), kv.kv("k", 1.0), kv.kv("k", "1")
    assert kv.all({"k": 1}) == [one] and kv.all({"k": True}) == [true]
    assert kv.all({"k": 1.0}) == [one_float] and kv.all({"k": "1"}) == [text]
    assert len({one, true, one_float, text}) == 4


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 2**32, 2**64 - 1])
def test_varint(n):
    from google.protobuf.internal.encoder import _VarintBytes
    assert varint(n) == _VarintBytes(n)


def test_a_kubernetes_source_resource_matches_the_reference(tmp_path):
    d = tmp_path / "var/log/pods/ns_pod_0123abcd-0000/vllm"
    d.mkdir(parents=True)
    path = str(d / "3.log")
    write_file(path, SynthConfig(requests=5, seed=1, cri=True))
    (got,), (want,) = encode_both(timelines(path))
    assert_same(got, want)
    res = ExportTraceServiceRequest.FromString(got).resource_spans[0].resource
    assert {kv.key for kv in res.attributes} >= {"k8s.pod.name", "k8s.container.restart_count", "service.name"}


def test_ids_keep_their_derivation():
    """Replays after an upgrade must send the same ids: the blake2b derivation is pinned."""
    from hashlib import blake2b

    from bridge.export.ids import span_id, trace_id

    person = b"vllm-trace-bri"
    want_trace = blake2b(b"file//x.log\x1frequest\x1f0x7f\x1f123", digest_size=16, person=person).digest()
    assert trace_id("file//x.log", "request", "0x7f", "123") == want_trace
    want_span = blake2b(want_trace + b"preempted\x1f2", digest_size=8, person=person).digest()
    assert span_id(want_trace, "preempted", 2) == want_span
    assert span_id(want_trace, "queued") == blake2b(want_trace + b"queued\x1f0", digest_size=8, person=person).digest()
