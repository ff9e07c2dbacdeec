"""Two API servers (`--api-server-count 2`) in front of DP=2 engines, with the plugin (issue #34):
the recorded real run in tests/fixtures/distributed/api2/ (tests/distributed_run.py `run_api2`).

What changes with two API servers (vLLM 0.32, read in its source and the log): each API server
is a process of its own, `ApiServer_<i>` (multiprocessing's name, `v1/utils.py`
`APIServerProcessManager`; the launcher is `MainProcess`), both writing to one stream, taking
connections from one socket as the kernel hands them out; vLLM turns its stats lines off
(`AsyncLLM created with api_server_count more than 1; disabling stats logging`), so no
`Running: … reqs` line says an engine is idle; either API server's requests go to either engine.

Expectations come from the client's record (`api2_truth.json`: what it sent, in which order,
with which X-Request-Id, traceparent and max_tokens, when, and what came back) and vLLM's
`/metrics` counters, never from the bridge: every request the client got an answer for has
exactly one root, with its own token count, inside the client's send → receive window; the
X-Request-Id sent twice one after the other and the one sent twice at once are two roots each.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from bridge.export.otlp import request_spans
from bridge.pipeline import replay

HERE = Path(__file__).resolve().parent / "fixtures" / "distributed" / "api2"
TRUTH = json.loads((HERE / "api2_truth.json").read_text())
SLACK_NS = 5_000_000  # the client's and vLLM's stamps: one host's clock, read a few µs apart


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> list[tuple[object, dict, list[str]]]:
    d = tmp_path_factory.mktemp("api2") / "pod"
    d.mkdir()
    shutil.copy(HERE / "api2.log", d / "0.log")
    out: list = []
    replay([str(d / "0.log")], [out.append])
    got = []
    for t in (t for t in out if hasattr(t, "phases")):
        root, *children = request_spans(t)
        attrs = {kv.key: (kv.value.string_value or kv.value.int_value) for kv in root.attributes}
        got.append((root, attrs, children))
    return got


def test_the_log_is_what_two_api_servers_write():
    """The premise, from vLLM's own lines: two API server processes took requests, two engines
    served them, and no stats line came."""
    text = (HERE / "api2.log").read_text()
    received = re.findall(r"\((ApiServer_\d) pid=\d+\) INFO [^\]]+\] Received request", text)
    assert set(received) == {"ApiServer_0", "ApiServer_1"}
    assert len(received) == len(TRUTH["requests"])
    assert "disabling stats logging" in text and "Running:" not in text
    assert {r["status"] for r in TRUTH["requests"]} == {200}


def test_every_request_the_client_sent_has_exactly_one_root_with_its_own_tokens(roots):
    sent = Counter(f"cmpl-{r['x_request_id']}-0" for r in TRUTH["requests"])
    got = Counter(attrs["vllm.request.id"] for _root, attrs, _c in roots)
    assert got == sent  # the repeated ids too: two sends, two roots
    for rid in sent:
        tokens = sorted(r["completion_tokens"] for r in TRUTH["requests"] if f"cmpl-{r['x_request_id']}-0" == rid)
        assert sorted(a["gen_ai.usage.output_tokens"] for _r, a, _c in roots if a["vllm.request.id"] == rid) == tokens
    for root, attrs, children in roots:
        assert attrs["vllm.outcome"] == "finished"
        assert [c.name for c in children][:4] == ["preprocess", "queued", "prefill", "decode"]
        assert root.status.code != 2  # no error on any


def test_one_id_twice_at_once_on_one_api_server_is_two_roots_each_with_its_own_lines(roots):
    """In the recording the two sends of `api2-dup` were in flight at once on one API server
    (both `Received` before either ended), served by two engine cores that finished them out of
    order. No line names which is which by engine id but `Added`: each root must carry its own
    `Received` line's max_tokens and its own end's token count (the client asked for
    max_tokens with ignore_eos, so the two agree: its record), and its own engine's rank."""
    text = (HERE / "api2.log").read_text()
    lines = [x for x in text.splitlines() if "cmpl-api2-dup-0" in x]
    kinds = [("R" if "Received request" in x else "E" if "] Request cmpl-api2-dup-0:" in x else "") for x in lines]
    assert "".join(k for k in kinds if k).startswith("RR")  # the premise: both received, neither ended
    assert len({re.search(r"\((ApiServer_\d) pid", x)[1] for x in lines if "Received request" in x}) == 1
    dup = [(r, a) for r, a, _c in roots if a["vllm.request.id"] == "cmpl-api2-dup-0"]
    assert sorted(a["gen_ai.usage.output_tokens"] for _r, a in dup) == sorted(
        r["completion_tokens"] for r in TRUTH["requests"] if r["x_request_id"] == "api2-dup")
    for _root, attrs in roots_attrs(roots):
        assert attrs["gen_ai.request.max_tokens"] == attrs["gen_ai.usage.output_tokens"], attrs["vllm.request.id"]
    # each engine core freed one of them just before the API server logged that one's end
    ends = re.findall(r"\((EngineCore_DP(\d)) pid=\d+\) .*Freed \d+ blocks for request cmpl-api2-dup-0.*\n"
                      r".*\] Request cmpl-api2-dup-0: prompt_tokens=\d+, generated_tokens=(\d+)", text)
    assert len(ends) == 2
    assert sorted((a["gen_ai.usage.output_tokens"], a["vllm.dp.rank"]) for _r, a in dup) == sorted(
        (int(tokens), int(rank)) for _p, rank, tokens in ends)


