"""A gateway's JSON access log line → (request id sent upstream, caller's trace context).

A gateway in front of vLLM knows both the `X-Request-Id` it sent upstream (which vLLM logs
inside its request ids) and the `traceparent` it received or created. Its access log, tailed
as a second source, joins the two (DESIGN.md §4). Presets name the fields of the formats
docs/trace-context.md recommends; each field can be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.parse.context import TraceContext, w3c_rule
from bridge.decode.clock import MAX_NS, Rfc3339
from bridge.decode.jsonline import loads, text


@dataclass(frozen=True, slots=True)
class GatewayFormat:
    """Field names, each tried in order; the first present and non-empty wins."""

    request_id: tuple[str, ...]
    traceparent: tuple[str, ...]
    time: tuple[str, ...]


PRESETS = {
    # nginx `log_format … escape=json`: `$request_id` (what it sent upstream when it sets
    # `proxy_set_header X-Request-Id $request_id`), else the client's `$http_x_request_id`.
    "nginx": GatewayFormat(("upstream_request_id", "request_id", "http_x_request_id"),
                           ("http_traceparent", "traceparent"), ("time_iso8601", "time")),
    # Envoy `json_format`: `%REQ(X-REQUEST-ID)%`, `%REQ(TRACEPARENT)%`, `%START_TIME%`.
    "envoy": GatewayFormat(("x_request_id", "request_id", "x-request-id"), ("traceparent",),
                           ("start_time", "timestamp")),
}


def gateway_format(preset: str, request_id_field: str | None = None,
                   traceparent_field: str | None = None) -> GatewayFormat:
    """A preset (`nginx`, `envoy`), with fields overridden where given."""
    try:
        base = PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown gateway format {preset!r}: use one of {', '.join(PRESETS)}") from None
    return GatewayFormat((request_id_field,) if request_id_field else base.request_id,
                         (traceparent_field,) if traceparent_field else base.traceparent, base.time)


@dataclass(frozen=True, slots=True)
class GatewayEntry:
    request_id: str
    context: TraceContext | None   # None: the gateway logged no valid traceparent for it
    ts_ns: int | None


_MISSING = ("", "-")


def _field(obj: dict, names: tuple[str, ...]) -> str | None:
    for name in names:
        v = obj.get(name)
        if isinstance(v, str) and v not in _MISSING:
            return v
    return None


class GatewayParser:
    """One JSON object per line. A line without a request id gives None (counted); one
    without a valid traceparent gives an entry with no context, so its request need not wait."""

    __slots__ = ("fmt", "entries", "skipped", "_clock")

    def __init__(self, fmt: GatewayFormat) -> None:
        self.fmt = fmt
        self.entries = 0
        self.skipped = 0
        self._clock = Rfc3339()

    def __call__(self, message: str) -> GatewayEntry | None:
        obj = loads(message) if message[:1] == "{" else None
        if not isinstance(obj, dict):
            self.skipped += 1
            return None
        rid, tp = _field(obj, self.fmt.request_id), _field(obj, self.fmt.traceparent)
        ctx = _traceparent(tp) if tp else None
        if rid is None:
            self.skipped += 1
            return None
        stamp = _field(obj, self.fmt.time)
        ts = self._clock(stamp) if stamp and len(stamp) >= 19 else None
        self.entries += 1
        return GatewayEntry(text(rid, message), ctx, ts if ts is not None and 0 <= ts <= MAX_NS else None)


def _traceparent(value: str) -> TraceContext | None:
    """A W3C traceparent header value; the same validation as the request-id rule."""
    ctx = w3c_rule(value.strip())
    if ctx is None or ctx.span_id is None or value.count("-") != 3:
        return None
    return TraceContext(ctx.trace_id, ctx.span_id, "access_log")
