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


def _emitted(paths, tmp_path, config=None) -> list:
    """Every timeline (requests and engine incidents) of a replay of these logs, each copied into
    its own pod-like directory (two sources, as two agents see them)."""
    files = []
    for p in paths:
        d = tmp_path / p.stem
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, d / "0.log")
        files.append(str(d / "0.log"))
    out = []
    if config is None:
        replay(files, [out.append])
    else:
        replay(files, [out.append], config)
    return out


def _timelines(paths, tmp_path) -> list:
    """The request timelines of a replay of these logs (`_emitted`)."""
    return [t for t in _emitted(paths, tmp_path) if hasattr(t, "phases")]


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


def test_a_failed_kv_load_ends_the_decode_at_vllms_failing_line_and_makes_no_engine_incident(tmp_path):
    """What vLLM logged for the one failed request: the handshake's failure with its traceback
    (ending `zmq.error.Again`), then the scheduler's `Failing 1 request(s) due to KV load failure
    … Request IDs: {<the decode's engine id>}` (scheduler.py `_handle_invalid_blocks`), and the
    engine went on serving (no death: its next line is the NIXL handshake that then passed). The
    request's root ends there, failed with the KV load failure; the traceback is the failure's,
    on the request, and no engine incident is made of any of it."""
    log = FIXTURES / "pd_fail_decode.log"
    text = log.read_text()
    (stamp, tokens, eid), = re.findall(r"^(\S+)Z .*Failing 1 request\(s\) due to KV load failure "
                                      r"\(failure_policy=fail, (\d+) tokens affected\)\. Request IDs: \{'([^']+)'\}",
                                      text, re.M)
    cause = re.findall(r"\[base_worker\.py:\d+\] (\w[\w.]*): Resource temporarily unavailable$", text, re.M)
    out = _emitted([log], tmp_path)
    incidents = [t for t in out if not hasattr(t, "phases") and t.kind != "startup"]
    assert incidents == []
    (x,) = [t for t in out if hasattr(t, "phases") and t.attrs.get("vllm.request.internal_id") == eid]
    assert x.outcome == "failed" and x.error_type == "distributed"
    assert x.error_message.startswith("KV load failure") and f"{tokens} tokens" in x.error_message
    ended = datetime.fromisoformat(stamp[:26] + "+00:00")
    load = [e for e in x.events if e.name == "exception" and e.attrs["exception.type"] == "KvLoadFailed"]
    assert [e.ts_ns // 1000 for e in load] == [int(ended.timestamp() * 1e6)]
    (failed,) = [e for e in x.events if e.attrs.get("exception.type") == "KvTransferFailed"]
    assert failed.attrs["vllm.kv_transfer.cause"] == cause[-1] == "zmq.error.Again"
    # the plugin's end line, after the request ended there, still gives its counts
    (counts,) = re.findall(r"ended: finish=error, prompt_tokens=(\d+), generated_tokens=(\d+), total_latency=([\d.]+)s",
                           text)
    assert (x.attrs["gen_ai.usage.input_tokens"], x.attrs["gen_ai.usage.output_tokens"], x.attrs["vllm.e2e_s"]) == (
        int(counts[0]), int(counts[1]), float(counts[2]))


def test_a_prefill_killed_before_the_read_fails_the_decode_with_the_typed_failure_and_one_incident(tmp_path):
    """tests/fixtures/distributed/pd_kill (its README says how it was made): the proxy killed
    the prefill after its answer; the decode's read of a gone peer failed. vLLM's lines: the NIXL
    library's C++ `E… nixl_agent.cpp … postXferReq: remote agent … was disconnected`, vLLM's
    `NIXL transfer failure: transfer_setup_failed …` with a traceback ending in the class of the
    NIXL error, `Failing 1 request(s) due to KV load failure`, then a `notification_failed`
    naming an id that is no request of this log. The client got HTTP 500."""
    d = FIXTURES / "pd_kill"
    t = json.loads((d / "truth.json").read_text())
    (kill,) = [r for r in t["requests"] if r["x_request_id"] == "pd-kill"]
    assert kill["status"] == 500
    text = (d / "decode.log").read_text()
    (failure, eid, remote), = re.findall(r"NIXL transfer failure: (\w+)\. Deferring[^|]*\| Context: \{'failure_type': "
                                        r"'\w+', 'request_id': '([^']+)',.*'remote_request_id': '([^']+)'", text)
    assert remote == kill["remote_request_id"]
    (cause,) = re.findall(r"\[pull_worker\.py:562\] (\w[\w.]*): NIXL_ERR_REMOTE_DISCONNECT$", text, re.M)
    (failing,) = re.findall(r"Failing 1 request\(s\) due to KV load failure .*Request IDs: \{'([^']+)'\}", text)
    assert failing == eid
    out = _emitted([d / "decode.log"], tmp_path)
    requests = [x for x in out if hasattr(x, "phases")]
    (x,) = [r for r in requests if r.attrs.get("vllm.request.internal_id") == eid]
    assert x.request_id == "cmpl-pd-kill-0" and x.attrs["vllm.pd.remote_request_id"] == remote
    assert x.outcome == "failed" and x.error_type == "distributed" and x.error_message.startswith("KV load failure")
    (kv,) = [e for e in x.events if e.attrs.get("exception.type") == "KvTransferFailed"]
    assert kv.attrs["exception.message"] == f"NIXL transfer failure: {failure}"
    assert kv.attrs["vllm.kv_transfer.cause"] == cause
    # the library's C++ lines: one incident, typed, hitting the one request in flight; the
    # notification that names no request of this log goes on none
    incidents = [i for i in out if not hasattr(i, "phases") and i.kind != "startup"]
    assert [(i.kind, i.affected) for i in incidents] == [("distributed", ["cmpl-pd-kill-0"])]
    assert incidents[0].message.split("] ", 1)[1].startswith("postXferReq: remote agent")
    assert [e.attrs["vllm.incident.kind"] for e in x.events if e.name == "vllm.engine.incident"] == ["distributed"]
    others = [r for r in requests if r is not x]
    assert others and not [e for r in others for e in r.events if e.name in ("exception", "vllm.engine.incident")]


def test_invalid_blocks_after_the_release_are_an_event_on_the_prefills_own_root(tmp_path):
    """NIXL's `Potentially invalid KV blocks for unrecognized request <eid>` comes only after it
    reaped that request's lease (pull_worker.py `_get_new_notifs`: the decode's read notification
    for a request no longer held), so after the plugin's release line: 28 s and 8 s after it in
    the recording. A prefill whose lease expired lingers for it (`kv_hold_s` from the release),
    so the event is on its own root; the prefills read in time have none and are not held."""
    log = FIXTURES / "pd_expiry_prefill.log"
    text = log.read_text()
    invalid = {eid: datetime.fromisoformat(ts[:26] + "+00:00") for ts, eid in re.findall(
        r"^(\S+)Z .*Potentially invalid KV blocks for unrecognized request (\S+) were", text, re.M)}
    released = {eid: datetime.fromisoformat(ts[:26] + "+00:00") for ts, eid in re.findall(
        r"^(\S+)Z .*KV blocks released for request \S+ engine_request_id=([^,]+),", text, re.M)}
    assert len(invalid) == 2 and all(invalid[e] > released[e] for e in invalid)
    freed = {eid: float(t) for eid, t in re.findall(  # the plugin's own stamp of the free (`t=`)
        r"KV blocks released for request \S+ engine_request_id=([^,]+),.* t=([0-9.]+)", text)}
    prefills = {x.attrs["vllm.request.internal_id"]: x for x in _timelines([log], tmp_path)
                if x.attrs.get("vllm.pd.role") == "prefill"}
    assert set(invalid) < set(prefills)
    for eid, x in prefills.items():
        got = [e.ts_ns // 1000 for e in x.events if e.name == "vllm.kv.blocks_invalid"]
        assert got == ([int(invalid[eid].timestamp() * 1e6)] if eid in invalid else [])
        if eid in invalid:  # the root reaches its last line, the late one; kv_hold stays the release
            assert x.end_ns // 1000 == int(invalid[eid].timestamp() * 1e6)
            (hold,) = [p for p in x.phases if p.name == "kv_hold"]
            assert hold.end_ns // 1000 == round(freed[eid] * 1e6)


def test_the_short_lease_run_puts_each_late_read_on_the_prefill_it_names(tmp_path):
    """tests/fixtures/distributed/pd_lease (its README): a 6 s lease, a proxy that held `pd-late`
    14 s. Each `Potentially invalid` line comes after that request's expiry and release, at the
    prefill's next request (19 s and 5 s after the release here): within `kv_hold_s` of the
    release, so on the prefill's own root with its expiry; the prefills read in time have
    neither, and no incident is made."""
    d = FIXTURES / "pd_lease"
    t = json.loads((d / "truth.json").read_text())
    assert t["kv_lease_duration"] == 6 and all(r["status"] == 200 for r in t["requests"])
    (late,) = [r for r in t["requests"] if r["x_request_id"] == "pd-late"]
    held_s = late["proxy_held"][1] - late["proxy_held"][0]
    assert held_s > t["kv_lease_duration"]
    text = (d / "prefill.log").read_text()

    def stamps(pattern):
        return {eid: datetime.fromisoformat(ts[:26] + "+00:00").timestamp() for ts, eid in
                re.findall(r"^(\S+)Z .*" + pattern, text, re.M)}
    expired = stamps(r"Releasing expired KV blocks for request (\S+) which")
    released = stamps(r"KV blocks released for request \S+ engine_request_id=([^,]+),")
    invalid = stamps(r"Potentially invalid KV blocks for unrecognized request (\S+) were")
    assert late["remote_request_id"] in invalid and set(invalid) == set(expired)
    for eid, at in invalid.items():
        assert expired[eid] <= released[eid] < at < released[eid] + 60  # AssembleConfig's kv_hold_s
    out = _emitted([d / "prefill.log"], tmp_path)
    assert [x for x in out if not hasattr(x, "phases") and x.kind != "startup"] == []
    prefills = {x.attrs["vllm.request.internal_id"]: x for x in out if hasattr(x, "phases")}
    assert set(prefills) == {r["remote_request_id"] for r in t["requests"]}
    for eid, x in prefills.items():
        names = {e.name: e.ts_ns for e in x.events if e.name.startswith("vllm.kv.")}
        if eid in invalid:
            assert names["vllm.kv.lease_expired"] // 1000 == round(expired[eid] * 1e6)
            assert names["vllm.kv.blocks_invalid"] // 1000 == round(invalid[eid] * 1e6)
            assert _phases(x)["kv_hold"].attrs["vllm.kv_hold.expired"] is True
        else:
            assert names == {} and _phases(x)["kv_hold"].attrs["vllm.kv_hold.expired"] is False


def test_invalid_blocks_after_the_prefill_went_out_are_a_kv_transfer_span_in_its_trace(tmp_path):
    """With `kv_hold_s` shorter than the lease (10 s; NIXL's is 30 s), each prefill of the
    recording is emitted before its release, so NIXL's late `Potentially invalid` lines find it
    gone: each becomes a `kv_transfer` incident naming it, whose span is in that prefill's trace,
    under its root (both ids derive from the engine request id the line names, as the root's
    did), and no request in flight gets its event."""
    from bridge.assemble.requests import AssembleConfig
    from bridge.export.mapping import request_spans, spans
    from bridge.pipeline import ReplayConfig

    log = FIXTURES / "pd_expiry_prefill.log"
    text = log.read_text()
    invalid = {eid: datetime.fromisoformat(ts[:26] + "+00:00") for ts, eid in re.findall(
        r"^(\S+)Z .*Potentially invalid KV blocks for unrecognized request (\S+) were", text, re.M)}
    assert set(invalid) < {r["remote_request_id"] for r in ok(truth("pd_expiry_truth.json"))}
    out = _emitted([log], tmp_path, ReplayConfig(assemble=AssembleConfig(kv_hold_s=10.0)))
    prefills = {x.attrs["vllm.request.internal_id"]: x for x in out
                if hasattr(x, "phases") and x.attrs.get("vllm.pd.role") == "prefill"}
    roots = {eid: request_spans(x)[0] for eid, x in prefills.items()}
    incidents = [x for x in out if not hasattr(x, "phases") and x.kind == "kv_transfer"]
    assert sorted(x.attrs["vllm.request.internal_id"] for x in incidents) == sorted(invalid)
    for inc in incidents:
        eid = inc.attrs["vllm.request.internal_id"]
        assert inc.error_type == "distributed" and inc.affected == []
        assert inc.start_ns // 1000 == int(invalid[eid].timestamp() * 1e6)
        (span,) = spans(inc)
        assert (span.trace_id, span.parent_span_id) == (roots[eid].trace_id, roots[eid].span_id)
        assert span.span_id not in {r.span_id for r in roots.values()}
    assert not [e for x in prefills.values() for e in x.events if e.name == "vllm.kv.blocks_invalid"]


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
                # every field vLLM 0.32's NIXL line has (nixl/stats.py `reduce`), none left out
                assert set(e.attrs) == {f"vllm.kv_transfer.{k}" for k in (
                    "count", "avg_s", "p90_s", "avg_post_s", "p90_post_s", "avg_bytes", "throughput_bytes_per_s",
                    "avg_descriptors", "failed", "expired", "notifs_after_expiry")}
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


def test_an_expired_prefill_lingers_after_its_release_for_the_invalid_line_but_no_longer_than_kv_hold_s():
    """After `Releasing expired KV blocks` and the release, the prefill waits (kv_hold_s from the
    release) for NIXL's `Potentially invalid` line: it goes at the next tick after that line, or
    at the bound without one; a prefill read in time goes at its release."""
    from bridge.assemble import Assembler
    from bridge.assemble.requests import AssembleConfig
    from bridge.decode.record import CLOCK_EXACT, Record
    from bridge.parse import events as ev
    from bridge.tail.source import source_for

    s = 1_000_000_000
    eid = "cmpl-a-0-12345678"

    def rec(t, off):
        return Record(t * s, CLOCK_EXACT, "INFO", "x.py:1", "", off, off + 1)

    def run(expired, invalid_at):
        out, when = [], None
        a = Assembler(source_for("x.log"), out.append, AssembleConfig(kv_hold_s=60.0))
        a.feed(rec(100, 0), ev.RequestReceived("cmpl-a-0", 1, None, None, None, None, pd_role="prefill"))
        a.feed(rec(100, 10), ev.RequestAdded(eid))
        a.feed(rec(101, 20), ev.RequestSummary("cmpl-a-0", 5, 1, 0.5, 0.0, 1.0, 101 * s,
                                               ev.PluginTimes(arrival_ns=100 * s)))
        if expired:
            a.feed(rec(131, 30), ev.KvLeaseExpired(eid, 0))
        a.feed(rec(131, 40), ev.KvReleased("cmpl-a-0", eid, 1, 101 * s, 131 * s))
        closed_at_release = bool(out)
        for t in range(132, 260):
            if t == invalid_at:
                a.feed(rec(t, 50), ev.KvBlocksInvalid(eid))
            a.tick(t * s)
            if out and when is None:
                when = t
        return out, closed_at_release, when

    out, at_release, _when = run(expired=False, invalid_at=None)
    assert at_release and len(out) == 1
    out, at_release, when = run(expired=True, invalid_at=180)  # 49 s after the release: within kv_hold_s
    assert not at_release and when == 180
    assert [e.ts_ns for e in out[0].events if e.name == "vllm.kv.blocks_invalid"] == [180 * s]
    out, at_release, when = run(expired=True, invalid_at=None)
    assert not at_release and when == 191 and len(out) == 1  # the release + kv_hold_s (60 s)
    assert not [e for e in out[0].events if e.name == "vllm.kv.blocks_invalid"]


def test_a_lease_expiry_is_the_only_line_of_a_prefill_it_opens_one_root_never_a_second():
    """Stock vLLM names no request: NIXL's `Releasing expired KV blocks for request <eid>` may be
    all a log shows of a prefill (a lease is given only to a prefill that finished). One root,
    its start unknown and its end inferred; an expiry for a prefill emitted already opens none."""
    from bridge.assemble import Assembler
    from bridge.assemble.requests import AssembleConfig
    from bridge.decode.record import CLOCK_EXACT, Record
    from bridge.parse import events as ev
    from bridge.tail.source import source_for

    s = 1_000_000_000

    def rec(t, off):
        return Record(t * s, CLOCK_EXACT, "WARNING", "nixl_connector.py:1049", "", off, off + 1)

    out = []
    a = Assembler(source_for("x.log"), out.append, AssembleConfig(kv_hold_s=60.0))
    a.feed(rec(100, 0), ev.KvLeaseExpired("cmpl-unseen-0-12345678", 0))
    # a prefill the log showed, emitted well before its lease ran out (kv_hold_s shorter)
    a.feed(rec(200, 10), ev.RequestReceived("cmpl-b-0", 1, None, None, None, None, pd_role="prefill"))
    a.feed(rec(200, 20), ev.RequestAdded("cmpl-b-0-87654321"))
    a.feed(rec(201, 30), ev.RequestSummary("cmpl-b-0", 5, 1, 0.5, 0.0, 1.0, 201 * s, ev.PluginTimes(arrival_ns=200 * s)))
    for t in range(202, 400):
        a.tick(t * s)
    assert sorted(r.request_id for r in out) == ["cmpl-b-0", "cmpl-unseen-0"]
    a.feed(rec(400, 40), ev.KvLeaseExpired("cmpl-b-0-87654321", 0))
    a.flush()
    (unseen,) = [r for r in out if r.request_id == "cmpl-unseen-0"]
    assert (unseen.outcome, unseen.start_ns, unseen.end_ns) == ("finished", 100 * s, 100 * s)
    assert {k: unseen.attrs[k] for k in ("vllm.start_unknown", "vllm.end_inferred", "vllm.pd.role",
                                          "vllm.request.internal_id")} == {
        "vllm.start_unknown": True, "vllm.end_inferred": True, "vllm.pd.role": "prefill",
        "vllm.request.internal_id": "cmpl-unseen-0-12345678"}
    assert [e.name for e in unseen.events] == ["vllm.kv.lease_expired"]
    assert sorted(r.request_id for r in out) == ["cmpl-b-0", "cmpl-unseen-0"]  # no second root for b
    assert a.stats.orphan_lines == 1


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
