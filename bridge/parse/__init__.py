"""parse: a vLLM message → a typed event, or nothing. Pure; counts what it did not know.

Two grammars share one dispatch table keyed by a message's first four characters: the seed
dialect's rules (`seed`) are tried first, so seed lines parse exactly as they always did, then
upstream vLLM's (`upstream`). Lines no key claims go to `upstream.fallback` (error levels,
header-less writers). A keyed line that no rule accepts is *malformed*; anything else that is
not recognised is *unrecognised*. Neither is an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bridge.parse import events, seed, upstream
from bridge.parse.events import KIND, Event, Notice, Stamped
from bridge.parse.seed import MALFORMED, parse_message


def _load_fast():
    """The C fast path for the commonest seed rules (`_fastseed.c`), or None: not built (no
    compiler at install), or VLLM_TRACE_BRIDGE_PURE=1. The Python rules stay the reference;
    the C answers only lines it is sure of and hands every other line to them."""
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return None
    try:
        from bridge.parse import _fastseed
    except ImportError:
        return None
    _fastseed.init(vars(events))
    return _fastseed


_FAST = _load_fast()
FAST_PARSE = _FAST.parse if _FAST is not None else None

__all__ = ["Event", "KIND", "ParseStats", "Parser", "parse_line", "parse_message", "MALFORMED"]


def _rules() -> dict[str, tuple]:
    table: dict[str, tuple] = {}
    for grammar in (seed.PREFILTER, upstream.PREFILTER):
        for key, rule in grammar.items():
            table[key] = table.get(key, ()) + (rule,)
    return table


def _guards(rules: dict[str, tuple]) -> dict[str, tuple[str, ...]]:
    """Key → the prefixes a message needs for any of its rules to run, for keys whose rules are
    all guarded (`upstream._starting`). A keyed line with none of them is chatter, as if no key
    claimed it. Only the prefixes that can share the key are kept."""
    guards = {}
    for key, group in rules.items():
        if all(hasattr(rule, "prefixes") for rule in group):
            guards[key] = tuple(dict.fromkeys(p for rule in group for p in rule.prefixes
                                              if p.startswith(key) or key.startswith(p)))
    return guards


RULES = _rules()
GUARDS = _guards(RULES)
if _FAST is not None:
    # The C answers the commonest lines fallback takes (chatter, uvicorn, glog, tqdm) from its own
    # tables (read-only there).
    _FAST.tables({"rule_keys": RULES, "guards": GUARDS, "notice_groups": upstream._NOTICE_GROUPS,
                  "module_cache": upstream._MODULE_OF, "request_modules": upstream.LINE_MODULES,
                  "vllm_other": upstream._VLLM_OTHER, "chatter_levels": upstream._CHATTER_LEVELS,
                  "noise": upstream._NOISE, "torch_log": upstream._TORCH_LOG, "uvicorn_rule": upstream._uvicorn})


def parse_line(message: str, level: str = "", origin: str = "", _rules=RULES,
               _fallback=upstream.fallback) -> Event | None | object:
    """Event for a recognised message (seed or upstream), `MALFORMED` for a near miss, None otherwise.
    `level` is the header's level ("" for a line with no vLLM header); `origin` its `file.py:N`
    (or a JSON record's logger name), which tells chatter from request and engine lines."""
    rules = _rules.get(message[:4])
    try:
        if rules is not None:
            for rule in rules:
                event = rule(message)
                if event is not None:
                    return event
        event = _fallback(message, level, origin)
    except (ValueError, OverflowError):  # the grammar fits but a number does not (1e400 bytes)
        return MALFORMED
    if event is None and not level:
        inner = upstream.unwrap(message)  # a vLLM line in a wrapper's frame: read it as vLLM's
        if inner is not None:
            return parse_line(*inner, _rules, _fallback)
    if event is None and rules is not None:
        return MALFORMED
    return event


@dataclass(slots=True)
class ParseStats:
    """`lines == sum(by_kind) + sum(malformed) + unrecognised`, always."""

    lines: int = 0
    unrecognised: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)
    by_rule: dict[str, int] = field(default_factory=dict)  # user rule name → lines it took (in by_kind too)

    @property
    def recognised(self) -> int:
        return sum(self.by_kind.values())


class Parser:
    """`parse_line` plus the counters that make unknown lines visible."""

    __slots__ = ("stats", "_counts", "_fast", "parse")

    def __init__(self, fast=FAST_PARSE, rules=None) -> None:
        """`rules`: user rules (`bridge.parse.rules.Rules`); None keeps `parse` exactly as fast."""
        self.stats = ParseStats()
        self._counts: dict[str, int] = {}
        self._fast = fast  # None: Python rules only
        # `parse` is this call in one C call when the fast path is there (the pipeline's per-line
        # call), else the method itself.
        if fast is FAST_PARSE and _FAST is not None:
            self.parse = _FAST.Parse(self.stats, self._counts, self._rest, self.__call__)
        else:
            self.parse = self.__call__
        if rules is not None:
            self.parse = self._with_rules(self.parse, rules)

    def _with_rules(self, builtin, rules):
        """`builtin` with user rules around it: override rules first, the others on the lines the
        built-in grammar left unrecognised or malformed, or took as a `Notice` (a line it knows
        carries nothing, e.g. a vLLM module's chatter); their counts then move to the rule."""
        stats, counts, by_rule = self.stats, self._counts, self.stats.by_rule
        first, rest, has_override = rules.first, rules.rest, rules.has_override

        def took(name: str, event) -> object:
            by_rule[name] = by_rule.get(name, 0) + 1
            inner = event.event if type(event) is Stamped else event
            kind = KIND.get(type(inner), "rule_event")
            counts[kind] = counts.get(kind, 0) + 1
            return event

        def parse(message: str, level: str = "", origin: str = ""):
            if has_override:
                hit = first(message)
                if hit is not None:
                    stats.lines += 1
                    return took(*hit)
            unrecognised = stats.unrecognised
            event = builtin(message, level, origin)
            if event is not None:
                if type(event) is not Notice:
                    return event
                hit = rest(message)
                if hit is None:
                    return event
                left = counts[event.kind] - 1
                if left:
                    counts[event.kind] = left
                else:
                    del counts[event.kind]
                return took(*hit)
            hit = rest(message)
            if hit is None:
                return None
            if stats.unrecognised != unrecognised:
                stats.unrecognised -= 1
            else:  # the built-in grammar counted it malformed
                key = message[:4]
                left = stats.malformed.get(key, 0) - 1
                if left > 0:
                    stats.malformed[key] = left
                else:
                    stats.malformed.pop(key, None)
            return took(*hit)

        return parse

    def __call__(self, message: str, level: str = "", origin: str = "") -> Event | None:
        self.stats.lines += 1
        if self._fast is not None:
            event = self._fast(message, self._counts)  # counted in C
            if event is not None:
                return event
        return self._rest(message, level, origin)

    def _rest(self, message: str, level: str, origin: str) -> Event | None:
        """A line the C rules did not take (stats.lines already counted)."""
        event = parse_line(message, level, origin)
        if event is None:
            self.stats.unrecognised += 1
            return None
        if event is MALFORMED:
            key = message[:4]
            self.stats.malformed[key] = self.stats.malformed.get(key, 0) + 1
            return None
        cls = type(event)
        kind = event.kind if cls is Notice else KIND[cls]
        self._counts[kind] = self._counts.get(kind, 0) + 1
        return event

    def snapshot(self) -> ParseStats:
        """Stats with per-kind counts under their stable names."""
        self.stats.by_kind = dict(self._counts)
        return self.stats
