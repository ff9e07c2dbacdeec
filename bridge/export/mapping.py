"""How a timeline becomes spans: the one statement of the mapping every encoder follows.

`spans(t)` turns a RequestTimeline or EngineTimeline into `SpanRecord`s (names, kinds, ids,
times, attributes, events, links, status), plain data with no protobuf in it. `otlp` turns
records into the `opentelemetry-proto` messages, `wire` into wire bytes; neither decides what a
span holds. `_fastwire.c` writes request spans without building records (it is ~4x cheaper per
span); it is handed this module's names at import (`wire._load_fast`) and a differential test
holds it to these records on every saved input (tests/test_mapping.py).

The rules:
- a request is a `vllm.request` root (SERVER) and one INTERNAL child per phase, in order;
  ids derive from the source, request id and occurrence (`ids`); with the caller's trace
  context the spans join the caller's trace, the root under the caller's span when its id is
  known;
- a span's attributes are its timeline's or phase's own, then `vllm.timing.start` / `.end`
  (and `vllm.timing` on a phase) replacing a same-named one in place or appended;
- the root carries the request's events, a link to the `vllm.engine` span of every incident it
  was in flight for (`vllm.incident.kind` on the link) and status ERROR when it failed;
- an engine timeline is one INTERNAL span: `vllm.startup` for a startup, `vllm.engine` for an
  incident; when an error ended it, an `exception` event at its end and status ERROR, the
  stack trace moved from the attributes onto that event. A `kv_transfer` incident about a
  disaggregated prefill emitted before (`vllm.pd.role` = prefill, its engine request id) goes
  in that prefill's trace, a child of its root: both ids derive from that id (`pd_ids`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple

from bridge import __version__
from bridge.assemble.timeline import (
    INFERRED, INTERNAL_ID, OBSERVED, PD_DECODE, PD_ENGINE, PD_PREFILL, PD_REMOTE_ENGINE, PD_REMOTE_REQUEST, PD_ROLE,
    EngineTimeline, IncidentEvent, RequestTimeline, SpanEvent, Timeline,
)
from bridge.export.ids import span_id, trace_id

SCOPE_NAME, SCOPE_VERSION = "vllm-trace-bridge", __version__  # the InstrumentationScope of every span

REQUEST_SPAN, ENGINE_SPAN, STARTUP_SPAN = "vllm.request", "vllm.engine", "vllm.startup"
STARTUP_KIND = "startup"  # EngineTimeline.kind of an engine's startup
KV_KIND = "kv_transfer"  # EngineTimeline.kind of a KV line about an emitted disaggregated prefill
REQUEST_IDS, ENGINE_IDS = "request", "engine"  # the kind word of `ids.trace_id`
PD_IDS = "pd"  # a disaggregated request's: both halves' ids from the P/D key (`pd_key`)
PD_PREFILL_ROOT, PD_DECODE_ROOT = 1, 2  # the index of each half's root in `ids.span_id`
TIMING, TIMING_START, TIMING_END = "vllm.timing", "vllm.timing.start", "vllm.timing.end"
INCIDENT_KIND = "vllm.incident.kind"  # the attribute of a link to an incident
EXCEPTION = "exception"  # the event name of OpenTelemetry's exception convention
EXC_TYPE, EXC_MESSAGE, EXC_STACKTRACE = "exception.type", "exception.message", "exception.stacktrace"

# Span.SpanKind and Status.StatusCode values of the OTLP schema (trace.proto)
KIND_INTERNAL, KIND_SERVER = 1, 2
STATUS_ERROR = 2


class Link(NamedTuple):
    trace_id: bytes
    span_id: bytes
    attrs: Mapping[str, object]


class SpanRecord(NamedTuple):
    """One span as a backend receives it. `attrs` then `extra`: the span's attributes, a key of
    `extra` replacing the same key of `attrs` in place, the others appended in order (kept
    apart so an encoder can encode the computed tail once for every span that shares it).
    `error`: None, or status ERROR with that message. A NamedTuple: a few are built per
    request on the export path, and a tuple is the cheapest immutable record to build."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes  # b"": a root
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attrs: Mapping[str, object]
    extra: tuple[tuple[str, object], ...]
    events: Sequence[SpanEvent]
    dropped_events: int
    links: tuple[Link, ...]
    error: str | None

    def attributes(self) -> dict:
        """`attrs` with `extra` applied: every attribute, in order."""
        if not self.extra:
            return dict(self.attrs)
        out = dict(self.attrs)
        out.update(self.extra)
        return out


