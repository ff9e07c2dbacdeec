"""The plugin's hook points against vLLM releases' own source, read without importing vLLM (or
torch): 0.33.0 from its wheel (downloaded once into a cache), 0.32 from the test venv when it is
there. A hook point renamed or given other parameters in a release fails here by name."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bridge.vllm_plugin import hooks

CACHE = Path(os.environ.get("VLLM_TRACE_BRIDGE_WHEELS", Path.home() / ".cache" / "vllm-trace-bridge" / "wheels"))
VENV = Path.home() / ".cache" / "vllm-trace-bridge" / "vllm-venv"


def _wheel(version: str) -> Path:
    """vLLM's wheel of that version: from the cache, else `pip download` into it (once)."""
    found = sorted(CACHE.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               f"vllm=={version}", "-d", str(CACHE)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"vLLM {version}'s wheel is not cached in {CACHE} and pip could not fetch it: {exc}")
    found = sorted(CACHE.glob(f"vllm-{version}-*.whl"))
    if done.returncode != 0 or not found:
        pytest.skip(f"vLLM {version}'s wheel is not cached in {CACHE} and the registry did not give it: "
                    f"{done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return found[0]


def test_every_hook_point_is_in_vllm_0_33_0s_source():
    with zipfile.ZipFile(_wheel("0.33.0")) as z:
        names = set(z.namelist())
        assert "vllm/v1/core/sched/scheduler.py" in names  # the wheel is vLLM's, not an empty stand-in

        def read(path: str) -> str | None:
            return z.read(path).decode("utf-8") if path in names else None

        assert hooks.missing_in_source(read) == []
        version = read("vllm/_version.py") or ""
    assert "0.33.0" in version


@pytest.mark.skipif(not VENV.is_dir(), reason="no vLLM venv (tests/vllm_env/install.sh)")
def test_every_hook_point_is_in_the_installed_vllm_0_32s_source():
    (site,) = VENV.glob("lib/python*/site-packages")

    def read(path: str) -> str | None:
        p = site / path
        return p.read_text(encoding="utf-8") if p.is_file() else None

    assert hooks.missing_in_source(read) == []
