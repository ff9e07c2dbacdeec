"""User line rules (`--rules`, issue #21): each fact kind, invalid files, a pathological pattern,
a foreign line joined to a vLLM request, and docs/rules.md's worked examples run as written.

Every expectation is stated from the input lines (times, ids, numbers read off them by hand),
never from an earlier run. Excerpts go through the C paths and the pure-Python ones, which
must give the same timelines.
"""

from __future__ import annotations

import io
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from bridge.assemble import Assembler, EngineTimeline, RequestTimeline
from bridge.check import check_file
from bridge.cli import main
from bridge.config import ConfigError, load
from bridge.decode import Decoder
from bridge.tail.source import source_for
from bridge.decode.stream import RecordStream
from bridge.parse import FAST_PARSE, Parser
from bridge.parse.events import (
    BlockFreed,
    EngineError,
    GpuMemory,
    Notice,
    Preempted,
    QueueState,
    RequestFailed,
    RequestReceived,
    RequestsAborted,
    RequestSummary,
    ResponseGenerated,
    RuleEvent,
    Scheduled,
    Stamped,
    StartupFact,
)
from bridge.parse.rules import RuleError, parse_rules
from bridge.tail import read_lines
from waits import deadline

DOC = Path(__file__).parent.parent / "docs" / "rules.md"


def ns(iso: str) -> int:
    t = datetime.fromisoformat(iso).replace(tzinfo=timezone.utc)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def rules_of(text: str):
    return parse_rules(yaml.safe_load(text))


def parsers(rules):
    """The C parser (when built) and the pure-Python one, both with `rules`."""
    out = [Parser(fast=None, rules=rules)]
    if FAST_PARSE is not None:
        out.append(Parser(rules=rules))
    return out


def timelines(lines: list[str], rules, tmp_path: Path, fast: bool, year: int = 2025) -> list:
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    parser = Parser(fast=FAST_PARSE if fast else None, rules=rules)
    out: list = []
    assembler = Assembler(source_for(str(path)), out.append, fast=fast)
    for record in RecordStream(Decoder(year=year)).over(read_lines(str(path))):
        event = parser.parse(record.message, record.level, record.origin)
        if event is not None:
            assembler.feed(record, event)
    assembler.flush()
    return out


def both(lines, rules, tmp_path) -> list:
    got = timelines(lines, rules, tmp_path, True)
    assert got == timelines(lines, rules, tmp_path, False), "C and Python disagree"
    return got


def roots(out) -> dict[str, RequestTimeline]:
    d = {}
    for t in out:
        if isinstance(t, RequestTimeline):
            assert t.request_id not in d, f"two roots for {t.request_id}"
            d[t.request_id] = t
    return d


# -- docs/rules.md: the worked examples, as written there -------------------------------------

def doc_example(name: str) -> tuple[list[str], object]:
    blocks = {(lang, tag): body for lang, tag, body in
              re.findall(r"^```(\w+) (\w+)\n(.*?)^```", DOC.read_text(), re.S | re.M)}
    return blocks[("text", name)].splitlines(), rules_of(blocks[("yaml", name)])


def test_doc_router_example_adds_an_event_and_an_attribute_to_the_request_it_forwarded(tmp_path):
    lines, rules = doc_example("router")
    out = both(lines, rules, tmp_path)
    (r,) = roots(out).values()
    assert r.request_id == "chatcmpl-r7f3" and r.outcome == "finished"
    # `span_attributes: http.response.status_code` ← status=200
    assert r.attrs["http.response.status_code"] == 200
    (ev,) = [e for e in r.events if e.name == "router.forwarded"]
    assert ev.ts_ns == ns("2025-01-15T08:01:02.250")  # the router's own stamp, not a vLLM header's
    assert ev.attrs == {"router.backend": "vllm-0", "router.upstream_ms": 2150}
    assert r.end_ns == ns("2025-01-15T08:01:02.250")  # its last evidence is the router line
    assert r.start_ns == ns("2025-01-15T08:01:00")