_record = tuple.__new__  # SpanRecord(*fields) without its Python-level __new__


def phase_timing(start: str, end: str) -> str:
    """A phase's `vllm.timing`: its boundaries' common kind, else `inferred` when either is
    (the phase lies somewhere in a range), else `observed`."""
    if start == end:
        return start
    return INFERRED if INFERRED in (start, end) else OBSERVED


def incident_ids(source_key: str, kind: str, occurrence: str) -> tuple[bytes, bytes]:
    """(trace id, span id) of an engine incident's `vllm.engine` span: what a request in flight
    links to."""
    tid = trace_id(source_key, ENGINE_IDS, kind, occurrence)
    return tid, span_id(tid, ENGINE_SPAN)


def incident_links(t: RequestTimeline) -> tuple[Link, ...]:
    """A link to each engine incident the request was in flight for, in the order of its events."""
    links = []
    for e in t.events:
        if type(e) is IncidentEvent and e.incident is not None:
            tid, sid = incident_ids(t.source.key, e.incident.kind, e.incident.occurrence)
            links.append(Link(tid, sid, {INCIDENT_KIND: e.incident.kind}))
    return tuple(links)


@lru_cache(maxsize=64)
def _root_timing(start: str, end: str) -> tuple[tuple[str, str], ...]:
    return (TIMING_START, start), (TIMING_END, end)


@lru_cache(maxsize=64)
def _phase_timing(start: str, end: str) -> tuple[tuple[str, str], ...]:
    return (TIMING, phase_timing(start, end)), (TIMING_START, start), (TIMING_END, end)


# vLLM's random suffix on an engine request id (`InputProcessor.assign_request_id`: 8 chars of a
# uuid4's hex); absent with VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1
_RANDOM_SUFFIX = re.compile(r"-[0-9a-f]{8}\Z")


def pd_key(t: RequestTimeline | EngineTimeline) -> tuple[str, str] | None:
    """(role, key) of one half of a disaggregated request, or None: the key both halves have
    from their own lines (docs/distributed.md), never a source's. The key is the prefill's
    engine request id; when it lacks vLLM's random suffix (request id randomization off: ids
    repeat across instances and restarts) the prefill's engine id goes before it, when known.
    The choice depends on the id alone, which both halves read alike. A prefill without an
    internal id has its API id as engine id (randomization off: vLLM added it under that id);
    an EngineTimeline (a late KV line about a prefill) names the id as an attribute. The
    assembler reads the id alike (timeline.pd_key_id); these names are the module's, which the
    C encoder is handed (wire._load_fast)."""
    attrs = t.attrs
    role = attrs.get(PD_ROLE)
    if role == PD_PREFILL:
        key, engine = attrs.get(INTERNAL_ID, getattr(t, "request_id", None)), attrs.get(PD_ENGINE)
    elif role == PD_DECODE:
        key, engine = attrs.get(PD_REMOTE_REQUEST), attrs.get(PD_REMOTE_ENGINE)
    else:
        return None
    if not isinstance(key, str) or not key:
        return None
    if _RANDOM_SUFFIX.search(key) is None and isinstance(engine, str) and engine:
        key = f"{engine}\x1f{key}"
    return role, key


def pd_ids(key: str, role: str) -> tuple[bytes, bytes]:
    """(trace id, root span id) of the `role` half of the disaggregated request of P/D key
    `key`: the same on any agent, whichever files it reads."""
    tid = trace_id("", PD_IDS, key, "")
    return tid, span_id(tid, REQUEST_SPAN, PD_PREFILL_ROOT if role == PD_PREFILL else PD_DECODE_ROOT)


