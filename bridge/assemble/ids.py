"""Upstream request ids: which spellings name the same request, and what the id tells about it.

vLLM logs one request under several spellings (reference "Parser implications" 4):
`Received request chatcmpl-a269…` but V1 ≥ 0.14 `Added request chatcmpl-a269…-a8a65d16`
(internal `-<8 hex>` suffix); n>1 children `{i}_<id>`; completions `cmpl-<id>-<i>`, one engine
request per prompt while the response id is `cmpl-<id>`; the Responses API (/v1/responses)
sends its first turn as `resp_<id>_0` and ends it with `Generated response resp_<id>`.
"""

from __future__ import annotations

import re
from collections.abc import Container

_V1_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_CHILD = re.compile(r"^\d+_")
_PROMPT_INDEX = re.compile(r"^(cmpl-.+)-\d+$|^(resp_.+)_\d+$")

#: id prefix → `gen_ai.operation.name` (OpenTelemetry GenAI conventions).
_OPERATIONS = (("chatcmpl-", "chat"), ("chat-", "chat"), ("cmpl-", "text_completion"), ("embd-", "embeddings"),
               ("resp_", "chat"))


def candidates(rid: str) -> list[str]:
    """Spellings to look up, most specific first."""
    out = [rid]
    child = _CHILD.match(rid)
    base = rid[child.end():] if child else rid
    if base != rid:
        out.append(base)
    stripped = _V1_SUFFIX.sub("", base)
    if stripped != base:
        out.append(stripped)
    if rid.startswith("cmpl-"):
        out.append(rid + "-0")  # a completion's base id names its first prompt's request
    elif rid.startswith("resp_"):
        out.append(rid + "_0")  # a response's id names its first turn (responses/serving.py)
    return out


def respelled(rid: str) -> bool:
    """Whether `rid` may be another spelling of an id (`candidates` gives more than itself):
    every other spelling comes from a `-` or an `_` in it. A seed-dialect id (`0x7f8c4a001010`)
    never is, and skipping the lookups saves a regex match and a substitution per request."""
    return "-" in rid or "_" in rid


def resolve(rid: str, open_ids: Container[str]) -> str | None:
    """The open request this spelling names, or None."""
    for c in candidates(rid):
        if c in open_ids:
            return c
    return None


def canonical(rid: str) -> str:
    """The key a request is opened under when no spelling of it is open yet."""
    child = _CHILD.match(rid)
    return _V1_SUFFIX.sub("", rid[child.end():] if child else rid)


def keys(rid: str) -> tuple[str, ...]:
    """Every key the request this spelling names may be open (or listed as delivered) under:
    an open spelling it resolves to (`resolve`), or the key it would open (`canonical`)."""
    return (*candidates(rid), canonical(rid))


def engine_base(rid: str) -> str:
    """An engine-side id without its n>1 child prefix: `1_chatcmpl-x-a1b2c3d4` → `chatcmpl-x-a1b2c3d4`."""
    child = _CHILD.match(rid)
    return rid[child.end():] if child else rid


def child_index(rid: str) -> int | None:
    """`1_cmpl-x-0` → 1: the index of an n>1 child (vLLM's `ParentRequest.get_child_info`:
    `f"{index}_{parent request_id}"`), None for any other id. Only an upstream-looking id (one
    with a `-` or `_` after the prefix) is a child: a seed id never has the prefix."""
    child = _CHILD.match(rid)
    if child is None or not respelled(rid[child.end():]):
        return None
    return int(rid[:child.end() - 1])


def response_id(key: str) -> str:
    """`gen_ai.response.id`: the id the client saw (a completion's prompt index dropped)."""
    m = _PROMPT_INDEX.match(key)
    return (m[1] or m[2]) if m else key


def operation(key: str) -> str | None:
    for prefix, name in _OPERATIONS:
        if key.startswith(prefix):
            return name
    return None
