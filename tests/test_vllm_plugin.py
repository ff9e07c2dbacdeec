"""The vLLM plugin without vLLM: its switches, its version gate, and its hooks on a stand-in
scheduler with the same method names (the real one is tested in tests/plugin/)."""

from __future__ import annotations

import types

import pytest
from plugin_log import log  # noqa: F401  (a fixture)

from bridge.parse.events import Preempted, QueueState, RequestEnded, RequestSummary, Scheduled
from bridge.parse.seed import parse_message
from bridge.vllm_plugin import enabled, hooks, register, version_tested


@pytest.mark.parametrize("version, ok", [
    ("0.32.0", True), ("0.32.1+cpu", True), ("0.32.0rc1", True), ("0.31.9", False), ("0.33.0", True), ("0.34.0", False),
    ("1.32.0", False), ("dev", False), ("", False),
])
def test_version_gate(version, ok):
    assert version_tested(version) is ok


def test_switch():
    assert enabled({}) and enabled({"VLLM_TRACE_BRIDGE_PLUGIN": "1"})
    for off in ("0", "false", "off", "no", ""):
        assert not enabled({"VLLM_TRACE_BRIDGE_PLUGIN": off})


class Status:
    def __init__(self, name):
        self.name = name


class Req:
    def __init__(self, rid, arrival, prompt=10):
        self.request_id = rid
        self.arrival_time = arrival
        self.priority = 0
        self.num_output_tokens = 0
        self.num_prompt_tokens = prompt
        self.status = Status("WAITING")


class Pool:
    num_gpu_blocks = 8

    def __init__(self):
        self.free = 8

    def get_num_free_blocks(self):
        return self.free


def make_scheduler_class(broken: str | None = None):
    """A stand-in with the five hooked methods; `broken` names one that raises."""

    class Sched:
        def __init__(self):
            self.requests = {}
            self.running = []
            self.waiting = []
            self.blocks = {}
            pool = Pool()
            self.kv_cache_manager = types.SimpleNamespace(
                block_pool=pool, get_block_ids=lambda rid: (list(self.blocks.get(rid, ())),))
            self.kv_cache_config = types.SimpleNamespace(kv_cache_tensors=[types.SimpleNamespace(size=8 * 4096)],
                                                         num_blocks=8)

        def add_request(self, request):
            self.requests[request.request_id] = request
            self.waiting.append(request)

        def schedule(self):
            if broken == "schedule":
                raise RuntimeError("vLLM's own error")
            new = []
            for r in list(self.waiting):
                self.blocks[r.request_id] = [len(self.blocks) * 2, len(self.blocks) * 2 + 1]
                self.kv_cache_manager.block_pool.free -= 2
                new.append(types.SimpleNamespace(req_id=r.request_id, block_ids=(self.blocks[r.request_id],)))
                self.running.append(r)
            self.waiting = []
            return types.SimpleNamespace(
                scheduled_new_reqs=new,
                scheduled_cached_reqs=types.SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[]))

        def update_from_output(self, tokens):
            for r in self.running:
                r.num_output_tokens += tokens
            return "vllm-result"

        def _preempt_request(self, request, timestamp, drop_stale_output=False):
            self._free_request_blocks(request)

        def _free_request(self, request, delay_free_blocks=False):
            self._free_request_blocks(request)
            return ("kv", "ec")

        def _free_request_blocks(self, request):
            self.kv_cache_manager.block_pool.free += len(self.blocks.pop(request.request_id, ()))

    return Sched


def make_output_class():
    """A stand-in for vLLM's OutputProcessor: the hooked methods, as vLLM 0.32 runs them (its
    `_finish_request` drops the state and the external id's mapping before the stats)."""

    class OutputProcessor:
        def __init__(self):
            self.calls = 0
            self.request_states = {}
            self.external_req_ids = {}
            self.parent_requests = {}

        def add(self, state):
            self.request_states[state.request_id] = state
            self.external_req_ids.setdefault(state.external_req_id, []).append(state.request_id)

        def finish(self, state, reason, iteration_stats):
            self.request_states.pop(state.request_id)
            ids = self.external_req_ids[state.external_req_id]
            ids.remove(state.request_id)
            if not ids:
                del self.external_req_ids[state.external_req_id]
            self._update_stats_from_finished(state, reason, iteration_stats)

        def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats):
            self.calls += 1
            return None

        def abort_requests(self, request_ids, internal):
            out = []
            for rid in request_ids:
                for i in ([rid] if internal else self.external_req_ids.pop(rid, [])):
                    if self.request_states.pop(i, None) is not None:
                        out.append(i)
            return out

    return OutputProcessor


def make_stats_class():
    """vLLM's IterationStats.update_from_events, as far as the plugin relies on it."""

    class IterationStats:
        def update_from_events(self, req_id, events, is_prefilling, req_stats, lora_states=None, lora_name=None):
            for ev in events:
                if ev.type.name == "QUEUED":
                    req_stats.queued_ts = ev.timestamp
                elif ev.type.name == "SCHEDULED" and not req_stats.scheduled_ts:
                    req_stats.scheduled_ts = ev.timestamp
                elif ev.type.name == "PREEMPTED":
                    req_stats.num_preemptions += 1

    return IterationStats


