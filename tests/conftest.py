import importlib.util
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest
from waits import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build_extensions_in_place() -> None:
    """`python -m pytest` from the checkout imports `bridge` from the source tree, where a
    plain `pip install .` (what .ci/run does) leaves no compiled extension: build the C fast
    paths in place, as `pip install -e .` does, so that the tests exercise them. Up-to-date
    extensions are not rebuilt; without a compiler or setuptools nothing happens (the pure
    path is tested, and tests/test_native.py says why it skips)."""
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return
    if not os.path.exists(os.path.join(ROOT, "setup.py")) or importlib.util.find_spec("setuptools") is None:
        return
    if shutil.which(os.environ.get("CC", "gcc")) is None and shutil.which("cc") is None:
        return
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=deadline(300), check=False)


_build_extensions_in_place()


@pytest.fixture(autouse=True)
def _stop_spawned_processes():
    """A failing test must not leave its agent, writer or receiver running."""
    yield
    try:
        from agentkit import SPAWNED
    except ImportError:
        return
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(deadline(10))


#: The long runs, each behind its marker: skipped in a plain local `python -m pytest`, run in CI
#: (CI=true, as .ci/run has it) or when selected (`-m faults`, `-m fuzz`).
LONG_RUNS = {"faults": "long fault-injection run", "fuzz": "long differential fuzz run"}


#: The suites that need software the machine may lack, each installed by a script of its own
#: (never in the middle of a test run): skipped unless selected with `-m`, CI or not. `.ci/run`
#: installs them and runs them after the README's test command.
INSTALLED_SUITES = {
    "real_vllm": "needs a real vLLM: bash tests/vllm_env/install.sh, then python -m pytest -m real_vllm",
    "phoenix": "needs Arize Phoenix: bash tests/phoenix_env/install.sh, then python -m pytest -m phoenix",
}


def _selected(expr: str, marker: str) -> bool:
    return marker in expr and f"not {marker}" not in expr


def pytest_collection_modifyitems(config, items):
    expr = config.getoption("markexpr", "") or ""
    for marker, why in INSTALLED_SUITES.items():
        if _selected(expr, marker):
            continue
        skip = pytest.mark.skip(reason=why)
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
    if os.environ.get("CI", "") not in ("", "0", "false"):
        return
    for marker, what in LONG_RUNS.items():
        if _selected(expr, marker):
            continue
        skip = pytest.mark.skip(reason=f"{what}: pytest -m {marker} (CI runs it)")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


def pytest_report_header(config):
    """The factor every wait's cap is scaled by (tests/waits.py), measured here at session start."""
    from waits import time_scale
    return time_scale().describe()