def test_doc_vendor_preemption_example_becomes_a_preempted_phase(tmp_path):
    lines, rules = doc_example("npu")
    out = both(lines, rules, tmp_path)
    (r,) = roots(out).values()
    assert r.request_id == "0x7f8c4a001000" and r.outcome == "finished"
    phases = {(p.name, p.index): p for p in r.phases}
    assert sorted(phases) == [("decode", 0), ("preempted", 0), ("prefill", 0), ("queued", 0)]
    p = phases[("preempted", 0)]
    # evicted at 10:23:01, rescheduled at 10:23:03
    assert (p.start_ns, p.end_ns) == (ns("2025-02-15T10:23:01"), ns("2025-02-15T10:23:03"))
    assert p.attrs == {"vllm.preemption.reason": "hbm_pressure", "vllm.preemption.blocks": 6}
    # total_latency=5.0s before 10:23:05 → arrival 10:23:00; ttft=3500ms → first token 10:23:03.5
    assert phases[("decode", 0)].start_ns == ns("2025-02-15T10:23:03.500")
    assert r.attrs["vllm.preemptions"] == 1


def test_doc_examples_through_check_count_the_rule_and_the_fact(tmp_path):
    lines, _ = doc_example("npu")
    log = tmp_path / "npu.log"
    log.write_text("\n".join(lines) + "\n")
    blocks = dict(((lang, tag), body) for lang, tag, body in
                  re.findall(r"^```(\w+) (\w+)\n(.*?)^```", DOC.read_text(), re.S | re.M))
    rules = tmp_path / "rules.yaml"
    rules.write_text(blocks[("yaml", "npu")])
    without = check_file(str(log))
    assert without.by_kind["vllm_other"] == 1 and "preemption" not in without.by_kind
    out = io.StringIO()
    assert main(["check", "--rules", str(rules), str(log)], out=out) == 0
    text = out.getvalue()
    assert "rules         npu-evict 1" in text
    assert "preemption 1" in text and "vllm_other" not in text


# -- each fact kind: the event the assembler already knows -------------------------------------

FACT_CASES = [
    # (rule, line, the event written from the line)
    ("{fact: arrived, match: 'ARRIVE (?P<rid>\\S+) max=(?P<max_tokens>\\d+) t=(?P<temperature>[\\d.]+)', request_id: rid}",
     "ARRIVE q1 max=64 t=0.5", RequestReceived("q1", 64, 0.5, None, None, None)),
    ("{fact: scheduled, match: 'SCHED (?P<rid>\\S+) blocks=(?P<blocks>\\d+) waited=(?P<queued_s>\\S+)', request_id: rid}",
     "SCHED q1 blocks=4 waited=250ms", Scheduled("q1", 0, 4, 0, 0.25)),
    ("{fact: preempted, match: 'EVICT (?P<rid>\\S+) (?P<why>\\w+)', request_id: rid, fields: {reason: why}}",
     "EVICT q1 swap", Preempted("q1", "swap", 0)),
    ("{fact: first_token, match: 'FIRST (?P<rid>\\S+) lat=(?P<l>\\d+)', request_id: rid,"
     " attributes: {vendor.latency_ms: {group: l, type: int}}}",
     "FIRST q1 lat=31", RuleEvent("q1", "vllm.first_token", (("vendor.latency_ms", 31),))),
    ("{fact: finished, match: 'DONE (?P<rid>\\S+) (?P<reason>\\w+) out=(?P<output_tokens>\\d+)', request_id: rid}",
     "DONE q1 length out=128", ResponseGenerated("q1", "length", 128, "")),
    ("{fact: finished, match: 'END (?P<rid>\\S+) ttft=(?P<ttft_s>\\S+) e2e=(?P<e2e_s>\\S+) out=(?P<output_tokens>\\d+)',"
     " request_id: rid}",
     "END q1 ttft=45ms e2e=2s out=7", RequestSummary("q1", 0, 7, 0.045, 0.0, 2.0)),
    ("{fact: aborted, match: 'CANCEL (?P<rid>\\S+)', request_id: rid}", "CANCEL q1", RequestsAborted(("q1",))),
    ("{fact: freed, match: 'RELEASE (?P<rid>\\S+) n=(?P<count>\\d+)', request_id: rid}",
     "RELEASE q1 n=3", BlockFreed("", "q1", "completed", 3)),
    ("{fact: error, match: 'FAIL (?P<rid>\\S+) (?P<type>\\w+): (?P<message>.*)', request_id: rid}",
     "FAIL q1 oom: no room", RequestFailed("q1", "oom", "no room")),
    ("{fact: error, match: 'HBM fault: (?P<message>.*)', values: {type: oom, fatal: true}}",
     "HBM fault: bank 3", EngineError("oom", "", "bank 3", True, "")),
    ("{fact: queue, match: 'Q run=(?P<running>\\d+) wait=(?P<waiting>\\d+) free=(?P<free_blocks>\\d+)/(?P<total_blocks>\\d+)'}",
     "Q run=2 wait=5 free=10/100", QueueState(2, 5, 10, 100)),
    ("{fact: memory, match: 'HBM (?P<used_bytes>\\S+)/(?P<total_bytes>\\S+)'}",
     "HBM 16GB/64GB", GpuMemory(16 << 30, 64 << 30, 0.25, 0, 0, 0)),
    ("{fact: startup, match: 'driver (?P<d>\\S+) cards=(?P<c>\\d+)', attributes: {vendor.driver: d,"
     " vendor.cards: {group: c, type: int}}}",
     "driver 9.1.0 cards=8", StartupFact((("vendor.driver", "9.1.0"), ("vendor.cards", 8)))),
    ("{fact: event, event: vendor.swap_in, match: 'SWAPIN (?P<rid>\\S+) ms=(?P<ms>[\\d.]+)', request_id: rid,"
     " attributes: {vendor.ms: {group: ms, type: float}}, span_attributes: {vendor.swapped: {group: rid, type: bool}}}",
     "SWAPIN q1 ms=2.5", None),  # rid 'q1' is no bool: the rule declines, the line stays unknown
    ("{fact: event, event: vendor.swap_in, match: 'SWAPIN (?P<rid>\\S+) ms=(?P<ms>[\\d.]+)', request_id: rid,"
     " attributes: {vendor.ms: {group: ms, type: float}}}",
     "SWAPIN q1 ms=2.5", RuleEvent("q1", "vendor.swap_in", (("vendor.ms", 2.5),))),
]


