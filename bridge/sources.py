"""What the agent keeps per container stream: its assembler, its files' record streams and the
delivery bookkeeping the checkpoint is computed from. Its own module so the agent (which fills
it) and the checkpointer (which reads it) share the type without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.assemble import Assembler
from bridge.decode.stream import RecordStream
from bridge.tail.checkpoint import Delivered, FileCheckpoint
from bridge.tail.follow import TrackedFile
from bridge.core.source import Source


@dataclass(slots=True)
class Pending:
    """A timeline handed to export and not yet acknowledged: its lines' span and its key."""

    first: int
    key: str
    last: int


@dataclass
class SourceState:
    """One container's stream: its assembler, its files' record streams, and delivery bookkeeping."""

    source: Source
    assembler: Assembler | None = None
    streams: dict[int, RecordStream] = field(default_factory=dict)  # id(TrackedFile) → its records
    quiet_since: dict[int, float] = field(default_factory=dict)  # id(TrackedFile) → last lines (monotonic)
    files: dict[int, TrackedFile] = field(default_factory=dict)
    skip: dict[str, int] = field(default_factory=dict)            # key → last position delivered
    pending: dict[int, Pending] = field(default_factory=dict)     # emitted, not yet acked
    delivered: list[Delivered] = field(default_factory=list)      # acked since the safe position
    pruned_at: int | None = None  # the safe position `delivered` was last pruned to (resume.py)
    retired: list[FileCheckpoint] = field(default_factory=list)   # closed files an open request may need
    facts: dict = field(default_factory=dict)  # engine facts a resumed assembler starts from (the checkpoint's)
    seq: int = 0
    last_ts: int = 0
    last_wall: int = 0
    gateway: bool = False  # a gateway's access log: its lines feed the join, not an assembler
