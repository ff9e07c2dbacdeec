"""Multi-line records: a traceback, a torch C++ block or a 3-line message becomes one Record.

Two shapes reach the log:

- **headed** — vLLM's `NewLineFormatter` repeats the full header on every line of a message and
  ends every line but the last with `\\r`. Continuation: same process, level, origin and second, and
  either the previous line ended in `\\r` or the line reads like a traceback line (for logs whose
  shipper dropped the `\\r`).
- **raw** — no header: Python tracebacks printed by multiprocessing or torch elastic
  (`[rank0]:`-prefixed), chained exceptions, torch C++ `frame #N:` blocks. Continuation: same
  process and the line reads like the inside of a traceback or C++ block.

Paste and terminal damage, read by how it is made (each needs a line that no log line starts as):

- **pretty-printed JSON** — a JSON formatter with an indent writes a record as `{` alone, its
  members indented, `}` alone: gathered and read as one record (`json`, the decoder's reading).
- **terminal-wrapped rows** — a terminal breaks a line every W columns whatever it holds; the
  rest starts the next row at column 0, with no header, prefix or stamp. A row exactly as wide as
  the widest rows, followed by such an orphan, is one line with it. The first wrap is taken only
  inside a word, its rest in lower case (`…KV cach` / `e is needed`); it fixes W, and a row wider
  than W unlearns it.
- **squashed indentation** — a renderer that collapses leading whitespace leaves a traceback's
  frames as `File "…", line N, in f` at column 0 and their source lines unindented: such a frame
  starts or continues a traceback, and the line after any frame is its source line (a lost
  newline may leave the frame at the end of another row).
- **a cut traceback's first line** — an excerpt or a rotation that cut a traceback may leave a
  frame's source line (`    call(x)`) before the next frame: it joins the frame that follows.

Only a line that can start a group is held, so most lines pass straight through; a held group
is released as soon as a line that does not continue it arrives (or a `\\r`-driven group gets
its last line), and by `flush()`. A group is cut at `max_lines` / `max_chars`: memory stays
bounded whatever the input.

The C fast path (`_fastdecode.c`) takes only INFO/DEBUG/WARNING lines with a header, and none
while a group is held: the rules above look only at the other records (no level, or ERROR and
CRITICAL), which reach this class on both paths, so both learn the same width.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from bridge.decode.record import CLOCK_ANCHORED, Record

_RANK = re.compile(r"\[rank\d+\]: ?")
# A traceback's frame line starts a group too: a traceback whose first line was cut off (an
# excerpt, an agent started mid-way, a file rotated mid-traceback) is still one record.
_RAW_START = re.compile(
    r"Traceback \(most recent call last\)|Process [\w-]+:$|terminate called|\[[EWF][\d ]|\[PG \d+"
    r'| {0,2}File "[^"\n]+", line \d+, in '
)
# A frame line whose indentation was squashed, and one at the end of a row (a lost newline)
_SQUASHED_FRAME = re.compile(r'File "[^"\n]+", line \d+, in ')
_FRAME_AT_END = re.compile(r'File "[^"\n]+", line \d+, in [^\s"]+\s*$')
_FRAME = re.compile(r' {0,2}File "[^"\n]+", line \d+, in ')
# A frame's source line as Python prints it (4 spaces): maybe the first line of a cut traceback
_SOURCE = "    "
_WORD = re.compile(r"\w")
_WORD_REST = re.compile(r"[a-z0-9_]")
_MIN_WRAP = 64  # no terminal is narrower: shorter rows are never taken for wrapped ones
# kinds of group: a traceback or message, a JSON record, a row held for its wrapped rest, a source
# line held for the frame that may follow it
_TRACE, _JSON, _WRAP, _LEAD = 0, 1, 2, 3
_EXC_LINE = re.compile(r"(?:[A-Za-z_][\w.:]*(?:Error|Exception|Exit|Interrupt|Failure|Warning)\b|Exception:)")
# A traceback's last line as Python writes it (`traceback.format_exception_only`: `module.Qualname:
# message`, or the name alone), whatever the class is called (`zmq.error.Again: Resource
# temporarily unavailable` ends NIXL's failed handshake): taken only right after a frame's
# indented line of the same headed message.
_EXC_TAIL = re.compile(r"[A-Za-z_][\w.]*(?:: |$)")
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
    lines_joined: int = 0  # lines folded into the record before them (unwrapped rows too): in = out + this
    cut: int = 0           # groups released early at the size bound
    unwrapped: int = 0     # of those, terminal-wrapped rows joined to the row they continue
    json: int = 0          # pretty-printed JSON records read


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
                 "_max_lines", "_max_chars", "_json", "_kind", "_wide", "_width", "_merged", "_squashed")

    def __init__(self, max_lines: int = 400, max_chars: int = 64 * 1024,
                 json: Callable[[str, Record, int], Record | None] | None = None) -> None:
        """`json`: reads a pretty-printed JSON record's joined text (the decoder's `json_record`);
        without it such a record is one record of its lines as they are."""
        self.stats = JoinStats()
        self._json = json
        self._kind = _TRACE
        self._wide = 0      # the widest row seen (of the records this class always sees)
        self._width = 0     # the terminal's width, once a wrap showed it
        self._merged = False  # the group's first part took a wrapped row
        self._squashed = False  # the group's last part is or ends in a frame line: its source line follows
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
        cols = self._see(rec)
        if p is not None and cols >= 0 and self._wrapped(rec):
            self._unwrap(rec)
            if self._chars >= self._max_chars:
                self.stats.cut += 1
                return (self._close(),)
            if self._kind == _WRAP and cols != self._width:
                return (self._close(),)  # its last row: shorter than the terminal
            return ()
        if p is None:
            if self._starts(rec):
                self._open(rec)
                return ()
            if self._holds(rec, cols):
                return ()
            return (rec,)
        if self._continues(p, rec):
            self._append(rec)
            if self._kind == _JSON and rec.message.rstrip() == "}":
                return (self._close(),)  # the record's closing brace
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
        if self._holds(rec, cols):
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

    def _see(self, rec: Record) -> int:
        """The record's row width (-1: not a row this class always sees, or several rows),
        learnt into the widest row and checked against the terminal's width."""
        if rec.level and rec.level not in _ERRORISH:
            return -1
        cols = rec.end_offset - rec.offset - 1 - rec.continued
        if cols > self._wide:
            self._wide = cols
            if self._width and cols > self._width:
                self._width = 0  # wider than the terminal: no terminal wrapped these rows
        return cols

    def _wrapped(self, rec: Record) -> bool:
        """`rec` is the rest of the group's last row, which the terminal wrapped."""
        last = self._last
        if rec.level or rec.process or rec.clock != CLOCK_ANCHORED or last.end_offset != rec.offset:
            return False
        msg = rec.message
        if not msg or msg[0].isspace() or _RAW_START.match(msg) or _EXC_LINE.match(msg):
            return False
        if self._squashed and not _strip_rank(self._parts[-1])[:1].isspace():
            return False  # after a frame whose indentation was lost: its source line, unindented too
        cols = last.end_offset - last.offset - 1 - last.continued
        if (last.level and last.level not in _ERRORISH) or cols < _MIN_WRAP:
            return False
        if self._width:
            return cols == self._width
        # no wrap seen yet: the widest row so far, cut inside a word (a rest that starts in lower
        # case: a capital after a word's end is as likely a new line's start, `….co` / `Memory …`)
        return cols == self._wide and _WORD_REST.match(msg) is not None and \
            _WORD.match(self._parts[-1][-1:] or " ") is not None

    def _unwrap(self, rec: Record) -> None:
        last = self._last
        self._width = last.end_offset - last.offset - 1 - last.continued
        self._parts[-1] += rec.message
        self._chars += len(rec.message)
        self._last = rec
        self._merged = True
        self._squashed = self._ends_in_frame(self._pending, self._parts[-1])
        self.stats.unwrapped += 1
        self.stats.lines_joined += 1

    def _holds(self, rec: Record, cols: int) -> bool:
        """Hold a record that starts no group for what may continue it: a row as wide as a
        terminal's (its wrapped rest), a frame's source line (the frame after it)."""
        if rec.level or cols < _MIN_WRAP and not rec.message.startswith(_SOURCE):
            return False
        if rec.message.startswith(_SOURCE):
            self._open(rec)
            self._kind = _LEAD
            return True
        if cols == (self._width or self._wide):
            self._open(rec)
            self._kind = _WRAP
            return True
        return False

    def _starts(self, rec: Record) -> bool:
        if rec.level:
            return ((rec.continued and self._cr_marks) or rec.level in _ERRORISH
                    or rec.message.startswith(_MEMORY_PROFILE[0]))
        msg = rec.message
        if msg[:1] not in "TPt[ F{":  # cheap: most header-less lines fail here
            return False
        if msg[0] == "{":
            return msg.rstrip() == "{"
        return _RAW_START.match(_strip_rank(msg)) is not None

    def _continues(self, p: Record, rec: Record) -> bool:
        if rec.process != p.process:
            return False
        kind = self._kind
        if kind != _TRACE:
            if rec.level or kind == _WRAP:
                return False
            if kind == _JSON:
                return rec.message[:1] in (" ", "\t") or rec.message.rstrip() == "}"
            if _FRAME.match(_strip_rank(rec.message)) is None:  # _LEAD: only a frame follows it
                return False
            self._kind = _TRACE
            return True
        if p.level:
            # NewLineFormatter formats the header once: every line of a message has the same stamp
            if rec.level != p.level or rec.origin != p.origin or abs(rec.ts_ns - self._last.ts_ns) >= _SECOND:
                return False
            return (self._last.continued and self._cr_marks) or _inside(rec.message) or \
                (self._parts[-1][:1] == " " and _EXC_TAIL.match(rec.message) is not None)
        if rec.level:
            return False
        msg = _strip_rank(rec.message)
        if self._squashed:  # the line after a frame: its source line, whatever its indentation
            return not msg.startswith("{")
        if _inside(msg) or _SQUASHED_FRAME.match(msg):
            return True
        # torch C++ (glog) error lines come in bursts that end in `terminate called …`: one block
        return msg.startswith(_GLOG_NEXT) and _strip_rank(p.message).startswith(_GLOG_NEXT)

    def _open(self, rec: Record) -> None:
        self._pending = self._last = rec
        self._parts = [rec.message]
        self._chars = len(rec.message)
        self._kind = _JSON if not rec.level and rec.message.rstrip() == "{" else _TRACE
        self._merged = False
        self._squashed = self._ends_in_frame(rec, rec.message)

    @staticmethod
    def _ends_in_frame(rec: Record, message: str) -> bool:
        """The row is a frame line, or ends in one (a newline lost in a paste): the next row is
        that frame's source line, however its indentation came through."""
        if rec.level:
            return False
        msg = _strip_rank(message)
        return _FRAME_AT_END.search(msg) is not None and (_FRAME.match(msg) is not None or " File " in msg)

    def _append(self, rec: Record) -> None:
        self._parts.append(rec.message)
        self._chars += len(rec.message) + 1
        self._last = rec
        self._squashed = self._ends_in_frame(rec, rec.message)
        self.stats.lines_joined += 1

    def _close(self) -> Record:
        p, last = self._pending, self._last
        self._pending = self._last = None
        parts, self._parts = self._parts, []
        kind, self._kind, self._squashed = self._kind, _TRACE, False
        if len(parts) == 1 and not self._merged:
            return p
        if kind == _JSON and self._json is not None:
            rec = self._json("\n".join(parts), p, last.end_offset)
            if rec is not None:
                self.stats.json += 1
                self.stats.groups += 1
                return rec
        self.stats.groups += len(parts) > 1
        return Record(p.ts_ns, p.clock, p.level, p.origin, "\n".join(parts), p.offset, last.end_offset,
                      p.process, False)
