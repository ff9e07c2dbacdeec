"""Join finished requests with a gateway's access log on the request id, within a time window.

Either side may come first: a gateway writes its line when the response ends, often after
vLLM's last line, but a slow tail or a streaming response can turn that round. A request whose
id carries no caller span waits here up to `window_s` for its gateway line; a gateway line
waits as long for its request. Both maps are bounded: past `max_entries` the oldest is let go
(a waiting request leaves with what it has), and every such case is counted.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from bridge.parse.context import TraceContext

T = TypeVar("T")

# vLLM's decorations around the X-Request-Id it was given (reference §g).
_BASE = re.compile(r"^(?:\d+_)?(?:chatcmpl|cmpl|chat|embd|pool|score|rerank|classify|tokn|trsc)-(.+?)$")
_PROMPT_INDEX = re.compile(r"-\d+$")


def upstream_id(request_key: str) -> str:
    """The `X-Request-Id` a gateway sent, from vLLM's key: `cmpl-<id>-0` → `<id>`, `chatcmpl-<id>` → `<id>`."""
    m = _BASE.match(request_key)
    if m is None:
        return request_key
    base = m[1]
    return _PROMPT_INDEX.sub("", base) if request_key.startswith(("cmpl-", "embd-")) else base


@dataclass(slots=True)
class JoinStats:
    joined: int = 0          # requests given a gateway's context
    expired: int = 0         # requests that waited the whole window: sent with what they had
    overflow: int = 0        # requests let go early because too many were waiting
    contexts_dropped: int = 0  # gateway lines forgotten unmatched (window passed, or too many)


class ContextJoin(Generic[T]):
    """`T` is what waits for a context (the agent's pending timeline and its delivery token)."""

    def __init__(self, window_s: float, max_entries: int = 100_000) -> None:
        self.stats = JoinStats()
        self._window_ns = int(window_s * 1e9)
        self._max = max_entries
        # None: the gateway logged the id with no trace context (nothing to wait for). The last
        # item is the caller's `hold` for the line (the agent: where it was read).
        self._contexts: OrderedDict[str, tuple[TraceContext | None, int, object]] = OrderedDict()
        self._waiting: OrderedDict[str, tuple[list[T], int]] = OrderedDict()
        self._n_waiting = 0

    @property
    def waiting(self) -> int:
        """Requests waiting now (a plain counter: read from the telemetry thread)."""
        return self._n_waiting

    def gateway(self, request_id: str, ctx: TraceContext | None, now_ns: int,
                hold: object = None) -> list[tuple[T, TraceContext | None]]:
        """A gateway line: the requests it completes, or none (then it waits for them, and
        `holds` gives back `hold` until it leaves). `ctx` None: the gateway saw no trace
        context; its requests go on as they are."""
        held = self._waiting.pop(request_id, None)
        if held is not None:
            self._n_waiting -= len(held[0])
            if ctx is not None:
                self.stats.joined += len(held[0])
            return [(item, ctx) for item in held[0]]
        self._contexts[request_id] = (ctx, now_ns, hold)
        self._contexts.move_to_end(request_id)
        if len(self._contexts) > self._max:
            self._contexts.popitem(last=False)
            self.stats.contexts_dropped += 1
        return []

    def request(self, request_id: str, item: T, now_ns: int) -> tuple[bool, TraceContext | None, list[T]]:
        """A finished request: (True, its context) if the gateway line was seen (consumed: a
        resent X-Request-Id joins its own line), else (False, None) and it waits. The list holds
        requests let go early by overflow."""
        found = self._contexts.pop(request_id, None)
        if found is not None:
            if found[0] is not None:
                self.stats.joined += 1
            return True, found[0], []
        entry = self._waiting.get(request_id)
        if entry is None:
            self._waiting[request_id] = ([item], now_ns)
        else:
            entry[0].append(item)
        self._n_waiting += 1
        released: list[T] = []
        while len(self._waiting) > self._max:
            _, (items, _) = self._waiting.popitem(last=False)
            self.stats.overflow += len(items)
            self._n_waiting -= len(items)
            released += items
        return False, None, released

    def expire(self, now_ns: int) -> list[T]:
        """Requests whose window has passed (they leave without a gateway context)."""
        deadline = now_ns - self._window_ns
        released: list[T] = []
        while self._waiting:
            rid, (items, since) = next(iter(self._waiting.items()))
            if since > deadline:
                break
            del self._waiting[rid]
            self.stats.expired += len(items)
            self._n_waiting -= len(items)
            released += items
        while self._contexts:
            rid, (_, since, _) = next(iter(self._contexts.items()))
            if since > deadline:
                break
            del self._contexts[rid]
            self.stats.contexts_dropped += 1
        return released

    def holds(self) -> Iterator[object]:
        """The `hold` of every gateway line still waiting for its request, oldest first: what a
        restart would have to read again (its checkpoint must not pass them)."""
        return (hold for _, _, hold in self._contexts.values() if hold is not None)

    def drain(self) -> list[T]:
        """Everything still waiting (shutdown)."""
        items = [i for items, _ in self._waiting.values() for i in items]
        self._waiting.clear()
        self._n_waiting = 0
        return items
