"""Deterministic trace and span ids: the same lines always give the same ids.

A replay after a crash therefore re-sends identical spans, which Jaeger and Tempo keep once.
Ids derive from (source identity, request id, occurrence, phase, index).
"""

from __future__ import annotations

from hashlib import blake2b

_PERSON = b"vllm-trace-bri"  # blake2b personalisation: ids differ from any other blake2b use


def trace_id(source_key: str, kind: str, request_id: str, occurrence: str) -> bytes:
    h = blake2b(f"{source_key}\x1f{kind}\x1f{request_id}\x1f{occurrence}".encode(), digest_size=16, person=_PERSON)
    d = h.digest()
    return d if any(d) else b"\x00" * 15 + b"\x01"  # all-zero ids are invalid in OTLP


def span_id(trace: bytes, name: str, index: int = 0) -> bytes:
    d = blake2b(trace + f"{name}\x1f{index}".encode(), digest_size=8, person=_PERSON).digest()
    return d if any(d) else b"\x00" * 7 + b"\x01"
