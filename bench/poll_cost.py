"""CPU of one follower poll over many unchanged files, with and without the rewrite checks.

    python bench/poll_cost.py [--files 2000] [--max-open 768] [--polls 300]

Makes `--files` kubelet-style files, follows them with a descriptor budget of `--max-open`
(the rest parked), reads them to their end, then times `--polls` polls (process CPU), the
clock moved past REWRITE_CHECK_S before each, so every poll does its full share of checks;
alternately with REWRITE_CHECKS at 0 and at its value. Figures only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bridge.tail.follow as follow  # noqa: E402


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--max-open", type=int, default=768)
    ap.add_argument("--polls", type=int, default=300)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="vtb-poll-")
    checks = follow.REWRITE_CHECKS
    try:
        for i in range(a.files):
            d = os.path.join(tmp, "pods", f"ns_p{i}_u{i}", "vllm")
            os.makedirs(d)
            with open(os.path.join(d, "0.log"), "w") as f:
                f.write("2025-02-15T10:23:00.000000000Z stdout F INFO 02-15 10:23:00 a.py:1] hello\n" * 5)
        for n in (0, checks, 0, checks):
            follow.REWRITE_CHECKS = n
            clock = _Clock()
            f = follow.Follower(follow.Filters((tmp + "/pods/*/*/*.log",)), clock=clock, max_open=a.max_open)
            f.discover(first_round=True)
            for _ in range(5):
                clock.t += follow.REWRITE_CHECK_S + 1
                f.poll()
            parked = sum(1 for t in f.files if t.fh is None)
            t0 = time.process_time()
            for _ in range(a.polls):
                clock.t += follow.REWRITE_CHECK_S + 1
                f.poll()
            ms = (time.process_time() - t0) / a.polls * 1e3
            print(f"rewrite checks per round {n:>3}: {ms:.2f} ms CPU per poll of {a.files} files ({parked} parked)")
            f.close()
    finally:
        follow.REWRITE_CHECKS = checks
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
