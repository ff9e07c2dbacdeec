"""Sinks that change a timeline on its way to another sink, each with one job.

They sit between the assembler and an exporter, like the SDK's span processors: the timeline's
meaning is unchanged, only where or how it is shown.
"""

from __future__ import annotations

from collections.abc import Callable

from bridge.assemble.timeline import RequestTimeline, Timeline

Sink = Callable[[Timeline], None]

#: The Kubernetes identity copied onto spans for backends that drop resource attributes.
K8S_KEYS = ("k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.container.name")


def fan_out(sinks: list[Sink]) -> Sink:
    """One sink that hands each timeline to every one of `sinks`, in order."""
    if len(sinks) == 1:
        return sinks[0]

    def emit(t: Timeline) -> None:
        for sink in sinks:
            sink(t)
    return emit


class LastEnd:
    """Remembers the latest end of every timeline it sees: the first pass of `--shift-to-now`."""

    def __init__(self) -> None:
        self.end_ns: int | None = None

    def __call__(self, t: Timeline) -> None:
        if self.end_ns is None or t.end_ns > self.end_ns:
            self.end_ns = t.end_ns


class Shift:
    """Moves every time of a timeline by `offset_ns` (`replay --shift-to-now`), so demo data or an
    old log lands inside a backend's default search window. Durations and order are unchanged;
    ids do not depend on time, so a shifted replay is the same traces, moved."""

    def __init__(self, sink: Sink, offset_ns: int) -> None:
        self._sink = sink
        self._offset = offset_ns

    def __call__(self, t: Timeline) -> None:
        d = self._offset
        t.start_ns += d
        t.end_ns += d
        if isinstance(t, RequestTimeline):
            for p in t.phases:
                p.start_ns += d
                p.end_ns += d
                for e in p.events:
                    e.ts_ns += d
            for e in t.events:
                e.ts_ns += d
        self._sink(t)


def with_k8s_identity(t: Timeline) -> None:
    """Copies the source's Kubernetes identity onto the timeline's own attributes (its root or
    incident span), for backends that drop resource attributes (Phoenix does)."""
    res = t.source.resource
    for key in K8S_KEYS:
        if key in res and key not in t.attrs:
            t.attrs[key] = res[key]


class K8sOnSpans:
    """`with_k8s_identity` as a sink in front of another. Off by default: it repeats the resource."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    def __call__(self, t: Timeline) -> None:
        with_k8s_identity(t)
        self._sink(t)


