"""Read a finished log file as (offset, raw line) pairs; gzip-rotated files are read through.

Also the one rule for which files are one stream and in what order they were written
(`rotated_from`, `rotation_key`): `replay` and `check` order the files they are given with it,
and the live follower orders the rotated siblings it catches up with by it.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from functools import partial

#: A line is read at most this far: its first MAX_LINE_BYTES are a line, its rest to the next
#: newline is dropped (counted). The live follower and `replay`/`check` cut alike, before any
#: byte past the bound is buffered (a `.gz` is decompressed a block at a time).
MAX_LINE_BYTES = 4 << 20

# `<live>.log` + the suffix a rotation gives it: kubelet's `.<YYYYMMDD-HHMMSS>`, logrotate's
# `.<N>` and dateext `-<YYYYMMDD[HH]>`, each maybe gzipped (kubelet gzips at the next rotation).
_ROTATED = re.compile(r"(?P<live>.+\.log)(?P<suffix>\.\d{8}-\d{6}|\.\d{1,6}|-\d{8,10})(?:\.gz)?")


def rotated_from(path: str) -> tuple[str, str] | None:
    """(the live file's path, the rotation suffix) when `path` is a rotated `.log` file's name
    (`0.log.20260215-100000.gz` → (`0.log`, `.20260215-100000`)), else None."""
    m = _ROTATED.fullmatch(path)
    return (m["live"], m["suffix"]) if m else None


def rotation_key(suffix: str, mtime: float, name: str = "") -> tuple:
    """Sorts one live file's rotated siblings oldest first, by the name the rotation gave: a
    number counts back (logrotate's `.1` is the newest), a stamp or date (kubelet's
    `20260215-100000`, `dateext`) counts forward; the modification time only where the name
    tells nothing. Not by mtime first: kubelet gzips a file at the next rotation, which makes
    an older file's `.gz` newer than the file after it."""
    suffix = suffix[1:] if suffix[:1] in ".-" else suffix
    if suffix.endswith(".gz"):
        suffix = suffix[:-3]
    if suffix.isdigit() and len(suffix) < 8:
        return (0, -int(suffix), mtime, name)
    if suffix[:1].isdigit():
        return (1, suffix, mtime, name)
    return (2, mtime, name)


def read_lines(path: str, base: int = 0, at: list[int] | None = None,
               cut: dict[str, int] | None = None) -> Iterator[tuple[int, bytes]]:
    """Each physical line with the byte offset where it starts (offsets of the uncompressed
    stream for `.gz`), plus `base` (a generation, as tail.follow numbers a source's files).
    A last line without a newline is still yielded. `at[0]`, if given, is kept at the offset
    of the last line handed out (where a reader that raised was). A line over MAX_LINE_BYTES is
    cut as the follower cuts it: its first MAX_LINE_BYTES are yielded, its rest is read a bound
    at a time and dropped, counted in `cut` (`lines_oversized`, `bytes_cut`). Memory stays
    within the bound whatever one line (or a `.gz` bomb of one line) holds."""
    opener = gzip.open if path.endswith(".gz") else open
    limit = MAX_LINE_BYTES
    with opener(path, "rb") as f:
        readline = f.readline
        offset = 0
        at = at if at is not None else [0]
        # readline(limit) through iter(): the buffered C readline, bounded, no Python per call
        for raw in iter(partial(readline, limit), b""):
            at[0] = offset
            yield base + offset, raw
            n = len(raw)
            offset += n
            if n == limit and raw[-1] != 10:  # cut: drop the rest of the line, a bound at a time
                dropped = 0
                for rest in iter(partial(readline, limit), b""):
                    dropped += len(rest)
                    if rest[-1] == 10:
                        break
                offset += dropped
                if cut is not None:
                    cut["lines_oversized"] = cut.get("lines_oversized", 0) + 1
                    cut["bytes_cut"] = cut.get("bytes_cut", 0) + dropped
