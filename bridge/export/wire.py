"""Timelines → OTLP/protobuf wire bytes, written directly: the fast encoder.

Building `opentelemetry-proto` messages and serialising them cost ~120 µs per span, more than
everything else in the bridge together. The OTLP trace schema is small and fixed, so this
module writes its wire format itself (protobuf encoding: tag, varint length, body) for exactly
the messages the bridge sends: ExportTraceServiceRequest → ResourceSpans → (Resource,
ScopeSpans → InstrumentationScope, Span → KeyValue/AnyValue/ArrayValue, Event, Status).
Request spans, nearly all of the volume, and engine spans (incidents, startups) are written here.

What makes it cheap:
- every KeyValue whose value repeats (strings, ints, flags, diagnosis lists) is encoded once
  and then looked up; a key's bytes are encoded once per key;
- an event shared by many spans (the queue and GPU-memory gauges fan out to every request in
  flight) is encoded once, not once per span;
- spans are kept as byte chunks and joined once per batch.

The mapping timeline → span (names, ids, attributes, events, status) is the same as
`otlp.request_spans` / `otlp.engine_spans`, which stay as the reference implementation:
tests decode these bytes with the proto stubs and compare them with the reference messages.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from bridge.assemble.timeline import EngineTimeline, IncidentEvent, RequestTimeline, SpanEvent, Timeline
from bridge.core.source import Source
from bridge.export.ids import big_float as _big_float, incident_ids, span_id, trace_id

SCOPE_NAME, SCOPE_VERSION = "vllm-trace-bridge", "0.1.0"


def _load_fast():
    """The C fast path for request spans (`_fastwire.c`), or None: not built (no compiler at
    install), or VLLM_TRACE_BRIDGE_PURE=1. `_request` below stays the reference; the C
    declines any timeline it cannot write the same way, and this module then writes it."""
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return None
    try:
        from bridge.export import _fastwire
    except ImportError:
        return None
    return _fastwire.spans


FAST_REQUEST = _load_fast()
_CACHE_LIMIT = 1 << 14  # entries per cache; a full cache is cleared, so memory stays bounded

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<BQ").pack  # tag byte, then a fixed64
_pack_times = struct.Struct("<BQBQ").pack  # Span fields 7 and 8: start and end, fixed64
_ONE_BYTE = [bytes((i,)) for i in range(128)]
_INT64 = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A serialised ExportTraceServiceRequest, ready for any transport."""

    payload: bytes
    spans: int


def span_count(t: Timeline) -> int:
    """How many spans a timeline becomes: the root and one per phase, or one engine span."""
    return 1 + len(t.phases) if isinstance(t, RequestTimeline) else 1


def varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: `tag` (field number and wire type 2), length, body."""
    return tag + varint(len(body)) + body


def any_value(v) -> bytes:
    """AnyValue body, with the same type rules as `otlp.any_value`."""
    if isinstance(v, str):
        return field(b"\x0a", v.encode())
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        if _I64_MIN <= v <= _I64_MAX:
            return b"\x18" + varint(v & _INT64)  # int64: negatives as 64-bit two's complement
        # Beyond int64 (a sum of bounded counts): the nearest double, never the low 64 bits
        # (2^64+12345 is not 12345).
        return b"\x21" + _pack_double(_big_float(v))
    if isinstance(v, float):
        return b"\x21" + _pack_double(v)
    if isinstance(v, (list, tuple)):
        return field(b"\x2a", b"".join([field(b"\x0a", any_value(x)) for x in v]))
    return field(b"\x0a", str(v).encode())


class KeyValues:
    """Encodes one kind of repeated `attributes` field (its tag given) as whole fields.

    `kv(key, value)` returns the field's bytes, tag included. Floats (durations, ratios)
    rarely repeat: their per-key prefix is cached and the value packed. Other values are
    cached whole, keyed by (key, value); every cache is bounded (cleared when full).
    """

    __slots__ = ("kv", "extend")

    def __init__(self, tag: int) -> None:
        tag_byte = bytes((tag,))
        keys: dict[str, bytes] = {}
        floats: dict[str, bytes] = {}
        whole: dict = {}
        pack_double = _pack_double
        limit = _CACHE_LIMIT
        one_byte = _ONE_BYTE

        def encode(k: str, v) -> bytes:
            key = keys.get(k)
            if key is None:
                if len(keys) >= limit:
                    keys.clear()
                key = keys[k] = field(b"\x0a", k.encode())
            return field(tag_byte, key + field(b"\x12", any_value(v)))

        def kv(k: str, v) -> bytes:
            t = type(v)
            if t is str:  # the commonest miss (request and block ids): written out inline
                cache_key = (k, v)
                b = whole.get(cache_key)
                if b is None:
                    key = keys.get(k)
                    if key is None:
                        key = field(b"\x0a", k.encode())
                    vb = v.encode()
                    n = len(vb)
                    if n < 126:
                        body = key + b"\x12" + one_byte[n + 2] + b"\x0a" + one_byte[n] + vb
                    else:
                        value = b"\x0a" + varint(n) + vb
                        body = key + b"\x12" + varint(len(value)) + value
                    b = tag_byte + varint(len(body)) + body
                    if len(whole) >= limit:
                        whole.clear()
                    whole[cache_key] = b
                return b
            if t is float:
                prefix = floats.get(k)
                if prefix is None:
                    if len(floats) >= limit:
                        floats.clear()
                    key = field(b"\x0a", k.encode())
                    prefix = floats[k] = tag_byte + varint(len(key) + 11) + key + b"\x12\x09\x21"
                return prefix + pack_double(v)
            if t is int:
                cache_key = (k, v)
            elif t is list:
                # Only all-string lists (diagnoses) are stored, so [True] cannot hit [1]'s entry.
                cache_key = (k, tuple(v), list)
                try:
                    b = whole.get(cache_key)
                except TypeError:  # nested lists
                    return encode(k, v)
                if b is not None:
                    return b
                b = encode(k, v)
                if all(type(x) is str for x in v):
                    if len(whole) >= limit:
                        whole.clear()
                    whole[cache_key] = b
                return b
            elif t is bool:
                cache_key = (k, v, bool)  # True == 1: keep flags apart from ints
            else:
                return encode(k, v)
            b = whole.get(cache_key)
            if b is None:
                if len(whole) >= limit:
                    whole.clear()
                b = whole[cache_key] = encode(k, v)
            return b

        def extend(out: list[bytes], attrs: Mapping) -> None:
            """`out += [kv(k, v) for k, v in attrs.items()]`, with the cache hits (most
            attributes) looked up here instead of in one call per attribute."""
            get = whole.get
            for k, v in attrs.items():
                t = type(v)
                if t is float:
                    prefix = floats.get(k)
                    out.append(prefix + pack_double(v) if prefix is not None else kv(k, v))
                elif t is int or t is str:
                    out.append(get((k, v)) or kv(k, v))
                else:
                    out.append(kv(k, v))

        self.kv = kv
        self.extend = extend

    def all(self, attrs: Mapping) -> list[bytes]:
        out: list[bytes] = []
        self.extend(out, attrs)
        return out


# Field tags (field number << 3 | wire type) of the messages written here.
_SPAN_ATTRS, _EVENT_ATTRS, _RESOURCE_ATTRS = 0x4A, 0x1A, 0x0A
_TRACE_ID, _SPAN_ID, _PARENT_ID = b"\x0a\x10", b"\x12\x08", b"\x22\x08"  # ids: 16 and 8 bytes
_EVENT, _DROPPED_EVENTS, _LINK, _STATUS = b"\x5a", b"\x60", b"\x6a", b"\x7a"
_LINK_ATTRS = b"\x22"  # Span.Link.attributes
_KIND_SERVER, _KIND_INTERNAL = b"\x30\x02", b"\x30\x01"
_STATUS_ERROR = b"\x18\x02"  # Status.code = STATUS_CODE_ERROR
_SPAN_IN_SCOPE = b"\x12"      # ScopeSpans.spans


_ROOT_HEAD = field(b"\x2a", b"vllm.request") + _KIND_SERVER  # Span.name and Span.kind
_SCOPE = field(b"\x0a", field(b"\x0a", SCOPE_NAME.encode()) + field(b"\x12", SCOPE_VERSION.encode()))


def _error_status(message: str) -> bytes:
    """Span.status: STATUS_CODE_ERROR, with its message when there is one."""
    return field(_STATUS, (field(b"\x12", message.encode()) if message else b"") + _STATUS_ERROR)


def _phase_timing(start: str, end: str) -> str:
    if start == end:
        return start
    return "inferred" if "inferred" in (start, end) else "observed"


class WireEncoder:
    """Accumulates spans per source as wire bytes; `take()` gives one EncodedRequest.

    Same interface as `reference.ProtoEncoder`: `add(timeline) -> spans added`, `count`, `take()`.
    """

    __slots__ = ("_base", "_resources", "_by_source", "count", "_span_kv", "_event_kv", "_events",
                 "_held", "_names", "_event_names", "_timings", "_span_extend", "_fast", "_fast_events", "size")

    def __init__(self, base: Mapping[str, str], fast=FAST_REQUEST):
        self._fast = fast  # None: this module's encoder only
        self._fast_events: dict[int, tuple] = {}  # the C encoder's shared events: id → (event, bytes)
        self._base = dict(base)
        self._resources: dict[Source, bytes] = {}
        self._by_source: dict[Source, tuple[Source, list[bytes]]] = {}
        self.count = 0
        self.size = 0  # bytes of the spans held (the request adds a resource and scope per source)
        span_kv = KeyValues(_SPAN_ATTRS)
        self._span_kv, self._span_extend = span_kv.kv, span_kv.extend
        self._event_kv = KeyValues(_EVENT_ATTRS).kv
        # Encoded events by identity. `_held` keeps each one alive while it is cached, so its
        # id cannot be reused by another object meanwhile.
        self._events: dict[int, bytes] = {}
        self._held: list[SpanEvent] = []
        self._names: dict[bytes, dict[str, bytes]] = {}  # tag → name → field
        self._event_names: dict[str, bytes] = {}
        self._timings: dict[tuple, bytes] = {}  # (start, end) timing → their attributes, encoded

    def add(self, timeline: Timeline) -> int:
        entry = self._by_source.get(timeline.source)  # one resource per file (ids are the stream's)
        if entry is None:
            entry = self._by_source[timeline.source] = (timeline.source, [])
        chunks = entry[1]
        held = len(chunks)
        if isinstance(timeline, RequestTimeline):
            if self._fast is not None:  # ids computed as ids.py does, in C; None: it declined
                spans = self._fast(timeline, self._fast_events)
                if spans is not None:
                    chunks.append(spans)
                    n = 1 + len(timeline.phases)
                    self.count += n
                    self.size += len(spans)
                    return n
            n = self._request(timeline, chunks)
        else:
            n = self._engine(timeline, chunks)
        self.count += n
        self.size += len(chunks[held]) if len(chunks) - held == 1 else sum(map(len, chunks[held:]))
        return n

    def take(self) -> EncodedRequest:
        out: list[bytes] = []
        for src, chunks in self._by_source.values():
            resource = self._resource(src)
            scope_spans_len = len(_SCOPE) + sum(map(len, chunks))
            scope_spans_head = b"\x12" + varint(scope_spans_len)
            out += (b"\x0a", varint(len(resource) + len(scope_spans_head) + scope_spans_len),
                    resource, scope_spans_head, _SCOPE)
            out += chunks
        request = EncodedRequest(b"".join(out), self.count)
        self._by_source = {}
        self.count = self.size = 0
        return request

    # -- pieces ---------------------------------------------------------------------------

    def _resource(self, source: Source) -> bytes:
        """ResourceSpans.resource, as a whole field."""
        res = self._resources.get(source)
        if res is None:
            if len(self._resources) > 10_000:  # one per file read: bounded over months of rotations
                self._resources.clear()
            kv = KeyValues(_RESOURCE_ATTRS)
            res = self._resources[source] = field(b"\x0a", b"".join(kv.all({**self._base, **source.resource})))
        return res

    def _name(self, tag: bytes, name: str) -> bytes:
        """A name field (Span.name: tag 0x2A, Event.name: 0x12), encoded once per name."""
        names = self._names.get(tag)
        if names is None:
            names = self._names[tag] = {}
        b = names.get(name)
        if b is None:
            b = names[name] = field(tag, name.encode())
        return b

    def _event(self, e: SpanEvent) -> bytes:
        """A Span.events field."""
        name = self._event_names.get(e.name)
        if name is None:
            name = self._event_names[e.name] = field(b"\x12", e.name.encode())
        kv = self._event_kv
        body = _pack_fixed64(0x09, e.ts_ns) + name
        for k, v in e.attrs.items():
            body += kv(k, v)
        return _EVENT + varint(len(body)) + body

    def _shared_event(self, e: SpanEvent) -> bytes:
        """`_event`, cached by identity: an event shared by many spans (queue and GPU gauges,
        engine incidents: all on root spans) is encoded once. Callers look in `_events` first."""
        b = self._event(e)
        held = self._held
        if len(held) >= _CACHE_LIMIT:
            self._events.clear()
            held.clear()
        self._events[id(e)] = b
        held.append(e)
        return b

    def _timing(self, start: str, end: str, phase: bool) -> bytes:
        """`vllm.timing` (phases only), `vllm.timing.start`, `vllm.timing.end`, encoded."""
        key = (start, end, phase)
        b = self._timings.get(key)
        if b is None:
            kv = self._span_kv
            b = kv("vllm.timing.start", start) + kv("vllm.timing.end", end)
            if phase:
                b = kv("vllm.timing", _phase_timing(start, end)) + b
            self._timings[key] = b
        return b

    def _request(self, t: RequestTimeline, out: list[bytes]) -> int:
        """The reference for `_fastwire.spans` (`add` asks the C first)."""
        tid = trace_id(t.source.key, "request", t.request_id, t.occurrence)
        root_id = span_id(tid + t.occurrence.encode(), "vllm.request")  # from our own trace id: see otlp
        kv, extend = self._span_kv, self._span_extend
        cached, shared, event = self._events.get, self._shared_event, self._event

        parent = t.parent
        if parent is None:
            parts = [_TRACE_ID, tid, _SPAN_ID, root_id, _ROOT_HEAD, _pack_times(0x39, t.start_ns, 0x41, t.end_ns)]
        else:  # into the caller's trace; under the caller's span when known (Span field 4)
            tid = parent.trace_id
            parts = [_TRACE_ID, tid, _SPAN_ID, root_id]
            if parent.span_id:
                parts += (_PARENT_ID, parent.span_id)
            parts += (_ROOT_HEAD, _pack_times(0x39, t.start_ns, 0x41, t.end_ns))
        attrs = t.attrs
        if "vllm.timing.start" in attrs or "vllm.timing.end" in attrs:  # keep the reference's order
            attrs = dict(attrs)
            attrs["vllm.timing.start"] = t.start_timing
            attrs["vllm.timing.end"] = t.end_timing
            extend(parts, attrs)
        else:
            extend(parts, attrs)
            parts.append(self._timing(t.start_timing, t.end_timing, False))
        parts += [cached(id(e)) or shared(e) for e in t.events]
        if t.dropped_events:
            parts += (_DROPPED_EVENTS, varint(t.dropped_events))
        for e in t.events:  # links to the engine incidents it was in flight for (otlp.incident_links)
            if type(e) is IncidentEvent and e.incident is not None:
                parts.append(self._link(t.source.key, e.incident.kind, e.incident.occurrence))
        if t.error_type:
            parts.append(_error_status(t.error_message))
        span = b"".join(parts)
        out += (_SPAN_IN_SCOPE, varint(len(span)), span)

        for p in t.phases:
            parts = [_TRACE_ID, tid, _SPAN_ID, span_id(root_id, p.name, p.index), _PARENT_ID, root_id,
                     self._name(b"\x2a", p.name), _KIND_INTERNAL, _pack_times(0x39, p.start_ns, 0x41, p.end_ns)]
            attrs = p.attrs
            if "vllm.timing" in attrs or "vllm.timing.start" in attrs or "vllm.timing.end" in attrs:
                attrs = dict(attrs)
                attrs["vllm.timing"] = _phase_timing(p.start_timing, p.end_timing)
                attrs["vllm.timing.start"] = p.start_timing
                attrs["vllm.timing.end"] = p.end_timing
                extend(parts, attrs)
            else:
                extend(parts, attrs)
                parts.append(self._timing(p.start_timing, p.end_timing, True))
            if p.events:  # KV block events: each belongs to this request alone
                parts += [event(e) for e in p.events]
            if p.dropped_events:
                parts += (_DROPPED_EVENTS, varint(p.dropped_events))
            span = b"".join(parts)
            out += (_SPAN_IN_SCOPE, varint(len(span)), span)
        return 1 + len(t.phases)

    def _link(self, source_key: str, kind: str, occurrence: str) -> bytes:
        """A Span.links field to an engine incident's span."""
        tid, sid = incident_ids(source_key, kind, occurrence)
        attr = field(b"\x0a", b"vllm.incident.kind") + field(b"\x12", any_value(kind))
        body = _TRACE_ID + tid + _SPAN_ID + sid + field(_LINK_ATTRS, attr)
        return _LINK + varint(len(body)) + body

    def _engine(self, t: EngineTimeline, out: list[bytes]) -> int:
        """`otlp.engine_spans`: `vllm.engine` for an incident (status ERROR), `vllm.startup` for
        an engine's startup (ERROR only when an error ended it). Written here rather than
        through the proto messages so that exporting never imports the protobuf runtime; tests
        compare the two as for request spans."""
        tid = trace_id(t.source.key, "engine", t.kind, t.occurrence)
        name = "vllm.startup" if t.kind == "startup" else "vllm.engine"
        attrs = t.attrs
        parts = [_TRACE_ID, tid, _SPAN_ID, span_id(tid, name), self._name(b"\x2a", name), _KIND_INTERNAL,
                 _pack_times(0x39, t.start_ns, 0x41, t.end_ns)]
        self._span_extend(parts, {k: v for k, v in attrs.items() if k != "exception.stacktrace"})
        if t.error_type:
            exc = {"exception.type": attrs.get("exception.type", t.kind), "exception.message": t.message}
            if "exception.stacktrace" in attrs:
                exc["exception.stacktrace"] = attrs["exception.stacktrace"]
            parts += (self._event(SpanEvent("exception", t.end_ns, exc)), _error_status(t.message))
        span = b"".join(parts)
        out += (_SPAN_IN_SCOPE, varint(len(span)), span)
        return 1