def make_async_class():
    class AsyncLLM:
        async def add_request(self, request_id, prompt=None, params=None, arrival_time=None, lora_request=None,
                              tokenization_kwargs=None, trace_headers=None, priority=0):
            self.seen = trace_headers
            return "collector"

    return AsyncLLM


def install(cls, log, version="0.32.0", output_cls=None, stats_cls=None, async_cls=None):
    return hooks.install(cls, version, log, output_cls=output_cls or make_output_class(), stats_cls=stats_cls,
                         async_cls=async_cls)


def test_hooks_write_the_seed_lines_the_bridge_parses(log, monkeypatch):
    """vLLM keeping no stats (`--disable-log-stats`): the engine core writes the summary."""
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "1")
    cls = make_scheduler_class()
    assert install(cls, log)
    s = cls()
    r = Req("cmpl-abc-0-1a2b3c4d", arrival=__import__("time").time() - 0.5)
    s.add_request(r)
    s.schedule()
    assert s.update_from_output(1) == "vllm-result"
    s._preempt_request(r, 0.0)
    r.num_output_tokens = 5
    r.status = Status("FINISHED_STOPPED")
    assert s._free_request(r) == ("kv", "ec")
    events = [parse_message(line) for line in log.lines]
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Scheduled", "BlockAllocated", "BlockAllocated", "QueueState", "Preempted",
                     "BlockFreed", "BlockFreed", "RequestSummary"], log.lines
    sched = events[0]
    assert isinstance(sched, Scheduled) and sched.request_id == "cmpl-abc-0"  # V1's suffix stripped
    assert (sched.blocks, sched.remaining_blocks) == (2, 6)
    assert 0 <= sched.queued_s < 1  # the engine's own queue time, as vLLM's time_in_queue
    assert events[1].size_bytes == 4096
    assert isinstance(events[3], QueueState) and (events[3].running, events[3].total_blocks) == (1, 8)
    assert isinstance(events[4], Preempted) and (events[4].reason, events[4].blocks) == ("kv_cache_full", 2)
    summary = events[-1]
    assert isinstance(summary, RequestSummary) and summary.generated_tokens == 5
    assert 0.5 <= summary.e2e_s < 5 and summary.ttft_s <= summary.e2e_s
    # the engine's own id, stated beside the API server's: what tells twins under one id apart
    assert sched.internal_id == events[4].internal_id == summary.times.internal_id == "cmpl-abc-0-1a2b3c4d"
    t = s.__dict__[hooks._ATTR]
    assert not t.ids and not t.first_token and not t.queued_at and not t.pending_first  # nothing kept


@pytest.mark.parametrize("end", ["FINISHED_ABORTED", "FINISHED_ERROR", "FINISHED_IGNORED"])
def test_no_summary_unless_completed_and_block_lines_are_off_by_default(log, end):
    cls = make_scheduler_class()
    install(cls, log)
    s = cls()
    r = Req("chatcmpl-x", arrival=0.0)
    s.add_request(r)
    s.schedule()
    s._preempt_request(r, 0.0)  # its count is on the Preempting line: no free line for it
    s.waiting.append(r)
    s.schedule()
    r.status = Status(end)
    s._free_request(r)
    events = [parse_message(x) for x in log.lines]
    assert [type(e).__name__ for e in events] == ["Scheduled", "QueueState", "Preempted", "Scheduled",
                                                  "BlockFreed"], log.lines
    freed = events[-1]
    assert (freed.block, freed.count, freed.request_id) == ("", 2, "chatcmpl-x")
    assert all(e.internal_id is None for e in events if hasattr(e, "internal_id"))  # ids kept as given: none
    assert not any("internal_id=" in x for x in log.lines)
    assert freed.reason == ("aborted" if end == "FINISHED_ABORTED" else "completed")


def test_engine_lines_state_the_engine_id_when_vllm_made_it_unique(log):
    """vLLM ≥ 0.14 adds `-<8 hex>` to each request's engine id: the lines name the API server's
    id (their join with vLLM's own lines) and state the engine's (`internal_id=`), which is what
    `Added request` names and what tells two requests under one X-Request-Id apart."""
    cls = make_scheduler_class()
    install(cls, log)
    s = cls()
    reqs = [Req("cmpl-q-0-0a0b0c0d", arrival=0.0), Req("cmpl-q-0-1a1b1c1d", arrival=0.0)]
    for r in reqs:
        s.add_request(r)
    s.schedule()
    for r in reversed(reqs):
        r.status = Status("FINISHED_STOPPED")
        s._free_request(r)
    got = [(type(e).__name__, e.request_id, e.internal_id) for e in map(parse_message, log.lines)
           if hasattr(e, "internal_id")]
    assert got == [("Scheduled", "cmpl-q-0", "cmpl-q-0-0a0b0c0d"), ("Scheduled", "cmpl-q-0", "cmpl-q-0-1a1b1c1d"),
                   ("BlockFreed", "cmpl-q-0", "cmpl-q-0-1a1b1c1d"), ("BlockFreed", "cmpl-q-0", "cmpl-q-0-0a0b0c0d")]


