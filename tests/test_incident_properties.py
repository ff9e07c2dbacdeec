"""Engine incidents over generated vLLM logs (Hypothesis, derandomized): how hangs, watchdogs,
deaths, restarts and data-parallel engines are grouped into `vllm.engine` spans.

A log is a random walk in vLLM 0.32's format (line makers of tests/test_lifecycle.py): banners
(restarts), startup lines of workers and the API server's listening line, requests received,
added, finished, stats lines counting what is in flight, shm_broadcast's hang warning at
random intervals (around its 60 s and the 5 s window), torch's NCCL watchdog with a random
`ran for`, the executor's and the client's death lines, EngineDeadError tracebacks, a SIGTERM
stop, with the engine core's prefix `EngineCore`, `EngineCore_DP0` or `EngineCore_DP1`.

Asserted on every log:
- the C paths and pure Python give the same timelines, and a second run gives them again;
- every incident starts no later than it ends and lasts at most the TTL (a hang warned for
  hours is held no longer than a request, `EngineLife.tick`);
- incidents of one engine (`vllm.dp.rank`) never overlap;
- every error line is accounted for exactly once: in an incident's `vllm.incident.lines`, a
  startup span's `vllm.startup.waits`, or the `stop_errors` / `death_errors` counters; and
  `engine_incidents` counts the incident spans;
- a request a fatal incident ended failed with that incident's type;
- after a long stream the engine's state holds no more than the open incident's;
- killed after any record and resumed from its checkpoint (`resumed`: `min_open_offset`, the
  facts in force there, `bridge.skip` as the agent uses it), it sends what one run sends.

`VLLM_TRACE_BRIDGE_FUZZ_EXAMPLES` sets the size (default 300).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st
from test_lifecycle import _timelines, engine_dead_traceback, sigterm_abort_mode

from bridge.assemble import EngineTimeline, RequestTimeline
from bridge.decode import Decoder
from bridge.decode.stream import RecordStream
from bridge.parse import FAST_PARSE, Parser
from bridge.parse.events import EngineError
from bridge.tail import read_lines

EXAMPLES = int(os.environ.get("VLLM_TRACE_BRIDGE_FUZZ_EXAMPLES", "300"))
NS = 1_000_000_000
T0 = 1_796_112_000 * NS  # 12-01 08:00:00, year 2026
TTL_NS = 600 * NS  # AssembleConfig.ttl_s
LINGER_NS = 5 * NS  # AssembleConfig.linger_s

CORES = ("EngineCore pid=200", "EngineCore_DP0 pid=200", "EngineCore_DP1 pid=201")
WORKERS = ("Worker_TP1 pid=301", "Worker_DP0_TP0 pid=310", "Worker_DP1_TP0 pid=311")
STARTUP = (("backends.py:1128", "Dynamo bytecode transform time: 14.14 s"),
           ("monitor.py:53", "torch.compile took 82.29 s in total"),
           ("monitor.py:81", "Initial profiling/warmup run took 76.71 s"),
           ("default_loader.py:262", "Loading weights took 24.84 seconds"),
           ("parallel_state.py:1165", "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0"))
#: seconds between two lines: around the window (5 s), the warning's interval (60 s) and the TTL
GAPS = (0, 0, 1, 2, 4, 5, 6, 30, 59, 60, 61, 64, 65, 66, 90, 300, 599, 600, 601, 700)


def hms(t: int) -> str:
    return f"{8 + t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}"


def line(process: str, t: int, origin: str, msg: str, level: str = "INFO") -> str:
    return f"({process}) {level} 12-01 {hms(t)} [{origin}] {msg}" if process else \
        f"{level} 12-01 {hms(t)} [{origin}] {msg}"


def api(t: int, origin: str, msg: str, level: str = "INFO") -> str:
    return line("APIServer pid=100", t, origin, msg, level)


class Log:
    """Renders a random walk of actions into lines, keeping which requests are in flight."""

    def __init__(self) -> None:
        self.t = 0
        self.n = 0
        self.in_flight: list[str] = []
        self.lines: list[str] = []
        self.seen: dict[str, int] = {}  # request id → the time of its latest line

    def do(self, action: tuple) -> None:
        kind, gap, pick = action
        self.t += gap
        t, out = self.t, self.lines
        core_p = CORES[pick % 3]
        if kind == "banner":
            out.append(line(core_p, t, "core.py:93", "Initializing a V1 LLM engine (v0.10.0) with config: model='m', "
                                                     "speculative_config=None, tokenizer='m'"))
            self.in_flight.clear()
        elif kind == "startup":
            origin, msg = STARTUP[pick % len(STARTUP)]
            out.append(line(WORKERS[pick % 3], t, origin, msg))
        elif kind == "listening":
            out.append(api(t, "api_server.py:1874", "Starting vLLM API server 0 on http://0.0.0.0:8000"))
        elif kind == "request":
            rid = f"chatcmpl-{self.n:024x}"
            self.n += 1
            out += [api(t, "request_logger.py:65", f"Received request {rid}: params: SamplingParams(n=1, "
                                                   f"max_tokens=16), lora_request: None."),
                    api(t, "async_llm.py:578", f"Added request {rid}-0a0b0c0d.")]
            self.in_flight.append(rid)
            self.seen[rid] = t
        elif kind == "finish" and (live := [r for r in self.in_flight if t - self.seen[r] < 500]):
            # (a request quiet for the TTL was closed; a line of it after would be another root)
            rid = live[pick % len(live)]
            self.in_flight.remove(rid)
            self.seen[rid] = t
            out.append(api(t, "request_logger.py:109", f"Generated response {rid}: output: 'ok', finish_reason: stop"))
        elif kind == "stats":
            n = len(self.in_flight)
            out.append(api(t, "loggers.py:300", f"Engine 000: Avg prompt throughput: 1.2 tokens/s, Avg generation "
                                                f"throughput: 3.4 tokens/s, Running: {n} reqs, Waiting: 0 reqs, "
                                                f"GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%"))
        elif kind == "hang":
            out.append(line(core_p, t, "shm_broadcast.py:750", "No available shared memory broadcast block found in "
                            "60 seconds. This typically happens when some processes are hanging or doing some "
                            "time-consuming work (e.g. compilation, weight/kv cache quantization)."))
        elif kind == "watchdog":
            ran_ms = (1000, 59_000, 65_000, 300_000, 600_010, 900_000)[pick % 6]
            out.append(f"({WORKERS[pick % 3]}) [rank1]:[E1201 {hms(t)}.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] "
                       f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                       f"NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for {ran_ms} milliseconds before timing out.")
        elif kind == "worker_died":
            out.append(line(core_p, t, "multiproc_executor.py:520", "Worker proc VllmWorker-1 died unexpectedly, "
                                                                    "shutting down executor.", "ERROR"))
        elif kind == "core_died":
            name = ("EngineCore_DP0", "EngineCore_DP1")[pick % 2]
            proc = "" if pick % 3 == 0 else "APIServer pid=100"  # the client's line often has no prefix
            out.append(line(proc, t, "core_client.py:818", f"Engine core proc {name} died unexpectedly, "
                                                           "shutting down client.", "ERROR"))
        elif kind == "dead":
            out += engine_dead_traceback(hms(t))
        elif kind == "stop":
            out += sigterm_abort_mode(hms(t), len(self.in_flight))
        elif kind == "lease":  # NIXL reaped a prefill's blocks: one never seen, one in flight or finished
            # (within the TTL of what the log said of it last: a request's id is forgotten after)
            recent = [rid for rid, last in self.seen.items() if t - last < 500]
            if pick % 4 == 0 or not recent:
                rid = f"chatcmpl-lease{self.n:019x}"
                self.n += 1
                self.seen[rid] = t  # (a line of a request emitted already keeps it no longer)
            else:  # the same prefill's expiry again (each TP worker prints its own), or a request's
                rid = recent[pick % len(recent)]
            out.append(line(WORKERS[pick % 3], t, "nixl_connector.py:1049", f"Releasing expired KV blocks for "
                            f"request {rid}-0a0b0c0d which were retrieved by 0 remote worker(s) within 120 "
                            f"seconds.", "WARNING"))


KINDS = ("banner", "startup", "startup", "listening", "request", "request", "finish", "stats", "hang", "hang",
         "hang", "watchdog", "worker_died", "core_died", "dead", "stop")
ACTION = st.one_of(st.tuples(st.sampled_from(KINDS), st.sampled_from(GAPS), st.integers(0, 59)),
                   # a lease runs out within the TTL of the request's last line (the id is not forgotten)
                   st.tuples(st.just("lease"), st.sampled_from((0, 1, 5, 30, 60)), st.integers(0, 59)))
#: a hang warned at its interval for a while (a run of warnings), the shape most rules are about
HANG_RUN = st.tuples(st.just("hang"), st.sampled_from((58, 60, 60, 61, 64, 66)), st.integers(0, 59))
#: an engine starting: its banner, then its workers' progress between the core's wait warnings
START_RUN = st.tuples(st.just(("banner", 5, 0)), st.lists(st.one_of(
    HANG_RUN, st.tuples(st.just("startup"), st.sampled_from((0, 1, 20, 40, 59, 70)), st.integers(0, 59))),
    min_size=1, max_size=10)).map(lambda run: [run[0], *run[1]])
WALK = st.lists(st.one_of(ACTION, st.lists(HANG_RUN, min_size=2, max_size=12), START_RUN), min_size=1, max_size=40)


def render(walk) -> list[str]:
    log = Log()
    for step in walk:
        for action in (step if isinstance(step, list) else [step]):
            log.do(action)
    return log.lines


def timelines_and_errors(lines: list[str], fast: bool) -> tuple[list, object, int]:
    """What the pipeline emits, the assembler's counters, and the error records the parser read."""
    from bridge.assemble import Assembler
    from bridge.tail.source import source_for

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "vllm.log")
        Path(path).write_text("\n".join(lines) + "\n")
        stream = RecordStream(Decoder(year=2026))
        parser = Parser(fast=FAST_PARSE if fast else None)
        out: list = []
        asm = Assembler(source_for(path), out.append, fast=fast)
        errors = 0
        for record in stream.over(read_lines(path)):
            event = parser.parse(record.message, record.level, record.origin)
            if event is not None:
                errors += type(event) is EngineError
                asm.feed(record, event)
        asm.flush()
        again = _timelines(path, fast)
    assert [_key(t) for t in out] == [_key(t) for t in again], "a second run differs"
    return out, asm.stats, errors