def pd_trace(t: RequestTimeline, role: str, key: str) -> tuple[bytes, bytes, bytes, tuple[Link, ...]]:
    """(trace id, root span id, parent span id, links) of a half of a disaggregated request.

    The trace: the caller's, when this half carried the caller's context (`t.parent`: the
    plugin's `traceparent`, a gateway's access log, its own X-Request-Id): a request sits inside
    the trace of the gateway that sent it. Else the caller's context read from the prefill's
    engine request id (`t.pd_context`: an X-Request-Id carrying W3C context reaches both halves
    inside it). Else the key's own trace (`pd_ids`), which two agents derive alike. The root
    span ids always come from the key, and the decode's root links to the prefill's root in
    its own trace: right whenever both halves got the same context or none (a proxy forwards
    the same headers to both); a context that reached one half only splits the two halves into
    two traces (docs/distributed.md)."""
    tid, root_id = pd_ids(key, role)
    parent_id = b""
    ctx = t.parent if t.parent is not None else t.pd_context
    if ctx is not None:
        tid, parent_id = ctx.trace_id, ctx.span_id or b""
    links: tuple[Link, ...] = ()
    if role == PD_DECODE:
        links = (Link(tid, pd_ids(key, PD_PREFILL)[1], {}),)
    return tid, root_id, parent_id, links


def request_spans(t: RequestTimeline) -> list[SpanRecord]:
    """The root and one child per phase. Span ids derive from the bridge's own trace id even in
    the caller's trace, so they stay deterministic and distinct when two requests carry the
    same context. (Records built with `_record`, SpanRecord's fields in order: this runs for
    every request the pure-Python encoder writes.) A half of a disaggregated request (`pd_key`)
    takes its ids from the prefill's engine request id, and a decode links to its prefill."""
    links = incident_links(t)
    pd = pd_key(t)
    if pd is None:
        tid = trace_id(t.source.key, REQUEST_IDS, t.request_id, t.occurrence)
        root_id = span_id(tid + t.occurrence.encode(), REQUEST_SPAN)
        parent_id = b""
        if t.parent is not None:
            tid, parent_id = t.parent.trace_id, t.parent.span_id or b""
    else:
        tid, root_id, parent_id, pd_links = pd_trace(t, *pd)
        links = (*pd_links, *links)
    out = [_record(SpanRecord, (
        tid, root_id, parent_id, REQUEST_SPAN, KIND_SERVER, t.start_ns, t.end_ns,
        t.attrs, _root_timing(t.start_timing, t.end_timing),
        t.events, t.dropped_events, links, t.error_message if t.error_type else None,
    ))]
    for p in t.phases:
        out.append(_record(SpanRecord, (
            tid, span_id(root_id, p.name, p.index), root_id, p.name, KIND_INTERNAL, p.start_ns, p.end_ns,
            p.attrs, _phase_timing(p.start_timing, p.end_timing), p.events, p.dropped_events, (), None,
        )))
    return out


def engine_spans(t: EngineTimeline) -> list[SpanRecord]:
    """`vllm.engine` for an incident (status ERROR), `vllm.startup` for a startup (ERROR only
    when an error ended it)."""
    tid = trace_id(t.source.key, ENGINE_IDS, t.kind, t.occurrence)
    parent = b""
    pd = pd_key(t) if t.kind == KV_KIND else None
    if pd is not None:  # about a disaggregated prefill emitted before: in its trace, under its root
        tid, parent = pd_ids(pd[1], pd[0])
    name = STARTUP_SPAN if t.kind == STARTUP_KIND else ENGINE_SPAN
    events: tuple[SpanEvent, ...] = ()
    error = None
    if t.error_type:
        exc = {EXC_TYPE: t.attrs.get(EXC_TYPE, t.kind), EXC_MESSAGE: t.message}
        if EXC_STACKTRACE in t.attrs:
            exc[EXC_STACKTRACE] = t.attrs[EXC_STACKTRACE]
        events = (SpanEvent(EXCEPTION, t.end_ns, exc),)
        error = t.message
    attrs = {k: v for k, v in t.attrs.items() if k != EXC_STACKTRACE}
    sid = span_id(tid, name) if not parent else span_id(parent, name, int(t.start_ns // 1000))
    return [SpanRecord(tid, sid, parent, name, KIND_INTERNAL, t.start_ns, t.end_ns,
                       attrs, (), events, 0, (), error)]


def spans(t: Timeline) -> list[SpanRecord]:
    return request_spans(t) if isinstance(t, RequestTimeline) else engine_spans(t)


def span_count(t: Timeline) -> int:
    """How many spans `spans(t)` gives, without building them (the batcher counts with it)."""
    return 1 + len(t.phases) if isinstance(t, RequestTimeline) else 1