class Stats:
    """vLLM's RequestStateStats, as the API server holds it at the end of a request."""

    def __init__(self, arrival, first_token_latency, generated, first_ts, last_ts, queued_ts=0.0, scheduled_ts=0.0):
        self.arrival_time = arrival
        self.first_token_latency = first_token_latency
        self.num_generation_tokens = generated
        self.queued_ts = queued_ts
        self.scheduled_ts = scheduled_ts
        self.first_token_ts = first_ts
        self.last_token_ts = last_ts
        self.num_preemptions = 0


def state(rid, ext, stats, prompt_len=12):
    return types.SimpleNamespace(request_id=rid, external_req_id=ext, prompt_len=prompt_len, stats=stats)


def test_with_vllm_stats_the_engine_core_is_untouched(log):
    """vLLM's default (`log_stats`): the scheduler keeps vLLM's own methods, nothing in between."""
    cls = make_scheduler_class()
    cls.log_stats = True
    assert install(cls, log)
    s = cls()
    assert not any(name in vars(s) for name in hooks.HOOKED)  # no wrapper bound on the instance
    r = Req("cmpl-abc-0-1a2b3c4d", arrival=100.0)
    s.add_request(r)
    s.schedule()
    s.update_from_output(7)
    r.status = Status("FINISHED_LENGTH_CAPPED")
    s._free_request(r)
    assert log.lines == []


def test_the_api_server_line_carries_vllms_own_numbers_and_event_times(log):
    """One line, from vLLM's RequestStateStats: ttft / itl / e2e as vLLM computes them, and its
    engine-core stamps (monotonic) on the wall clock with the process's one offset."""
    import time

    out_cls = make_output_class()
    assert install(make_scheduler_class(), log, output_cls=out_cls)
    op = out_cls()
    mono = time.monotonic()
    wall = time.time() - mono
    st = state("cmpl-abc-0-1a2b3c4d", "cmpl-abc-0",
               Stats(100.0, 0.0421234, 7, mono + 0.010, mono + 0.070, queued_ts=mono + 0.001, scheduled_ts=mono + 0.004))
    op.add(st)
    op.finish(st, types.SimpleNamespace(name="LENGTH"), types.SimpleNamespace(iteration_timestamp=100.5))
    assert op.calls == 1
    summary = parse_message(log.lines[-1])
    assert isinstance(summary, RequestSummary) and summary.request_id == "cmpl-abc-0"
    assert summary.at_ns == 100_500_000_000  # the end is vLLM's own iteration stamp, to the µs
    assert (summary.prompt_tokens, summary.generated_tokens) == (12, 7)
    assert summary.ttft_s == pytest.approx(0.0421234, abs=1e-6)       # vLLM's first_token_latency
    assert summary.e2e_s == pytest.approx(0.5, abs=1e-6)              # iteration stamp − arrival
    assert summary.itl_s == pytest.approx(0.060 / 6, abs=1e-6)        # decode time / (n − 1)
    t = summary.times
    assert t.arrival_ns == 100_000_000_000
    for got, mono_ts in ((t.queued_ns, mono + 0.001), (t.scheduled_ns, mono + 0.004),
                         (t.first_token_ns, mono + 0.010), (t.last_token_ns, mono + 0.070)):
        assert abs(got / 1e9 - (mono_ts + wall)) < 2e-3
    # vLLM's intervals, to the µs the line prints: time_in_queue, time_in_model_prefill / _decode
    assert (t.scheduled_ns - t.queued_ns) / 1e9 == pytest.approx(0.003, abs=2e-6)
    assert (t.first_token_ns - t.scheduled_ns) / 1e9 == pytest.approx(0.006, abs=2e-6)
    assert (t.last_token_ns - t.first_token_ns) / 1e9 == pytest.approx(0.060, abs=2e-6)
    assert t.preempted == () and t.caller is None
    assert t.internal_id == "cmpl-abc-0-1a2b3c4d"  # the engine's id of the request, beside the API id
    n = len(log.lines)
    op._update_stats_from_finished(state("x", "x", None), types.SimpleNamespace(name="STOP"),
                                   types.SimpleNamespace(iteration_timestamp=1.0))  # no stats kept
    op._update_stats_from_finished(st, types.SimpleNamespace(name="STOP"), None)
    assert len(log.lines) == n