def _key(t):
    """A timeline without its source (equal sources of two temporary files differ by path)."""
    return t.__class__.__name__, {f: getattr(t, f) for f in t.__slots__ if f != "source"} \
        if hasattr(t, "__slots__") else t


def incidents(out) -> list[EngineTimeline]:
    return [t for t in out if isinstance(t, EngineTimeline) and t.kind != "startup"]


def check(lines: list[str]) -> list:
    out, stats, errors = timelines_and_errors(lines, True)
    pure, pure_stats, pure_errors = timelines_and_errors(lines, False)
    assert [_key(t) for t in out] == [_key(t) for t in pure], "C and Python disagree"
    assert (stats, errors) == (pure_stats, pure_errors)
    incs = incidents(out)
    for i in incs:
        assert i.start_ns <= i.end_ns, i
        assert i.end_ns - i.start_ns <= TTL_NS, ("held past the TTL", i)
    by_engine: dict = {}
    for i in incs:
        by_engine.setdefault(i.attrs.get("vllm.dp.rank"), []).append(i)
    for rank, group in by_engine.items():
        group.sort(key=lambda i: (i.start_ns, i.end_ns))
        for a, b in zip(group, group[1:]):
            assert b.start_ns >= a.end_ns, ("two incidents of one engine overlap", rank, a, b)
    assert stats.engine_incidents == len(incs)
    roots = [t.request_id for t in out if isinstance(t, RequestTimeline)]
    assert len(roots) == len(set(roots)), "two roots for one request"
    waits = sum(t.attrs.get("vllm.startup.waits", 0) for t in out
                if isinstance(t, EngineTimeline) and t.kind == "startup")
    counted = sum(i.attrs["vllm.incident.lines"] for i in incs) + waits + stats.stop_errors + stats.death_errors
    assert counted == errors, ("error lines unaccounted for", counted, errors, stats)
    fatal = {}
    for i in incs:
        if i.attrs["vllm.incident.fatal"]:
            for rid in i.affected:
                fatal.setdefault(rid, []).append(i)
    for r in out:
        if isinstance(r, RequestTimeline) and r.outcome == "failed" and r.request_id in fatal:
            # (its span runs to its last line, which may come after the incident's)
            ended_by = [i for i in fatal[r.request_id] if i.start_ns <= r.end_ns]
            assert ended_by, r
            # its type is final once no line of the incident can come before the request goes out
            # (it lingers `linger_s` after its end): then request, event and span say one type
            if all(i.end_ns < r.end_ns + LINGER_NS for i in ended_by):
                types = {i.error_type for i in ended_by}
                assert r.error_type in types, (r.request_id, r.error_type, ended_by)
                events = [e.attrs["error.type"] for e in r.events if e.name == "vllm.engine.incident"]
                assert events[-1] == r.error_type, (events, r.error_type, ended_by)
    return out


