"""The plugin's KV-transfer lines (bridge/vllm_plugin/kv.py) without vLLM: on a stand-in
scheduler and connector with the methods and call order of vLLM's (v1/core/sched/scheduler.py:
`_update_from_kv_xfer_finished` → `_update_waiting_for_remote_kv`; the connector's
`update_state_after_alloc` / `request_finished`), and the hook points in each release's source.
The real run is tests/test_distributed_real.py."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from plugin_log import log  # noqa: F401  (a fixture)

from bridge.parse import parse_line
from bridge.parse.events import KvReceived, KvReleased
from bridge.vllm_plugin import hooks, kv


class Req:
    def __init__(self, eid, params=None):
        self.request_id = eid
        self.kv_transfer_params = params
        self.status = "WAITING_FOR_REMOTE_KVS"


class Connector:
    """vLLM's KV connector API as the scheduler calls it (KVConnectorBase_V1)."""

    def __init__(self, delay_free=True):
        self.delay_free = delay_free
        self.calls = []

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.calls.append(("alloc", request.request_id, num_external_tokens))

    def request_finished(self, request, block_ids):
        self.calls.append(("finished", request.request_id))
        return self.delay_free, {"remote_request_id": request.request_id}


class Output:
    def __init__(self, recving=(), sending=()):
        self.finished_recving = set(recving)
        self.finished_sending = set(sending)


class Manager:
    def __init__(self, blocks):
        self.blocks = blocks

    def get_block_ids(self, eid):
        return (list(self.blocks.get(eid, ())),)


def make_scheduler(*, old=False):
    """A scheduler with vLLM's two KV methods. `old`: before 0.24, `_update_waiting_for_remote_kv`
    is called on every step and returns False until the KV is there."""

    class Scheduler:
        def __init__(self, connector=None):
            self.connector = connector
            self.requests = {}
            self.finished_recving_kv_req_ids = set()
            self.failed_recving_kv_req_ids = set()
            self.kv_cache_manager = Manager({})
            self.freed = []

        def _update_waiting_for_remote_kv(self, request):
            if old:
                if request.request_id not in self.finished_recving_kv_req_ids:
                    return False
                self.finished_recving_kv_req_ids.discard(request.request_id)
                return True
            self.finished_recving_kv_req_ids.remove(request.request_id)
            return None

        def _update_from_kv_xfer_finished(self, kv_connector_output):
            for eid in kv_connector_output.finished_recving:
                self.finished_recving_kv_req_ids.add(eid)
            for eid in kv_connector_output.finished_sending:
                self.freed.append(eid)
                self.kv_cache_manager.blocks.pop(eid, None)
                del self.requests[eid]

    return Scheduler


def parsed(lines):
    return [parse_line(line, "INFO") for line in lines]


def test_a_scheduler_without_a_connector_gets_no_wrapper(log):
    sched = make_scheduler()(None)
    assert kv.attach(sched, log, lambda e: e) is False
    assert "_update_waiting_for_remote_kv" not in sched.__dict__ and not log.lines


def test_the_decode_line_names_its_prefill_and_the_times(log):
    conn = Connector()
    sched = make_scheduler()(conn)
    assert kv.attach(sched, log, hooks._Hooks(log).api_id, hooks._signature_gap)
    params = {"do_remote_prefill": True, "remote_request_id": "cmpl-x-0-9e27b547", "remote_engine_id": "prefill-0"}
    req = Req("cmpl-x-0-0a1b2c3d", params)
    sched.requests[req.request_id] = req
    sched.kv_cache_manager.blocks[req.request_id] = [4, 5, 6]
    sched.connector.update_state_after_alloc(req, None, 40)   # schedule(): the async load starts
    sched._update_from_kv_xfer_finished(Output(recving=[req.request_id]))  # the worker says it arrived
    assert sched._update_waiting_for_remote_kv(req) is None    # the scheduler moves it on
    assert conn.calls == [("alloc", req.request_id, 40)]       # vLLM's own call went through
    (ev,) = parsed(log.lines)
    assert isinstance(ev, KvReceived)
    assert (ev.request_id, ev.engine_request_id, ev.remote_request_id, ev.remote_engine_id, ev.blocks, ev.ok) == \
        ("cmpl-x-0", "cmpl-x-0-0a1b2c3d", "cmpl-x-0-9e27b547", "prefill-0", 3, True)
    assert ev.waiting_since_ns <= ev.arrived_ns <= ev.at_ns


def test_a_failed_load_says_so_and_the_old_per_step_calls_write_nothing_until_it_arrives(log):
    sched = make_scheduler(old=True)(Connector())
    kv.attach(sched, log, lambda e: e)
    req = Req("r-1", None)
    sched.requests["r-1"] = req
    for _ in range(3):
        assert sched._update_waiting_for_remote_kv(req) is False
    assert log.lines == []
    sched.failed_recving_kv_req_ids.add("r-1")
    sched._update_from_kv_xfer_finished(Output(recving=["r-1"]))
    assert sched._update_waiting_for_remote_kv(req) is True
    (ev,) = parsed(log.lines)
    assert ev == KvReceived("r-1", "r-1", None, None, 0, False, None, ev.arrived_ns, ev.at_ns)
    assert ev.arrived_ns is not None