def test_preemptions_aborts_and_errors_get_their_times_and_an_ended_line(log):
    out_cls, stats_cls = make_output_class(), make_stats_class()
    assert install(make_scheduler_class(), log, output_cls=out_cls, stats_cls=stats_cls)
    op, it = out_cls(), stats_cls()
    st = state("cmpl-p-0-00000000", "cmpl-p-0", Stats(__import__("time").time() - 1, 0.0, 0, 0.0, 0.0))
    op.add(st)
    it.update_from_events(st.request_id, [Event("QUEUED", 10.0), Event("SCHEDULED", 10.5)], True, st.stats)
    it.update_from_events(st.request_id, [Event("PREEMPTED", 11.0)], False, st.stats)
    it.update_from_events(st.request_id, [Event("SCHEDULED", 11.25)], False, st.stats)
    it.update_from_events(st.request_id, [Event("PREEMPTED", 12.0)], False, st.stats)
    assert op.abort_requests(["cmpl-p-0"], internal=False) == [st.request_id]  # the client went
    ended = parse_message(log.lines[-1])
    assert isinstance(ended, RequestEnded) and (ended.request_id, ended.finish) == ("cmpl-p-0", "abort")
    pre = ended.times.preempted
    assert len(pre) == 2 and pre[1][1] is None  # the second never rescheduled
    assert (pre[0][1] - pre[0][0]) / 1e9 == pytest.approx(0.25, abs=2e-6)
    assert ended.times.first_token_ns is None  # never stamped: left out, not zero
    # an error end from the engine (FinishReason.ERROR): the same line, its reason
    st2 = state("cmpl-e-0-00000000", "cmpl-e-0", Stats(50.0, 0.0, 0, 0.0, 0.0))
    op.add(st2)
    op.finish(st2, types.SimpleNamespace(name="ERROR"), types.SimpleNamespace(iteration_timestamp=51.0))
    ended = parse_message(log.lines[-1])
    assert (ended.finish, ended.e2e_s, ended.at_ns) == ("error", 1.0, 51_000_000_000)
    assert op.abort_requests(["gone"], internal=True) == [] and len(log.lines) == 2


