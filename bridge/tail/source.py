"""Who wrote a file: its `Source` (bridge.core) read from its path, and how files make streams.

A *stream* is one container's log: its live file, the files rotation made of it and, on the
kubelet's path, the files of its restarts (`0.log`, `1.log`). The stream is the identity ids
derive from (`Source.key`); the file a line came from is only named (`Source.path`,
`log.file.path`), so a replay of the rotated files and the agent that followed them live
derive the same ids.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from bridge.core.source import Source
from bridge.tail.files import rotated_from, rotation_key

# /var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log[.<rotation stamp>][.gz]
_SURROGATE = re.compile("[\ud800-\udfff]")
_POD_PATH = re.compile(
    r"/pods/(?P<ns>[^/_]+)_(?P<pod>[^/_]+)_(?P<uid>[0-9a-fA-F-]{8,})/(?P<container>[^/]+)/(?P<restart>\d+)\.log"
)
# /var/log/containers/<pod>_<namespace>_<container>-<64 hex id>.log
_CONTAINERS_PATH = re.compile(
    r"/containers/(?P<pod>[^/_]+)_(?P<ns>[^/_]+)_(?P<container>[^/]+)-(?P<cid>[0-9a-f]{64})\.log"
)


def source_for(path: str) -> Source:
    """Source identity from a path, with the Kubernetes identity kubelet encodes in it. A
    rotated file (`0.log.<stamp>`, `.gz`, `.1`) is of its live file's stream."""
    abspath = os.path.abspath(path)
    # A name that is not UTF-8 comes from the OS with surrogates, which no encoder takes: the
    # identity (ids are hashed from it) and the resource use its text with U+FFFD instead.
    text = abspath if abspath.isascii() else _SURROGATE.sub("\ufffd", abspath)
    resource: dict[str, str | int] = {"log.file.path": text}
    m = _POD_PATH.search(text)
    if m:
        resource.update({
            "k8s.namespace.name": m["ns"],
            "k8s.pod.name": m["pod"],
            "k8s.pod.uid": m["uid"],
            "k8s.container.name": m["container"],
            "k8s.container.restart_count": int(m["restart"]),
        })
        return Source(f"k8s/{m['ns']}/{m['pod']}/{m['uid']}/{m['container']}", abspath, resource)
    m = _CONTAINERS_PATH.search(text)
    if m:
        resource.update({
            "k8s.namespace.name": m["ns"],
            "k8s.pod.name": m["pod"],
            "k8s.container.name": m["container"],
        })
        return Source(f"k8s/{m['ns']}/{m['pod']}/{m['container']}", abspath, resource)
    rotated = rotated_from(text)
    return Source(f"file/{rotated[0] if rotated else text}", abspath, resource)


def file_of(stream: Source, path: str) -> Source:
    """`stream`'s identity, naming another of its files (a rotated one) and that file's resource."""
    own = source_for(path)
    return Source(stream.key, own.path, own.resource)


def live_order(path: str) -> tuple[int, str]:
    """Where a live file comes in its stream: a container's restarts in order (`0.log`, `1.log`,
    …, `10.log`: by number, not by name), other files by path."""
    m = _POD_PATH.search(path)
    return (int(m["restart"]) if m else 0, path)


def streams(paths: Iterable[str]) -> list[list[str]]:
    """The files given, as streams (`Source.key`) in the order first named, each stream's files
    in the order they were written: per live file (restarts in order: `0.log` before `1.log`),
    its rotated files oldest first (`rotation_key`), then the live file. A path named twice is
    read once."""
    groups: dict[str, list[tuple[tuple, str]]] = {}
    seen: set[str] = set()
    for path in paths:
        abspath = os.path.abspath(path)
        if abspath in seen:
            continue
        seen.add(abspath)
        rotated = rotated_from(abspath)
        live, suffix = rotated if rotated else (abspath, "")
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            mtime = 0.0
        order = (*live_order(live), 0 if rotated else 1, rotation_key(suffix, mtime, abspath) if rotated else ())
        groups.setdefault(source_for(abspath).key, []).append((order, path))
    return [[p for _, p in sorted(files, key=lambda f: f[0])] for files in groups.values()]
