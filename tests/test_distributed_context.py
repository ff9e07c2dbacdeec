"""A disaggregated request and its caller's trace context (issue #34; docs/distributed.md, "The
caller's trace context").

The recorded NIXL run (tests/fixtures/distributed/prefill.log, decode.log) is replayed with a
caller's W3C `traceparent` added where the plugin writes it (the end of its `Request …`
summary line), on no half, the prefill only, the decode only or both, as a proxy may forward
the header to either; and with the caller's context in the X-Request-Id both halves share. Each
variant is read as one agent reading both files (in both orders) and as two agents each
reading one: every reading must give the same roots. The rule (the lead's decision on #34): a
half that carried the caller's `traceparent` is in the caller's trace, under the caller's span
(requests sit inside the API gateway's trace); the key's own trace only without one; the
decode's root always links to the prefill's root.

Expectations come from the W3C traceparent written and from the documented id derivation,
computed here with hashlib, not from the bridge: the P/D key is the prefill's engine request id
the proxy carried (`pd_truth.json` `remote_request_id`); trace id = blake2b-16(person
`vllm-trace-bri`, "\\x1fpd\\x1f<key>\\x1f"); the prefill's root span id = blake2b-8(trace id +
"vllm.request\\x1f1"), the decode's "…\\x1f2".
"""

from __future__ import annotations

import json
import re
from hashlib import blake2b
from pathlib import Path

import pytest

from bridge.assemble.requests import AssembleConfig
from bridge.export.otlp import request_spans
from bridge.pipeline import ReplayConfig, replay

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "distributed"
TRUTH = json.loads((FIXTURES / "pd_truth.json").read_text())
DONE = [r for r in TRUTH["requests"] if r["status"] == 200]
PERSON = b"vllm-trace-bri"

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"   # the gateway's trace
PREFILL_LEG, DECODE_LEG = "00f067aa0ba902b7", "53995c3f42cd8ad8"  # the proxy's span for each leg


def pd_trace_id(key: str) -> bytes:
    return blake2b(f"\x1fpd\x1f{key}\x1f".encode(), digest_size=16, person=PERSON).digest()


def pd_root_span(trace: bytes, role: str) -> bytes:
    return blake2b(trace + f"vllm.request\x1f{1 if role == 'prefill' else 2}".encode(), digest_size=8,
                   person=PERSON).digest()


def with_traceparent(text: str, leg: str) -> str:
    """The log with the caller's traceparent on every plugin summary line (`Request <id>: …`)."""
    tp = f"00-{CALLER_TRACE}-{leg}-01"
    return re.sub(r"(\] Request cmpl-[^:]+: prompt_tokens=.*)$", lambda m: f"{m[1]}, traceparent={tp}", text,
                  flags=re.M)


def with_legs(case: str, pre: str, dec: str) -> tuple[str, str]:
    """The two logs with the caller's traceparent on the halves `case` names (`CASES`)."""
    on_prefill, on_decode = CASES[case]
    return (with_traceparent(pre, PREFILL_LEG) if on_prefill else pre,
            with_traceparent(dec, DECODE_LEG) if on_decode else dec)


def write(where: Path, name: str, text: str) -> Path:
    d = where / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "0.log").write_text(text)
    return d / "0.log"


def read(paths: list[Path]) -> dict:
    """{(request id, role): (trace id, span id, parent span id, links)} of one replay."""
    out: list = []
    replay([str(p) for p in paths], [out.append])
    got = {}
    for t in (t for t in out if hasattr(t, "phases")):
        root = request_spans(t)[0]
        attrs = {kv.key: kv.value.string_value for kv in root.attributes}
        key = (t.request_id, attrs.get("vllm.pd.role"))
        assert key not in got, key  # one root per half
        got[key] = (root.trace_id, root.span_id, root.parent_span_id,
                    [(lk.trace_id, lk.span_id, {kv.key: kv.value.string_value for kv in lk.attributes})
                     for lk in root.links])
    return got


def readings(pre: str, dec: str, where: Path) -> list[dict]:
    """The same two logs as one agent reads them (both orders) and as two agents do."""
    p, d = write(where, "prefill", pre), write(where, "decode", dec)
    alone = {**read([p]), **read([d])}
    return [read([p, d]), read([d, p]), alone]


CASES = {  # which halves the proxy forwarded the caller's traceparent to
    "none": (False, False),
    "prefill only": (True, False),
    "decode only": (False, True),
    "both": (True, True),
}