def resumed(lines: list[str], k: int) -> tuple[list, list, object]:
    """The agent's restart on the assembler alone: a run of the whole log, and one killed after
    its `k`-th record, resumed where its checkpoint would be (`min_open_offset`, the engine facts
    in force there) skipping what it delivered (`bridge.skip`, as agent.py does). Returns the
    whole run's timelines, the killed run's and the resumed one's together (each once), and the
    killed run's engine (what it knew when it was killed) with the whole run's counters."""
    from bridge.assemble import Assembler
    from bridge.skip import key, sent_before, unsent
    from bridge.tail.source import source_for

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "vllm.log")
        Path(path).write_text("\n".join(lines) + "\n")
        stream, parser = RecordStream(Decoder(year=2026)), Parser(fast=FAST_PARSE)
        recs = [(r, e) for r in stream.over(read_lines(path))
                if (e := parser.parse(r.message, r.level, r.origin)) is not None]

        def run(fed, facts=None):
            out: list = []
            asm = Assembler(source_for(path), out.append)
            if facts:
                asm.resume_facts(facts)
            for record, event in fed:
                asm.feed(record, event)
            return asm, out

        whole_asm, whole = run(recs)
        whole_asm.flush()
        killed_asm, killed = run(recs[:k])
        at = killed_asm.min_open_offset
        if at is None:
            at = recs[k][0].offset if k < len(recs) else 1 << 62
        skip = {key(t): t.last_offset for t in killed}
        fed = [(r, unsent(skip, r.offset, e)) for r, e in recs if r.offset >= at]
        resumed_asm, after = run([(r, e) for r, e in fed if e is not None], killed_asm.facts_at(at))
        resumed_asm.flush()
    sent = [_unaffected(t) for t in killed]
    sent += [x for x in (_unaffected(t) for t in after if not sent_before(skip, t)) if x not in sent]
    return [_unaffected(t) for t in whole], sent, (killed_asm.engine, whole_asm.stats)


