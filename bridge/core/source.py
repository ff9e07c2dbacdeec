"""Who wrote a line: the identity deterministic ids derive from, and the resource attributes
its spans carry. How a path maps to one is the tail's (`bridge.tail.source.source_for`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Source:
    """A *stream* (one container's log: its live file, the files rotation made of it, its
    restarts' files) and the file a line came from. Ids derive from `key` only, so a replay of
    the rotated files and the agent that followed them live derive the same ids; `path` and
    `resource` only name the file (`log.file.path`, `k8s.*`)."""

    key: str                       # the stream: stable across rotations, restarts and replays
    path: str                      # the file
    resource: dict[str, str | int] = field(default_factory=dict, hash=False, compare=False)
