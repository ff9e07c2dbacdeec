"""What the whole-process benchmarks share: the synthetic log they run on, and the bridge as a
`pip install` leaves it."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def synth_log(requests: int, cri: bool) -> str:
    """The seed-dialect log of `requests` requests (seed 42), generated once into bench/out/.

    Generated in a child process: generating holds the whole log in memory, and a bridge forked
    from a process that big would report that size as its own peak RSS."""
    out = os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"seed-{requests}{'-cri' if cri else ''}.log")
    if not os.path.exists(path):
        t = time.time()
        subprocess.run([sys.executable, "-c", "import sys; from bridge.synth import SynthConfig, write_file; "
                        f"write_file(sys.argv[1] + '.tmp', SynthConfig(requests={requests}, seed=42, cri={cri}, "
                        "mean_interarrival_s=0.05, nccl_incidents=3, oom_failures=5))", path],
                       cwd=ROOT, check=True)
        os.replace(path + ".tmp", path)
        print(f"generated {path} in {time.time() - t:.1f}s", file=sys.stderr)
    return path


def as_installed() -> None:
    """Write the bridge's bytecode, as `pip install` (and so the container image) does.

    From a source checkout under PYTHONDONTWRITEBYTECODE (set on this machine and in the image)
    every start would compile the bridge's ~45 modules again: ~0.08 s of CPU that no installed
    agent pays, a fifth of the start-up a whole-process figure includes."""
    compileall.compile_dir(os.path.join(ROOT, "bridge"), quiet=1)