def _unaffected(t):
    """`_key` without which requests an incident hit: a request that went out while the incident
    was still open (ended, or past its TTL during an hour's hang) is not read again after a
    restart, so the incident rebuilt then cannot name it (a known gap: the requests carry the
    incident's event either way)."""
    kind, fields = _key(t)
    if kind == "EngineTimeline":
        fields = {**fields, "affected": None, "attrs": {k: v for k, v in fields["attrs"].items()
                                                        if k != "vllm.requests_affected"}}
    return kind, fields


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(WALK, st.floats(0.05, 0.95))
def test_a_restart_anywhere_sends_what_one_run_sends(walk, cut):
    """Killed after any record and resumed from its checkpoint, the assembler sends what one
    run sends, no span twice and none lost: incidents held open for their window, starts that
    absorbed waits, orphan prefills of lease expiries. Not where the engine had died or was
    being stopped (when killed, or lines after told so): a checkpoint keeps no engine state but
    its facts (a known gap)."""
    lines = render(walk)
    k = int(len(lines) * cut)
    whole, sent, (engine, stats) = resumed(lines, k)
    assume(engine.death is None and engine.stop_ns is None and not stats.death_errors and not stats.stop_errors)
    note("\n".join(lines))
    assert [x for x in whole if x not in sent] == [] and [x for x in sent if x not in whole] == []


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(WALK)
def test_generated_logs_keep_the_incident_invariants(walk):
    lines = render(walk)
    note("\n".join(lines))
    out = check(lines)
    # what the walk reached (`--hypothesis-show-statistics`)
    starts = [t for t in out if isinstance(t, EngineTimeline) and t.kind == "startup"]
    event(f"waits absorbed into a start: {any(t.attrs.get('vllm.startup.waits') for t in starts)}"
          if starts else "no start")
    event(f"incidents: {min(len(incidents(out)), 3)}")


