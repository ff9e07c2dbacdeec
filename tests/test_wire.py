"""End to end over the wire: generated logs → `replay` → a real OTLP receiver → compared with
the generator's ground truth (never with output of the code under test)."""

from __future__ import annotations

import io
from collections import defaultdict

import pytest
from receivers import GrpcReceiver, HttpReceiver, attrs

from bridge.cli import main
from bridge.synth import SynthConfig, write_file

MS = 1_000_000
SERVER = 2  # Span.SpanKind.SPAN_KIND_SERVER
ERROR = 2   # Status.StatusCode.STATUS_CODE_ERROR


def replay_into(endpoint: str, path: str, *extra: str, protocol: str = "grpc") -> tuple[int, str]:
    out = io.StringIO()
    code = main(["replay", path, "--otlp-endpoint", endpoint, "--protocol", protocol, *extra], env={}, out=out)
    return code, out.getvalue()


def traces(spans) -> dict[bytes, list]:
    by_trace = defaultdict(list)
    for _, s in spans:
        by_trace[s.trace_id].append(s)
    return by_trace


def expected_children(r) -> list[str]:
    names = []
    arrival_known = r.outcome in ("finished", "timeout")
    if arrival_known and (r.schedules or r.outcome == "timeout"):
        names.append("queued")
    if r.schedules:
        names.append("prefill")
    names += ["preempted"] * len(r.preemptions)
    if r.outcome == "finished":
        names.append("decode")
    if r.outcome != "incomplete" and r.last_free_ns is not None:
        names.append("freed")
    return sorted(names)


def expected_start(r) -> int:
    if r.outcome == "finished":
        return r.arrival_ns
    if r.outcome == "timeout":
        return r.arrival_ns
    return r.first_line_ns


def match_roots(truth, roots):
    """Pair each truth request with the one root of the same id that starts where it should."""
    by_id = defaultdict(list)
    for root in roots:
        by_id[attrs(root.attributes)["vllm.request.id"]].append(root)
    pairs = []
    for r in truth.requests:
        candidates = [s for s in by_id[r.request_id] if abs(s.start_time_unix_nano - expected_start(r)) <= MS]
        assert len(candidates) == 1, f"{r.request_id} ({r.outcome}) matched {len(candidates)} roots"
        pairs.append((r, candidates[0]))
    return pairs


@pytest.fixture(scope="module")
def cri_run(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("logs") / "cri.log")
    truth = write_file(path, SynthConfig(requests=120, seed=7, cri=True, preempt_ratio=0.3))
    with GrpcReceiver() as rx:
        code, out = replay_into(rx.endpoint, path)
    return truth, rx, code, out, path


def test_every_request_arrives_once_with_the_right_shape(cri_run):
    truth, rx, code, out, _ = cri_run
    assert code == 0, out
    by_trace = traces(rx.spans())
    roots = [s for spans in by_trace.values() for s in spans if s.name == "vllm.request"]
    engines = [s for spans in by_trace.values() for s in spans if s.name == "vllm.engine"]
    assert len(roots) == len(truth.requests)
    assert len(engines) == len(truth.incidents)
    for r, root in match_roots(truth, roots):
        spans = by_trace[root.trace_id]
        children = [s for s in spans if s is not root]
        assert root.kind == SERVER and root.parent_span_id == b""
        assert all(c.parent_span_id == root.span_id for c in children)
        assert sorted(c.name for c in children) == expected_children(r), r
        a = attrs(root.attributes)
        assert a["vllm.outcome"] == r.outcome
        assert a["vllm.preemptions"] == len(r.preemptions)
        assert a["vllm.kv_blocks"] == r.blocks_allocated
        assert a["vllm.kv_blocks.freed"] == r.blocks_freed
        if r.outcome == "finished":
            assert a["gen_ai.usage.input_tokens"] == r.prompt_tokens
            assert a["gen_ai.usage.output_tokens"] == r.generated_tokens
            assert a["vllm.ttft_s"] == pytest.approx(r.ttft_s, abs=1e-4)
            assert a["vllm.e2e_s"] == pytest.approx(r.e2e_s, abs=1e-4)
            assert ("slow_ttft" in a.get("vllm.diagnosis", [])) == (r.ttft_s > 0.2)
            assert ("slow_itl" in a.get("vllm.diagnosis", [])) == (r.itl_s > 0.05)
        assert ("preempted" in a.get("vllm.diagnosis", [])) == bool(r.preemptions)
        if r.error_type:
            assert a["error.type"] == r.error_type
            assert root.status.code == ERROR
            exc = [e for e in root.events if e.name == "exception"]
            assert len(exc) == 1 and attrs(exc[0].attributes)["exception.message"]
        else:
            assert "error.type" not in a and root.status.code != ERROR