@pytest.mark.parametrize("rule,line,expected", FACT_CASES, ids=[c[1].split()[0] + str(i) for i, c in enumerate(FACT_CASES)])
def test_each_fact_kind_becomes_the_event_the_line_says(rule, line, expected):
    rules = rules_of(f"- {{name: r, {rule[1:]}")
    for parser in parsers(rules):
        assert parser.parse(line, "", "") == expected
        stats = parser.snapshot()
        assert stats.by_rule == ({"r": 1} if expected is not None else {})
        assert stats.unrecognised == (0 if expected is not None else 1)
        assert stats.lines == stats.recognised + stats.unrecognised + sum(stats.malformed.values())


def test_a_time_group_replaces_the_records_stamp(tmp_path):
    rules = rules_of("""
- {name: arrive, fact: arrived, match: '^(?P<t>\\d+\\.\\d+) ARRIVE (?P<rid>\\S+)', request_id: rid, time: t, time_format: epoch}
- {name: done, fact: finished, match: '^(?P<t>\\d+) DONE (?P<rid>\\S+)', request_id: rid, time: t, time_format: epoch_ms}
""")
    for parser in parsers(rules):
        assert parser.parse("1736928000.5 ARRIVE z", "", "") == Stamped(
            1_736_928_000_500_000_000, RequestReceived("z", None, None, None, None, None))
    out = both(["1736928000.5 ARRIVE z", "1736928002750 DONE z"], rules, tmp_path)
    r = roots(out)["z"]
    assert (r.start_ns, r.end_ns, r.outcome) == (1_736_928_000_500_000_000, 1_736_928_002_750_000_000, "finished")
    assert r.attrs["gen_ai.response.finish_reasons"] == ["stop"]


