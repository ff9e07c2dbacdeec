"""Durable checkpoints: where to resume each file, and what was already delivered past there.

One JSON document in the state directory, replaced atomically (write to a temporary file,
fsync, rename, fsync the directory), so a crash leaves either the old or the new one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

_VERSION = 1


@dataclass(slots=True)
class Delivered:
    """A request (or engine incident) already acknowledged whose lines reach past the offset:
    on resume, its lines up to `last_offset` are skipped so it is not rebuilt a second time."""

    key: str          # request id, or "engine@<offset>"
    last_offset: int


@dataclass(slots=True)
class FileCheckpoint:
    path: str
    source_key: str
    generation: int    # order of this file among its source's files (rotations); see tail.follow
    inode: int
    fingerprint: str   # hex digest of the first `fingerprint_len` bytes
    fingerprint_len: int
    offset: int        # every byte before this is delivered or belongs to no request


@dataclass(slots=True)
class SourceCheckpoint:
    key: str
    next_generation: int
    delivered: list[Delivered] = field(default_factory=list)  # positions are source-wide


class CheckpointStore:
    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "checkpoints.json")
        self.written_at: float | None = None
        self._last_body: dict | None = None

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def load(self) -> tuple[list[FileCheckpoint], list[SourceCheckpoint]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return [], []
        if doc.get("version") != _VERSION:
            return [], []
        files = [FileCheckpoint(**entry) for entry in doc.get("files", [])]
        sources = []
        for entry in doc.get("sources", []):
            delivered = [Delivered(**d) for d in entry.pop("delivered", [])]
            sources.append(SourceCheckpoint(**entry, delivered=delivered))
        self.written_at = doc.get("written_at")
        return files, sources

    def save(self, files: list[FileCheckpoint], sources: list[SourceCheckpoint]) -> None:
        """Write the checkpoint, unless it says exactly what the file already says (an idle
        agent then costs no writes and no fsyncs); either way it is current as of now."""
        body = {"files": [asdict(f) for f in files], "sources": [asdict(s) for s in sources]}
        if body == self._last_body:
            self.written_at = time.time()
            return
        doc = {"version": _VERSION, "written_at": time.time(), **body}
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.written_at = doc["written_at"]
        self._last_body = body
