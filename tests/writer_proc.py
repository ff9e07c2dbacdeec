"""A process that appends generated vLLM logs at a steady rate, rotating as told.

    python writer_proc.py PATH --requests N --rate LINES_PER_S [--rotate-every LINES]
                          [--rotate rename|copytruncate|gzip[,...]] [--seed S] [--truth FILE]
                          [--reuse RATIO] [--poison-every LINES]

Writes CRI-framed seed-dialect lines (as containerd would) from bridge.synth's ground truth.
`rename` moves PATH to PATH.<stamp> (kubelet's name: 20260215-100100, a minute later at each
rotation) and starts a new PATH; `gzip` does the same and then compresses the rotated file;
`copytruncate` copies PATH to PATH.<stamp> and truncates
PATH in place; a comma-separated list is taken in turn, one per rotation. Writes the truth
(request id and expected start per request) as JSON first. `--poison-every N` adds, after
every Nth whole line, a line carrying a fault marker (POISON-DECODE, POISON-PARSE, or a queue
gauge from poison_assemble.py, in turn) that belongs to no request: the agent under test is
told to raise on them (VLLM_TRACE_BRIDGE_INJECT_FAULT), the truth is unchanged.
"""

import argparse
import gzip
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bridge.synth import SynthConfig, generate, write  # noqa: E402


class _Collect(list):
    def write(self, s):
        self.extend(s.splitlines(keepends=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--rotate-every", type=int, default=0)
    ap.add_argument("--rotate", default="rename")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--truth")
    ap.add_argument("--partial-ratio", type=float, default=0.05)
    ap.add_argument("--reuse", type=float, default=0.5)
    ap.add_argument("--poison-every", type=int, default=0)
    a = ap.parse_args()
    cfg = SynthConfig(requests=a.requests, seed=a.seed, cri=True, mean_interarrival_s=0.05,
                      cri_partial_ratio=a.partial_ratio, model_load_failure=False, incomplete_tail=0,
                      reuse_ratio=a.reuse)
    kinds = a.rotate.split(",")
    assert all(k in ("rename", "copytruncate", "gzip") for k in kinds), kinds
    lines, truth = generate(cfg)
    if a.truth:
        with open(a.truth, "w") as f:
            json.dump({"requests": [
                {"id": r.request_id, "outcome": r.outcome, "start": r.arrival_ns if r.outcome in ("finished", "timeout")
                 else r.first_line_ns} for r in truth.requests],
                "incidents": len(truth.incidents)}, f)
    out = _Collect()
    write(lines, out, cfg)
    f = open(a.path, "a", encoding="utf-8")
    start = time.monotonic()
    rotations = 0
    poisons = 0
    for i, line in enumerate(out, 1):
        f.write(line)
        whole = line.split(" ", 3)[2] == "F"
        if a.poison_every and i % a.poison_every == 0 and whole:
            stamp, hdr = line.split(" ", 1)[0], "INFO 02-15 10:23:00"
            f.write((f"{stamp} stdout F {hdr} api.py:1] POISON-DECODE user text\n",
                     f"{stamp} stdout F {hdr} api.py:1] POISON-PARSE user text\n",
                     f"{stamp} stdout F {hdr} poison_assemble.py:1] Running queue: 1 requests, waiting queue: 0 "
                     "requests, free blocks: 500/512\n")[poisons % 3])
            poisons += 1
        if i % 200 == 0:
            f.flush()
            delay = start + i / a.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if a.rotate_every and i % a.rotate_every == 0 and whole:
            f.flush()
            kind = kinds[rotations % len(kinds)]
            rotations += 1
            # Named as kubelet names them, by a stamp that counts forward (a fixed clock, a
            # minute a rotation: distinct and ordered however fast it rotates). Not `.1`, `.2`:
            # a number counts back (logrotate's `.1` is the newest), so a reader catching up
            # two of them at once would read the newer first.
            rotated = f"{a.path}.{time.strftime('%Y%m%d-%H%M%S', time.gmtime(1_771_149_600 + 60 * rotations))}"
            if kind in ("rename", "gzip"):
                f.close()
                os.rename(a.path, rotated)
                f = open(a.path, "a", encoding="utf-8")
                if kind == "gzip":
                    time.sleep(0.5)  # kubelet compresses a rotated file later
                    with open(rotated, "rb") as src, gzip.open(rotated + ".gz", "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    os.unlink(rotated)
            else:
                shutil.copyfile(a.path, rotated)
                with open(a.path, "r+") as t:
                    t.truncate(0)
    f.close()
    print(f"wrote {len(out)} lines, {rotations} rotations, {poisons} poison lines", flush=True)


if __name__ == "__main__":
    main()