def test_a_foreign_engines_whole_lifecycle_assembles_from_rules_alone(tmp_path):
    """A made-up engine whose every line is foreign: the facts make the same spans vLLM's would."""
    rules = rules_of(r"""
- {name: arrive, fact: arrived, match: 'ARRIVE (?P<rid>\S+) max=(?P<max_tokens>\d+)', request_id: rid}
- {name: sched, fact: scheduled, match: 'SCHED (?P<rid>\S+) blocks=(?P<blocks>\d+)', request_id: rid}
- {name: queue, fact: queue, match: 'Q run=(?P<running>\d+) wait=(?P<waiting>\d+) free=(?P<free_blocks>\d+)/(?P<total_blocks>\d+)'}
- {name: mem, fact: memory, match: 'HBM (?P<used_bytes>\S+)/(?P<total_bytes>\S+)'}
- {name: first, fact: first_token, match: 'FIRST (?P<rid>\S+)', request_id: rid}
- {name: done, fact: finished, match: 'DONE (?P<rid>\S+) (?P<reason>\w+) out=(?P<output_tokens>\d+)', request_id: rid}
- {name: free, fact: freed, match: 'RELEASE (?P<rid>\S+) n=(?P<count>\d+)', request_id: rid}
- {name: cancel, fact: aborted, match: 'CANCEL (?P<rid>\S+)', request_id: rid}
- {name: fail, fact: error, match: 'FAIL (?P<rid>\S+) (?P<type>\w+)', request_id: rid}
- {name: boot, fact: startup, match: 'BOOT driver=(?P<d>\S+)', attributes: {vendor.driver: d}}
""")
    lines = [
        "INFO 01-15 09:59:59 boot.py:1] BOOT driver=9.1.0",
        "INFO 01-15 10:00:00 x.py:1] ARRIVE a1 max=64",
        "INFO 01-15 10:00:01 x.py:1] SCHED a1 blocks=4",
        "INFO 01-15 10:00:01 x.py:1] Q run=1 wait=2 free=10/100",
        "INFO 01-15 10:00:02 x.py:1] HBM 8GB/16GB",
        "INFO 01-15 10:00:03 x.py:1] FIRST a1",
        "INFO 01-15 10:00:05 x.py:1] ARRIVE a2 max=8",
        "INFO 01-15 10:00:06 x.py:1] CANCEL a2",
        "INFO 01-15 10:00:07 x.py:1] ARRIVE a3 max=8",
        "INFO 01-15 10:00:08 x.py:1] FAIL a3 oom",
        "INFO 01-15 10:00:09 x.py:1] DONE a1 length out=64",
        "INFO 01-15 10:00:09 x.py:1] RELEASE a1 n=4",
    ]
    out = both(lines, rules, tmp_path)
    rs = roots(out)
    assert sorted(rs) == ["a1", "a2", "a3"]
    a1 = rs["a1"]
    assert a1.outcome == "finished" and a1.attrs["gen_ai.response.finish_reasons"] == ["length"]
    assert a1.attrs["gen_ai.usage.output_tokens"] == 64 and a1.attrs["gen_ai.request.max_tokens"] == 64
    assert (a1.start_ns, a1.end_ns) == (ns("2025-01-15T10:00:00"), ns("2025-01-15T10:00:09"))
    events = {e.name: e for e in a1.events}
    assert events["vllm.first_token"].ts_ns == ns("2025-01-15T10:00:03")
    assert events["vllm.queue_state"].attrs["vllm.queue.waiting"] == 2
    assert events["vllm.gpu_memory"].attrs["vllm.gpu.memory.utilization"] == 0.5
    phases = {p.name: p for p in a1.phases}
    assert phases["prefill"].start_ns == ns("2025-01-15T10:00:01")
    assert phases["prefill"].attrs["vllm.scheduling.blocks"] == 4
    assert "freed" in phases and phases["freed"].end_ns == ns("2025-01-15T10:00:09")
    assert (rs["a2"].outcome, rs["a2"].error_type) == ("aborted", "aborted")
    assert rs["a2"].end_ns == ns("2025-01-15T10:00:06")
    assert (rs["a3"].outcome, rs["a3"].error_type) == ("failed", "oom")
    startup = [t for t in out if isinstance(t, EngineTimeline) and t.kind == "startup"]
    assert len(startup) == 1 and startup[0].attrs["vendor.driver"] == "9.1.0"


def test_an_engine_wide_event_goes_on_every_request_in_flight(tmp_path):
    rules = rules_of(r"""
- {name: arrive, fact: arrived, match: 'ARRIVE (?P<rid>\S+)', request_id: rid}
- {name: throttle, fact: event, event: vendor.throttle, match: 'THROTTLE (?P<pct>\d+)%', attributes: {vendor.pct: {group: pct, type: int}}}
""")
    lines = ["INFO 01-15 10:00:00 x.py:1] ARRIVE a", "INFO 01-15 10:00:00 x.py:1] ARRIVE b",
             "INFO 01-15 10:00:01 x.py:1] THROTTLE 40%"]
    rs = roots(both(lines, rules, tmp_path))
    for rid in "ab":
        (ev,) = [e for e in rs[rid].events if e.name == "vendor.throttle"]
        assert ev.attrs == {"vendor.pct": 40} and ev.ts_ns == ns("2025-01-15T10:00:01")