@pytest.mark.parametrize("headers, expect", [
    ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      "tracestate": "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE", "authorization": "Bearer secret"},
     ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")),
    ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "bad state!"},
     ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", None)),
    ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a= x"},
     ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", None)),
    ({"traceparent": "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"}, None),  # upper case
    ({"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}, None),  # zero trace
    ({"traceparent": "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, None),  # version ff
    ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x"}, None),  # 00 + more
    ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01, evil=1"}, None),
    ({"tracestate": "rojo=1"}, None),
])
def test_the_callers_traceparent_is_kept_strictly_and_nothing_else(log, headers, expect):
    import asyncio

    out_cls, async_cls = make_output_class(), make_async_class()
    assert install(make_scheduler_class(), log, output_cls=out_cls, async_cls=async_cls)
    engine, op = async_cls(), out_cls()
    assert asyncio.run(engine.add_request("cmpl-t-0", "p", None, trace_headers=headers)) == "collector"
    assert engine.seen == headers  # vLLM's own call gets its arguments untouched
    kids = [state(f"{i}_cmpl-t-0-0000000{i}", "cmpl-t-0", Stats(1.0, 0.1, 2, 0.0, 0.0)) for i in range(2)]  # n=2
    for k in kids:
        op.add(k)
    for k in kids:
        op.finish(k, types.SimpleNamespace(name="STOP"), types.SimpleNamespace(iteration_timestamp=2.0))
    assert len(log.lines) == 2 and "Bearer" not in "".join(log.lines) and "evil" not in "".join(log.lines)
    for line in log.lines:
        t = parse_message(line).times
        if expect is None:
            assert t.caller is None and "traceparent" not in line
        else:
            assert (t.caller.trace_id.hex(), t.caller.span_id.hex(), t.tracestate) == expect
    front = [c for c in vars(out_cls).values() if getattr(c, hooks._WRAPPED, False)]
    assert front  # and the context was let go with the last child:
    assert not any(v for v in _frontends(out_cls))


def _frontends(out_cls):
    """The Frontend states the wrappers close over (their kept contexts and preemptions)."""
    fn = out_cls._update_stats_from_finished
    cells = [c.cell_contents for c in fn.__closure__ or ()]
    fronts = [c for c in cells if isinstance(c, hooks.Frontend)]
    return [f.contexts for f in fronts] + [f.preempted for f in fronts]


def test_caller_context_can_be_refused_in_vllm_too(log, monkeypatch):
    import asyncio

    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_TRACE_CONTEXT", "0")
    out_cls, async_cls = make_output_class(), make_async_class()
    install(make_scheduler_class(), log, output_cls=out_cls, async_cls=async_cls)
    asyncio.run(async_cls().add_request(
        "r", trace_headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}))
    op = out_cls()
    st = state("r", "r", Stats(1.0, 0.1, 2, 0.0, 0.0))
    op.add(st)
    op.finish(st, types.SimpleNamespace(name="STOP"), types.SimpleNamespace(iteration_timestamp=2.0))
    assert "traceparent" not in log.lines[-1]


def test_the_line_writer_writes_vllms_format_whatever_vllms_logging_says(monkeypatch, tmp_path):
    """Not through `logging`: vLLM's level (VLLM_LOGGING_LEVEL=WARNING sets its loggers') and
    the root logger's do not drop the plugin's lines; replayed, the bridge reads them whole:
    the phases at vLLM's own stamps, the root under the caller's span."""
    import io
    import logging as lg

    from bridge.pipeline import replay

    monkeypatch.setattr(lg.getLogger("vllm"), "level", lg.WARNING)
    monkeypatch.setattr(lg.root, "level", lg.CRITICAL)
    buf = io.StringIO()
    w = hooks.LineWriter(buf, environ={})
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    w.info(hooks._PHASES, "cmpl-1-0", 3, 5, 40.0, 2.5, 0.5, 1764600000.5,
           ", arrival=1764600000.000000, queued_at=1764600000.010000, scheduled_at=1764600000.012000, "
           "first_token_at=1764600000.040000, last_token_at=1764600000.490000, "
           f"preempted=1764600000.100000~1764600000.200000, traceparent={tp}")
    line = buf.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert " INFO " in line and "[trace_bridge.py:1] Request cmpl-1-0: " in line and line.startswith("(")
    path = tmp_path / "api.log"
    path.write_text(line)
    out = []
    replay([str(path)], [out.append])
    (t,) = out
    ph = {p.name: p for p in t.phases}
    assert list(ph) == ["preprocess", "queued", "prefill", "preempted", "decode"]
    assert (ph["queued"].start_ns, ph["queued"].end_ns) == (1764600000_010000000, 1764600000_012000000)
    assert (ph["prefill"].start_ns, ph["prefill"].end_ns) == (1764600000_012000000, 1764600000_040000000)
    assert (ph["decode"].start_ns, ph["decode"].end_ns) == (1764600000_040000000, 1764600000_490000000)
    assert (ph["preempted"].start_ns, ph["preempted"].end_ns) == (1764600000_100000000, 1764600000_200000000)
    assert (t.start_ns, t.end_ns) == (1764600000_000000000, 1764600000_500000000)
    assert t.attrs["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.028)
    assert t.attrs["gen_ai.latency.time_in_queue"] == pytest.approx(0.002)
    assert t.attrs["vllm.preemptions"] == 1
    assert (t.parent.trace_id.hex(), t.parent.span_id.hex()) == ("0af7651916cd43dd8448eb211c80319c",
                                                                 "b7ad6b7169203331")
    assert t.attrs["vllm.trace_context"] == "traceparent"


def test_install_is_idempotent(log):
    cls = make_scheduler_class()
    out_cls = make_output_class()
    assert install(cls, log, output_cls=out_cls) and install(cls, log, output_cls=out_cls)
    s = cls()
    r = Req("a", 0.0)
    s.waiting.append(r)
    s.requests["a"] = r
    s.schedule()
    assert sum("Scheduling request" in x for x in log.lines) == 1


def test_an_untested_version_with_every_hook_point_installs_and_says_so(log):
    cls, out_cls = make_scheduler_class(), make_output_class()
    assert install(cls, log, "0.99.0", out_cls) is True
    assert len(log.lines) == 1 and "0.99.0 is not a version it was tested on" in log.lines[0]
    assert getattr(cls.__init__, hooks._WRAPPED, False)


def test_a_missing_api_server_hook_point_or_another_signature_is_named_and_changes_nothing(log):
    """The default mode lives in the API server: without one of its hook points (by any name, with
    the parameters its wrapper relies on) the plugin wraps nothing at all."""
    cls, out_cls = make_scheduler_class(), make_output_class()
    before, out_before = dict(vars(cls)), dict(vars(out_cls))
    del out_cls._update_stats_from_finished
    out_before.pop("_update_stats_from_finished")
    assert install(cls, log, "0.32.0", out_cls) is False
    assert dict(vars(cls)) == before and dict(vars(out_cls)) == out_before
    cls2, out_cls2 = make_scheduler_class(), make_output_class()
    out_cls2.abort_requests = lambda self, ids_to_abort, internal: []  # another first parameter
    assert install(cls2, log, "0.33.1", out_cls2) is False
    assert not getattr(cls2.__init__, hooks._WRAPPED, False)
    assert len(log.lines) == 2 and all("does nothing" in x for x in log.lines)
    assert log.lines[0].endswith("has no OutputProcessor._update_stats_from_finished")
    assert "OutputProcessor.abort_requests(request_ids), it takes (ids_to_abort, internal)" in log.lines[1]


def _finish_one(out_cls, rid="cmpl-g-0"):
    op = out_cls()
    st = state(rid, rid, Stats(1.0, 0.1, 2, 0.0, 0.0))
    op.add(st)
    op.finish(st, types.SimpleNamespace(name="STOP"), types.SimpleNamespace(iteration_timestamp=2.0))


@pytest.mark.parametrize("lacks", ["free", "preempt_signature", "preempt"])
def test_a_missing_engine_hook_point_leaves_the_engine_core_alone_and_the_api_server_on(log, monkeypatch, lacks):
    """0.10-0.11 have no `_preempt_request` (and 0.10's takes no timestamp): the API server's line
    is written as on any release; the engine core gets no wrapper, and says so once, only where
    its lines are wanted."""
    cls, out_cls = make_scheduler_class(), make_output_class()
    if lacks == "free":
        del cls._free_request_blocks
        cls._free_request = lambda self, request: None
    elif lacks == "preempt_signature":
        cls._preempt_request = lambda self, request, drop_stale_output=False: None  # no timestamp
    else:
        del cls._preempt_request
    cls.log_stats = True
    assert install(cls, log, "0.32.0", out_cls) is True
    assert log.lines == []
    _finish_one(out_cls)
    assert isinstance(parse_message(log.lines[-1]), RequestSummary)  # the default mode: every phase
    cls()  # stats on, no engine lines asked for: nothing to say
    assert len(log.lines) == 1
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_ENGINE", "1")
    s, s2 = cls(), cls()
    assert not any(name in vars(s) or name in vars(s2) for name in (*hooks.HOOKED, "_free_blocks"))
    assert len(log.lines) == 2 and "the engine core writes no line: vLLM 0.32.0 has no Scheduler." in log.lines[1]
    want = {"free": "Scheduler._free_request_blocks",
            "preempt_signature": "Scheduler._preempt_request(request, timestamp), it takes (request, drop_stale_output)",
            "preempt": "Scheduler._preempt_request"}[lacks]
    assert log.lines[1].endswith(want)


def test_a_missing_engine_hook_point_with_stats_off_says_there_is_no_line_at_all(log):
    cls, out_cls = make_scheduler_class(), make_output_class()
    del cls._preempt_request
    assert install(cls, log, "0.11.2", out_cls) is True
    cls()
    assert any("vLLM keeps no stats" in x and "drop --disable-log-stats" in x for x in log.lines)


def test_0_12_to_0_23_free_blocks_give_the_engine_lines(log, monkeypatch):
    """Before 0.24 a finished request's blocks are freed by `_free_blocks(request)` (vLLM
    0.23's source: `kv_cache_manager.free(request)`, then the request is dropped) and a
    preemption frees its blocks inside `_preempt_request`: the same lines come out."""
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "1")
    cls = make_scheduler_class()
    del cls._free_request_blocks

    def _free_blocks(self, request):
        assert request.status.name.startswith("FINISHED")
        self.kv_cache_manager.block_pool.free += len(self.blocks.pop(request.request_id, ()))
        del self.requests[request.request_id]

    def _preempt_request(self, request, timestamp):
        self.kv_cache_manager.block_pool.free += len(self.blocks.pop(request.request_id, ()))

    def _free_request(self, request):
        self._free_blocks(request)

    cls._free_blocks, cls._preempt_request, cls._free_request = _free_blocks, _preempt_request, _free_request
    cls.log_stats = True
    assert install(cls, log, "0.23.0") is True
    s = cls()
    assert "_free_blocks" in vars(s) and "_free_request_blocks" not in vars(s)
    r = Req("cmpl-o-0", arrival=0.0)
    s.add_request(r)
    s.schedule()
    s._preempt_request(r, 0.0)
    s.waiting.append(r)
    s.schedule()
    r.status = Status("FINISHED_STOPPED")
    s._free_request(r)
    assert "0.23.0 is not a version it was tested on" in log.lines[0]
    events = [parse_message(x) for x in log.lines[1:]]
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Scheduled", "BlockAllocated", "BlockAllocated", "QueueState", "Preempted", "BlockFreed",
                     "BlockFreed", "Scheduled", "BlockAllocated", "BlockAllocated", "BlockFreed", "BlockFreed"], log.lines
    assert [e.reason for e in events if type(e).__name__ == "BlockFreed"] == ["preempted"] * 2 + ["completed"] * 2
    assert s.__dict__[hooks._ATTR].on


