"""One file's physical lines → complete records: container framing, then multi-line joining.

The pair every reader of a file needs (replay, check, the live agent), so none of them
repeats the order of the two steps or how to empty them at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bridge.decode import Decoder
from bridge.decode.joiner import Joiner
from bridge.decode.record import Record


class RecordStream:
    __slots__ = ("decoder", "joiner")

    def __init__(self, decoder: Decoder, joiner: Joiner | None = None) -> None:
        self.decoder = decoder
        self.joiner = joiner or Joiner()

    def __call__(self, raw: bytes, offset: int) -> tuple[Record, ...]:
        record = self.decoder(raw, offset)
        return () if record is None else self.joiner(record)

    def over(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[Record]:
        """Every complete record of a finished file, its last held ones included."""
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
        record = self.decoder.flush()
        if record is not None:
            out.extend(self.joiner(record))
        out.extend(self.release())
        return out

    @property
    def held_position(self) -> int | None:
        """The earliest position a resume must re-read for what this stream still holds."""
        held = [p for p in (self.decoder.held_position, self.joiner.held_position) if p is not None]
        return min(held, default=None)
