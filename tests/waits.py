"""How tests wait: on the event, never on a fixed clock.

A test waits for what it awaits (a condition polled, a process's exit, a pipe's line); the cap
on such a wait only keeps a hang from hanging the suite. Caps are written as the seconds the
wait could take on an idle machine, `deadline(30)`, and scaled by this machine's measured speed:
a small fixed CPU workload and a Python process start, timed once per test process and compared
with an idle reference. A loaded machine (two cores shared by a CI runner's neighbours) gets
longer caps, never shorter ones. `VTB_TEST_TIME_SCALE=F` sets the factor instead of measuring
(e.g. 5 under valgrind or an emulator).

`tests/test_waits.py` fails on a new fixed timeout literal elsewhere in tests/.
"""

from __future__ import annotations

import functools
import inspect
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

SCALE_ENV = "VTB_TEST_TIME_SCALE"

#: What the baseline takes on an idle current x86 core (CPython 3.11), in seconds. A machine that
#: takes longer gets a proportionally larger scale; a faster one keeps 1 (caps never shrink).
REFERENCE_CPU_S = 0.020
REFERENCE_SPAWN_S = 0.020
#: A measured scale above this is a hiccup during the measurement, not the machine's speed.
MAX_MEASURED_SCALE = 20.0


@dataclass(frozen=True)
class TimeScale:
    factor: float
    source: str      # "VTB_TEST_TIME_SCALE" or "measured"
    cpu_s: float     # the measured workload (0 when set by the variable)
    spawn_s: float   # the measured process start

    def describe(self) -> str:
        if self.source == SCALE_ENV:
            return f"time scale {self.factor:g} (from {SCALE_ENV})"
        return (f"time scale {self.factor:.2f} (measured: CPU workload {self.cpu_s * 1000:.0f} ms, "
                f"process start {self.spawn_s * 1000:.0f} ms, idle reference {REFERENCE_CPU_S * 1000:.0f}/"
                f"{REFERENCE_SPAWN_S * 1000:.0f} ms; {SCALE_ENV}=F sets it)")


def _cpu_workload() -> float:
    t = time.perf_counter()
    x = 0
    for i in range(300_000):
        x += i * i
    return time.perf_counter() - t


def _process_start() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t


@functools.lru_cache(maxsize=1)
def time_scale() -> TimeScale:
    """The factor every cap is multiplied by: the variable when set, else measured (once)."""
    raw = os.environ.get(SCALE_ENV, "").strip()
    if raw:
        try:
            factor = float(raw)
        except ValueError:
            factor = 0.0
        if not factor > 0:
            raise ValueError(f"{SCALE_ENV}={raw!r}: expected a positive number such as 3")
        return TimeScale(factor, SCALE_ENV, 0.0, 0.0)
    cpu = statistics.median(_cpu_workload() for _ in range(3))
    spawn = statistics.median(_process_start() for _ in range(3))
    factor = max(1.0, min(MAX_MEASURED_SCALE, max(cpu / REFERENCE_CPU_S, spawn / REFERENCE_SPAWN_S)))
    return TimeScale(round(factor, 2), "measured", cpu, spawn)


def deadline(seconds: float) -> float:
    """The cap for a wait that could take up to `seconds` on an idle machine, scaled to this one
    (a duration: give it as `timeout=`, or to `wait_for`)."""
    return seconds * time_scale().factor


class TimedOut:
    """What `wait_for` gives when the cap passed: false, and it says what was awaited, how long it
    waited and the scale (pytest prints it under a failed `assert wait_for(...)`)."""

    def __init__(self, what: str, waited: float, cap: float) -> None:
        self.what, self.waited, self.cap = what, waited, cap

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        # The figures at both ends: pytest cuts a long repr in its middle.
        scale = time_scale()
        return (f"TimedOut(waited {self.waited:.1f} s for: {self.what}; cap deadline({self.cap / scale.factor:g}) "
                f"= {self.cap:.1f} s at time scale {scale.factor:g} "
                f"({'from ' + SCALE_ENV if scale.source == SCALE_ENV else 'measured; ' + SCALE_ENV + '=F sets it'}))")

    __str__ = __repr__


def _what(cond) -> str:
    """The condition's source, for the message (a lambda's line), else its name."""
    try:
        src = inspect.getsource(cond).strip()
    except (OSError, TypeError):
        return getattr(cond, "__qualname__", repr(cond))
    if getattr(cond, "__name__", "") == "<lambda>" and "lambda" in src:
        src = src[src.index("lambda"):]
    return src if len(src) <= 300 else src[:300] + "…"


def wait_for(cond, timeout: float, every: float = 0.2, what: str | None = None):
    """Poll `cond()` until true; give its value, or a false `TimedOut` once `timeout` (already a
    `deadline(...)`) has passed. Checked once more at the cap, so a slow last poll still counts."""
    start = time.monotonic()
    end = start + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(every)
    value = cond()
    return value or TimedOut(what or _what(cond), time.monotonic() - start, timeout)


def wait_until(cond, timeout: float, what: str | None = None, every: float = 0.2):
    """`wait_for` that fails the test with the `TimedOut` message instead of giving it."""
    value = wait_for(cond, timeout, every, what)
    if not value:
        raise AssertionError(str(value)) if isinstance(value, TimedOut) else AssertionError(what)
    return value


def wait_while_progressing(done, progress, stall: float | None = None, every: float = 0.2):
    """Wait for `done()`, giving up only when `progress()` has not changed for `stall` seconds
    (default `deadline(90)`): a loaded machine is slow but moving, a stuck one is not (no cap on
    the whole)."""
    stall = deadline(90) if stall is None else stall
    start = last_move = time.monotonic()
    last = progress()
    while not done():
        now = progress()
        if now != last:
            last, last_move = now, time.monotonic()
        elif time.monotonic() - last_move > stall:
            return done() or TimedOut(f"{_what(done)} (no progress in {_what(progress)} for {stall:.1f} s, "
                                      f"last {last!r})", time.monotonic() - start, stall)
        time.sleep(every)
    return True
