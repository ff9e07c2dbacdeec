"""The vLLM plugin without vLLM: its switches, its version gate, and its hooks on a stand-in
scheduler with the same method names (the real one is tested in tests/plugin/)."""

from __future__ import annotations

import logging
import types

import pytest

from bridge.parse.events import Preempted, QueueState, RequestSummary, Scheduled
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


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def log():
    logger = logging.getLogger(f"test.vllm_plugin.{id(object())}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    h = Lines()
    logger.addHandler(h)
    logger.lines = h.lines
    return logger


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
    """A stand-in for vLLM's OutputProcessor: the one hooked method, as vLLM calls it."""

    class OutputProcessor:
        def __init__(self):
            self.calls = 0

        def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats):
            self.calls += 1
            return None

    return OutputProcessor


def install(cls, log, version="0.32.0", output_cls=None):
    return hooks.install(cls, version, log, output_cls=output_cls or make_output_class())


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
    assert freed.reason == ("aborted" if end == "FINISHED_ABORTED" else "completed")


class Stats:
    """vLLM's RequestStateStats, as the API server holds it at the end of a request."""

    def __init__(self, arrival, first_token_latency, generated, first_ts, last_ts):
        self.arrival_time = arrival
        self.first_token_latency = first_token_latency
        self.num_generation_tokens = generated
        self.first_token_ts = first_ts
        self.last_token_ts = last_ts


def test_with_vllm_stats_the_api_server_writes_the_summary_from_vllms_own_numbers(log):
    cls, out_cls = make_scheduler_class(), make_output_class()
    assert install(cls, log, output_cls=out_cls)
    s = cls()
    s.log_stats = True  # vLLM's default: the API server keeps per-request stats
    r = Req("cmpl-abc-0-1a2b3c4d", arrival=100.0)
    s.add_request(r)
    s.schedule()
    s.update_from_output(7)
    r.status = Status("FINISHED_LENGTH_CAPPED")
    s._free_request(r)
    assert not any(x.startswith("Request ") for x in log.lines)  # not from the engine core
    assert log.lines[-1].startswith("Freed 2 blocks for request cmpl-abc-0, reason=completed, t=")

    op = out_cls()
    state = types.SimpleNamespace(request_id="cmpl-abc-0-1a2b3c4d", prompt_len=12,
                                  stats=Stats(100.0, 0.0421234, 7, 200.010, 200.070))
    finish = types.SimpleNamespace(name="LENGTH")
    op._update_stats_from_finished(state, finish, types.SimpleNamespace(iteration_timestamp=100.5))
    assert op.calls == 1
    summary = parse_message(log.lines[-1])
    assert isinstance(summary, RequestSummary) and summary.request_id == "cmpl-abc-0"
    assert summary.at_ns == 100_500_000_000  # the end is vLLM's own iteration stamp, to the µs
    assert (summary.prompt_tokens, summary.generated_tokens) == (12, 7)
    assert summary.ttft_s == pytest.approx(0.0421234, abs=1e-6)       # vLLM's first_token_latency
    assert summary.e2e_s == pytest.approx(0.5, abs=1e-6)              # iteration stamp − arrival
    assert summary.itl_s == pytest.approx(0.060 / 6, abs=1e-6)        # decode time / (n − 1)
    n = len(log.lines)
    for reason, stats in (("ABORT", state.stats), ("STOP", None)):   # aborted, or no stats kept
        op._update_stats_from_finished(types.SimpleNamespace(request_id="x", prompt_len=1, stats=stats),
                                       types.SimpleNamespace(name=reason), types.SimpleNamespace(iteration_timestamp=1.0))
    op._update_stats_from_finished(state, finish, None)
    assert len(log.lines) == n and op.calls == 4


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
    assert getattr(cls.schedule, hooks._WRAPPED, False)


def test_a_missing_hook_point_or_another_signature_is_named_and_changes_nothing(log):
    cls, out_cls = make_scheduler_class(), make_output_class()
    before, out_before = dict(vars(cls)), dict(vars(out_cls))
    del cls._free_request_blocks
    assert install(cls, log, "0.32.0", out_cls) is False
    assert dict(vars(cls)) == {k: v for k, v in before.items() if k != "_free_request_blocks"}
    assert dict(vars(out_cls)) == out_before
    cls2, out_cls2 = make_scheduler_class(), make_output_class()
    del out_cls2._update_stats_from_finished
    before2 = dict(vars(cls2))
    assert install(cls2, log, "0.32.0", out_cls2) is False
    assert dict(vars(cls2)) == before2
    cls3, out_cls3 = make_scheduler_class(), make_output_class()
    cls3._preempt_request = lambda self, request, drop_stale_output=False: None  # no timestamp
    assert install(cls3, log, "0.33.1", out_cls3) is False
    assert not getattr(cls3.schedule, hooks._WRAPPED, False)
    assert len(log.lines) == 3 and all("does nothing" in x for x in log.lines)
    assert log.lines[0].endswith("has no Scheduler._free_request_blocks")
    assert "OutputProcessor._update_stats_from_finished" in log.lines[1]
    assert "Scheduler._preempt_request(request, timestamp), it takes (request, drop_stale_output)" in log.lines[2]


class Event:
    """vLLM's EngineCoreEvent: a type (an enum member) and a time.monotonic() stamp."""

    def __init__(self, kind, ts):
        self.type = Status(kind)
        self.timestamp = ts


def test_lines_carry_vllms_own_event_times_on_the_wall_clock(log):
    """With vLLM's stats on, the request's QUEUED / SCHEDULED / PREEMPTED stamps (monotonic)
    are what the lines say, turned into wall time with one offset: queued= is exactly
    vLLM's time_in_queue and t= the scheduling's own time."""
    import time

    cls = make_scheduler_class()
    install(cls, log)
    s = cls()
    s.log_stats = True
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
    sched = ("class Scheduler:\n" + "".join(
        f"    def {m}(self, {', '.join(p)}): pass\n" for f, c, m, p in hooks.HOOK_POINTS if c == "Scheduler"))
    files = {hooks._SCHEDULER_PY: sched + "# kv_cache_manager requests running waiting log_stats\n",
             hooks._OUTPUT_PY: "class OutputProcessor:\n    def _update_stats_from_finished(self, req_state, "
                               "finish_reason, iteration_stats): pass\n"}
    for path, words in hooks.READ_AT_RUN_TIME:
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
