"""vLLM's JSON log lines (`--logging-config.formatter json`, or a python-json-logger dictConfig).

One object per line: `{"asctime": "2026-11-30 07:49:14,368", "levelname": "INFO", "name":
"vllm.v1.engine.async_llm", "process": 24672, "message": "Added request …", "vllm_process_name":
"APIServer"}`. Unlike the text header, `asctime` has the year and milliseconds (no zone: the
server's local time, like the text header). A traceback is in `exc_info`, joined to the message
as the text formatter would print it, so error rules see one record either way.
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
    obj = loads(line)
    if not isinstance(obj, dict) or not isinstance(obj.get("message"), str):
        return None
    message = obj["message"]
    exc = obj.get("exc_info")
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
