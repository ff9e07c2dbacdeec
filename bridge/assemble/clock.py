"""Clock jumps: a stream's clock that leaps between two neighbouring lines.

A container's lines are stamped by its node's clock (the runtime's CRI / docker stamp, vLLM's
JSON or header stamp). That clock can be stepped: a node that boots with a dead RTC (1970, or
its firmware's date) and is corrected by NTP later, a VM restored from a snapshot, an operator's
`date -s`. The lines before and after such a step are real; only the distance between them is
not. Without care the assembler reads a step of years forward as years of silence (every open
request evicted at its TTL, idle ones closed, a request straddling the step split into an
`incomplete` root and a second one decades later), and a step back as the log standing still
(nothing evicted until the clock catches up again, decades on).

What counts as a jump, by cause:

- **Forward, at least `AHEAD_NS` (366 days).** Real silence between two lines of one container
  is bounded by how long a container lives and stays quiet: an idle vLLM logs nothing (no
  request, no stats line), so hours, days, even months without a line are real and stay an
  idle gap (TTL eviction, as before). A pod does not outlive its node's yearly maintenance, and a
  stream's files are one container's; more than a year between neighbouring lines is a clock
  being set, not time passing.
- **Backward, at least `BEHIND_NS` (one day).** Lines of one container never go back by more
  than a little: stdout and stderr (and vLLM's processes) interleave by milliseconds, NTP steps
  by seconds, a header stamp in local time goes back an hour at the end of summer time, a
  misconfigured zone is off by at most 26 hours (UTC−12 … UTC+14) but consistently so. A step
  back of a day or more is a clock being set.

Only stamps that are readings of the clock count: a line with no stamp of its own at the start
of a file takes the file's modification time (decode's `anchored` clock), a guess that can be
days after the file's lines; it is neither side of a jump.

A jump is counted (`AssembleStats.clock_jumps`, `vllm_trace_bridge_clock_jumps_total`),
reported as a `vllm.clock_jump` event on every request not yet emitted (both stamps as attributes),
and the assembler's clock follows the new time. No stamp is rewritten: a request that straddles
the jump is one request whose lines keep their stamps. Deadlines (TTL, linger, idle grace) that
would fall before the jump count from the jump instead, so the jump itself ends nothing; the
requests from before it are then evicted (or emitted) when the new clock has run a whole TTL
without a line for them, as if their last line had been at the jump.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

_NS = 1_000_000_000
AHEAD_NS = 366 * 86_400 * _NS   # forward: longer than any real silence of one container
BEHIND_NS = 86_400 * _NS        # backward: more than stream interleaving, NTP steps, zones, DST


@dataclass(frozen=True, slots=True)
class ClockJump:
    """The assembler's own event between two lines of a stream: its clock read `before_ns`, then
    `after_ns` (a jump, `jumped`). Dispatched through the table like a line's event."""

    before_ns: int
    after_ns: int


def jumped(before_ns: int, after_ns: int) -> bool:
    """Whether `after_ns`, the stamp of the line after one stamped `before_ns` (of one stream), is a
    jump of the clock rather than time passing. `before_ns` 0: no line before (never a jump)."""
    if not before_ns:
        return False
    d = after_ns - before_ns
    return d >= AHEAD_NS or -d >= BEHIND_NS


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / _NS, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def jump_attrs(before_ns: int, after_ns: int) -> dict:
    """A `vllm.clock_jump` event's attributes: both sides as they were stamped, and the step."""
    return {"vllm.clock.before": _iso(before_ns), "vllm.clock.after": _iso(after_ns),
            "vllm.clock.jump_s": (after_ns - before_ns) / _NS}


class ClockWatch:
    """The latest jump of one stream's clock, while anything from before it may still be open.

    `since` is the first stamp after the jump; `hold_ns` the longest deadline window (the TTL).
    `deadline(d)`: a deadline that would fall before the jump counts from the jump (-1: nothing is
    due). `stale(...)`: after a jump *back*, the requests whose stamps lie ahead of the new clock
    (their lines came before the jump): due, once the new clock has run `hold_ns` past it."""

    __slots__ = ("since", "back", "hold_ns")

    def __init__(self, hold_ns: int) -> None:
        self.since: int | None = None
        self.back = False
        self.hold_ns = hold_ns

    def jump(self, before_ns: int, after_ns: int) -> None:
        self.since = after_ns
        self.back = after_ns < before_ns

    def deadline(self, deadline_ns: int) -> int:
        since = self.since
        return deadline_ns if since is None or deadline_ns >= since else -1

    def stale(self, open_requests: Iterable, now_ns: int, due: list) -> list:
        """The requests from before a jump back that are due now (not in `due` already), and,
        once the new clock has run `hold_ns` past the jump, forget it: nothing from before it is
        left open after this tick."""
        since = self.since
        if since is None or now_ns - self.hold_ns < since:
            return []
        self.since = None
        if not self.back:
            return []
        taken = {id(r) for r in due}
        return [r for r in open_requests if id(r) not in taken and
                (r.last_ns > now_ns or (r.terminal_ns is not None and r.terminal_ns > now_ns))]
