"""The caller's trace context, read from a request id (DESIGN.md §4).

vLLM logs the client's `X-Request-Id` inside its own ids (`chatcmpl-<X-Request-Id>`,
`cmpl-<X-Request-Id>-0`, V1's `…-<8 hex>` internal suffix). A gateway or client that puts W3C
trace context there gets vLLM's spans inside its own trace. The default rule, once vLLM's
decorations are removed, accepts exactly:

- a traceparent `00-<32 hex trace>-<16 hex span>-<2 hex flags>` → child of that span;
- `<32 hex trace>-<16 hex span>` → child of that span;
- `<32 hex trace>` → joins that trace (no parent span).

Anything else — all-zero ids, wrong lengths, upper case, version `ff` — gives no context, and
the request gets its own trace. A custom rule is a regular expression with a named group
`trace` (32 hex) and optionally `span` (16 hex), searched in the id as logged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16

# vLLM's decorations: n>1 child `{i}_`, an id prefix, the completion prompt index `-<i>`, V1's
# internal `-<8 hex>`. Prefixes are those `random_uuid()` ids carry (reference §g).
_W3C = re.compile(
    r"(?:\d+_)?(?:chatcmpl|cmpl|chat|embd|pool|score|rerank|classify|tokn|trsc|resp|vllm-batch)?-?"
    r"(?:(?P<version>[0-9a-f]{2})-(?P<t1>[0-9a-f]{32})-(?P<s1>[0-9a-f]{16})-(?P<flags>[0-9a-f]{2})"
    r"|(?P<t2>[0-9a-f]{32})-(?P<s2>[0-9a-f]{16})"
    r"|(?P<t3>[0-9a-f]{32}))"
    r"(?:-\d+)?(?:-[0-9a-f]{8})?"
)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A caller's context: its trace and, when known, the span to nest under."""

    trace_id: bytes                # 16 bytes, never all zero
    span_id: bytes | None = None   # 8 bytes, never all zero; None: join the trace at its root
    source: str = "request_id"     # where it came from: request_id | access_log


Rule = Callable[[str], "TraceContext | None"]


def _context(trace: str | None, span: str | None) -> TraceContext | None:
    if trace is None or len(trace) != 32 or trace == _ZERO_TRACE:
        return None
    if span is not None and (len(span) != 16 or span == _ZERO_SPAN):
        return None
    try:
        return TraceContext(bytes.fromhex(trace), bytes.fromhex(span) if span is not None else None)
    except ValueError:
        return None


def w3c_rule(request_id: str) -> TraceContext | None:
    """The default rule (see the module docstring)."""
    m = _W3C.fullmatch(request_id)
    if m is None:
        return None
    if m["t1"] is not None:
        if m["version"] == "ff":
            return None
        return _context(m["t1"], m["s1"])
    if m["t2"] is not None:
        return _context(m["t2"], m["s2"])
    return _context(m["t3"], None)


def regex_rule(pattern: str) -> Rule:
    """A custom rule: `trace` (and optional `span`) named groups, searched in the id."""
    compiled = re.compile(pattern)
    if "trace" not in compiled.groupindex:
        raise ValueError(f"trace context pattern {pattern!r} needs a named group (?P<trace>…)")

    def rule(request_id: str) -> TraceContext | None:
        m = compiled.search(request_id)
        if m is None:
            return None
        span = m.group("span") if "span" in compiled.groupindex else None
        return _context(m["trace"], span)
    return rule


def no_rule(request_id: str) -> None:
    return None


def make_rule(spec: str) -> Rule:
    """`w3c` (default), `off`, or a regular expression with a `trace` group."""
    if spec in ("", "w3c", "auto"):
        return w3c_rule
    if spec == "off":
        return no_rule
    return regex_rule(spec)