def test_0_34_resumed_requests_in_scheduled_new_reqs(log, monkeypatch):
    """0.34 dropped `CachedRequestData.resumed_req_ids`: a resumed request is re-sent in
    `scheduled_new_reqs` (0.34's source: "re-sent in full, like a new one"). Its line is a
    resumption's (no `queued=`), and the engine side stays on."""
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_ENGINE", "1")
    cls = make_scheduler_class()
    orig = cls.schedule

    def schedule(self):
        out = orig(self)
        out.scheduled_cached_reqs = types.SimpleNamespace(req_ids=[], new_block_ids=[])  # 0.34's fields
        return out

    cls.schedule = schedule
    cls.log_stats = True
    assert install(cls, log, "0.34.0") is True
    s = cls()
    r = Req("cmpl-r-0", arrival=0.0)
    s.add_request(r)
    s.schedule()
    s._preempt_request(r, 0.0)
    s.waiting.append(r)
    s.schedule()
    scheds = [e for e in map(parse_message, log.lines) if isinstance(e, Scheduled)]
    assert len(scheds) == 2 and scheds[0].queued_s is not None and scheds[1].queued_s is None
    assert s.__dict__[hooks._ATTR].on


def make_old_output_class():
    """vLLM 0.10-0.13's OutputProcessor: no external ids (a request is known by the id given to
    `add_request`, children by `<i>_<id>` under a parent), `abort_requests(request_ids)`."""

    class OutputProcessor:
        def __init__(self):
            self.request_states = {}
            self.parent_requests = {}

        def finish(self, state, reason, iteration_stats):
            self.request_states.pop(state.request_id)
            self._update_stats_from_finished(state, reason, iteration_stats)

        def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats):
            return None

        def abort_requests(self, request_ids):
            out = []
            for rid in request_ids:
                if self.request_states.pop(rid, None) is not None:
                    out.append(rid)
                elif parent := self.parent_requests.get(rid):
                    out += self.abort_requests(list(parent.child_requests))
                    self.parent_requests.pop(rid, None)
            return out

    return OutputProcessor


