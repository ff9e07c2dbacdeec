"""The assembled trace of a disaggregated request and of a DP=2 server (issue #34), from the
recorded real runs in tests/fixtures/distributed/: what the assembler's state-table rows for
distributed serving (bridge/assemble/kvlines.py) and the ids of both halves
(bridge/export/mapping.py `pd_ids`) make true (docs/distributed.md says why each expectation is
what it is).

The expectations come from the client's record (`*_truth.json`) and vLLM's own lines, not from
the bridge's output: the two halves of a request are the prefill and decode requests with the
client's X-Request-Id, linked by the prefill engine request id the proxy carried in
`kv_transfer_params.remote_request_id`.
"""

from __future__ import annotations

import json
from datetime import datetime
import re
import shutil
from pathlib import Path

import pytest

from bridge.export.otlp import request_spans
from bridge.pipeline import replay

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "distributed"



def truth(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def ok(t: dict) -> list[dict]:
    return [r for r in t["requests"] if r["status"] == 200]


def _timelines(paths, tmp_path) -> list:
    """The request timelines of a replay of these logs, each copied into its own pod-like
    directory (two sources, as two agents see them)."""
    files = []
    for p in paths:
        d = tmp_path / p.stem
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, d / "0.log")
        files.append(str(d / "0.log"))
    out = []
    replay(files, [out.append])
    return [t for t in out if hasattr(t, "phases")]


def roots(paths, tmp_path) -> dict:
    """{(request id, role): root span} and {(request id, role): [child spans]} of a replay of
    these logs, each copied into its own pod-like directory (two sources, as two agents see them)."""
    got, children = {}, {}
    for t in _timelines(paths, tmp_path):
        spans = request_spans(t)
        root = spans[0]
        attrs = {kv.key: kv.value for kv in root.attributes}
        role = attrs.get("vllm.pd.role")
        role = role.string_value if role is not None else None
        got[(t.request_id, role)] = (root, attrs)
        children[(t.request_id, role)] = spans[1:]
    return got, children


def _s(v):
    return None if v is None else (v.string_value or v.int_value)


@pytest.fixture
def pd(tmp_path):
    p, d = FIXTURES / "prefill.log", FIXTURES / "decode.log"
    together = roots([p, d], tmp_path / "both")
    alone = ({**roots([p], tmp_path / "p")[0], **roots([d], tmp_path / "d")[0]})
    return truth("pd_truth.json"), together, alone


def test_both_halves_are_one_trace_whichever_files_an_agent_reads(pd):
    t, (got, _children), alone = pd
    for r in ok(t):
        rid = f"cmpl-{r['x_request_id']}-0"
        (pre, _), (dec, _) = got[(rid, "prefill")], got[(rid, "decode")]
        assert pre.trace_id == dec.trace_id
        # an agent that reads only one half derives the same ids
        assert alone[(rid, "prefill")][0].trace_id == pre.trace_id
        assert alone[(rid, "decode")][0].trace_id == dec.trace_id
        assert alone[(rid, "prefill")][0].span_id == pre.span_id
        assert alone[(rid, "decode")][0].span_id == dec.span_id


def test_each_root_says_its_role_and_the_decode_names_the_prefills_engine_and_request(pd):
    # from each half's own Received request line: the same whichever files an agent reads
    t, (got, _children), alone = pd
    for r in ok(t):
        rid = f"cmpl-{r['x_request_id']}-0"
        for roots_ in (got, alone):
            (_pre, pre_attrs), (_dec, dec_attrs) = roots_[(rid, "prefill")], roots_[(rid, "decode")]
            assert _s(dec_attrs["vllm.pd.remote_engine_id"]) == t["prefill_engine_id"]
            assert _s(dec_attrs["vllm.pd.remote_request_id"]) == r["remote_request_id"]
            assert _s(pre_attrs["vllm.request.internal_id"]) == r["remote_request_id"]
            assert "vllm.pd.remote_request_id" not in pre_attrs
            assert _s(dec_attrs["vllm.request.internal_id"]) != r["remote_request_id"]


