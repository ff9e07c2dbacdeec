import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest


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
            proc.wait(10)
