"""Which containers run vLLM, told by what their files log rather than by their names.

KServe names its container `kserve-container`; others say `server`, `model`, `llm`. A name
pattern cannot know them all, so by default (`detect: vllm`) the agent reads the first bytes
of a container's file (at most `detect_bytes`) with the bridge's own decode and parse stages and
follows it once one line was written by vLLM:

- vLLM's text header, `INFO 12-03 10:00:00 [api_server.py:1234] …` (vllm/logger.py `_FORMAT`:
  level, `%m-%d %H:%M:%S`, `[fileinfo:lineno]`, a Python file), whatever stands before it;
- a JSON record of vLLM's loggers (`"name": "vllm…"`, vllm/logger.py's `vllm` logger tree);
- the process prefix vLLM writes on every line of its processes (`(APIServer pid=1) `,
  `(EngineCore_DP0 pid=7) `, `(Worker_TP0 pid=9) `: vllm/utils/system_utils.py), uvicorn's and
  tracebacks' lines included;
- a line the grammar knows as a vLLM request, engine or startup event (your `rules` included).

A Python traceback, a uvicorn line without a prefix or a torch message is not enough: any
Python server prints those. A file with no such line yet is looked at again as it grows (a
container that starts quietly: a shell script, a download; its files rotated away are read
too: an idle vLLM's new file may be empty), until its first `detect_bytes` were read; then it is skipped, once, with a `file_skipped` line (`kind=not_vllm`) and the
`files_skipped{reason="not_vllm"}` gauge. A container once found to be vLLM stays so (its
rotated and restarted files are followed without a look). Not asked: files of no container
(a path outside kubelet's tree: the include glob named it), gateway access logs, and a file
or container the settings name literally (`include: [/x/0.log]`, `containers: [server]`).

Above tail, decode and parse (it uses the last two); the follower only calls it.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from dataclasses import dataclass, field
from datetime import timezone, tzinfo

from bridge.decode import Decoder, Record
from bridge.parse import Parser
from bridge.parse.events import KIND, AccessLog, EngineError, Notice, Stamped
from bridge.tail.follow import read_head, siblings
from bridge.core.source import Source

KIND_NOT_VLLM = "not_vllm"
_PY_ORIGIN = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.py:\d+")  # `[api_server.py:1234]`, DEBUG `v1/engine/core.py:12`
# vLLM's process names (set_process_title / decorate_logs callers, and the older ones of
# /work/shared/reference/vllm-log-formats.md §a.3); the `(name pid=N) ` shape is decode's.
_VLLM_PROCESS = re.compile(r"(?:APIServer|ApiServer|EngineCore|VllmWorker|Worker|DPCoordinator|DPSupervisor|"
                           r"RayWorkerWrapper|RayWorkerVllm|_AsyncLLMEngine)(?:[_-]\w+)?(?: |$)")
_NOT_ENOUGH = (Notice, EngineError, AccessLog)  # chatter, tracebacks, uvicorn: any Python server
_KEEP = 100_000  # remembered verdicts; past this they are forgotten (asked again: a few reads)


def evidence(record: Record, event) -> str | None:
    """Why this record was written by vLLM (a short phrase for the log), or None."""
    origin = record.origin
    if record.level and origin:
        if origin == "vllm" or origin.startswith("vllm."):
            return f"a JSON record of vLLM's logger {origin!r}"
        if _PY_ORIGIN.fullmatch(origin):
            return f"vLLM's log header ({record.level} MM-DD HH:MM:SS [{origin}])"
    if record.process and _VLLM_PROCESS.match(record.process):
        return f"vLLM's process prefix ({record.process.split(' pid=')[0]} pid=…)"
    if event is not None and not isinstance(event, _NOT_ENOUGH):
        inner = event.event if type(event) is Stamped else event
        return f"a line the grammar knows ({KIND.get(type(inner), 'rule_event')})"
    return None


@dataclass(slots=True)
class DetectStats:
    """Files looked at, by verdict (the `files_detected` counter)."""

    vllm: int = 0       # a vLLM line found: followed
    not_vllm: int = 0   # `detect_bytes` read and no vLLM line: skipped
    named: int = 0      # named literally by include or containers: followed without a look
    bytes_read: int = 0


@dataclass(slots=True)
class _Look:
    """How far a file with no vLLM line yet was read."""

    inode: int
    decoder: Decoder
    size: int = -1      # the size when last read: unchanged, nothing to read again
    examined: int = 0   # bytes decoded (complete lines only)
    rotated: set = field(default_factory=set)  # files rotated from it, already read


@dataclass(frozen=True, slots=True)
class Found:
    """A file found to be vLLM, for the agent's log (`vllm_detected`)."""

    path: str
    evidence: str
    line: int  # 1-based physical line of the evidence