# -- where rules run -----------------------------------------------------------------------------

SCHED_LINE = "Scheduling request 0xabc: priority=0, num_scheduled_blocks=4, remaining_blocks=2"


def test_rules_never_see_what_the_grammar_took_unless_they_override():
    plain = rules_of(r"- {name: mine, fact: event, event: x, match: '^Scheduling request (?P<rid>\S+):', request_id: rid}")
    for parser in parsers(plain):
        assert parser.parse(SCHED_LINE, "INFO", "scheduler.py:1") == Scheduled("0xabc", 0, 4, 2)
        assert parser.snapshot().by_rule == {}
    over = rules_of(r"- {name: mine, fact: event, event: x, override: true, match: '^Scheduling request (?P<rid>\S+):',"
                    r" request_id: rid}")
    for parser in parsers(over):
        assert parser.parse(SCHED_LINE, "INFO", "scheduler.py:1") == RuleEvent("0xabc", "x", ())
        s = parser.snapshot()
        assert s.by_rule == {"mine": 1} and s.by_kind == {"rule_event": 1} and s.lines == 1


def test_a_malformed_line_a_rule_takes_leaves_the_malformed_count():
    # `Request ` is the seed summary's key: a line with it and no summary is malformed
    rules = rules_of(r"- {name: mine, fact: aborted, match: '^Request (?P<rid>\S+) was cancelled', request_id: rid}")
    for parser in parsers(rules):
        assert parser.parse("Request 0x1 was cancelled", "INFO", "") == RequestsAborted(("0x1",))
        s = parser.snapshot()
        assert s.malformed == {} and s.unrecognised == 0 and s.by_kind == {"request_aborted": 1}


def test_a_notice_a_rule_takes_moves_its_count():
    rules = rules_of(r"- {name: mine, fact: event, event: e, match: 'npu warmup done in (?P<s>\d+)s'}")
    for parser in parsers(rules):
        assert parser.parse("npu warmup done in 3s", "INFO", "npu_worker.py:9") == RuleEvent(None, "e", ())
        other = parser.parse("npu idle", "INFO", "npu_worker.py:9")
        assert isinstance(other, Notice)
        s = parser.snapshot()
        assert s.by_kind == {"rule_event": 1, other.kind: 1} and s.lines == 2


def test_a_pathological_pattern_finishes_fast_on_a_long_line():
    """`(a+)+$` on a's then one b: Python's `re` backtracks exponentially (years at 100 KB),
    RE2 scans the line once."""
    rules = rules_of(r"- {name: evil, fact: event, event: e, match: '(?P<x>(a+)+$)'}")
    line = "a" * 100_000 + "b"
    for parser in parsers(rules):
        start = time.perf_counter()
        for _ in range(20):
            assert parser.parse(line, "", "") is None
        assert time.perf_counter() - start < 1.0
        assert parser.parse("a" * 1000, "", "") == RuleEvent(None, "e", ())


def test_a_line_no_rule_matches_is_still_counted_unrecognised_with_its_template(tmp_path):
    rules = tmp_path / "r.yaml"
    rules.write_text("- {name: never, fact: aborted, match: 'NEVER (?P<rid>x)', request_id: rid}\n")
    log = tmp_path / "s.log"
    log.write_text("something else 12\nINFO 01-15 10:00:00 api_server.py:1] Request timeout: 0x5\n")
    out = io.StringIO()
    assert main(["check", "--rules", str(rules), str(log)], out=out) == 0
    text = out.getvalue()
    assert "rules         never 0" in text and "unrecognised  1 (50.0 %)" in text


# -- invalid rule files: one line, the rule, the field, the fix, exit 2 -------------------------

