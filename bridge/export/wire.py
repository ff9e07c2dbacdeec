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

What a span holds (names, ids, attributes, events, links, status) is `mapping`'s: this module
encodes its `SpanRecord`s, as `otlp` builds messages from them; tests decode these bytes with
the proto stubs and compare them with `otlp`'s messages. The C fast path (`_fastwire.c`) writes
request spans without building records, with `mapping`'s names handed to it at import; it is
held to the records by tests/test_mapping.py on every saved input.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from bridge.assemble.timeline import INFERRED, OBSERVED, IncidentEvent, RequestTimeline, SpanEvent, Timeline
from bridge.core.source import Source
from bridge.export import mapping
from bridge.export.ids import PERSON, big_float as _big_float
from bridge.export.mapping import SCOPE_NAME, SCOPE_VERSION, Link, SpanRecord, span_count  # noqa: F401 - span_count: batch's


def _load_fast():
    """The C fast path for request spans (`_fastwire.c`), or None: not built (no compiler at
    install), or VLLM_TRACE_BRIDGE_PURE=1. The C declines any timeline it cannot write the
    same way, and this module then writes `mapping`'s records."""
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return None
    try:
        from bridge.export import _fastwire
    except ImportError:
        return None
    _fastwire.configure({  # the C spells none of the mapping: its names come from here
        "request_span": mapping.REQUEST_SPAN, "engine_span": mapping.ENGINE_SPAN,
        "kind_server": mapping.KIND_SERVER, "kind_internal": mapping.KIND_INTERNAL,
        "request_ids": mapping.REQUEST_IDS, "engine_ids": mapping.ENGINE_IDS,
        "timing": mapping.TIMING, "timing_start": mapping.TIMING_START, "timing_end": mapping.TIMING_END,
        "inferred": INFERRED, "observed": OBSERVED, "incident_kind": mapping.INCIDENT_KIND,
        "incident_event": IncidentEvent, "person": PERSON, "cache_limit": _CACHE_LIMIT,
        "pd_role": mapping.PD_ROLE, "pd_prefill": mapping.PD_PREFILL, "pd_decode": mapping.PD_DECODE,
        "pd_prefill_key": mapping.INTERNAL_ID, "pd_decode_key": mapping.PD_REMOTE_REQUEST, "pd_ids": mapping.PD_IDS,
        "pd_prefill_engine": mapping.PD_ENGINE, "pd_decode_engine": mapping.PD_REMOTE_ENGINE,
        "pd_prefill_index": mapping.PD_PREFILL_ROOT, "pd_decode_index": mapping.PD_DECODE_ROOT,
    })
    return _fastwire.spans


_CACHE_LIMIT = 1 << 14  # entries per cache; a full cache is cleared, so memory stays bounded
FAST_REQUEST = _load_fast()

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
_STATUS_ERROR = b"\x18\x02"  # Status.code = STATUS_CODE_ERROR
_SPAN_IN_SCOPE = b"\x12"      # ScopeSpans.spans


_SCOPE = field(b"\x0a", field(b"\x0a", SCOPE_NAME.encode()) + field(b"\x12", SCOPE_VERSION.encode()))


def _error_status(message: str) -> bytes:
    """Span.status: STATUS_CODE_ERROR, with its message when there is one."""
    return field(_STATUS, (field(b"\x12", message.encode()) if message else b"") + _STATUS_ERROR)


