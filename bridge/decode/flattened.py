"""Records run together into one line (a paste or a viewer that lost the newlines between them):
where each begins, in the line's text and in its bytes. Pure functions; `Decoder._unflatten`
reads each piece as a record of its own.
"""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ANSI_BYTES = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")

#: Where a vLLM record begins inside a line that holds several: a paste or a viewer that lost the
#: newlines between them (`… kubectl logs pod/x INFO 06-09 05:30:55 [__init__.py:239] Automatically
#: detected … INFO 06-09 05:30:58 [api_server.py:1043] vLLM API server version …`): a space, then
#: a header (its process prefix before it, if any).
_EMBEDDED = re.compile(r" (?=(?:\([^()\n]{1,100}\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d "
                       r"\d\d:\d\d:\d\d(?:[.,]\d+)? \[[^\s\]]+:\d+\] )")
_PREFIX_ONLY = re.compile(r"\([^()\n]{1,100}\)")
#: Headers a line with no header of its own must hold to be read as flattened records: one is a
#: wrapper's frame around a vLLM line (parse unwraps it), two or more are lines run together.
_FLATTENED = 2


def raw_starts(message: str, starts: list[int], raw: bytes) -> list[int]:
    """Where each of `message`'s records (`starts`, positions in the text) begins in the line's
    bytes `raw`. The text is the bytes decoded (invalid UTF-8 replaced: 1 to 3 bytes become 3),
    its ANSI codes and trailing `\r` taken off, so a count from the line's end is off by those.
    Each start is found by its space and header in the bytes without their ANSI codes, the last
    first, each before the one after it; the bytes between two must read as the text between
    them (so a header written twice cannot be taken for another). When they do not (a header
    with bytes that are no UTF-8), the count from the end."""
    body = raw[:-1] if raw.endswith(b"\n") else raw
    kept, at_raw = [], []  # the bytes without ANSI codes, in pieces, and where each piece is in `body`
    pos = 0
    for m in _ANSI_BYTES.finditer(body):
        kept.append(body[pos:m.start()])
        at_raw.append(pos)
        pos = m.end()
    kept.append(body[pos:])
    at_raw.append(pos)
    plain = b"".join(kept)
    found: list[int] = []
    hi = len(plain)
    for s in reversed(starts):
        header = message[s:message.index("] ", s) + 2]
        at = plain.rfind((" " + header).encode("utf-8"), 0, hi)
        if at < 0 and header[:1] == "(":  # a prefix whose bytes are no UTF-8: found by its header
            close = header.index(") ")
            at = plain.rfind(header[close:].encode("utf-8"), 0, hi)
            at = plain.rfind(b" (", 0, at + 1) if at > 0 else -1
        if at < 0:
            break
        found.append(at + 1)
        hi = at + 1  # (its space may end the header before: `[utils.py:1] INFO …`)
    if len(found) == len(starts):
        found.reverse()
        texts = [message[s:t - 1] for s, t in zip(starts, starts[1:])] + [message[starts[-1]:]]
        pieces = [plain[a:b - 1] for a, b in zip(found, found[1:])] + [plain[found[-1]:]]
        if all(piece.decode("utf-8", "replace") == text for piece, text in zip(pieces[:-1], texts)) and \
                pieces[-1].decode("utf-8", "replace").rstrip("\r") == texts[-1]:
            out, i, low = [], 0, 0
            for at in found:  # (each the byte after its space: the space's place in `body`, plus one)
                while i + 1 < len(kept) and low + len(kept[i]) <= at - 1:
                    low += len(kept[i])
                    i += 1
                out.append(at_raw[i] + (at - 1 - low) + 1)
            return out
    at = len(plain.rstrip(b"\r"))  # (the line's bytes as read: exact for the pieces with no invalid byte after)
    back = []
    for s, t in zip(reversed(starts), [len(message), *reversed(starts)]):  # (each piece once: linear)
        at -= len(message[s:t].encode("utf-8", "replace"))
        back.append(at)
    return back[::-1]


def _clean(piece: bytes, last: bool) -> str:
    """Bytes of a line as `Decoder._record` reads them: decoded, ANSI codes off (and the line's
    trailing `\r`, in its `last` piece)."""
    text = piece.decode("utf-8", "replace")
    if "\x1b" in text:
        text = ANSI.sub("", text)
    return text.rstrip("\r") if last else text


def may_hold_records(message: str) -> bool:
    """Cheap first: `] ` ends a header's origin and few messages hold it; then the search."""
    return "] " in message and _EMBEDDED.search(message) is not None


def record_starts(message: str, own_header: bool) -> list[int] | None:
    """Where each record run into `message` begins (after its space; a header right after a
    process prefix begins at the prefix), or None when the line holds fewer than `_FLATTENED`
    headers, its own (`own_header`) counted."""
    starts: list[int] = []
    for m in _EMBEDDED.finditer(message):
        if not (starts and _PREFIX_ONLY.fullmatch(message, starts[-1], m.start())):
            starts.append(m.end())
    return starts if len(starts) + own_header >= _FLATTENED else None


def line_text(raw: bytes) -> str:
    """A line's bytes as `Decoder._record` reads them (its newline off)."""
    return _clean(raw[:-1] if raw.endswith(b"\n") else raw, True)
