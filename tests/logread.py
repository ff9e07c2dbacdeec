"""A log file read as the bridge reads it, for tests that check decode and parse on their own:
each logical line (a Record) through the decoder, then its event (or None) through the parser."""

from __future__ import annotations

from pathlib import Path

from bridge.decode import Decoder
from bridge.parse import Parser


def parsed(path: Path | str, parser: Parser | None = None) -> list:
    """(Record, event or None) for each logical line of `path`, the decoder's last held line
    included; `parser`: one the caller inspects after (its snapshot's counts)."""
    dec, parser, out, offset = Decoder(), parser or Parser(), [], 0
    with open(path, "rb") as f:
        for raw in f:
            rec = dec(raw, offset)
            offset += len(raw)
            if rec is not None:
                out.append(rec)
    last = dec.flush()
    if last is not None:
        out.append(last)
    return [(rec, parser.parse(rec.message, rec.level, rec.origin)) for rec in out]
