"""vLLM's JSON log lines (`--logging-config.formatter json`, or a python-json-logger dictConfig).

One object per line: `{"asctime": "2026-11-30 07:49:14,368", "levelname": "INFO", "name":
"vllm.v1.engine.async_llm", "process": 24672, "message": "Added request …", "vllm_process_name":
"APIServer"}`. Unlike the text header, `asctime` has the year and milliseconds (no zone: the
server's local time, like the text header). A traceback is in `exc_info`, joined to the message
as the text formatter would print it, so error rules see one record either way (a formatter may
give it as a list of lines: they are joined).

A formatter with an indent (python-json-logger's `json_indent`, a `jq` or a viewer in between)
writes one record over many lines: decode's joiner gathers them (`{` alone, indented lines, `}`)
and reads the whole with `parse_json_text`, which also reads a record cut before its end (an
excerpt, a rotation, the joiner's size bound) from the members complete before the cut.
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo

_NS = 1_000_000_000
_MARK = '"levelname"'
_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(line: str):
    """json.loads, or None for what is not JSON, nesting too deep for the parser included
    (RecursionError: a line of 100,000 `[`)."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def text(value: str, line: str) -> str:
    """A string json.loads gave, each lone UTF-16 surrogate (`"\\ud800"`, which no encoder
    takes) replaced by U+FFFD, as invalid UTF-8 is. Only a line with a `\\u` escape can hold one."""
    return _SURROGATE.sub("\ufffd", value) if "\\u" in line else value


@dataclass(frozen=True, slots=True)
class JsonLine:
    ts_ns: int | None
    level: str
    origin: str     # the logger name: JSON records carry no file and line
    message: str
    process: str    # `APIServer pid=24672`, as the text format's prefix would say


def parse_json_line(line: str, tz: tzinfo = timezone.utc) -> JsonLine | None:
    """The record, or None when the line is not a JSON log record (cheap check first)."""
    if not line.startswith("{") or _MARK not in line:
        return None
    return _record(loads(line), line, tz)


def parse_json_text(text: str, tz: tzinfo = timezone.utc) -> JsonLine | None:
    """A record written over several lines (pretty-printed), or None. Cut before its closing
    brace, it is read from the members complete before the cut (`_closed`)."""
    if not text.startswith("{") or _MARK not in text:
        return None
    obj = loads(text)
    if obj is None:
        obj = _closed(text)
    return _record(obj, text, tz)


#: At most this many cut points are tried, from the last line back: a member cut inside its
#: value (`"exc_info": [` and its lines) moves the cut before it.
_CUT_TRIES = 4


def _closed(text: str):
    """The object a cut pretty-printed record held before the cut: the text up to the end of one
    of its last lines (outside any string), its open brackets closed. None when no cut point
    makes JSON. One scan for the open brackets at each line end, then at most `_CUT_TRIES` parses."""
    stack: list[str] = []
    ends: list[tuple[int, str]] = []
    in_str = esc = False
    for i, c in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            stack.append("]" if c == "[" else "}")
        elif c in "]}":
            if not stack:
                return None
            stack.pop()
        elif c == "\n":
            ends.append((i, "".join(reversed(stack))))
    if not in_str:
        ends.append((len(text), "".join(reversed(stack))))
    for end, closers in reversed(ends[-_CUT_TRIES:]):
        head = text[:end].rstrip().rstrip(",")
        obj = loads(head + closers)
        if obj is not None:
            return obj
    return None


def _record(obj, line: str, tz: tzinfo) -> JsonLine | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("message"), str):
        return None
    message = obj["message"]
    exc = obj.get("exc_info")
    if isinstance(exc, list) and all(isinstance(x, str) for x in exc):
        exc = "\n".join(exc)
    if isinstance(exc, str) and exc:
        message = f"{message}\n{exc}"
    name = obj.get("vllm_process_name") or obj.get("processName") or ""
    pid = obj.get("process")
    process = f"{name} pid={pid}" if name and pid is not None else str(name)
    level = obj.get("levelname")
    return JsonLine(_stamp(obj.get("asctime"), tz), text(level, line) if isinstance(level, str) else "",
                    text(str(obj.get("name") or ""), line), text(message, line), text(process, line))


def _stamp(text, tz: tzinfo) -> int | None:
    """`2026-11-30 07:49:14,368` (logging's default asctime) → epoch ns in `tz`."""
    if not isinstance(text, str) or len(text) < 19:
        return None
    try:
        dt = datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    frac = text[20:].strip() if len(text) > 20 and text[19] in ".," else ""
    ns = int(frac[:9].ljust(9, "0")) if frac.isdigit() else 0
    secs = calendar.timegm(dt.timetuple()) if tz is timezone.utc else int(dt.replace(tzinfo=tz).timestamp())
    return secs * _NS + ns
