"""Multi-line records: a traceback, a torch C++ block or a 3-line message becomes one Record.

Two shapes reach the log:

- **headed** — vLLM's `NewLineFormatter` repeats the full header on every line of a message and
  ends every line but the last with `\\r`. Continuation: same process, level, origin and second, and
  either the previous line ended in `\\r` or the line reads like a traceback line (for logs whose
  shipper dropped the `\\r`).
- **raw** — no header: Python tracebacks printed by multiprocessing or torch elastic
  (`[rank0]:`-prefixed), chained exceptions, torch C++ `frame #N:` blocks. Continuation: same
  process and the line reads like the inside of a traceback or C++ block.

Only a line that can start a group is held, so most lines pass straight through; a held group
is released as soon as a line that does not continue it arrives (or a `\\r`-driven group gets
its last line), and by `flush()`. A group is cut at `max_lines` / `max_chars`: memory stays
bounded whatever the input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bridge.decode.record import Record

_RANK = re.compile(r"\[rank\d+\]: ?")
# A traceback's frame line starts a group too: a traceback whose first line was cut off (an
# excerpt, an agent started mid-way, a file rotated mid-traceback) is still one record.
_RAW_START = re.compile(
    r"Traceback \(most recent call last\)|Process [\w-]+:$|terminate called|\[[EWF][\d ]|\[PG \d+"
    r'|  File "[^"\n]+", line \d+, in '
)
_EXC_LINE = re.compile(r"[A-Za-z_][\w.:]*(?:Error|Exception|Exit|Interrupt|Failure|Warning)\b")
_INSIDE = ("  ", "\t", "Traceback (most recent call last)", "The above exception", "During handling of",
           "frame #", "Exception raised from", "^")
_MEMORY_PROFILE = ("Memory profiling takes", "the current vLLM instance", "model weights take")
_ERRORISH = ("ERROR", "CRITICAL")
_GLOG_NEXT = ("[E", "[F", "terminate called")
_SECOND = 1_000_000_000
_CRLF_EVIDENCE = 3  # `\r` lines not followed by their continuation: the file is CRLF, not vLLM's marker


@dataclass(slots=True)
class JoinStats:
    groups: int = 0        # records made of more than one line
    lines_joined: int = 0  # continuation lines folded into a group
    cut: int = 0           # groups released early at the size bound


def _strip_rank(message: str) -> str:
    if message.startswith("[rank"):
        m = _RANK.match(message)
        if m is not None:
            return message[m.end():]
    return message


def _inside(message: str) -> bool:
    """A line that reads like the inside or the end of a traceback or C++ block."""
    return message.startswith(_INSIDE) or _EXC_LINE.match(message) is not None or message.startswith(_MEMORY_PROFILE[1:])


class Joiner:
    """Feed records of one file in order; each call returns the records now complete."""

    __slots__ = ("stats", "_pending", "_parts", "_chars", "_last", "_cr_marks", "_crlf_evidence",
                 "_max_lines", "_max_chars")

    def __init__(self, max_lines: int = 400, max_chars: int = 64 * 1024) -> None:
        self.stats = JoinStats()
        self._pending: Record | None = None
        self._parts: list[str] = []
        self._chars = 0
        self._last: Record | None = None
        self._cr_marks = True      # `\r` still taken as vLLM's continuation marker
        self._crlf_evidence = 0
        self._max_lines = max_lines
        self._max_chars = max_chars

    def __call__(self, rec: Record) -> tuple[Record, ...]:
        p = self._pending
        if p is None:
            if self._starts(rec):
                self._open(rec)
                return ()
            return (rec,)
        if self._continues(p, rec):
            self._append(rec)
            if self._cr_marks and self._last.continued is False and p.level and p.continued:
                return (self._close(),)  # the line without `\r` ends a headed message
            if len(self._parts) >= self._max_lines or self._chars >= self._max_chars:
                self.stats.cut += 1
                return (self._close(),)
            return ()
        if p.level and self._last.continued and self._cr_marks:
            self._crlf_evidence += 1
            if self._crlf_evidence >= _CRLF_EVIDENCE:
                self._cr_marks = False
        done = self._close()
        if self._starts(rec):
            self._open(rec)
            return (done,)
        return (done, rec)

    @property
    def held_position(self) -> int | None:
        """Where the group being held began (a resume must re-read it)."""
        return self._pending.offset if self._pending is not None else None

    def flush(self) -> Record | None:
        """At end of input (or when the live agent goes idle): release the held group."""
        return self._close() if self._pending is not None else None

    # -- internals -----------------------------------------------------------------------

    def _starts(self, rec: Record) -> bool:
        if rec.level:
            return ((rec.continued and self._cr_marks) or rec.level in _ERRORISH
                    or rec.message.startswith(_MEMORY_PROFILE[0]))
        msg = rec.message
        if msg[:1] not in "TPt[ ":  # cheap: most header-less lines fail here
            return False
        return _RAW_START.match(_strip_rank(msg)) is not None

    def _continues(self, p: Record, rec: Record) -> bool:
        if rec.process != p.process:
            return False
        if p.level:
            # NewLineFormatter formats the header once: every line of a message has the same stamp
            if rec.level != p.level or rec.origin != p.origin or abs(rec.ts_ns - self._last.ts_ns) >= _SECOND:
                return False
            return (self._last.continued and self._cr_marks) or _inside(rec.message)
        if rec.level:
            return False
        msg = _strip_rank(rec.message)
        if _inside(msg):
            return True
        # torch C++ (glog) error lines come in bursts that end in `terminate called …`: one block
        return msg.startswith(_GLOG_NEXT) and _strip_rank(p.message).startswith(_GLOG_NEXT)

    def _open(self, rec: Record) -> None:
        self._pending = self._last = rec
        self._parts = [rec.message]
        self._chars = len(rec.message)

    def _append(self, rec: Record) -> None:
        self._parts.append(rec.message)
        self._chars += len(rec.message) + 1
        self._last = rec
        self.stats.lines_joined += 1

    def _close(self) -> Record:
        p, last = self._pending, self._last
        self._pending = self._last = None
        parts, self._parts = self._parts, []
        if len(parts) == 1:
            return p
        self.stats.groups += 1
        return Record(p.ts_ns, p.clock, p.level, p.origin, "\n".join(parts), p.offset, last.end_offset,
                      p.process, False)
