"""One file's physical lines → complete records: container framing, then multi-line joining.

The pair every reader of a file needs (replay, check, the live agent), so none of them
repeats the order of the two steps or how to empty them at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import chain

from bridge.decode import Carry, Decoder, DecodeStats
from bridge.decode.clock import HeaderClock, Rfc3339
from bridge.decode.framing import CRI, PLAIN, CriUnwrapper
from bridge.decode.joiner import Joiner
from bridge.decode.record import CLOCK_ANCHORED, CLOCK_HEADER, CLOCK_RUNTIME, Record


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


#: Records held at a file's start while none has a time of its own (`RecordStream._lead`); past
#: this many the file is no log with stamps to wait for, and they go on with the time they have.
_MAX_LEAD = 256


class RecordStream:
    """A file's records in order. Records before the file's first stamped one (a traceback or a
    library's lines printed before vLLM's first header, an excerpt that starts mid-way) have no
    time of their own; the decoder could only give them the file's mtime, which is later than
    anything in it. They are held until the first stamped record and take its time, the nearest
    the file states (never the wall clock); with no stamp at all they keep what they had.
    `lead=False` holds nothing: a file whose lines carry their time in a form the decoder
    does not read (a gateway's access log) would otherwise wait for a stamp that never comes."""

    __slots__ = ("decoder", "joiner", "_fast", "_lead", "_stamped")

    def __init__(self, decoder: Decoder, joiner: Joiner | None = None, fast=FAST, lead: bool = True) -> None:
        self.decoder = decoder
        self.joiner = joiner or Joiner(json=decoder.json_record)
        # The C fast path works on these exact classes only (it reads their slots).
        exact = type(self.decoder) is Decoder and type(self.joiner) is Joiner
        self._fast = fast if exact else None
        self._lead: list[Record] = []
        self._stamped = not lead  # a stamped record was seen (or the lead gave up): nothing is held

    def __call__(self, raw: bytes, offset: int) -> tuple[Record, ...]:
        if self._fast is not None:
            record = self._fast.line(self.decoder, self.joiner, raw, offset)
            if record is not None:
                if record is self._fast.CONSUMED:  # a CRI part held
                    return ()
                return (record,) if self._stamped else tuple(self._restamp(iter((record,))))
        records = self._python(raw, offset)
        return records if self._stamped or not records else tuple(self._restamp(iter(records)))

    def _restamp(self, records: Iterator[Record]) -> Iterator[Record]:
        """`records` with the lead logic: held until the first stamped record, which releases
        them with its time; once it came, the rest pass straight through."""
        lead = self._lead
        for record in records:
            if record.clock != CLOCK_ANCHORED or len(lead) >= _MAX_LEAD:
                self._stamped = True
                if record.clock != CLOCK_ANCHORED:
                    for held in lead:
                        held.ts_ns = record.ts_ns
                self._lead = []
                yield from lead
                yield record
                break
            lead.append(record)
        yield from records

    def _python(self, raw: bytes, offset: int) -> tuple[Record, ...]:
        """The reference path: Decoder, then Joiner."""
        record = self.decoder(raw, offset)
        if record is None:
            return ()
        more = self.decoder.more()  # a flattened line's other records (`Decoder._unflatten`)
        if more is None:
            return self.joiner(record)
        return tuple(out for each in (record, *more) for out in self.joiner(each))

    def over(self, lines: Iterable[tuple[int, bytes]], carry: bool = False) -> Iterator[Record]:
        """Every complete record of a finished file, its last held ones included. `carry`: the
        file's writer went on in a next file (a rotation), so a partial line it ends in is not
        a line yet: it stays in the decoder for `Decoder.carry`."""
        end = _Later(lambda: self.flush(partials=not carry))
        if self._fast is not None:
            records = self._fast.records(self.decoder, self.joiner, self._python, lines)
            return chain(records if self._stamped else self._restamp(records), end)
        return chain((record for offset, raw in lines for record in self(raw, offset)), end)

    def each(self, lines: Iterator[tuple[int, bytes]]) -> Iterator[Record]:
        """The complete records of a live file's new lines, nothing flushed (more may come).
        The C path takes one line from `lines` at a time, so after a line it raised on the
        same iterator goes on from the next line."""
        if self._fast is not None:
            records = self._fast.records(self.decoder, self.joiner, self._python, lines)
            return records if self._stamped else self._restamp(records)
        return (record for offset, raw in lines for record in self(raw, offset))

    def release(self) -> list[Record]:
        """The multi-line record held for a continuation that has not come (the file is quiet).
        Before the file's first stamp it joins the lead, which waits for that stamp."""
        held = self.joiner.flush()
        if held is None:
            return []
        return [held] if self._stamped else list(self._restamp(iter((held,))))

    def flush(self, partials: bool = True) -> list[Record]:
        """End of the file: a partial line never completed (not with `partials=False`: the
        file's writer goes on in the next, `hand_on`), then whatever the joiner holds, then a
        lead no stamp came for, with the time it had."""
        out: list[Record] = []
        while partials and (record := self.decoder.flush()) is not None:  # one per stream with a partial line
            out.extend(self.joiner(record))
        held = self.joiner.flush()
        if held is not None:
            out.append(held)
        if not self._stamped:
            out = list(self._restamp(iter(out)))
            out, self._lead = self._lead + out, []
        return out

    def hand_on(self) -> tuple[list[Record], Carry | None]:
        """End of a file whose writer goes on in the next one (a kubelet rotation): what the
        joiner and the lead hold, as `flush`, and the partial lines it ends in, for the next
        file's decoder (`Decoder.adopt`), where their `F` ends are."""
        carry = self.decoder.carry()
        return self.flush(), carry

    @property
    def held_position(self) -> int | None:
        """The earliest position a resume must re-read for what this stream still holds."""
        held = [p for p in (self.decoder.held_position, self.joiner.held_position,
                            self._lead[0].offset if self._lead else None) if p is not None]
        return min(held, default=None)