class OldStats(Stats):
    """0.10-0.29's RequestStateStats: no `num_preemptions`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        del self.num_preemptions


def make_old_stats_class():
    class IterationStats:
        def update_from_events(self, req_id, events, is_prefilling, req_stats, lora_stats):
            for ev in events:
                if ev.type.name == "QUEUED":
                    req_stats.queued_ts = ev.timestamp
                elif ev.type.name == "SCHEDULED" and not req_stats.scheduled_ts:
                    req_stats.scheduled_ts = ev.timestamp

    return IterationStats


def test_0_10_to_0_13s_api_server_every_phase_preemptions_aborts_and_context(log):
    """No `num_preemptions` (before 0.30): the preemptions come from the PREEMPTED events; no
    external ids and `abort_requests(request_ids)` (before 0.14): vLLM's own ids, a parent's
    children aborted by its id; the caller's context on every child, let go with the last."""
    import asyncio

    out_cls, stats_cls, async_cls = make_old_output_class(), make_old_stats_class(), make_async_class()
    assert install(make_scheduler_class(), log, "0.13.0", out_cls, stats_cls, async_cls) is True
    op, it = out_cls(), stats_cls()
    st = types.SimpleNamespace(request_id="cmpl-p-0", parent_req=None, prompt_len=4,
                               stats=OldStats(__import__("time").time() - 1, 0.0, 0, 0.0, 0.0))
    op.request_states[st.request_id] = st
    for evs in ([Event("QUEUED", 10.0), Event("SCHEDULED", 10.5)], [Event("PREEMPTED", 11.0)],
                [Event("SCHEDULED", 11.25)]):
        it.update_from_events(st.request_id, evs, False, st.stats, None)
    assert op.abort_requests(["cmpl-p-0"]) == ["cmpl-p-0"]
    ended = parse_message(log.lines[-1])
    assert isinstance(ended, RequestEnded) and (ended.request_id, ended.finish) == ("cmpl-p-0", "abort")
    (pre,) = ended.times.preempted
    assert (pre[1] - pre[0]) / 1e9 == pytest.approx(0.25, abs=2e-6)
    # n=2 under a parent, with the caller's context; one child aborted through the parent's id
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    now = __import__("time").time()
    asyncio.run(async_cls().add_request("cmpl-t-0", trace_headers={"traceparent": tp}))
    parent = types.SimpleNamespace(request_id="cmpl-t-0", child_requests={"0_cmpl-t-0", "1_cmpl-t-0"})
    op.parent_requests["cmpl-t-0"] = parent
    kids = [types.SimpleNamespace(request_id=f"{i}_cmpl-t-0", parent_req=parent, prompt_len=4,
                                  stats=OldStats(now - 1, 0.1, 2, 0.0, 0.0)) for i in range(2)]
    for k in kids:
        op.request_states[k.request_id] = k
    op.finish(kids[0], types.SimpleNamespace(name="STOP"), types.SimpleNamespace(iteration_timestamp=now))
    parent.child_requests.discard("0_cmpl-t-0")
    assert op.abort_requests(["cmpl-t-0"]) == ["1_cmpl-t-0"]
    done, aborted = map(parse_message, log.lines[-2:])
    assert isinstance(done, RequestSummary) and done.times.preempted == ()
    assert aborted.request_id == "1_cmpl-t-0" and aborted.finish == "abort"
    assert done.times.caller.trace_id.hex() == aborted.times.caller.trace_id.hex() == tp[3:35]
    assert not any(v for v in _frontends(out_cls))  # the context and the spans let go
    assert not any("switched off" in x or "has no" in x for x in log.lines)


def test_a_missing_extra_hook_point_costs_its_part_said_once_by_the_api_server(log):
    class IterationStats:  # a release without update_from_events
        pass

    out_cls = make_output_class()
    assert install(make_scheduler_class(), log, "0.32.0", out_cls, IterationStats, None) is True
    assert log.lines == []  # not at install: every vLLM process installs
    _finish_one(out_cls, "a")
    _finish_one(out_cls, "b")
    warnings = [x for x in log.lines if "has no" in x]
    assert warnings == ["vllm-trace-bridge plugin: vLLM 0.32.0 has no IterationStats.update_from_events: "
                        "no preempted spans"]
    assert sum(isinstance(parse_message(x), RequestSummary) for x in log.lines) == 2


class Event:
    """vLLM's EngineCoreEvent: a type (an enum member) and a time.monotonic() stamp."""

    def __init__(self, kind, ts):
        self.type = Status(kind)
        self.timestamp = ts