# -- what the generator found, kept as examples ----------------------------------------------------

def test_a_sibling_engines_incident_told_more_by_a_later_line_retypes_what_it_ended():
    """DP0 hangs (its warning holds an incident open); meanwhile DP1's worker dies (DP1's own
    incident, a sibling, fatal: the request fails) and DP1's core warns of its wait 2 s later,
    while the request lingers. The sibling's later line made its type more specific; the request
    it ended and the event on it must say that type too, as they do for the first engine's
    incident (found by the walk: request, hang DP0, worker_died DP1, hang DP1)."""
    log = Log()
    for action in [("request", 0, 0), ("hang", 60, 1), ("worker_died", 1, 2), ("hang", 2, 2)]:
        log.do(action)
    out = check(log.lines)
    (dp1,) = [i for i in incidents(out) if i.attrs.get("vllm.dp.rank") == 1]
    (r,) = [t for t in out if isinstance(t, RequestTimeline)]
    assert r.outcome == "failed" and r.error_type == dp1.error_type
    assert [e.attrs["error.type"] for e in r.events if e.name == "vllm.engine.incident"][-1] == dp1.error_type


def test_a_long_stream_leaves_the_engine_holding_no_more_than_its_open_incident():
    """Hours of hangs, deaths, restarts, starts and requests: what `EngineLife` keeps is its open
    incident's, nothing grows with the stream (lists and dicts of its own, not the requests')."""
    from bridge.assemble import Assembler
    from bridge.decode.record import CLOCK_EXACT  # noqa: F401  (the decoder stamps it)
    from bridge.tail.source import source_for

    import random

    rnd = random.Random(7)
    log = Log()
    kinds = [k for k in KINDS if k != "stop"] + ["lease"]
    for _ in range(3000):
        log.do((rnd.choice(kinds), rnd.choice((0, 1, 5, 30, 60, 61)), rnd.randrange(60)))
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "vllm.log")
        Path(path).write_text("\n".join(log.lines) + "\n")
        stream, parser = RecordStream(Decoder(year=2026)), Parser(fast=FAST_PARSE)
        out: list = []
        asm = Assembler(source_for(path), out.append)
        sizes = []
        for n, record in enumerate(stream.over(read_lines(path))):
            event = parser.parse(record.message, record.level, record.origin)
            if event is not None:
                asm.feed(record, event)
            if n % 500 == 0:
                life = asm.engine
                inc = life.incident
                sizes.append((len(life._siblings), len(life._stats_engines),
                              0 if inc is None else len(inc.affected), 0 if inc is None else len(inc.failed),
                              len(asm.index.open)))
    assert len(incidents(out)) > 20
    for siblings, engines, affected, failed, open_ in sizes:
        assert siblings <= 2 and engines <= 3 and affected <= open_ + failed and failed <= 60, sizes
    assert max(s[4] for s in sizes) < 200, sizes  # requests: bounded by the TTL


