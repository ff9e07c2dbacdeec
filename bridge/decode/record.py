"""The decode stage's output: one logical log line, framing removed, timestamp resolved."""

from __future__ import annotations

from dataclasses import dataclass

#: How a record's timestamp was obtained, best first.
CLOCK_RUNTIME = "runtime"    # container runtime's nanosecond stamp (CRI, docker)
CLOCK_SHIPPER = "shipper"    # a log shipper's ISO 8601 stamp written in front of the line
CLOCK_JSON = "json"          # vLLM's JSON format: `asctime` with year and milliseconds
CLOCK_HEADER = "header"      # vLLM header, one-second precision, year inferred
CLOCK_ANCHORED = "anchored"  # no stamp of its own: the last one seen in the same file
CLOCK_EXACT = "exact"        # the event's own time, stated by the line (the vLLM plugin's `t=`)


@dataclass(slots=True)
class Record:
    ts_ns: int
    clock: str
    level: str     # "" when the line had no vLLM header
    origin: str    # "file.py:123", "" when unknown
    message: str
    offset: int      # byte offset of the first physical line in the file
    end_offset: int  # byte offset just past the last physical line
    process: str = ""       # vLLM's `(EngineCore_DP0 pid=7) ` prefix, without parentheses
    continued: bool = False  # the line ended in `\r`: vLLM's NewLineFormatter says more follows
