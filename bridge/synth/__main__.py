"""`python -m bridge.synth OUT [--requests N] [--cri] [--seed S]`: write a generated seed log."""

import argparse

from bridge.synth.seed import SynthConfig, write_file

p = argparse.ArgumentParser(prog="python -m bridge.synth")
p.add_argument("out")
p.add_argument("--requests", type=int, default=60)
p.add_argument("--seed", type=int, default=1)
p.add_argument("--cri", action="store_true", help="CRI framing with nanosecond stamps")
a = p.parse_args()
truth = write_file(a.out, SynthConfig(requests=a.requests, seed=a.seed, cri=a.cri))
print(f"{a.out}: {truth.lines} lines, {len(truth.requests)} requests")
