"""Read a finished log file as (offset, raw line) pairs; gzip-rotated files are read through."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

# A position is (generation << GEN_SHIFT) + byte offset: the files of one source (a container's
# rotations, restarts) are its generations, so positions stay ordered across them.
GEN_SHIFT = 40


def read_lines(path: str, base: int = 0, at: list[int] | None = None) -> Iterator[tuple[int, bytes]]:
    """Each physical line with the byte offset where it starts (offsets of the uncompressed
    stream for `.gz`), plus `base` (a generation, as tail.follow numbers a source's files).
    A last line without a newline is still yielded. `at[0]`, if given, is kept at the offset
    of the last line handed out (where a reader that raised was)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        offset = 0
        if at is None and not base:
            for raw in f:  # buffered readline in C: the cheapest way to split lines in CPython
                yield offset, raw
                offset += len(raw)
            return
        at = at if at is not None else [0]
        for raw in f:
            at[0] = offset
            yield base + offset, raw
            offset += len(raw)