def test_each_root_says_its_role_and_the_remote_engine_and_the_decode_links_to_the_prefill(pd):
    t, (got, _children), alone = pd
    for r in ok(t):
        rid = f"cmpl-{r['x_request_id']}-0"
        (pre, pre_attrs), (dec, dec_attrs) = got[(rid, "prefill")], got[(rid, "decode")]
        assert _s(dec_attrs["vllm.pd.remote_engine_id"]) == t["prefill_engine_id"]
        assert _s(dec_attrs["vllm.pd.remote_request_id"]) == r["remote_request_id"]
        assert _s(pre_attrs["vllm.request.internal_id"]) == r["remote_request_id"]
        links = [(lk.trace_id, lk.span_id) for lk in dec.links]
        assert (pre.trace_id, pre.span_id) in links
        # derivable from the decode's own lines alone
        assert (pre.trace_id, pre.span_id) in [(lk.trace_id, lk.span_id) for lk in alone[(rid, "decode")][0].links]
        assert pre.end_time_unix_nano <= dec.end_time_unix_nano


def test_the_kv_transfer_span_lies_inside_the_decodes_queued_time_and_kv_hold_on_the_prefill(pd):
    t, (got, children), _alone = pd
    for r in ok(t):
        rid = f"cmpl-{r['x_request_id']}-0"
        dec_children = {s.name: s for s in children[(rid, "decode")]}
        pre_children = {s.name: s for s in children[(rid, "prefill")]}
        xfer, queued = dec_children["kv_transfer"], dec_children["queued"]
        assert queued.start_time_unix_nano <= xfer.start_time_unix_nano < xfer.end_time_unix_nano
        assert xfer.end_time_unix_nano <= dec_children["prefill"].end_time_unix_nano
        hold = pre_children["kv_hold"]
        # The prefill holds the blocks from its end (before the proxy sends the decode its
        # request) until the read (or the lease) is over: NIXL's read carries the notification
        # that frees them (pull_worker.py: `make_prepped_xfer(…, notif_msg=notif_id)`), delivered
        # as the read completes, while the decode's scheduler learns of it a worker poll and a
        # step later (`arrived_at`): so the release may come a few ms before the transfer's end
        # (4.6 and 8.7 ms in the recording), but never before the decode began waiting.
        assert hold.start_time_unix_nano <= xfer.start_time_unix_nano < hold.end_time_unix_nano
        assert hold.start_time_unix_nano < hold.end_time_unix_nano


def test_each_dp_root_carries_the_rank_of_the_engine_that_served_it(tmp_path):
    if not (FIXTURES / "dp.log").exists():
        pytest.skip("no DP fixture recorded")
    t = truth("dp_truth.json")
    got, _children = roots([FIXTURES / "dp.log"], tmp_path)
    served: dict[str, int] = {}
    for r in ok(t):
        _root, attrs = got[(f"cmpl-{r['x_request_id']}-0", None)]
        rank = _s(attrs["vllm.dp.rank"])
        served[str(rank)] = served.get(str(rank), 0) + 1
    assert served == {k: v for k, v in t["finished_per_engine"].items() if v}


def _phases(t) -> dict:
    return {p.name: p for p in t.phases}


def test_a_lease_nixl_reaped_is_an_event_on_its_prefill_and_ends_kv_hold_at_the_release(tmp_path):
    """NIXL's own WARNING names the prefill engine request id whose lease ran out (vLLM's
    `kv_lease_duration`, 30 s by default): that prefill's root has the event, its `kv_hold` says
    so and lasts the lease; the prefills the decode read in time have neither."""
    log = FIXTURES / "pd_expiry_prefill.log"
    expired = set(re.findall(r"Releasing expired KV blocks for request (\S+) ", log.read_text()))
    t = truth("pd_expiry_truth.json")
    assert expired and expired < {r["remote_request_id"] for r in ok(t)}
    prefills = {x.attrs["vllm.request.internal_id"]: x for x in _timelines([log], tmp_path)
                if x.attrs.get("vllm.pd.role") == "prefill"}
    assert set(prefills) == {r["remote_request_id"] for r in ok(t)}
    for eid, x in prefills.items():
        hold = _phases(x)["kv_hold"]
        names = [e.name for e in x.events]
        assert ("vllm.kv.lease_expired" in names) == (eid in expired) == hold.attrs["vllm.kv_hold.expired"]
        if eid in expired:
            assert hold.end_ns - hold.start_ns >= 30 * 1_000_000_000
            assert x.end_ns >= hold.end_ns


