"""The bounds of a number read from a line, applied once, where the line is parsed.

A count beyond int64 would be wrapped on the OTLP wire (2^64+12345 exported as 12345: plausible
and false), thousands of digits make `int()` itself raise, and a duration of centuries puts a
span in 1970. A number outside these bounds raises ValueError, which `parse_line` counts as a
malformed line; the request keeps the facts of its other lines. The C fast path
(`_fastseed.c`) declines every number near a bound, so the Python rules decide those lines.
"""

from __future__ import annotations

INT64_MAX = 2**63 - 1
MAX_DIGITS = 19  # INT64_MAX has 19: a longer digit string is out of range without reading it
MAX_DURATION_S = 30 * 86400.0  # no request, queue wait or collective lasts a month


def count(text: str) -> int:
    """int() of `-?\\d+`, ValueError beyond int64 (the length is checked before the conversion)."""
    if len(text) - (text[:1] == "-") > MAX_DIGITS:
        raise ValueError(f"out of int64: {text[:20]}…")
    return fits(int(text))


def fits(n: int) -> int:
    """`n`, or ValueError when OTLP's int64 cannot carry it."""
    if not -INT64_MAX - 1 <= n <= INT64_MAX:
        raise ValueError("out of int64")
    return n


def seconds(value: float) -> float:
    """A duration in seconds, ValueError when not finite, negative or over MAX_DURATION_S."""
    if not 0.0 <= value <= MAX_DURATION_S:
        raise ValueError(f"not a duration: {value!r} s")
    return value