@pytest.mark.parametrize("case", CASES)
def test_a_half_that_carried_the_callers_traceparent_is_in_the_callers_trace(case, tmp_path):
    """The same roots whatever an agent reads; a header on both halves (a proxy forwarding the
    gateway's headers to both legs, llm-d's sidecar) keeps them in one trace, the gateway's, and
    the decode's link then names the prefill's root there; a header on one half only puts that
    half in the gateway's trace and the other in the key's (documented in distributed.md)."""
    on_prefill, on_decode = CASES[case]
    pre, dec = with_legs(case, (FIXTURES / "prefill.log").read_text(), (FIXTURES / "decode.log").read_text())
    caller = bytes.fromhex(CALLER_TRACE)
    for got in readings(pre, dec, tmp_path):
        for r in DONE:
            rid = f"cmpl-{r['x_request_id']}-0"
            trace = pd_trace_id(r["remote_request_id"])  # the key's: span ids always come from it
            pre_root, dec_root = pd_root_span(trace, "prefill"), pd_root_span(trace, "decode")
            p_tid, p_sid, p_parent, p_links = got[(rid, "prefill")]
            d_tid, d_sid, d_parent, d_links = got[(rid, "decode")]
            assert (p_tid, p_sid, p_parent) == (
                (caller, pre_root, bytes.fromhex(PREFILL_LEG)) if on_prefill else (trace, pre_root, b""))
            assert (d_tid, d_sid, d_parent) == (
                (caller, dec_root, bytes.fromhex(DECODE_LEG)) if on_decode else (trace, dec_root, b""))
            assert p_links == []
            assert d_links == [(caller if on_decode else trace, pre_root, {})]
            assert (p_tid == d_tid) == (on_prefill == on_decode)


def caller_span(xid: str) -> str:
    """The gateway's span of one request (its own per request, as a gateway makes them)."""
    return blake2b(xid.encode(), digest_size=8).hexdigest()


def with_context_in_ids(text: str) -> str:
    """The log of a run whose X-Request-Ids were W3C traceparents (docs/trace-context.md recipe
    1): vLLM's ids `cmpl-pd-000-0…` become `cmpl-00-<trace>-<span>-01-0…`, in every line that
    names them, the decode's `remote_request_id` included (the prefill's id, as the proxy
    carried it)."""
    return re.sub(r"\bpd-(?:warm-)?\d+\b", lambda m: f"00-{CALLER_TRACE}-{caller_span(m[0])}-01", text)


@pytest.mark.parametrize("case", CASES)
def test_the_callers_context_in_the_shared_request_id_puts_both_halves_in_the_callers_trace(case, tmp_path):
    """The X-Request-Id reaches both halves inside the prefill's engine request id (the key):
    both derive the caller's trace and span from it; a traceparent header in the same trace is
    the more precise parent of the half that got it."""
    on_prefill, on_decode = CASES[case]
    pre, dec = with_legs(case, with_context_in_ids((FIXTURES / "prefill.log").read_text()),
                         with_context_in_ids((FIXTURES / "decode.log").read_text()))
    caller = bytes.fromhex(CALLER_TRACE)
    for got in readings(pre, dec, tmp_path):
        for r in DONE:
            xid = f"00-{CALLER_TRACE}-{caller_span(r['x_request_id'])}-01"
            rid = f"cmpl-{xid}-0"
            key = r["remote_request_id"].replace(r["x_request_id"], xid)
            own = pd_trace_id(key)  # the span ids still come from the key: distinct per request
            pre_root = pd_root_span(own, "prefill")
            p_tid, p_sid, p_parent, p_links = got[(rid, "prefill")]
            d_tid, d_sid, d_parent, d_links = got[(rid, "decode")]
            assert p_tid == d_tid == caller
            assert (p_sid, d_sid) == (pre_root, pd_root_span(own, "decode"))
            span = bytes.fromhex(caller_span(r["x_request_id"]))
            assert p_parent == (bytes.fromhex(PREFILL_LEG) if on_prefill else span)
            assert d_parent == (bytes.fromhex(DECODE_LEG) if on_decode else span)
            assert p_links == [] and d_links == [(caller, pre_root, {})]


def test_with_client_context_off_neither_the_header_nor_the_id_decides(tmp_path):
    pre = with_traceparent(with_context_in_ids((FIXTURES / "prefill.log").read_text()), PREFILL_LEG)
    p = write(tmp_path, "prefill", pre)
    out: list = []
    replay([str(p)], [out.append], ReplayConfig(assemble=AssembleConfig(client_context=False)))
    ts = [t for t in out if hasattr(t, "phases") and t.attrs.get("vllm.pd.role") == "prefill"]
    assert ts
    for t in ts:
        root = request_spans(t)[0]
        assert root.trace_id == pd_trace_id(t.attrs["vllm.request.internal_id"])
        assert root.parent_span_id == b"" and list(root.links) == []


# -- VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1 ------------------------------------------------------
# vLLM 0.32 `InputProcessor.assign_request_id` then keeps the external id as the engine request
# id (no `-<8 hex>`): the same X-Request-Id on two prefill instances, or after a restart, gives
# the same prefill engine request id. The P/D key is then (prefill engine id, engine request id).


