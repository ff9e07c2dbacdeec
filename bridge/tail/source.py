"""Who wrote a file: identity for deterministic ids and resource attributes for spans."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

# /var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log[.<rotation stamp>][.gz]
_SURROGATE = re.compile("[\ud800-\udfff]")
_POD_PATH = re.compile(
    r"/pods/(?P<ns>[^/_]+)_(?P<pod>[^/_]+)_(?P<uid>[0-9a-fA-F-]{8,})/(?P<container>[^/]+)/(?P<restart>\d+)\.log"
)
# /var/log/containers/<pod>_<namespace>_<container>-<64 hex id>.log
_CONTAINERS_PATH = re.compile(
    r"/containers/(?P<pod>[^/_]+)_(?P<ns>[^/_]+)_(?P<container>[^/]+)-(?P<cid>[0-9a-f]{64})\.log"
)


@dataclass(frozen=True, slots=True)
class Source:
    key: str                       # stable across rotations and replays of the same stream
    path: str
    resource: dict[str, str | int] = field(default_factory=dict, hash=False, compare=False)


def source_for(path: str) -> Source:
    """Source identity from a path, with the Kubernetes identity kubelet encodes in it."""
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
    return Source(f"file/{text}", abspath, resource)