def roots_attrs(roots):
    return [(r, a) for r, a, _c in roots]


def decode_end(children) -> int:
    return next(c for c in children if c.name == "decode").end_time_unix_nano


def test_each_request_lies_in_its_send_to_answer_window(roots):
    """Matched by id and tokens (the two at once with one id asked for 7 and 9): the root starts
    after the client sent, and vLLM's last token (the plugin's stamp, the `decode` span's end)
    comes before the client had the answer: one host's clock. (The root itself runs to the last
    line's evidence, which here includes the runtime's stamps of lines a starved log pump read
    up to 0.7 s late: docs/distributed.md.)"""
    by = {(a["vllm.request.id"], a["gen_ai.usage.output_tokens"]): (r, c) for r, a, c in roots}
    assert len(by) == len(roots)
    for r in TRUTH["requests"]:
        root, children = by[(f"cmpl-{r['x_request_id']}-0", r["completion_tokens"])]
        assert r["sent"] * 1e9 - SLACK_NS <= root.start_time_unix_nano
        assert root.start_time_unix_nano <= decode_end(children) <= r["received"] * 1e9 + SLACK_NS


def test_sequential_requests_run_in_the_clients_order(roots):
    by = {(a["vllm.request.id"], a["gen_ai.usage.output_tokens"]): (r, c) for r, a, c in roots}
    seq = [by[(f"cmpl-{r['x_request_id']}-0", r["completion_tokens"])]
           for r in sorted(TRUTH["requests"], key=lambda r: r["order"]) if not r["burst"]]
    assert len(seq) == 9
    assert [r.start_time_unix_nano for r, _c in seq] == sorted(r.start_time_unix_nano for r, _c in seq)
    assert all(decode_end(a[1]) <= b[0].start_time_unix_nano for a, b in zip(seq, seq[1:]))


def test_the_callers_traceparent_through_either_api_server_parents_its_root(roots):
    by = {(a["vllm.request.id"], a["gen_ai.usage.output_tokens"]): (r, a) for r, a, _c in roots}
    sent_with = [r for r in TRUTH["requests"] if r["traceparent"]]
    assert len(sent_with) >= 2
    for r in TRUTH["requests"]:
        root, attrs = by[(f"cmpl-{r['x_request_id']}-0", r["completion_tokens"])]
        if r["traceparent"]:
            _v, trace, span, _f = r["traceparent"].split("-")
            assert (root.trace_id.hex(), root.parent_span_id.hex()) == (trace, span)
            assert attrs["vllm.trace_context"] == "traceparent"
        else:
            assert root.parent_span_id == b"" and "vllm.trace_context" not in attrs


def test_each_root_names_the_engine_that_served_it_as_vllms_counter_does(roots):
    ranks = Counter(str(a["vllm.dp.rank"]) for _r, a, _c in roots)
    assert ranks == Counter({k: v for k, v in TRUTH["finished_per_engine"].items() if v})
    assert len({root.span_id for root, _a, _c in roots}) == len(roots)
    assert len({root.trace_id for root, a, _c in roots if "vllm.trace_context" not in a}) == \
        len([a for _r, a, _c in roots if "vllm.trace_context" not in a])


