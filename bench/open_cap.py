"""Peak RSS of `replay` and `check` on a million requests that start and never end.

    python bench/open_cap.py [--requests 1000000] [--max-open N]

Writes (once, under bench/out/) a plain vLLM log of N `Scheduling request` lines, 10,000 a
second of log time (so none reaches the TTL), then runs `python -m bridge replay PATH
--waterfalls 0` and `python -m bridge check PATH` each in its own process and prints its peak
RSS (`os.wait4` rusage). Figures, not assertions: the open-request limit's effect on memory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def ensure_log(n: int) -> str:
    path = os.path.join(HERE, "out", f"open_{n}.log")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            for i in range(n):
                s = 1_000 + i // 10_000
                f.write(f"INFO 02-15 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d} scheduler.py:234] "
                        f"Scheduling request 0x7f{i:010x}: priority=0, num_scheduled_blocks=4, remaining_blocks=2\n")
        os.replace(path + ".tmp", path)
    return path


def peak_mb(args: list[str]) -> tuple[float, str]:
    proc = subprocess.Popen([sys.executable, "-m", "bridge", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = proc.stdout.read().decode()
    _, status, ru = os.wait4(proc.pid, 0)
    return ru.ru_maxrss / 1024, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--max-open", type=int, default=None, help="replay's --max-open-requests (default: its own)")
    a = ap.parse_args()
    path = ensure_log(a.requests)
    extra = [] if a.max_open is None else ["--max-open-requests", str(a.max_open)]
    for name, args in (("replay", ["replay", path, "--waterfalls", "0", "--year", "2025", *extra]),
                       ("check", ["check", path])):
        mb, out = peak_mb(args)
        print(f"{name:7} peak RSS {mb:7.0f} MB")
        for line in out.splitlines():
            if line.startswith(("requests", "open limit", "  records")):
                print(f"        {line.strip()}")


if __name__ == "__main__":
    main()
