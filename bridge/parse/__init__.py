"""parse: a vLLM message → a typed event, or nothing. Pure; counts what it did not know."""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.parse.events import KIND, Event
from bridge.parse.seed import MALFORMED, parse_message

__all__ = ["Event", "KIND", "ParseStats", "Parser", "parse_message", "MALFORMED"]


@dataclass(slots=True)
class ParseStats:
    """`lines == sum(by_kind) + sum(malformed) + unrecognised`, always."""

    lines: int = 0
    unrecognised: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)

    @property
    def recognised(self) -> int:
        return sum(self.by_kind.values())


class Parser:
    """`parse_message` plus the counters that make unknown lines visible."""

    __slots__ = ("stats", "_counts")

    def __init__(self) -> None:
        self.stats = ParseStats()
        self._counts: dict[type, int] = {}

    def __call__(self, message: str) -> Event | None:
        self.stats.lines += 1
        event = parse_message(message)
        if event is None:
            self.stats.unrecognised += 1
            return None
        if event is MALFORMED:
            key = message[:4]
            self.stats.malformed[key] = self.stats.malformed.get(key, 0) + 1
            return None
        cls = type(event)
        self._counts[cls] = self._counts.get(cls, 0) + 1
        return event

    def snapshot(self) -> ParseStats:
        """Stats with per-kind counts folded in by their stable names."""
        self.stats.by_kind = {KIND[cls]: n for cls, n in self._counts.items()}
        return self.stats