def test_a_lease_expiry_after_a_restart_opens_no_second_root_for_a_delivered_prefill():
    """A prefill served and emitted; the agent restarts; NIXL's expiry of its lease comes later
    (the lease outlasts `kv_hold_s`). One run counts that line an orphan (`index.gone`); the
    resumed agent knows the request only from its checkpoint's delivered list, which must keep
    the line from opening an orphan root for it (found by the walk: lease, start, lease)."""
    log = Log()
    for action in [("request", 0, 0), ("finish", 1, 0), ("stats", 69, 0), ("lease", 20, 1)]:
        log.do(action)
    assert "Releasing expired KV blocks for request chatcmpl-000000000000000000000000-" in log.lines[-1]
    whole, sent, _ = resumed(log.lines, 4)  # killed after the stats line: the request was delivered
    assert [t["request_id"] for kind, t in whole if kind == "RequestTimeline"] == ["chatcmpl-" + "0" * 24]
    assert sent == whole


def test_a_start_that_absorbed_waits_holds_their_lines_for_a_restart():
    """Warnings of a wait, then the start's first line (no banner before it: an excerpt, a
    start read from its middle): the waits were the start's work, counted on its span. A
    checkpoint must hold the start's lines from the first warning, or a restart re-reads only
    the startup line and sends a start without its waits (found by the walk: hang, hang,
    startup, lease, banner)."""
    log = Log()
    for action in [("hang", 58, 0), ("hang", 58, 0), ("startup", 0, 0), ("startup", 20, 1)]:
        log.do(action)
    whole, sent, _ = resumed(log.lines, 3)  # killed after the first startup line
    (start,) = [t for kind, t in whole if kind == "EngineTimeline"]
    assert (start["kind"], start["attrs"]["vllm.startup.waits"], start["start_ns"]) == ("startup", 2, T0 + 58 * NS)
    assert sent == whole


def test_a_watchdog_after_the_warnings_stopped_is_its_own_incident_whatever_it_ran_for():
    """Warnings each minute until 08:03, the watchdog at 08:06:40 on a collective that `ran for`
    350 s (from 08:00:50, while the wait was warned of). The wait went quiet for its window at
    08:04:05 and a tick sent it (in the agent on the wall clock, in a replay at the next line):
    nothing joins it after, so replay and agent group alike; the watchdog is its own incident.
    (The rule read `ran for` to join such a line; a tick always came first: never ran.)"""
    log = Log()
    for action in [("hang", 60, 0), ("hang", 60, 0), ("hang", 60, 0)]:
        log.do(action)
    log.lines.append(f"(Worker_TP1 pid=301) [rank1]:[E1201 {hms(400)}.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] "
                     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
                     "NumelOut=1, Timeout(ms)=600000) ran for 350000 milliseconds before timing out.")
    got = [(i.start_ns - T0, i.end_ns - T0, i.error_type) for i in incidents(check(log.lines))]
    at = 400 * NS + 123_456_789  # the glog stamp's fraction
    assert got == [(60 * NS, 180 * NS, "timeout"), (at, at, "distributed")]
