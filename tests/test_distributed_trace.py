"""The assembled trace of a disaggregated request and of a DP=2 server (issue #34), from the
recorded real runs in tests/fixtures/distributed/: what the assembler's state-table rows for
distributed serving must make true. Strict xfail until those rows land; then each test must
pass as written (docs/distributed.md says why each expectation is what it is).

The expectations come from the client's record (`*_truth.json`) and vLLM's own lines, not from
the bridge's output: the two halves of a request are the prefill and decode requests with the
client's X-Request-Id, linked by the prefill engine request id the proxy carried in
`kv_transfer_params.remote_request_id`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bridge.export.otlp import request_spans
from bridge.pipeline import replay

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "distributed"

_NOT_YET = "#34: the assembler's P/D rows are not there yet; see docs/distributed.md"


def truth(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def ok(t: dict) -> list[dict]:
    return [r for r in t["requests"] if r["status"] == 200]


def roots(paths, tmp_path) -> dict:
    """{(request id, role): root span} and {(request id, role): [child spans]} of a replay of
    these logs, each copied into its own pod-like directory (two sources, as two agents see them)."""
    files = []
    for p in paths:
        d = tmp_path / p.stem
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, d / "0.log")
        files.append(str(d / "0.log"))
    out = []
    replay(files, [out.append])
    got, children = {}, {}
    for t in out:
        if not hasattr(t, "phases"):
            continue
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


@pytest.mark.xfail(strict=True, reason=_NOT_YET)
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


@pytest.mark.xfail(strict=True, reason=_NOT_YET)
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


@pytest.mark.xfail(strict=True, reason=_NOT_YET)
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
        # the prefill holds the blocks from its end until after the decode's transfer ended
        assert hold.end_time_unix_nano >= xfer.end_time_unix_nano - 1_000_000
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
