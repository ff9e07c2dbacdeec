"""By hand: `PYTHONPATH=tests python -m randomized SEED COUNT OUTDIR` runs one randomized
workload (take /tmp/vllm.lock around it) and prints its violations; `... check DIR` re-checks a
saved run."""

import sys
from pathlib import Path

from .workload import check_dir, run

if sys.argv[1] == "check":
    d = Path(sys.argv[2])
else:
    d = Path(sys.argv[3])
    run(int(sys.argv[1]), int(sys.argv[2]), d)
vs = check_dir(d)
for v in vs:
    print(v.render())
print(f"{len(vs)} violations")