def test_the_prefill_line_comes_when_the_held_blocks_are_freed(log):
    conn = Connector(delay_free=True)
    sched = make_scheduler()(conn)
    kv.attach(sched, log, hooks._Hooks(log).api_id)
    req = Req("cmpl-p-0-9e27b547", {"do_remote_decode": True})
    sched.requests[req.request_id] = req
    sched.kv_cache_manager.blocks[req.request_id] = [1, 2]
    assert sched.connector.request_finished(req, [[1, 2]]) == (True, {"remote_request_id": req.request_id})
    assert log.lines == []  # held, not freed yet
    sched._update_from_kv_xfer_finished(Output(sending=[req.request_id]))
    assert sched.freed == [req.request_id]
    (ev,) = parsed(log.lines)
    assert isinstance(ev, KvReleased)
    assert (ev.request_id, ev.engine_request_id, ev.blocks) == ("cmpl-p-0", "cmpl-p-0-9e27b547", 2)
    assert ev.held_since_ns <= ev.at_ns
    assert ev.engine_id is None  # a scheduler without vLLM's config: no engine id to name


def test_the_prefill_line_names_its_engine_as_the_decode_will_know_it(log):
    """vLLM's `Scheduler.vllm_config.kv_transfer_config.engine_id` (with the `_dp<n>` the engine
    core adds under DP) is what NIXL returns to the proxy as `remote_engine_id`."""
    from types import SimpleNamespace

    sched = make_scheduler()(Connector(delay_free=True))
    sched.vllm_config = SimpleNamespace(kv_transfer_config=SimpleNamespace(engine_id="prefill engine,0_dp1"))
    kv.attach(sched, log, hooks._Hooks(log).api_id)
    req = Req("cmpl-p-0", {"do_remote_decode": True})  # randomisation off: no suffix
    sched.requests[req.request_id] = req
    sched.kv_cache_manager.blocks[req.request_id] = [1]
    sched.connector.request_finished(req, [[1]])
    sched._update_from_kv_xfer_finished(Output(sending=[req.request_id]))
    (ev,) = parsed(log.lines)
    assert isinstance(ev, KvReleased)
    assert (ev.engine_request_id, ev.engine_id) == ("cmpl-p-0", "prefill_engine_0_dp1")  # one field, no separator
    assert ev.held_since_ns <= ev.at_ns


def test_a_plugin_error_is_said_once_switches_the_kv_lines_off_and_vllm_runs_on(log):
    sched = make_scheduler()(Connector())
    kv.attach(sched, log, lambda e: e)
    sched.kv_cache_manager = None  # the plugin's read fails
    req = Req("r-2")
    sched.requests["r-2"] = req
    sched._update_from_kv_xfer_finished(Output(recving=["r-2"]))
    assert sched._update_waiting_for_remote_kv(req) is None  # vLLM's method ran
    sched._update_from_kv_xfer_finished(Output(recving=["r-2"]))
    assert len([line for line in log.lines if "switched off" in line]) == 1
    assert not any(line.startswith("KV ") for line in log.lines)


def test_vllms_own_errors_pass_through(log):
    sched = make_scheduler()(Connector())
    kv.attach(sched, log, lambda e: e)
    with pytest.raises(KeyError):
        sched._update_waiting_for_remote_kv(Req("never-received"))  # vLLM's own `remove` raises
    assert log.lines == []


def test_the_scheduler_init_hook_binds_them_only_with_a_connector_and_the_switch_on(log, monkeypatch):
    cls = make_scheduler()
    hooks._wrap(cls, log, {}, "0.32.0", lacking=("(engine lines not under test)",))
    with_conn, without = cls(Connector()), cls(None)
    assert "_update_waiting_for_remote_kv" in with_conn.__dict__
    assert "_update_waiting_for_remote_kv" not in without.__dict__
    monkeypatch.setenv("VLLM_TRACE_BRIDGE_PLUGIN_KV", "0")
    assert "_update_waiting_for_remote_kv" not in cls(Connector()).__dict__


def test_a_release_without_the_hook_points_gets_no_kv_line_and_says_why(log):
    class Bare:
        connector = Connector()

    assert kv.attach(Bare(), log, lambda e: e, hooks._signature_gap) is False
    assert "_update_waiting_for_remote_kv" in log.lines[0]


WHEELS_SRC = Path(os.environ.get("VLLM_TRACE_BRIDGE_WHEELS_SRC", Path.home() / ".cache/vllm-trace-bridge/wheels-src"))
INSTALLED = Path.home() / ".cache/vllm-trace-bridge/vllm-venv/lib/python3.11/site-packages"


def _sources():
    out = [pytest.param(INSTALLED, id="installed")]
    if WHEELS_SRC.is_dir():
        out += [pytest.param(p, id=p.name) for p in sorted(WHEELS_SRC.iterdir())]
    return out


@pytest.mark.parametrize("root", _sources())
def test_every_kv_hook_point_is_in_the_releases_source(root):
    """Each cached release's scheduler.py (tests/plugin_versions_table.py caches them), read
    without importing vLLM: the method, and its leading parameter."""
    path = root / kv.SCHEDULER_PY
    if not path.exists():
        pytest.skip(f"no {path}")
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    methods = {n.name: [a.arg for a in n.args.args][1:] for n in cls.body if isinstance(n, ast.FunctionDef)}
    for hp in kv.KV_HOOK_POINTS:
        assert hp.name in methods, f"{root.name}: no Scheduler.{hp.name}"
        assert tuple(methods[hp.name][:len(hp.params)]) == hp.params


def test_another_signature_is_named_and_gets_no_wrapper(log):
    class Renamed:
        connector = Connector()

        def _update_waiting_for_remote_kv(self, req):  # another parameter name
            return None

        def _update_from_kv_xfer_finished(self, kv_connector_output):
            return None

    sched = Renamed()
    assert kv.attach(sched, log, lambda e: e, hooks._signature_gap) is False
    assert "(request), it takes (req)" in log.lines[0]
    assert "_update_waiting_for_remote_kv" not in sched.__dict__