def test_a_failed_kv_load_is_the_decodes_error_with_nixls_failure_type(tmp_path):
    """The recorded handshake timeout: the client got HTTP 500; NIXL's line names the decode's
    engine request id and the failure type: an exception on that request, its error."""
    t = truth("pd_fail_truth.json")
    assert [r["status"] for r in t["requests"]] == [500]
    log = FIXTURES / "pd_fail_decode.log"
    failure = re.search(r"NIXL transfer failure: (\w+) \| Context: \{[^}]*'request_id': '([^']+)'", log.read_text())
    dec = [x for x in _timelines([log], tmp_path) if x.request_id == f"cmpl-{t['requests'][0]['x_request_id']}-0"]
    assert len(dec) == 1 and dec[0].attrs["vllm.pd.role"] == "decode"
    x = dec[0]
    assert x.attrs["vllm.request.internal_id"] == failure.group(2)
    assert x.outcome == "failed" and x.attrs["error.type"] == x.error_type == "distributed"
    kv = [e for e in x.events if e.name == "exception" and e.attrs["exception.type"] == "KvTransferFailed"]
    assert [e.attrs["exception.message"] for e in kv] == [f"NIXL transfer failure: {failure.group(1)}"]
    assert "kv_transfer" not in _phases(x)


def test_vllms_kv_transfer_metrics_are_events_on_the_decodes_in_flight(tmp_path):
    """Each `KV Transfer metrics` line (the aggregate) is an event on the requests in flight then,
    with vLLM's figures in seconds: the first line of the recording, 594.429 ms, 1 transfer."""
    log = FIXTURES / "decode.log"
    text = log.read_text()

    def at(stamp):
        return datetime.fromisoformat(stamp[:26] + "+00:00")

    # the decode's requests, from its own lines: `Received request` → the plugin's summary
    opened = {rid: at(ts) for ts, rid in re.findall(r"^(\S+)Z .*Received request (\S+): ", text, re.M)}
    closed = {rid: at(ts) for ts, rid in re.findall(r"^(\S+)Z .*\] Request (\S+): prompt_tokens=", text, re.M)}
    lines = []
    for stamp, n, ms in re.findall(r"^(\S+)Z .*KV Transfer metrics: Num successful transfers=(\d+), "
                                   r"Avg xfer time \(ms\)=([\d.]+)", text, re.M):
        # a line while the decode had no request open lands on none
        if any(opened[rid] <= at(stamp) <= closed[rid] for rid in opened):
            lines.append((n, ms))
    assert len(lines) == 3  # of 4: 00:02:42 came between pd-002's end and pd-003's receipt
    seen = {}
    for x in _timelines([log], tmp_path):
        for e in x.events:
            if e.name == "vllm.kv_transfer.metrics":
                seen[e.ts_ns] = (e.attrs["vllm.kv_transfer.count"], e.attrs["vllm.kv_transfer.avg_s"])
    assert sorted(seen.values()) == sorted((int(n), float(ms) / 1000) for n, ms in lines)