def test_lines_carry_vllms_own_event_times_on_the_wall_clock(log, monkeypatch):
    """With vLLM's stats on, the request's QUEUED / SCHEDULED / PREEMPTED stamps (monotonic)
    are what the lines say, turned into wall time with one offset: queued= is exactly
    vLLM's time_in_queue and t= the scheduling's own time."""
    import time

    cls = make_scheduler_class()
    cls.log_stats = True
    install(cls, log)
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_ENGINE", "1")  # engine lines asked for
    s = cls()
    r = Req("cmpl-q-0-00000000", arrival=time.time())
    s.add_request(r)
    mono = time.monotonic()
    r.events = [Event("QUEUED", mono - 0.25), Event("SCHEDULED", mono - 0.0123456)]
    s.schedule()
    s._preempt_request(r, mono - 0.001)
    sched, _queue, pre = (parse_message(x) for x in log.lines[:3])
    assert sched.queued_s == pytest.approx(0.25 - 0.0123456, abs=1e-6)
    wall = time.time() - time.monotonic()
    assert abs(sched.at_ns / 1e9 - (mono - 0.0123456 + wall)) < 1e-3
    assert abs(pre.at_ns / 1e9 - (mono - 0.001 + wall)) < 1e-3
    assert pre.at_ns - sched.at_ns == pytest.approx(11_345_600, abs=2_000)  # the µs, not the second


def test_the_hook_points_are_read_from_source_without_importing_vllm():
    """`missing_in_source` on a made-up release: what it names is what is missing."""
    files: dict[str, str] = {}
    for f, c, m, p, *_ in hooks.HOOK_POINTS:
        head = f"class {c}:\n"
        text = files.get(f, "")
        files[f] = (text if head in text else text + head) + f"    def {m}(self, {', '.join(p)}): pass\n"
    # one class per file here: methods follow their class's header
    assert len({hp.cls for hp in hooks.HOOK_POINTS}) == len(files)
    for path, _side, words in hooks.READ_AT_RUN_TIME:
        files[path] = files.get(path, "") + "\n# " + " ".join(words) + "\n"
    assert hooks.missing_in_source(files.get) == []
    files[hooks._SCHEDULER_PY] = files[hooks._SCHEDULER_PY].replace("request, timestamp", "request, ts")
    files["vllm/v1/engine/__init__.py"] = "# QUEUED SCHEDULED\n"
    assert hooks.missing_in_source(files.get) == [
        "Scheduler._preempt_request(request, timestamp), it takes (request, ts)",
        "vllm/v1/engine/__init__.py: PREEMPTED"]


def test_a_plugin_error_never_reaches_vllm_and_switches_the_plugin_off(log):
    cls = make_scheduler_class()
    install(cls, log)
    s = cls()
    def boom(*_a):
        raise KeyError("plugin-side failure")
    pool = s.kv_cache_manager.block_pool
    pool.get_num_free_blocks = boom  # what the plugin reads now fails inside the plugin
    s.kv_cache_manager.get_block_ids = boom
    r = Req("a", 0.0)
    s.requests["a"] = r
    s.waiting.append(r)
    s.blocks["a"] = [1]
    out = s.schedule()
    assert len(out.scheduled_new_reqs) == 1
    assert s.update_from_output(1) == "vllm-result"
    r.status = Status("FINISHED_STOPPED")
    assert s._free_request(r) == ("kv", "ec")
    warnings = [x for x in log.lines if "switched off" in x]
    assert len(warnings) == 1 and not any(x.startswith("Request ") for x in log.lines)


def test_vllms_own_errors_pass_through_unchanged(log):
    cls = make_scheduler_class(broken="schedule")
    install(cls, log)
    with pytest.raises(RuntimeError, match="vLLM's own error"):
        cls().schedule()
    assert log.lines == []


def test_register_swallows_everything(monkeypatch):
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN", "1")
    monkeypatch.setattr(hooks, "install", lambda: (_ for _ in ()).throw(ImportError("no vllm here")))
    register()  # must not raise
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN", "0")
    register()


def test_without_vllm_stats_the_engine_summary_follows_the_release_and_the_trace_has_freed(log, tmp_path):
    """`--disable-log-stats`: the engine core writes the summary, after vLLM freed the blocks, as
    the API server would; replayed, the request has every phase."""
    from bridge.pipeline import replay

    cls = make_scheduler_class()
    install(cls, log)
    s = cls()
    r = Req("cmpl-xyz-0-0badf00d", arrival=__import__("time").time() - 0.2)
    s.add_request(r)
    s.schedule()
    s.update_from_output(1)
    r.num_output_tokens = 9
    r.status = Status("FINISHED_STOPPED")
    s._free_request(r)
    kinds = [type(parse_message(x)).__name__ for x in log.lines]
    assert kinds == ["Scheduled", "QueueState", "BlockFreed", "RequestSummary"], log.lines
    path = tmp_path / "engine.log"
    path.write_text("".join(f"2026-11-30T09:35:24.{100000000 + i * 1000:09d}Z stdout F (EngineCore pid=7) "
                            f"INFO 11-30 09:35:24 [hooks.py:1] {line}\n" for i, line in enumerate(log.lines)))
    out = []
    replay([str(path)], [out.append])
    (t,) = out
    assert t.request_id == "cmpl-xyz-0" and t.outcome == "finished"
    # preprocess: vLLM's arrival_time → the engine's add_request (0.2 s here)
    assert [p.name for p in t.phases] == ["preprocess", "queued", "prefill", "decode", "freed"]
    assert t.attrs["vllm.kv_blocks.freed"] == 2