class WireEncoder:
    """Accumulates spans per source as wire bytes; `take()` gives one EncodedRequest.

    Same interface as `reference.ProtoEncoder`: `add(timeline) -> spans added`, `count`, `take()`.
    """

    __slots__ = ("_base", "_resources", "_by_source", "count", "_span_kv", "_event_kv", "_events",
                 "_held", "_heads", "_event_names", "_extras", "_span_extend", "_link_kv", "_fast", "_fast_events", "size")

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
        self._heads: dict[str, tuple[int, bytes]] = {}  # span name → (kind, name and kind fields)
        self._event_names: dict[str, bytes] = {}
        self._extras: dict[tuple, tuple[bytes, tuple[str, ...]]] = {}  # a record's `extra` → encoded, keys
        self._link_kv = KeyValues(_LINK_ATTRS[0])

    def add(self, timeline: Timeline) -> int:
        entry = self._by_source.get(timeline.source)  # one resource per file (ids are the stream's)
        if entry is None:
            entry = self._by_source[timeline.source] = (timeline.source, [])
        chunks = entry[1]
        held = len(chunks)
        if isinstance(timeline, RequestTimeline):
            # ids computed as mapping.request_spans does, in C; None: it declined.
            if self._fast is not None:
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

    def _head(self, name: str, kind: int) -> tuple[int, bytes]:
        """(kind, Span.name and Span.kind fields), encoded once per name (a name has one kind)."""
        if len(self._heads) >= _CACHE_LIMIT:
            self._heads.clear()
        head = self._heads[name] = (kind, field(b"\x2a", name.encode()) + b"\x30" + varint(kind))
        return head

    def _extra(self, extra: tuple) -> tuple[bytes, tuple[str, ...]]:
        """A record's computed attributes (the timing ones), encoded once per value; and their keys."""
        hit = self._extras.get(extra)
        if hit is None:
            if len(self._extras) >= _CACHE_LIMIT:
                self._extras.clear()
            kv = self._span_kv
            hit = self._extras[extra] = (b"".join([kv(k, v) for k, v in extra]), tuple(k for k, _ in extra))
        return hit

    def _span(self, r: SpanRecord, out: list[bytes], shared: bool) -> None:
        """One record as a ScopeSpans.spans field. `shared`: its events may be shared with other
        spans (a request's root: queue and GPU gauges, incidents), so they are cached by identity."""
        tid, sid, parent, name, kind, start, end, attrs, extra, events, dropped, links, error = r
        head = self._heads.get(name)
        if head is None or head[0] != kind:
            head = self._head(name, kind)
        if parent:
            parts = [_TRACE_ID, tid, _SPAN_ID, sid, _PARENT_ID, parent, head[1], _pack_times(0x39, start, 0x41, end)]
        else:
            parts = [_TRACE_ID, tid, _SPAN_ID, sid, head[1], _pack_times(0x39, start, 0x41, end)]
        if extra:
            hit = self._extras.get(extra)
            if hit is None:
                hit = self._extra(extra)
            for k in hit[1]:
                if k in attrs:  # replaced in place: the whole set, in order
                    self._span_extend(parts, r.attributes())
                    break
            else:
                self._span_extend(parts, attrs)
                parts.append(hit[0])
        else:
            self._span_extend(parts, attrs)
        if events:
            if shared:
                cached, keep = self._events.get, self._shared_event
                parts += [cached(id(e)) or keep(e) for e in events]
            else:
                event = self._event
                parts += [event(e) for e in events]
        if dropped:
            parts += (_DROPPED_EVENTS, varint(dropped))
        for link in links:
            parts.append(self._link(link))
        if error is not None:
            parts.append(_error_status(error))
        span = b"".join(parts)
        out += (_SPAN_IN_SCOPE, varint(len(span)), span)

    def _request(self, t: RequestTimeline, out: list[bytes]) -> int:
        records = mapping.request_spans(t)
        self._span(records[0], out, True)
        for r in records[1:]:  # a phase's events (KV blocks) belong to this request alone
            self._span(r, out, False)
        return len(records)

    def _engine(self, t, out: list[bytes]) -> int:
        records = mapping.engine_spans(t)
        for r in records:
            self._span(r, out, False)
        return len(records)

    def _link(self, link: Link) -> bytes:
        """A Span.links field."""
        body = _TRACE_ID + link.trace_id + _SPAN_ID + link.span_id + b"".join(self._link_kv.all(link.attrs))
        return _LINK + varint(len(body)) + body
