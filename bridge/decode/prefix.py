"""What may stand in front of vLLM's header: a shipper's stamp, a process prefix, a literal prefix.

Only lines that do not start with a header come here, so the common case never pays for it.
Order on a line, each part optional:

    <viewer bar> <shipper stamp> <syslog tag> <junk> (EngineCore_DP0 pid=7) [rank0]: <VLLM_LOGGING_PREFIX>
        INFO 10-22 09:33:49 [f.py:1] msg

where a viewer bar is what log viewers put before each line (`  | `, docker compose's
`vllm-1  | `), a shipper stamp is an ISO stamp (docker `logs -t`, Fluent Bit, cloud exports:
`2025-10-22 09:33:49.123 UTC`) or journald's `Oct 22 09:33:49`, and a syslog tag is journald's
`host vllm[1234]: `. Ray's colour codes whose ESC byte a shipper dropped (`[36m(RayWorker
pid=1)[0m `) are read as the colour they were.

Lines with no header at all (uvicorn, torch C++, raw tracebacks, tqdm) keep their process
prefix and shipper stamp removed too, so a traceback printed by a worker still knows its writer.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# LEVEL MM-DD HH:MM:SS file.py:LINE] message   (v0.8+ writes [file.py:LINE]; DEBUG a relative path).
# A logging config's own `datefmt` may leave the seconds out (`11-03 23:14`); a markdown renderer
# turns the `]` that closes `[file.py:LINE]` into `[]`.
HEADER = re.compile(
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d(?::\d\d)?)(?:[.,]\d+)? \[?([^\s\]]+:\d+)(?:\]|\[\]) ?"
)
# (APIServer pid=1) (VllmWorker rank=0 pid=5) (VllmWorker TP0 pid=5) (RayWorkerWrapper pid=206994, ip=10.0.0.1)
# The same header whose level lost its first letter, at a line's very start (a paste or a terminal
# selection that began one column late: `NFO 12-17 10:47:07 [loader.py:458] …`); FULL_LEVEL names it.
CLIPPED_HEADER = re.compile("(NFO|EBUG|ARNING|RROR|RITICAL)" + HEADER.pattern[HEADER.pattern.index(")") + 1:])
FULL_LEVEL = {"NFO": "INFO", "EBUG": "DEBUG", "ARNING": "WARNING", "RROR": "ERROR", "RITICAL": "CRITICAL"}
# (ServeReplica:app:Deployment pid=1, ip=10.0.0.1): a Ray Serve replica's actor name holds `:`
_PROCESS = re.compile(r"\(([A-Za-z_][\w.:-]*(?: [A-Za-z_][\w.=-]*)*? pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?)\) ?")
# 2025-10-22T09:33:49.123Z, 2025-10-22 09:33:49,123 +02:00 … (Fluent Bit, Vector, Promtail, journald exports),
# then one separator: what follows may be a traceback line whose indentation is its meaning
_ISO = re.compile(
    r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)([.,]\d{1,9})?\s?(Z|z|[+-]\d\d:?\d\d| ?UTC| ?GMT)?\b(?:\s?[|,;\]])?\s?"
)
# A wrapper that relays a child process's output lines verbatim after its own stamp, level and
# source: a log4j pattern `[%-5p] %t %c - ` (TorchServe: `[INFO ] W-9000-model_1.0-stdout MODEL_LOG - `),
# Rust tracing's `LEVEL crate::module: ` (NVIDIA Dynamo: `DEBUG dynamo_run::subprocess: `). What
# follows is the child's line as it wrote it (a traceback's indentation kept).
# Python logging's `%(asctime)s - %(name)s - %(levelname)s - %(message)s` (an application that logs
# vLLM's output through its own logger: `- __main__ - INFO - `), and its pipe-separated form
# `%(asctime)s | %(levelname)s | %(name)s | %(message)s` (FastChat's workers, whose logger takes their
# stdout and stderr: `2023-12-15 00:46:02 | ERROR | stderr | Traceback …`; the stamp's own `| ` is
# the stamp's separator).
_RELAY = re.compile(r"\[(?:TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ?\] \S+ \S+ - "
                    r"|(?:TRACE|DEBUG| ?INFO| ?WARN|ERROR) [A-Za-z_]\w*(?:::\w+)+: "
                    r"|- [\w.<>-]+ - (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
                    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \| [\w.<>-]+ \| ")
# A log viewer's table row (`U | 2025-07-18 11:29:37.824 | worker |   | <message>`): a stamp with cells
# on both sides; after it, the row's further cells, named or empty, up to the message
_TABLE = re.compile(r"[\w.-]*(?: +\|)+ ")
# A viewer's columns before every line, read where a header follows them: one or two names
# (`kubectl logs --prefix`-like tools, stern's `<pod> <container> `, `kserve-container `)
_COLUMN = re.compile(r"(?:[A-Za-z][\w.-]* ){1,2}")
_RAY_CC = re.compile(r"[DIWEF] \d+ \d+\] ")
# Python logging with the level before a full-date `asctime` (`%(levelname)s %(asctime)s …`: Ray Serve's
# own loggers, many apps): the stamp is read as a shipper's, the level word goes with it
_LEVEL_FIRST = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?=\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)")
# `  | ` (a log viewer's gutter), `vllm-1  | ` (docker compose): at most a name, then the bar
# (a name starts the line; spaces then a bar would also be a traceback's code line `    a | b`)
_VIEWER = re.compile(r"(?: {0,4}|[\w.-]+ +)\| ")
# A relay's label before its own stamp (a sidecar forwarding the server's output: `[VllmSidecar
# kooEr8C…]: 2024-11-13T03:15:08.672Z 1 stdout: `): a name and an id in brackets, `: `, a full date
_RELAY_LABEL = re.compile(r"\[[A-Za-z][\w.-]* [\w.-]+\]: (?=\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)")
# ... and after that stamp, the stream it read (`1 stdout: `: its file descriptor and name)
_RELAY_STREAM = re.compile(r"\d (?:stdout|stderr): ")
# journald / syslog short formats: `Oct 22 09:33:49[.123456] host ident[pid]: `, year-less local time
_SYSLOG = re.compile(r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]\d) (\d\d:\d\d:\d\d)(\.\d{1,9})? ")
_SYSLOG_TAG = re.compile(r"[\w.-]+ [\w.@/-]+\[\d+\]: ")   # `host ident[pid]: `; the pid is required
_MONTHS = {m: i + 1 for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split())}
# Colour codes that lost their ESC byte to a shipper: `[36m`, `[0m`, `[1;36m`
_BARE_SGR = re.compile(r"\[[0-9;]{0,8}m")
# torch elastic's `[rank3]: ` before every line a rank prints (`[rank1]:[E…` is torch C++'s own, kept)
_RANK = re.compile(r"\[rank(\d+)\]: ")
# torch C++ (c10 / glog) lines: `[E1022 09:33:49.123456 1234 ProcessGroupNCCL.cpp:1316] …`, also without `[`
# (torch elastic's `[rank2]:` right before it, no space; torch ≥ 2.4 writes no thread id:
# `[rank2]:[E1001 16:06:04.537131842 ProcessGroupNCCL.cpp:607]`)
# c10's own logger writes the month unpadded (`[W505 14:36:29.719250907 …]` is May 5), glog pads it
_TORCH = re.compile(r"(?:\[rank\d+\]:)?\[?[EWIF](\d{1,2})(\d\d) (\d\d:\d\d:\d\d)\.(\d{1,9})(?: +\d+)? +[^\s\]]+:\d+\]")


# torch_npu's (Ascend) error report: `[ERROR] 2025-12-05-07:51:07 (PID:585, Device:-1, RankID:-1) ERR99999 …`,
# the node's local time; read as the line's own stamp, the message kept whole
_NPU = re.compile(r"\[(?:ERROR|WARNING|INFO|DEBUG|EVENT)\] \d{4}-(\d\d)-(\d\d)-(\d\d:\d\d:\d\d) \(PID:")


class Split(NamedTuple):
    """A line taken apart. `header` is the match object over `line`, or None. A named tuple:
    built for every line that does not start with a header, where a frozen dataclass's
    construction cost more than the rest of the split."""

    header: re.Match[str] | None
    message_start: int   # where the message begins in `line` when there is no header
    process: str
    shipper_stamp: str   # RFC 3339 text ready for `Rfc3339`, "" when there was none
    own_stamp: str = ""  # a year-less local `MM-DD HH:MM:SS` the line carries (journald, torch C++)
    own_frac_ns: int = 0  # its fraction of a second
    line: str = ""       # the line `header` and `message_start` point into (split_prefix may rewrite it)
    column: str = ""     # words before the header a viewer puts on every line (stern's `pod container `)


def split_prefix(line: str) -> Split:
    """Find the header after whatever precedes it. Never raises."""
    pos = 0
    stamp = ""
    own, own_ns = "", 0
    viewer = False
    if line.find("| ", 0, 48) >= 0:
        m = _VIEWER.match(line)
        if m is not None:
            pos = m.end()
            viewer = True
    c = line[pos:pos + 1]
    if c == "[" and not viewer and (m := _RELAY_LABEL.match(line)) is not None:
        pos = m.end()
        c = line[pos:pos + 1]
    if c in "DIWEC" and (m := _LEVEL_FIRST.match(line, pos)) is not None:
        pos = m.end()
        c = line[pos:pos + 1]
    if c == "[" and line[pos + 1:pos + 2].isdigit():
        # a bracketed stamp: a CI runner's `[2025-03-10T15:07:20Z] ` (Buildkite), Ray's C++ logger's
        # `[2024-02-27 16:09:19,123 E 1234 5678] ` (its level, pid and thread inside)
        m = _ISO.match(line, pos + 1)
        if m is not None and not m[0].rstrip().endswith("]"):
            r = _RAY_CC.match(line, m.end())
            m = None if r is None else r
        if m is not None:
            date, hms, frac, tz = _ISO.match(line, pos + 1).groups()
            tz = (tz or "Z").strip()
            stamp = f"{date}T{hms}{'.' + frac[1:] if frac else ''}{'Z' if tz in ('UTC', 'GMT') else tz}"
            pos = m.end()
            c = ""
    if c.isdigit():
        m = _ISO.match(line, pos)
        if m is not None:
            date, hms, frac, tz = m.groups()
            tz = (tz or "Z").strip()
            stamp = f"{date}T{hms}{'.' + frac[1:] if frac else ''}{'Z' if tz in ('UTC', 'GMT') else tz}"
            pos = m.end()
    elif c in "JFMASOND":
        m = _SYSLOG.match(line, pos)
        if m is not None:
            mon, day, hms, frac = m.groups()
            own = f"{_MONTHS[mon]:02d}-{int(day):02d} {hms}"
            own_ns = int(frac[1:10].ljust(9, "0")) if frac else 0
            pos = m.end()
    if stamp or own:
        m = _SYSLOG_TAG.match(line, pos)
        if m is not None:
            pos = m.end()
    if stamp:
        m = _RELAY.match(line, pos) or _RELAY_STREAM.match(line, pos)
        if m is not None:
            pos = m.end()
        elif viewer and line.endswith("| ", 0, pos) and (m := _TABLE.match(line, pos)) is not None:
            pos = m.end()
    if line.startswith("[", pos) and _BARE_SGR.match(line, pos) is not None:
        line = _strip_bare_sgr(line, pos)
    elif line.startswith(" [", pos) and _BARE_SGR.match(line, pos + 1) is not None:
        # the same codes, their ESC byte turned into a space: ` [36m(RayWorker pid=1) [0m …`
        pos += 1
        line = _strip_bare_sgr(line, pos)
    process = ""
    m = _PROCESS.match(line, pos)
    if m is not None:
        process = m[1]
        pos = m.end()
        h = HEADER.match(line, pos)
        if h is not None:
            return Split(h, h.end(), process, stamp, "", 0, line)
        if not stamp and (lv := _LEVEL_FIRST.match(line, pos)) is not None and \
                (iso := _ISO.match(line, lv.end())) is not None:  # `(ServeController pid=1) ERROR 2025-…`
            date, hms, frac, tz = iso.groups()
            tz = (tz or "Z").strip()
            stamp = f"{date}T{hms}{'.' + frac[1:] if frac else ''}{'Z' if tz in ('UTC', 'GMT') else tz}"
            pos = iso.end()
    if line.startswith("[rank", pos):
        m = _RANK.match(line, pos)
        if m is not None:   # the rank joins the writer's name: a rank's traceback is one record
            process = f"{process} rank={m[1]}" if process else f"rank={m[1]}"
            pos = m.end()
    h = HEADER.search(line, pos)
    if h is None and pos == 0:
        h = CLIPPED_HEADER.match(line)
    if h is None:
        if line.startswith(("[", "E", "W", "I", "F"), pos):
            t = _TORCH.match(line, pos)
            if t is not None:   # a torch C++ line: its own stamp, the message kept whole
                mm, dd, hms, frac = t.groups()
                own, own_ns = f"{mm:0>2}-{dd} {hms}", int(frac[:9].ljust(9, "0"))
            elif (t := _NPU.match(line, pos)) is not None:
                own, own_ns = f"{t[1]}-{t[2]} {t[3]}", 0
        return Split(None, pos, process, stamp, own, own_ns, line)
    column = ""
    if not process and h.start() > pos:  # junk, then the process prefix, then the header
        m = _PROCESS.search(line, pos, h.start())
        if m is not None:
            process = m[1]
        junk = line[pos:m.start() if m is not None else h.start()]
        if _COLUMN.fullmatch(junk):
            column = line[:pos + len(junk)]
    return Split(h, h.end(), process, stamp, "", 0, line, column)


def _strip_bare_sgr(line: str, pos: int) -> str:
    """`[36m(RayWorker pid=1)[0m …` → `(RayWorker pid=1) …`, as the ESC-intact line decodes: the
    colour code at `pos` and the one right after the process prefix, nowhere else (a message may
    hold `[0m`)."""
    m = _BARE_SGR.match(line, pos)
    p = _PROCESS.match(line, m.end())
    if p is None:
        return line[:pos] + line[m.end():]
    close = p.end(1) + 1   # just past `)`
    s = _BARE_SGR.match(line, close)
    if s is None and line.startswith(" [", close):  # its ESC byte turned into a space
        s = _BARE_SGR.match(line, close + 1)
    return line[:pos] + line[m.end():close] + line[s.end() if s is not None else close:]
