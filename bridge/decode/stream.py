"""One file's physical lines → complete records: container framing, then multi-line joining.

The pair every reader of a file needs (replay, check, the live agent), so none of them
repeats the order of the two steps or how to empty them at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import chain

from bridge.decode import Decoder, DecodeStats
from bridge.decode.clock import HeaderClock, Rfc3339
from bridge.decode.framing import CRI, PLAIN, CriUnwrapper
from bridge.decode.joiner import Joiner
from bridge.decode.record import CLOCK_HEADER, CLOCK_RUNTIME, Record


def _load_fast():
    """The C fast path (`_fastdecode.c`) for the common line of a plain or CRI-framed file, or
    None: not built (no compiler at install), or VLLM_TRACE_BRIDGE_PURE=1. It handles only a
    line that Decoder and Joiner would pass straight through (in a CRI file: an `F` line on
    stdout/stderr whose stamp is in the second Rfc3339 has cached, and the `P` parts before it,
    which it holds in Decoder's `_parts` as Decoder does; with or without V1's process prefix,
    `(APIServer pid=1) `, right before the header), and hands every other line to them.
    Its cost is measured in docs/performance.md."""
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return None
    try:
        from bridge.decode import _fastdecode
    except ImportError:
        return None
    _fastdecode.init({"Decoder": Decoder, "Joiner": Joiner, "Record": Record, "HeaderClock": HeaderClock,
                      "DecodeStats": DecodeStats, "CriUnwrapper": CriUnwrapper, "Rfc3339": Rfc3339},
                     PLAIN, CRI, CLOCK_HEADER, CLOCK_RUNTIME)
    return _fastdecode


FAST = _load_fast()


class _Later:
    """Iterating it calls `fn` then: the end-of-file records, once the lines before are read."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def __iter__(self):
        return iter(self.fn())


class RecordStream:
    __slots__ = ("decoder", "joiner", "_fast")

    def __init__(self, decoder: Decoder, joiner: Joiner | None = None, fast=FAST) -> None:
        self.decoder = decoder
        self.joiner = joiner or Joiner()
        # The C fast path works on these exact classes only (it reads their slots).
        exact = type(self.decoder) is Decoder and type(self.joiner) is Joiner
        self._fast = fast if exact else None

    def __call__(self, raw: bytes, offset: int) -> tuple[Record, ...]:
        if self._fast is not None:
            record = self._fast.line(self.decoder, self.joiner, raw, offset)
            if record is not None:
                return () if record is self._fast.CONSUMED else (record,)  # CONSUMED: a CRI part held
        return self._python(raw, offset)

    def _python(self, raw: bytes, offset: int) -> tuple[Record, ...]:
        """The reference path: Decoder, then Joiner."""
        record = self.decoder(raw, offset)
        return () if record is None else self.joiner(record)

    def over(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[Record]:
        """Every complete record of a finished file, its last held ones included."""
        if self._fast is not None:
            return chain(self._fast.records(self.decoder, self.joiner, self._python, lines), _Later(self.flush))
        return self._over(lines)

    def each(self, lines: Iterator[tuple[int, bytes]]) -> Iterator[Record]:
        """The complete records of a live file's new lines, nothing flushed (more may come).
        The C path takes one line from `lines` at a time, so after a line it raised on the
        same iterator goes on from the next line."""
        if self._fast is not None:
            return self._fast.records(self.decoder, self.joiner, self._python, lines)
        return (record for offset, raw in lines for record in self(raw, offset))

    def _over(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[Record]:
        for offset, raw in lines:
            yield from self(raw, offset)
        yield from self.flush()

    def release(self) -> list[Record]:
        """The multi-line record held for a continuation that has not come (the file is quiet)."""
        held = self.joiner.flush()
        return [] if held is None else [held]

    def flush(self) -> list[Record]:
        """End of the file: a partial line never completed, then whatever the joiner holds."""
        out: list[Record] = []
        while (record := self.decoder.flush()) is not None:  # one per stream with a partial line
            out.extend(self.joiner(record))
        out.extend(self.release())
        return out

    @property
    def held_position(self) -> int | None:
        """The earliest position a resume must re-read for what this stream still holds."""
        held = [p for p in (self.decoder.held_position, self.joiner.held_position) if p is not None]
        return min(held, default=None)