def test_one_id_in_flight_on_both_api_servers_at_once_is_two_roots(tmp_path):
    """The recording's two sends of one X-Request-Id, as they come when both are in flight at
    once on the two API servers: the second's `Received`, `Added` (on the other API server) and
    its engine core's `Scheduling` moved to just after the first's `Added`, before the first's
    `Freed` and end. Each API server logs its own requests' ends (the plugin's summary, under its
    `ApiServer_<i>` prefix): two roots, each with the tokens its own API server reported, the
    engine id that API server added it under, its blocks freed when its own `Freed` line says and
    the rank of the engine core whose `Scheduling` line named it (both read in the recording's
    original order, where the two did not overlap)."""
    lines = (HERE / "serial.log").read_text().splitlines(True)  # a run where they did not overlap
    serial = json.loads((HERE / "serial_truth.json").read_text())
    dup = [i for i, line in enumerate(lines) if "cmpl-api2-dup-0" in line]
    received = [i for i in dup if "Received request" in lines[i]]
    added = [i for i in dup if "Added request" in lines[i]]
    summary = [i for i in dup if "] Request cmpl-api2-dup-0: " in lines[i]]
    assert len(received) == len(added) == len(summary) == 2 and summary[0] < received[1]  # not overlapping
    truth = []  # per send, in the recording's order: engine id, tokens, Freed t (µs), DP rank
    for k in (0, 1):
        mine = lines[received[k]:summary[k] + 1]
        eid = next(re.search(r"Added request (\S+)\.$", x)[1] for x in mine if "Added request cmpl-api2-dup" in x)
        freed = next(re.search(r"t=(\d+\.\d+)", x)[1] for x in mine if "Freed 1 blocks for request cmpl-api2-dup" in x)
        tokens = int(re.search(r"generated_tokens=(\d+)", lines[summary[k]])[1])
        rank = next(int(re.search(r"\(EngineCore_DP(\d+) ", x)[1]) for x in mine if "Scheduling request cmpl-api2-dup" in x)
        truth.append((eid, tokens, round(float(freed) * 1e6), rank))
    assert sorted(t[1] for t in truth) == sorted(
        r["completion_tokens"] for r in serial["requests"] if r["x_request_id"] == "api2-dup")
    sched2 = next(i for i in dup if received[1] < i < summary[1] and "Scheduling request" in lines[i])
    moved = [received[1], added[1], sched2]
    rest = [line for i, line in enumerate(lines) if i not in moved]
    at = rest.index(lines[added[0]]) + 1
    rest[at:at] = [lines[i] for i in moved]
    d = tmp_path / "pod"
    d.mkdir()
    (d / "0.log").write_text("".join(rest))
    out: list = []
    replay([str(d / "0.log")], [out.append])
    got = sorted((t.attrs.get("vllm.request.internal_id"), t.attrs.get("gen_ai.usage.output_tokens"),
                  round(next(p.end_ns for p in t.phases if p.name == "freed") / 1e3), t.attrs.get("vllm.dp.rank"))
                 for t in out if hasattr(t, "phases") and t.request_id == "cmpl-api2-dup-0")
    assert got == sorted(truth)


def test_twins_on_two_api_servers_finishing_in_another_order_than_scheduled_keep_their_own_ends(tmp_path):
    """race.log (the real_vllm test's run of 2026-12-04, kept when it failed): the two sends of
    one X-Request-Id in flight at once on ApiServer_0 and ApiServer_1, both served by engine 0,
    which scheduled ApiServer_0's first (its `Scheduling` line before ApiServer_1's `Received`)
    but finished ApiServer_1's first (fewer tokens asked for). Each API server logs its own
    request's end: every root's max_tokens (its own `Received` line) goes with the token count
    the client got for that max_tokens, as the client's record pairs them."""
    truth = json.loads((HERE / "race_truth.json").read_text())
    d = tmp_path / "pod"
    d.mkdir()
    shutil.copy(HERE / "race.log", d / "0.log")
    out: list = []
    replay([str(d / "0.log")], [out.append])
    got = Counter((t.request_id, t.attrs.get("gen_ai.request.max_tokens"), t.attrs.get("gen_ai.usage.output_tokens"))
                  for t in out if hasattr(t, "phases"))
    want = Counter((f"cmpl-{r['x_request_id']}-0", r["max_tokens"], r["completion_tokens"]) for r in truth["requests"])
    assert [k for k in want if k[0] == "cmpl-api2-dup-0"] and got == want


_ADDED = re.compile(r"\((ApiServer_\d) pid=\d+\) .*\] Added request ((\S+)-[0-9a-f]{8})\.$", re.M)
_SCHEDULED = re.compile(r"\(EngineCore_DP(\d) pid=\d+\) .*\] Scheduling request \S+: .*, t=([\d.]+), "
                        r"internal_id=(\S+)$", re.M)