INVALID = [
    ("- {name: a, match: '(?<=x)y', fact: aborted, request_id: r}", "rule 'a' (#1): field 'match'", "lookaround"),
    ("- {name: a, match: '(x', fact: aborted}", "field 'match'", "fix:"),
    ("- {name: a, match: 'x', fact: exploded}", "field 'fact'", "use one of: arrived"),
    ("- {name: a, match: 'x(?P<id>y)', fact: aborted}", "field 'request_id'", "name the group"),
    ("- {name: a, match: 'x(?P<id>y)', fact: aborted, request_id: rid}", "field 'request_id': 'rid' is not a named group",
     "groups: id"),
    ("- {match: 'x', fact: aborted}", "rule #1: field 'name'", "give the rule a name"),
    ("- {name: a, match: 'x', fact: event}", "field 'event'", "router.forwarded"),
    ("- {name: a, match: 'x(?P<r>y)', fact: preempted, request_id: r, fields: {why: r}}", "field 'fields'",
     "reason, blocks"),
    ("- {name: a, match: 'x(?P<r>y)', fact: preempted, request_id: r, attributes: {k: r}}", "field 'attributes'",
     "fact: event"),
    ("- {name: a, match: 'x(?P<r>y)', fact: event, event: e, attributes: {k: {group: r, type: date}}}",
     "field 'attributes.k'", "use one of: str, int"),
    ("- {name: a, match: 'x', fact: queue, colour: red}", "field 'colour': unknown field", "use only"),
    ("- {name: a, match: 'x', fact: queue}\n- {name: a, match: 'y', fact: queue}", "rule 'a' (#2): field 'name'",
     "its own name"),
    ("- {name: a, match: 'x(?P<t>y)', fact: queue, time: t, time_format: rfc}", "field 'time_format'", "strptime"),
    ("- {name: a, match: 'x', fact: queue, override: maybe}", "field 'override'", "true"),
    ("- {name: a, match: 'x(?P<r>y)', fact: queue, request_id: r}", "field 'request_id': fact 'queue' is engine-wide",
     "fact: event"),
    ("- {name: a, match: \"x\\ud800\", fact: queue}", "field 'match'", "fix:"),
    ("- {name: a, match: 'x', fact: startup}", "field 'attributes'", "vendor.driver"),
    ("name: a", "expected a non-empty YAML list", "fact"),
    ("- [a, b", "not valid YAML at line", "fix the syntax"),
]


@pytest.mark.parametrize("text,where,fix", INVALID, ids=[str(i) for i in range(len(INVALID))])
def test_an_invalid_rule_file_stops_the_start_with_one_line(text, where, fix, tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text(text + "\n")
    log = tmp_path / "s.log"
    log.write_text("x\n")
    for argv in (["replay", "--rules", str(rules), str(log)], ["check", "--rules", str(rules), str(log)]):
        assert main(argv, out=io.StringIO()) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"vllm-trace-bridge: --rules {rules}"), err
        assert where in err and fix in err, err
    # the agent's setting, from the environment: the same line, with where the value came from
    with pytest.raises(ConfigError) as exc:
        load(None, {"VLLM_TRACE_BRIDGE_RULES": str(rules)}, {})
    assert "rules (from VLLM_TRACE_BRIDGE_RULES)" in str(exc.value) and where in str(exc.value)


def test_a_missing_rule_file_is_named():
    with pytest.raises(RuleError, match="cannot read it"):
        from bridge.parse.rules import load_rules
        load_rules("/nonexistent/rules.yaml")