def test_boundaries_match_the_truth_to_a_millisecond(cri_run):
    truth, rx, *_ = cri_run
    by_trace = traces(rx.spans())
    roots = [s for spans in by_trace.values() for s in spans if s.name == "vllm.request"]
    checked = 0
    for r, root in match_roots(truth, roots):
        phases = defaultdict(list)
        for s in by_trace[root.trace_id]:
            phases[s.name].append(s)
        if r.outcome == "finished":
            (q,), (sch,), (gen,) = phases["queued"], phases["prefill"], phases["decode"]
            # reported durations fix arrival and first token
            assert abs(q.start_time_unix_nano - r.arrival_ns) <= MS
            assert abs(sch.end_time_unix_nano - r.first_token_ns) <= MS
            assert abs(gen.start_time_unix_nano - r.first_token_ns) <= MS
            # CRI stamps give observed boundaries
            assert abs(q.end_time_unix_nano - r.schedules[0]) <= MS
            assert abs(sch.start_time_unix_nano - r.schedules[0]) <= MS
            assert abs(gen.end_time_unix_nano - r.finish_ns) <= MS
            (fr,) = phases["freed"]
            assert abs(fr.start_time_unix_nano - r.finish_ns) <= MS
            assert abs(fr.end_time_unix_nano - r.last_free_ns) <= MS
            checked += 1
        got = sorted((p.start_time_unix_nano, p.end_time_unix_nano) for p in phases["preempted"])
        if r.outcome != "incomplete":
            for (gs, ge), (ts, te) in zip(got, sorted(r.preemptions)):
                assert abs(gs - ts) <= MS and abs(ge - te) <= MS
    assert checked > 80


def test_events_are_capped_and_engine_incidents_reach_requests_in_flight(cri_run):
    truth, rx, *_ = cri_run
    spans = rx.spans()
    for _, s in spans:
        blocks = [e for e in s.events if e.name.startswith("vllm.kv_block.")]
        assert len(blocks) <= 32
    engines = {attrs(s.attributes)["vllm.incident.kind"]: s for _, s in spans if s.name == "vllm.engine"}
    assert set(engines) == {i.kind for i in truth.incidents}
    nccl = next(i for i in truth.incidents if i.kind == "nccl_timeout")
    span = engines["nccl_timeout"]
    assert span.status.code == ERROR
    assert abs(span.start_time_unix_nano - nccl.start_ns) <= MS and abs(span.end_time_unix_nano - nccl.ts_ns) <= MS
    assert "network congestion" in attrs(span.attributes)["vllm.incident.causes"]
    in_flight = {
        r.request_id for r in truth.requests
        if r.first_line_ns <= nccl.ts_ns and (r.finish_ns is None or nccl.ts_ns < r.finish_ns)
    }
    marked = {
        attrs(s.attributes)["vllm.request.id"] for _, s in spans if s.name == "vllm.request"
        and any(e.name == "vllm.engine.incident" and attrs(e.attributes)["vllm.incident.kind"] == "nccl_timeout"
                for e in s.events)
    }
    assert marked == in_flight and in_flight
    assert attrs(span.attributes)["vllm.requests_affected"] == len(in_flight)


def test_resource_carries_service_and_source(cri_run):
    _, rx, _, _, path = cri_run
    res, _ = rx.spans()[0]
    assert res["service.name"] == "vllm"
    assert res["log.file.path"] == path
    assert res["host.name"]


def test_http_protobuf_carries_the_same_spans(cri_run):
    _, grpc_rx, _, _, path = cri_run
    with HttpReceiver() as rx:
        code, out = replay_into(rx.endpoint, path, protocol="http/protobuf")
    assert code == 0, out
    assert rx.requests

    def key(spans):
        return sorted(s.SerializeToString(deterministic=True) for _, s in spans)

    assert key(rx.spans()) == key(grpc_rx.spans())


def test_replaying_twice_gives_byte_identical_ids(cri_run):
    _, first, _, _, path = cri_run
    with GrpcReceiver() as rx:
        code, _ = replay_into(rx.endpoint, path)
    assert code == 0
    ids = sorted((s.trace_id, s.span_id, s.parent_span_id) for _, s in rx.spans())
    assert ids == sorted((s.trace_id, s.span_id, s.parent_span_id) for _, s in first.spans())
    assert len({i[1] for i in ids}) == len(ids)


