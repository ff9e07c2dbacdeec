"""Deterministic trace and span ids: the same lines always give the same ids.

A replay after a crash therefore re-sends identical spans, which Jaeger and Tempo keep once.
Ids derive from (source identity, request id, occurrence, phase, index).
"""

from __future__ import annotations

import math
from functools import lru_cache
from hashlib import blake2b

PERSON = b"vllm-trace-bri"  # blake2b personalisation: ids differ from any other blake2b use
_TRACE_HASH = blake2b(digest_size=16, person=PERSON)  # copied per id: cheaper than a new one
_SPAN_HASH = blake2b(digest_size=8, person=PERSON)
_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


def trace_id(source_key: str, kind: str, request_id: str, occurrence: str) -> bytes:
    h = _TRACE_HASH.copy()
    h.update(f"{source_key}\x1f{kind}\x1f{request_id}\x1f{occurrence}".encode())
    d = h.digest()
    return d if d != _ZERO_TRACE else b"\x00" * 15 + b"\x01"  # all-zero ids are invalid in OTLP


@lru_cache(maxsize=256)
def _suffix(name: str, index: int) -> bytes:
    return f"{name}\x1f{index}".encode()


def span_id(trace: bytes, name: str, index: int = 0) -> bytes:
    h = _SPAN_HASH.copy()
    h.update(trace)
    h.update(_suffix(name, index))
    d = h.digest()
    return d if d != _ZERO_SPAN else b"\x00" * 7 + b"\x01"


def big_float(v: int) -> float:
    """An int past int64 as its nearest double (±inf past a double), never its low 64 bits:
    the wire encoder and the reference mapping both send it so."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf
