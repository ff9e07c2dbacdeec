"""What the follower follows and why not the rest, said in the agent's log.

The follower knows why it turned a candidate away (a filter, an exclude glob, permissions, not
a regular file); this turns its `Discovery` records into one log line each, at start and on
each change, and warns when nothing at all is followed, naming where it looked.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from bridge.tail.follow import Discovery


def log_changes(log, changes: Iterable[Discovery]) -> None:
    """One line per change: `file_followed`, `file_skipped` (with `reason`), `file_released`."""
    for c in changes:
        if c.action == "followed":
            if c.reason:
                log.info("file_followed", path=c.path, source=c.source, note=c.reason)
            else:
                log.info("file_followed", path=c.path, source=c.source)
        elif c.action == "skipped":
            log.info("file_skipped", path=c.path, kind=c.kind, reason=c.reason)
        else:
            log.info("file_released", path=c.path, reason=c.reason)


def _root(pattern: str) -> str:
    """The part of a glob before its first wildcard: the directory it lists."""
    parts = pattern.split(os.sep)
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return os.sep.join(parts[:i]) or os.sep
    return os.path.dirname(pattern) or os.curdir


def warn_if_nothing(log, followed: int, include: Iterable[str], skipped: dict[str, int]) -> bool:
    """A warning when no file is followed: where each glob looks (and whether that exists) and
    how many candidates were skipped by kind. True when it warned."""
    if followed:
        return False
    where = {p: ("exists" if os.path.isdir(_root(p)) else f"{_root(p)} does not exist") for p in include}
    log.warning("following_nothing", include=where, skipped={k: v for k, v in skipped.items() if v},
                fix="check include (the log mount), and containers/pods/namespaces against the file_skipped "
                    "lines (kind=not_vllm: no line vLLM wrote in the file's start; see detect); /readyz stays "
                    "ready: it reports checkpoint trouble, not files")
    return True