def not_randomised(text: str, engine: str) -> str:
    """A recorded log as vLLM writes it with request id randomization off and the prefill's
    `kv_transfer_config.engine_id` = `engine`: engine request ids without their suffix, and the
    plugin's release line naming the engine (bridge/vllm_plugin/kv.py)."""
    text = re.sub(r"\b((?:cmpl)-pd-(?:warm-)?\d+-0)-[0-9a-f]{8}\b", r"\1", text)
    text = text.replace("prefill-engine-0", engine)
    return re.sub(r"(KV blocks released for request \S+ engine_request_id=\S+ blocks=\d+)",
                  lambda m: f"{m[1]}, engine_id={engine}", text)


def test_ids_not_randomised_two_prefill_engines_with_the_same_request_ids_are_two_traces(tmp_path):
    """Two P/D pairs served the same X-Request-Ids (a client retrying through another pair):
    the engine request ids are equal, the engine ids are not; four roots, two traces, each
    decode linked to its own prefill, whatever an agent reads."""
    pairs = {}
    for engine in ("prefill-a", "prefill-b"):
        pre = not_randomised((FIXTURES / "prefill.log").read_text(), engine)
        dec = not_randomised((FIXTURES / "decode.log").read_text(), engine)
        assert f"engine_id={engine}" in pre and f"remote_engine_id={engine}" in dec
        pairs[engine] = (write(tmp_path / engine, "prefill", pre), write(tmp_path / engine, "decode", dec))
    (pa, da), (pb, db) = pairs["prefill-a"], pairs["prefill-b"]
    for engine, (p, d) in pairs.items():
        for got in ({**read([p]), **read([d])}, read([p, d]), read([d, p])):
            for r in DONE:
                rid = f"cmpl-{r['x_request_id']}-0"
                key = f"{engine}\x1f{rid}"  # the engine request id is the API id, randomization off
                trace = pd_trace_id(key)
                pre_root = pd_root_span(trace, "prefill")
                assert got[(rid, "prefill")][:3] == (trace, pre_root, b"")
                assert got[(rid, "decode")][:3] == (trace, pd_root_span(trace, "decode"), b"")
                assert got[(rid, "decode")][3] == [(trace, pre_root, {})]
    # and the two pairs differ, request by request (without the engine id they would not)
    a, b = read([pa, da]), read([pb, db])
    for r in DONE:
        rid = f"cmpl-{r['x_request_id']}-0"
        assert {a[(rid, role)][1] for role in ("prefill", "decode")}.isdisjoint(
            {b[(rid, role)][1] for role in ("prefill", "decode")})


def test_a_randomised_id_keeps_the_key_it_had(tmp_path):
    """With vLLM's suffix the id alone is unique: the key is the id, as before the engine id
    was known (the recorded traces keep their ids, though the plugin now names the engine)."""
    pre = (FIXTURES / "prefill.log").read_text()
    pre = re.sub(r"(KV blocks released for request \S+ engine_request_id=\S+ blocks=\d+)",
                 lambda m: f"{m[1]}, engine_id=prefill-engine-0", pre)
    got = read([write(tmp_path, "prefill", pre)])
    for r in DONE:
        tid, sid, _parent, _links = got[(f"cmpl-{r['x_request_id']}-0", "prefill")]
        assert (tid, sid) == (pd_trace_id(r["remote_request_id"]), pd_root_span(pd_trace_id(r["remote_request_id"]), "prefill"))


def test_a_gateway_join_on_one_half_puts_it_in_the_gateways_trace(tmp_path):
    """The agent's gateway join (an access log beside one half's pod) sets the half's caller
    context after assembly: as a header would, it puts the half under the gateway's span; the
    link to the prefill's root stays, in that trace."""
    from bridge.parse.context import TraceContext

    out: list = []
    replay([str(write(tmp_path, "decode", (FIXTURES / "decode.log").read_text()))], [out.append])
    r = DONE[0]
    (t,) = [t for t in out if hasattr(t, "phases") and t.request_id == f"cmpl-{r['x_request_id']}-0"]
    t.parent = TraceContext(bytes.fromhex(CALLER_TRACE), bytes.fromhex(DECODE_LEG), "access_log")
    root = request_spans(t)[0]
    trace = pd_trace_id(r["remote_request_id"])
    caller = bytes.fromhex(CALLER_TRACE)
    assert (root.trace_id, root.span_id, root.parent_span_id) == (
        caller, pd_root_span(trace, "decode"), bytes.fromhex(DECODE_LEG))
    assert [(lk.trace_id, lk.span_id, {kv.key: kv.value.string_value for kv in lk.attributes}) for lk in root.links] == [
        (caller, pd_root_span(trace, "prefill"), {})]