def test_a_prefill_lingers_for_its_release_line_but_no_longer_than_kv_hold_s():
    from bridge.assemble import Assembler
    from bridge.assemble.requests import AssembleConfig
    from bridge.decode.record import CLOCK_EXACT, Record
    from bridge.parse import events as ev
    from bridge.tail.source import source_for

    s = 1_000_000_000

    def rec(t, off):
        return Record(t * s, CLOCK_EXACT, "INFO", "x.py:1", "", off, off + 1)

    def run(release_at, kv_hold_s=60.0):
        out = []
        a = Assembler(source_for("x.log"), out.append, AssembleConfig(kv_hold_s=kv_hold_s))
        a.feed(rec(100, 0), ev.RequestReceived("cmpl-a-0", 1, None, None, None, None, pd_role="prefill"))
        a.feed(rec(100, 10), ev.RequestAdded("cmpl-a-0-12345678"))
        a.feed(rec(101, 20), ev.RequestSummary("cmpl-a-0", 5, 1, 0.5, 0.0, 1.0, 101 * s,
                                               ev.PluginTimes(arrival_ns=100 * s)))
        a.tick(110 * s)  # past linger_s (5 s): still held for the decode
        held = not out
        if release_at is not None:
            a.feed(rec(release_at, 30), ev.KvReleased("cmpl-a-0", "cmpl-a-0-12345678", 1, 101 * s, release_at * s))
        a.tick(200 * s)
        return held, out

    held, out = run(release_at=131)
    assert held and len(out) == 1 and _phases(out[0])["kv_hold"].end_ns == 131 * s
    held, out = run(release_at=None)  # no release line: out at kv_hold_s after its end
    assert held and len(out) == 1 and "kv_hold" not in _phases(out[0])
    held, out = run(release_at=None, kv_hold_s=3.0)
    assert not held  # a bound shorter than linger_s: linger_s rules


def test_the_wire_encoder_sends_both_halves_ids_and_the_link_as_the_mapping_says(tmp_path):
    """What a backend receives (the wire encoder's bytes, decoded by protobuf): the same trace
    for both halves and the decode's link to the prefill's root, C built or not (the C encoder
    leaves these timelines to the Python one)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from bridge.export.batch import OtlpSink
    from bridge.export.resource import base_resource
    from bridge.export.wire import WireEncoder
    from receivers import CapturingTransport

    files = []
    for p in (FIXTURES / "prefill.log", FIXTURES / "decode.log"):
        d = tmp_path / p.stem
        d.mkdir()
        shutil.copy(p, d / "0.log")
        files.append(str(d / "0.log"))
    transport = CapturingTransport()
    sink = OtlpSink(transport, base_resource({}), encoder=WireEncoder)
    replay(files, [sink])
    assert sink.close()
    roots_ = {}
    for payload in transport.payloads:
        for rs in ExportTraceServiceRequest.FromString(payload).resource_spans:
            for s in (s for ss in rs.scope_spans for s in ss.spans if s.name == "vllm.request"):
                attrs = {kv.key: kv.value.string_value for kv in s.attributes}
                roots_[(attrs["vllm.request.id"], attrs.get("vllm.pd.role"))] = s
    for r in ok(truth("pd_truth.json")):
        rid = f"cmpl-{r['x_request_id']}-0"
        pre, dec = roots_[(rid, "prefill")], roots_[(rid, "decode")]
        assert pre.trace_id == dec.trace_id
        assert [(lk.trace_id, lk.span_id) for lk in dec.links] == [(pre.trace_id, pre.span_id)]
        assert not pre.links and pre.span_id != dec.span_id


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_bad_kv_hold_fails_at_start_naming_the_field_and_the_fix(value):
    from bridge.config import ConfigError, load
    for file_data, env, flags, origin in ((None, {"VLLM_TRACE_BRIDGE_KV_HOLD": value}, {}, "VLLM_TRACE_BRIDGE_KV_HOLD"),
                                          ({"kv_hold": float(value)}, {}, {}, "config file"),
                                          (None, {}, {"kv_hold": value}, "--kv-hold")):
        with pytest.raises(ConfigError) as e:
            load(file_data, env, flags)
        text = str(e.value)
        assert text.startswith(f"kv_hold (from {origin}): ") and "give seconds greater than 0" in text
        assert "e.g. kv_hold: 60" in text
    with pytest.raises(ConfigError, match=r"kv_hold \(from config file\): expected a number"):
        load({"kv_hold": "a minute"}, {}, {})
    assert load(None, {"VLLM_TRACE_BRIDGE_KV_HOLD": "90"}, {})[0].kv_hold == 90.0
