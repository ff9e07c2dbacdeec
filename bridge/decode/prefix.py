"""What may stand in front of vLLM's header: a shipper's stamp, a process prefix, a literal prefix.

Only lines that do not start with a header come here, so the common case never pays for it.
Order on a line, each part optional:

    <shipper ISO stamp> <junk> (EngineCore_DP0 pid=7) <VLLM_LOGGING_PREFIX>INFO 10-22 09:33:49 [f.py:1] msg

Lines with no header at all (uvicorn, torch C++, raw tracebacks, tqdm) keep their process
prefix and shipper stamp removed too, so a traceback printed by a worker still knows its writer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# LEVEL MM-DD HH:MM:SS file.py:LINE] message   (v0.8+ writes [file.py:LINE]; DEBUG a relative path)
HEADER = re.compile(
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \[?([^\s\]]+:\d+)\] ?"
)
# (APIServer pid=1) (VllmWorker rank=0 pid=5) (VllmWorker TP0 pid=5) (RayWorkerWrapper pid=206994, ip=10.0.0.1)
_PROCESS = re.compile(r"\(([A-Za-z_][\w.-]*(?: [A-Za-z_][\w.=-]*)*? pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?)\) ?")
# 2025-10-22T09:33:49.123Z, 2025-10-22 09:33:49,123 +02:00 … (Fluent Bit, Vector, Promtail, journald exports)
_ISO = re.compile(
    r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)([.,]\d{1,9})?\s?(Z|z|[+-]\d\d:?\d\d)?\b[\s|,;\]]*"
)


@dataclass(frozen=True, slots=True)
class Split:
    """A line taken apart. `header` is the match object over `line`, or None."""

    header: re.Match[str] | None
    message_start: int   # where the message begins in `line` when there is no header
    process: str
    shipper_stamp: str   # RFC 3339 text ready for `Rfc3339`, "" when there was none


def split_prefix(line: str) -> Split:
    """Find the header after whatever precedes it. Never raises."""
    pos = 0
    stamp = ""
    if line[:1].isdigit():
        m = _ISO.match(line)
        if m is not None:
            date, hms, frac, tz = m.groups()
            stamp = f"{date}T{hms}{'.' + frac[1:] if frac else ''}{tz or 'Z'}"
            pos = m.end()
    process = ""
    m = _PROCESS.match(line, pos)
    if m is not None:
        process = m[1]
        pos = m.end()
        h = HEADER.match(line, pos)
        if h is not None:
            return Split(h, h.end(), process, stamp)
    h = HEADER.search(line, pos)
    if h is None:
        return Split(None, pos, process, stamp)
    if not process and h.start() > pos:  # junk, then the process prefix, then the header
        m = _PROCESS.search(line, pos, h.start())
        if m is not None:
            process = m[1]
    return Split(h, h.end(), process, stamp)