def test_header_only_logs_keep_reported_durations_to_a_millisecond(tmp_path):
    path = str(tmp_path / "plain.log")
    truth = write_file(path, SynthConfig(requests=60, seed=3))
    with GrpcReceiver() as rx:
        code, out = replay_into(rx.endpoint, path, "--year", "2025")
    assert code == 0, out
    by_trace = traces(rx.spans())
    truth_by_id = defaultdict(list)
    for r in truth.requests:
        truth_by_id[r.request_id].append(r)
    checked = 0
    for spans in by_trace.values():
        names = {s.name: s for s in spans}
        root = names.get("vllm.request")
        if root is None or attrs(root.attributes)["vllm.outcome"] != "finished":
            continue
        a = attrs(root.attributes)
        arrival = names["queued"].start_time_unix_nano
        first_token = names["decode"].start_time_unix_nano
        end = names["decode"].end_time_unix_nano
        # the one truth request with these reported figures
        (r,) = [t for t in truth_by_id[a["vllm.request.id"]] if t.e2e_s == pytest.approx(a["vllm.e2e_s"], abs=1e-6)]
        assert abs((first_token - arrival) - r.ttft_s * 1e9) <= MS
        assert abs((end - arrival) - r.e2e_s * 1e9) <= MS
        assert abs((end - arrival) - (r.finish_ns - r.arrival_ns)) <= MS
        # one-second stamps: the observed finish is the truth floored to its second
        assert end == r.finish_ns // 1_000_000_000 * 1_000_000_000
        checked += 1
    assert checked >= 50


def test_retryable_errors_are_retried_and_nothing_is_lost(tmp_path, monkeypatch):
    path = str(tmp_path / "cri.log")
    truth = write_file(path, SynthConfig(requests=30, seed=11, cri=True))
    with GrpcReceiver(fail_first=1) as rx:
        code, out = replay_into(rx.endpoint, path)
    assert code == 0, out
    assert rx.rejected == 1
    roots = [s for _, s in rx.spans() if s.name == "vllm.request"]
    assert len(roots) == len(truth.requests)


def test_unreachable_receiver_fails_with_exit_1_and_counts_what_was_not_delivered(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    path = str(tmp_path / "cri.log")
    write_file(path, SynthConfig(requests=10, seed=2, cri=True))
    with GrpcReceiver() as rx:
        endpoint = rx.endpoint  # a port that was just closed again
    code, out = replay_into(endpoint, path)
    assert code == 1
    assert "NOT delivered" in out
    assert "export_failed" in capsys.readouterr().err


@pytest.mark.parametrize("encoder", ["wire", "reference"])
def test_batches_stop_growing_at_their_byte_bound(tmp_path, encoder):
    """A receiver refuses a message over its limit (the Collector: 4 MiB on gRPC), and a refused
    batch is retried until dropped: a batch closes once its spans reach `max_bytes`, whatever
    the span count. Checked on the bytes the receiver got, decoded independently."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from bridge.export.batch import OtlpSink
    from bridge.export.resource import base_resource
    from bridge.export.reference import ProtoEncoder
    from bridge.export.wire import WireEncoder
    from bridge.pipeline import replay
    from receivers import CapturingTransport

    path = tmp_path / "seed.log"
    write_file(str(path), SynthConfig(requests=300, seed=5))
    transport = CapturingTransport()
    bound = 20_000
    sink = OtlpSink(transport, base_resource({}), max_batch=100_000, max_bytes=bound,
                    encoder=WireEncoder if encoder == "wire" else ProtoEncoder)
    replay([str(path)], [sink])
    assert sink.close()
    sizes, spans = [], 0
    for payload in transport.payloads:
        req = ExportTraceServiceRequest.FromString(payload)
        got = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        spans += len(got)
        sizes.append(sum(1 + len(_varint(s.ByteSize())) + s.ByteSize() for s in got))  # as fields of ScopeSpans
    biggest_request = 60_000  # a request's spans: events capped (state.EVENT_CAP, block events)
    assert len(sizes) > 5 and all(s < bound + biggest_request for s in sizes), sizes
    assert all(s >= bound for s in sizes[:-1]), sizes  # none sent before it was full
    assert spans == sink.stats.spans_sent


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)
