"""The trace context rule: which request ids carry a caller's context, and which fall back."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bridge.parse.context import TraceContext, make_rule, regex_rule, w3c_rule
from bridge.export.reference import ProtoEncoder
from bridge.export.wire import WireEncoder
from bridge.pipeline import ReplayConfig, replay

T, S = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
CHILD = TraceContext(bytes.fromhex(T), bytes.fromhex(S))
JOIN = TraceContext(bytes.fromhex(T), None)


@pytest.mark.parametrize("rid, want", [
    # What vLLM 0.32 logs for `X-Request-Id: 00-T-S-01` (seen on a real server).
    (f"chatcmpl-00-{T}-{S}-01", CHILD),
    (f"cmpl-00-{T}-{S}-01-0", CHILD),
    (f"chatcmpl-00-{T}-{S}-01-827b679e", CHILD),        # V1 internal suffix
    (f"cmpl-00-{T}-{S}-01-0-aaf6a3a4", CHILD),
    (f"1_chatcmpl-00-{T}-{S}-01", CHILD),                # n>1 child
    (f"00-{T}-{S}-01", CHILD),                           # raw engine ids
    (f"chatcmpl-00-{T}-{S}-00", CHILD),                  # not sampled: still the caller's trace
    (f"chatcmpl-{T}-{S}", CHILD),
    (f"cmpl-{T}-{S}-0", CHILD),
    (f"chatcmpl-{T}", JOIN),
    (f"cmpl-{T}-0", JOIN),
])
def test_default_rule_reads_the_caller_context(rid, want):
    assert w3c_rule(rid) == want


@pytest.mark.parametrize("rid", [
    f"chatcmpl-00-{'0' * 32}-{S}-01",        # all-zero trace id
    f"chatcmpl-00-{T}-{'0' * 16}-01",        # all-zero span id
    f"chatcmpl-{'0' * 32}",
    f"chatcmpl-ff-{T}-{S}-01",               # version ff is invalid
    f"chatcmpl-0-{T}-{S}-01",                # version of one digit
    f"chatcmpl-00-{T[:-1]}-{S}-01",          # 31 hex trace
    f"chatcmpl-00-{T}0-{S}-01",              # 33 hex trace
    f"chatcmpl-00-{T}-{S[:-1]}-01",          # 15 hex span
    f"chatcmpl-00-{T}-{S}1-01",              # 17 hex span
    f"chatcmpl-00-{T}-{S}-1",                # flags of one digit
    f"chatcmpl-{T.upper()}",                 # W3C ids are lower case
    f"chatcmpl-{T[:8]}-{T[8:12]}-{T[12:16]}-{T[16:20]}-{T[20:]}",  # a dashed UUID is not a trace id
    "cmpl-8362cc1b7d470f8b-0",               # vLLM's own 16-hex ids
    "chatcmpl-b634eea6aeb3f023",
    "0x7f8c4a001b20",                         # seed dialect
    f"my-gateway-{T}-{S}-suffix",            # unknown decorations
    "",
])
def test_invalid_or_foreign_ids_fall_back(rid):
    assert w3c_rule(rid) is None


def test_custom_rule_and_off():
    rule = make_rule(r"trace=(?P<trace>[0-9a-f]{32});span=(?P<span>[0-9a-f]{16})")
    assert rule(f"chatcmpl-trace={T};span={S}") == CHILD
    assert rule(f"chatcmpl-trace={'0' * 32};span={S}") is None
    assert make_rule("off")(f"chatcmpl-00-{T}-{S}-01") is None
    assert make_rule("w3c") is w3c_rule
    assert regex_rule(r"(?P<trace>[0-9a-f]{32})")(f"x-{T}-y") == JOIN
    with pytest.raises(ValueError, match="trace"):
        make_rule(r"[0-9a-f]{32}")


def _request_timeline():
    out: list = []
    replay([str(Path(__file__).parent / "fixtures" / "upstream" / "v1_modern.log")], [out.append],
           ReplayConfig(year=2025))
    return next(t for t in out if hasattr(t, "phases"))


@pytest.mark.parametrize("parent", [CHILD, JOIN])
def test_wire_encoder_carries_the_parent_like_the_reference(parent):
    t = copy.copy(_request_timeline())
    own = copy.copy(t)
    t.parent = parent
    got = ExportTraceServiceRequest.FromString(_encode(WireEncoder, t))
    want = ExportTraceServiceRequest.FromString(_encode(ProtoEncoder, t))
    assert got == want
    spans = got.resource_spans[0].scope_spans[0].spans
    root = spans[0]
    assert root.name == "vllm.request" and root.trace_id == parent.trace_id
    assert root.parent_span_id == (parent.span_id or b"")
    assert all(s.trace_id == parent.trace_id for s in spans)
    assert all(s.parent_span_id == root.span_id for s in spans[1:])
    # The root's own id does not depend on the context: a re-send is byte-identical, and two
    # requests that carry the same context still get distinct spans.
    base = ExportTraceServiceRequest.FromString(_encode(WireEncoder, own)).resource_spans[0].scope_spans[0].spans[0]
    assert base.span_id == root.span_id and base.trace_id != root.trace_id


def _encode(cls, t) -> bytes:
    enc = cls({"service.name": "vllm"})
    enc.add(t)
    return enc.take().payload