def test_twins_on_one_api_server_scheduled_out_of_added_order_keep_their_own_lines(tmp_path):
    """twins.log (tests/distributed_run.py `run_api2` with `API2_TWINS_BURST`, 2026-12-04, the
    plugin stating `internal_id=`): three X-Request-Ids sent twice at once; ApiServer_0 had
    `api2-dupc` in flight twice, and the two engine cores scheduled the twin added second first.
    Each plugin line states the engine id vLLM's `Added request` gave its twin, so every root has
    its own `Received` line's max_tokens with the token count the client got for that
    max_tokens, and the rank of the engine core whose `Scheduling` line states its engine id.
    (The order rule — the oldest twin not yet scheduled — swapped this pair's ends and ranks.)"""
    text = (HERE / "twins.log").read_text()
    truth = json.loads((HERE / "twins_truth.json").read_text())
    # the premise, from vLLM's own lines: one API server added both, two engines took them in the other order
    added: dict = {}
    for server, eid, rid in _ADDED.findall(text):
        added.setdefault((server, rid), []).append(eid)
    sched = {eid: (float(t), int(rank)) for rank, t, eid in _SCHEDULED.findall(text)}
    swapped = [eids for eids in added.values() if len(eids) == 2 and sched[eids[0]][0] > sched[eids[1]][0]
               and sched[eids[0]][1] != sched[eids[1]][1]]
    assert swapped == [["cmpl-api2-dupc-0-9a1b2c11", "cmpl-api2-dupc-0-a4c443ca"]]
    _each_twin_its_own(text, truth, sched, tmp_path)


def test_an_engine_line_before_its_twins_added_line_goes_to_the_twin_not_added_yet(tmp_path):
    """twins.log with `Added request …-a4c443ca` moved to just after engine 0's `Scheduling`
    line that states that id (the engine core's line can reach the stream before its API
    server's `Added`, written after the hand-off): the other twin was added under `…-9a1b2c11`,
    so the id is the one twin's not added yet, and every root still has its own lines."""
    text = (HERE / "twins.log").read_text()
    truth = json.loads((HERE / "twins_truth.json").read_text())
    lines = text.splitlines(True)
    added = next(i for i, x in enumerate(lines) if "Added request cmpl-api2-dupc-0-a4c443ca." in x)
    first = next(i for i, x in enumerate(lines) if "Added request cmpl-api2-dupc-0-9a1b2c11." in x)
    sched_at = next(i for i, x in enumerate(lines) if "Scheduling request" in x
                    and x.rstrip().endswith("internal_id=cmpl-api2-dupc-0-a4c443ca"))
    assert first < added < sched_at  # as recorded: both added, then scheduled
    moved = lines[:added] + lines[added + 1:sched_at + 1] + [lines[added]] + lines[sched_at + 1:]
    text = "".join(moved)
    sched = {eid: (float(t), int(rank)) for rank, t, eid in _SCHEDULED.findall(text)}
    _each_twin_its_own(text, truth, sched, tmp_path)


def test_twins_on_two_api_servers_added_in_another_order_than_received_keep_their_own_lines(tmp_path):
    """twins_servers.log (a second `API2_TWINS_BURST` run, 2026-12-04): `api2-dupb` received by
    ApiServer_0 then ApiServer_1, whose `Added` came first (and engine 1 scheduled ApiServer_0's
    before its `Added` was written). Each API server writes its own `Received` and `Added`: the
    engine id goes to the twin that API server received, and every root keeps its own lines."""
    text = (HERE / "twins_servers.log").read_text()
    truth = json.loads((HERE / "twins_servers_truth.json").read_text())
    order = re.findall(r"\((ApiServer_\d) pid=\d+\) .*\] (Received|Added) request cmpl-api2-dupb-0\b", text)
    assert [p for p, kind in order if kind == "Received"] == ["ApiServer_0", "ApiServer_1"]
    assert [p for p, kind in order if kind == "Added"] == ["ApiServer_1", "ApiServer_0"]
    sched = {eid: (float(t), int(rank)) for rank, t, eid in _SCHEDULED.findall(text)}
    _each_twin_its_own(text, truth, sched, tmp_path)


def _each_twin_its_own(text: str, truth: dict, sched: dict, tmp_path) -> None:
    """Replayed, every root has its own max_tokens with the tokens the client got for it, and
    the rank of the engine core whose `Scheduling` line states its engine id."""
    d = tmp_path / "pod"
    d.mkdir()
    (d / "0.log").write_text(text)
    out: list = []
    replay([str(d / "0.log")], [out.append])
    traces = [t for t in out if hasattr(t, "phases")]
    got = Counter((t.request_id, t.attrs.get("gen_ai.request.max_tokens"), t.attrs.get("gen_ai.usage.output_tokens"))
                  for t in traces)
    want = Counter((f"cmpl-{r['x_request_id']}-0", r["max_tokens"], r["completion_tokens"]) for r in truth["requests"])
    assert {r["status"] for r in truth["requests"]} == {200} and got == want
    for t in traces:  # each root's rank: the engine whose Scheduling line states its engine id
        eid = t.attrs.get("vllm.request.internal_id")
        assert t.attrs.get("vllm.dp.rank") == sched[eid][1], eid
    assert Counter(str(t.attrs["vllm.dp.rank"]) for t in traces) == Counter(
        {k: v for k, v in truth["finished_per_engine"].items() if v})