@dataclass
class Detector:
    """`admit` for the follower: None to follow a file, else (kind, why) to hold it back."""

    limit: int = 64 << 10
    gateway: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    containers: tuple[str, ...] = ()
    rules: object = None
    tz: tzinfo = timezone.utc
    stats: DetectStats = field(default_factory=DetectStats)
    found: list[Found] = field(default_factory=list)  # since the agent last took them
    _vllm: set = field(default_factory=set)     # source keys found to be vLLM
    _not: dict = field(default_factory=dict)    # path → inode decided not vLLM
    _looks: dict = field(default_factory=dict)  # path → _Look, no verdict yet
    _parser: Parser | None = None

    def __post_init__(self) -> None:
        self._named_paths = {os.path.abspath(p) for p in self.include if not glob.has_magic(p)}
        self._named_containers = {c for c in self.containers if not glob.has_magic(c)}
        self._parser = Parser(rules=self.rules)  # its own counts: a look is not a line read
        self._waiting = (f"no vLLM line yet: looked at again as it grows, up to its first {self.limit} bytes "
                         "(detect_bytes); followed from its start once one appears")
        self._refused = (f"not vLLM: no vLLM line (log header, process prefix, vLLM logger) in its first "
                         f"{self.limit} bytes; to follow it anyway name its container in `containers` "
                         "(no wildcard) or set detect: off")

    def __call__(self, path: str, source: Source) -> tuple[str, str] | None:
        container = source.resource.get("k8s.container.name")
        if container is None or any(fnmatch.fnmatch(path, g) for g in self.gateway):
            return None  # not a container's stream, or a gateway's access log
        if source.key in self._vllm:
            return None
        if path in self._named_paths or container in self._named_containers:
            self.stats.named += 1
            self._vllm.add(source.key)
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None  # the follower finds out and counts it
        if self._not.get(path) == st.st_ino:
            return KIND_NOT_VLLM, self._refused
        look = self._looks.get(path)
        if look is None or look.inode != st.st_ino:
            look = self._looks[path] = _Look(st.st_ino, Decoder(tz=self.tz))
            if len(self._looks) > _KEEP:
                self._looks.clear()
                self._looks[path] = look
        why = None
        if st.st_size != look.size:
            look.size = st.st_size
            try:
                why = self._read(path, look)
            except OSError:  # unreadable (permission, I/O): the follower reports it and tries again
                del self._looks[path]
                return None
        if why is None:
            why = self._rotated(path, look)
        if why is not None:
            del self._looks[path]
            if len(self._vllm) > _KEEP:
                self._vllm.clear()
            self._vllm.add(source.key)
            self.stats.vllm += 1
            self.found.append(Found(path, *why))
            return None
        if look.examined >= self.limit:
            del self._looks[path]
            if len(self._not) > _KEEP:
                self._not.clear()
            self._not[path] = st.st_ino
            self.stats.not_vllm += 1
            return KIND_NOT_VLLM, self._refused
        return KIND_NOT_VLLM, self._waiting

    def _rotated(self, path: str, look: _Look) -> tuple[str, int] | None:
        """Evidence in a file rotated from `path` (each read once): an idle vLLM's new file may
        stay empty while the one rotated away is full of its lines, and a look can come just
        after a rotation."""
        for sibling in siblings(path):
            if sibling in look.rotated:
                continue
            look.rotated.add(sibling)
            try:
                found = self._read(sibling, _Look(0, Decoder(tz=self.tz)))
            except OSError:
                continue
            if found is not None:
                return f"{found[0]}, in {os.path.basename(sibling)}", found[1]
        return None

    def _read(self, path: str, look: _Look) -> tuple[str, int] | None:
        """Decode and parse the complete lines past `look.examined`, up to `limit` bytes in all
        (OSError when the file cannot be read)."""
        head = read_head(path, self.limit)
        self.stats.bytes_read += max(0, len(head) - look.examined)
        decoder, parse = look.decoder, self._parser.parse
        pos = look.examined
        line_no = head.count(b"\n", 0, pos)
        while True:
            end = head.find(b"\n", pos)
            if end < 0:
                break
            raw = head[pos:end + 1]
            line_no += 1
            try:
                record = decoder(raw, pos)
                if record is not None:
                    event = parse(record.message, record.level, record.origin)
                    why = evidence(record, event)
                    if why is not None:
                        return why, line_no
            except Exception:  # a bad line never raises out of a stage, nor out of a look
                pass
            pos = end + 1
        if len(head) < self.limit:
            look.examined = pos
            return None
        # The whole head is read: the line it ends inside (a vLLM line longer than the head still
        # starts with its header) and a partial line the decoder holds (CRI `P`) count too.
        look.examined = self.limit
        try:
            tail = [decoder(head[pos:], pos)] if pos < len(head) else []
            for record in tail + [decoder.flush()]:
                if record is not None:
                    why = evidence(record, parse(record.message, record.level, record.origin))
                    if why is not None:
                        return why, line_no + 1
        except Exception:
            pass
        return None

    def take_found(self) -> list[Found]:
        out, self.found = self.found, []
        return out
