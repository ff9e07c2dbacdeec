"""Real vLLM with the plugin installed only as `inject`'s init container installs it (issue 32):
`vllm-trace-bridge plugin install --target DIR`, then vLLM started with `PYTHONPATH=DIR`,
nothing in its site-packages. vLLM itself says which copy it loaded: the plugin's start line
names the directory it was loaded from, in each vLLM process; and its lifecycle lines are there
for every request sent.

The shared vLLM venv may still hold a pip-installed copy of the plugin (the distribution
`vllm-trace-bridge`, whose entry point has the same name and, coming later on sys.path, would
win in vLLM's plugin table). A metadata-only `vllm_trace_bridge` .dist-info put on PYTHONPATH
hides it (importlib.metadata keeps the first distribution of a name), so the vLLM here is what
a stock vLLM image is: no plugin but the one from DIR."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_proc import Vllm, venv_ready  # noqa: E402
from waits import deadline  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.real_vllm,
              pytest.mark.skipif(venv_ready() is not None, reason=venv_ready() or "")]


def hide_site_packages_copy(where: Path) -> Path:
    info = where / "vllm_trace_bridge-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-trace-bridge\nVersion: 0.0.0\n")
    return where


def test_vllm_with_the_plugin_only_from_plugin_install_target_writes_its_lines(tmp_path):
    target = tmp_path / "vllm-trace-bridge-plugin"
    proc = subprocess.run([sys.executable, "-m", "bridge", "plugin", "install", "--target", str(target)],
                          capture_output=True, text=True, cwd=ROOT, timeout=deadline(120))
    assert proc.returncode == 0, proc.stderr
    mask = hide_site_packages_copy(tmp_path / "mask")
    log = tmp_path / "vllm.log"
    # engine lines asked for: both processes' hooks run from the --target copy (by default only
    # the API server writes; the engine core's `Scheduling request` lines need this switch)
    with Vllm(log, plugin=True, plain=True,
              extra_env={"PYTHONPATH": f"{target}:{mask}", "VLLM_TRACE_BRIDGE_PLUGIN_ENGINE": "1"}) as v:
        ids = v.load(4, max_tokens=16, prompt_words=10)
        assert v.metrics()["vllm:request_success_total"] == 4
    lines = log.read_text().splitlines()
    loaded = [x for x in lines if "vllm-trace-bridge plugin" in x and "loaded from" in x]
    assert loaded, "no plugin start line"
    assert all(x.rstrip().endswith(f"loaded from {target}/vllm_trace_bridge_plugin") for x in loaded), loaded
    # The engine core says it; the API server loads plugins while it builds its argument parser,
    # before vLLM has configured its logging from the flags, so its INFO start line is dropped
    # (issue 32, point 4); its summary lines below show the plugin runs there too.
    assert any("EngineCore" in x for x in loaded), loaded
    assert [x for x in lines if "APIServer" in x and "prompt_tokens=" in x]
    for rid in ids:  # every request's scheduling and summary lines, whatever prefix vLLM gave its id
        assert [x for x in lines if re.search(rf"Scheduling request \S*{rid}\S*: priority=", x)], rid
        assert [x for x in lines if re.search(rf"Request \S*{rid}\S*: prompt_tokens=\d+", x)], rid
