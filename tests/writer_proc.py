"""A process that appends generated vLLM logs at a steady rate, rotating as told.

    python writer_proc.py PATH --requests N --rate LINES_PER_S [--rotate-every LINES]
                          [--rotate rename|copytruncate|gzip] [--seed S] [--truth FILE]

Writes CRI-framed seed-dialect lines (as containerd would) from bridge.synth's ground truth.
`rename` moves PATH to PATH.<n> and starts a new PATH (kubelet style); `gzip` does the same
and then compresses the rotated file; `copytruncate` copies PATH to PATH.<n> and truncates
PATH in place. Writes the truth (request id and expected start per request) as JSON first.
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
    ap.add_argument("--rotate", default="rename", choices=["rename", "copytruncate", "gzip"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--truth")
    ap.add_argument("--partial-ratio", type=float, default=0.05)
    a = ap.parse_args()
    cfg = SynthConfig(requests=a.requests, seed=a.seed, cri=True, mean_interarrival_s=0.05,
                      cri_partial_ratio=a.partial_ratio, model_load_failure=False, incomplete_tail=0)
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
    for i, line in enumerate(out, 1):
        f.write(line)
        if i % 200 == 0:
            f.flush()
            delay = start + i / a.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if a.rotate_every and i % a.rotate_every == 0 and not (line.split(" ", 3)[2] == "P"):
            f.flush()
            rotations += 1
            rotated = f"{a.path}.{rotations}"
            if a.rotate in ("rename", "gzip"):
                f.close()
                os.rename(a.path, rotated)
                f = open(a.path, "a", encoding="utf-8")
                if a.rotate == "gzip":
                    time.sleep(0.5)  # kubelet compresses a rotated file later
                    with open(rotated, "rb") as src, gzip.open(rotated + ".gz", "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    os.unlink(rotated)
            else:
                shutil.copyfile(a.path, rotated)
                with open(a.path, "r+") as t:
                    t.truncate(0)
    f.close()
    print(f"wrote {len(out)} lines, {rotations} rotations", flush=True)


if __name__ == "__main__":
    main()
