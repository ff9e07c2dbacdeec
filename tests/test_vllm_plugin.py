"""The vLLM plugin without vLLM: its switches, its version gate, and its hooks on a stand-in
scheduler with the same method names (the real one is tested in tests/plugin/)."""

from __future__ import annotations

import logging
import types

import pytest

from bridge.parse.events import Preempted, QueueState, RequestSummary, Scheduled
from bridge.parse.seed import parse_message
from bridge.vllm_plugin import enabled, hooks, register, version_supported


@pytest.mark.parametrize("version, ok", [
    ("0.32.0", True), ("0.32.1+cpu", True), ("0.32.0rc1", True), ("0.31.9", False), ("0.33.0", False),
    ("1.32.0", False), ("dev", False), ("", False),
])
def test_version_gate(version, ok):
    assert version_supported(version) is ok


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


def test_hooks_write_the_seed_lines_the_bridge_parses(log, monkeypatch):
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "1")
    cls = make_scheduler_class()
    assert hooks.install(cls, "0.32.0", log)
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
    hooks.install(cls, "0.32.0", log)
    s = cls()
    r = Req("chatcmpl-x", arrival=0.0)
    s.add_request(r)
    s.schedule()
    r.status = Status(end)
    s._free_request(r)
    assert [type(parse_message(x)).__name__ for x in log.lines] == ["Scheduled", "QueueState"]


def test_install_is_idempotent(log):
    cls = make_scheduler_class()
    assert hooks.install(cls, "0.32.0", log) and hooks.install(cls, "0.32.0", log)
    s = cls()
    r = Req("a", 0.0)
    s.waiting.append(r)
    s.requests["a"] = r
    s.schedule()
    assert sum("Scheduling request" in x for x in log.lines) == 1


def test_unsupported_version_or_missing_hook_warns_once_and_changes_nothing(log):
    cls = make_scheduler_class()
    before = dict(vars(cls))
    assert hooks.install(cls, "0.33.0", log) is False
    assert dict(vars(cls)) == before
    del cls._free_request_blocks
    assert hooks.install(cls, "0.32.0", log) is False
    assert dict(vars(cls)) == {k: v for k, v in before.items() if k != "_free_request_blocks"}
    assert len(log.lines) == 2 and all("does nothing" in x for x in log.lines)


def test_a_plugin_error_never_reaches_vllm_and_switches_the_plugin_off(log):
    cls = make_scheduler_class()
    hooks.install(cls, "0.32.0", log)
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
    hooks.install(cls, "0.32.0", log)
    with pytest.raises(RuntimeError, match="vLLM's own error"):
        cls().schedule()
    assert log.lines == []


def test_register_swallows_everything(monkeypatch):
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN", "1")
    monkeypatch.setattr(hooks, "install", lambda: (_ for _ in ()).throw(ImportError("no vllm here")))
    register()  # must not raise
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN", "0")
    register()