def test_the_setting_reaches_the_agent_from_file_env_and_flag(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("- {name: a, match: 'x', fact: queue}\n")
    assert load({"rules": str(rules)}, {}, {})[0].rules == str(rules)
    assert load(None, {"VLLM_TRACE_BRIDGE_RULES": str(rules)}, {})[0].rules == str(rules)
    assert load(None, {}, {"rules": str(rules)})[0].rules == str(rules)
    assert load(None, {}, {})[0].rules is None


@pytest.mark.parametrize("line", ["\udcff\udc80 EVICT q1 swap", "EVICT \ud800 swap", "EVICT q1 \x00swap", "EVICT é swap"])
def test_odd_text_never_raises_and_groups_come_back_as_text(line):
    rules = rules_of(r"- {name: r, fact: preempted, match: 'EVICT (?P<rid>\S+) (?P<reason>\S+)', request_id: rid}")
    for parser in parsers(rules):
        event = parser.parse(line, "", "")
        assert event is None or (isinstance(event, Preempted) and isinstance(event.request_id, str))
    assert parsers(rules)[0].parse("EVICT é swap", "", "") == Preempted("é", "swap", 0)


def test_run_takes_rules_and_refuses_a_bad_file_at_start(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("- {name: a, match: 'x', fact: queue}\n")
    out = io.StringIO()
    assert main(["run", "--print-config", "--rules", str(good)], env={}, out=out) == 0
    assert yaml.safe_load(out.getvalue())["rules"] == str(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: a, match: 'x', fact: queue, request_id: nope}\n")
    assert main(["run", "--print-config", "--rules", str(bad)], env={}, out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rules (from --rules)" in err and "rule 'a' (#1): field 'request_id'" in err


def test_the_agent_skips_a_stamped_event_of_a_request_delivered_before_a_restart():
    """After a restart, lines of requests already delivered (up to offset 500 here) are not fed
    again: a rule's event with its own time is filtered like the event inside it."""
    from types import SimpleNamespace

    from bridge.agent import Agent

    agent = Agent.__new__(Agent)
    from bridge.health import AgentCounters
    agent.counters = AgentCounters()
    st = SimpleNamespace(skip={"chatcmpl-r1": 500})
    keep = agent._not_delivered(st)  # the filter the agent's drive runs a resumed source's events through
    mine = Stamped(1, RuleEvent("chatcmpl-r1", "router.forwarded", ()))
    other = Stamped(1, RuleEvent("chatcmpl-r2", "router.forwarded", ()))
    assert keep(SimpleNamespace(offset=400), mine) is None
    assert keep(SimpleNamespace(offset=600), mine) == mine  # a later line: a new request
    assert keep(SimpleNamespace(offset=400), other) == other
    aborted = Stamped(1, RequestsAborted(("chatcmpl-r1", "chatcmpl-r2")))
    assert keep(SimpleNamespace(offset=400), aborted) == Stamped(1, RequestsAborted(("chatcmpl-r2",)))
    assert agent.counters.skipped_delivered == 2


def test_replay_and_the_agent_export_the_same_spans_with_rules(tmp_path):
    """The router example through `replay --rules` and `run --rules` into an OTLP receiver:
    the same spans, and the root carries the router's event and attribute on the wire."""
    import os

    from agentkit import AgentProc, wait_for
    from receivers import GrpcReceiver, attrs

    lines, _ = doc_example("router")
    blocks = {(lang, tag): body for lang, tag, body in
              re.findall(r"^```(\w+) (\w+)\n(.*?)^```", DOC.read_text(), re.S | re.M)}
    rules = tmp_path / "rules.yaml"
    rules.write_text(blocks[("yaml", "router")])
    log = tmp_path / "pods" / "llm_vllm-0_3f2a9c1e-1111-2222-3333-444455556666" / "vllm" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(lines) + "\n")
    stamp = ns("2025-01-15T09:00:00") / 1e9
    os.utime(log, (stamp, stamp))  # the year both infer from the file's time: 2025, as the router's stamp
    with GrpcReceiver() as rx:
        out = io.StringIO()
        assert main(["replay", str(log), "--rules", str(rules), "--otlp-endpoint", rx.endpoint], env={}, out=out) == 0
        assert "rules        edge-router-access 1" in out.getvalue()
        spans = [s for _, s in rx.spans()]
    want = {s.SerializeToString(deterministic=True) for s in spans}
    (root,) = [s for s in spans if s.name == "vllm.request"]
    assert attrs(root.attributes)["http.response.status_code"] == 200
    (ev,) = [e for e in root.events if e.name == "router.forwarded"]
    assert ev.time_unix_nano == ns("2025-01-15T08:01:02.250")
    assert attrs(ev.attributes) == {"router.backend": "vllm-0", "router.upstream_ms": 2150}
    with GrpcReceiver() as rx:
        agent = AgentProc(str(tmp_path / "pods" / "*" / "*" / "*.log"), str(tmp_path / "state"), rx.endpoint,
                          "--rules", str(rules), "--ttl", "3", "--linger", "1", "--poll-interval", "0.2").start()
        try:
            wait_for(lambda: len(rx.spans()) >= len(want), deadline(30))
            time.sleep(1.0)
        finally:
            agent.term()
        got = {s.SerializeToString(deterministic=True) for _, s in rx.spans()}
    assert got == want
