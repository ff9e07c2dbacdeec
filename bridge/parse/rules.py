"""User line rules (`--rules FILE`): formats the built-in grammar does not know, as typed events.

A rule file is a YAML list; each rule names a `fact` the assembler already knows and the
regex groups that fill it (docs/rules.md). Patterns run under RE2, whose matching is linear in
the line's length: a user pattern runs on every unknown line of a node, and a backtracking
one ((a+)+$) would be a node-wide outage. All patterns go into one `re2.Set`, so a line no
rule matches costs one scan, whatever the number of rules. Nothing here raises on a line: a
group that does not convert leaves the line to the next rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

from bridge.parse.events import (
    BlockFreed,
    EngineError,
    GpuMemory,
    Preempted,
    QueueState,
    RequestFailed,
    RequestReceived,
    RequestsAborted,
    RequestSummary,
    ResponseGenerated,
    RuleEvent,
    Scheduled,
    Stamped,
    StartupFact,
)


class RuleError(ValueError):
    """A rule file that cannot be used: one line naming the rule, the field and the fix."""


_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "kib": 1 << 10, "mb": 1 << 20, "mib": 1 << 20, "gb": 1 << 30,
          "gib": 1 << 30, "tb": 1 << 40, "tib": 1 << 40}
_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "m": 60.0, "min": 60.0}


def _split(text: str) -> tuple[float, str]:
    i = len(text)
    while i and not (text[i - 1].isdigit() or text[i - 1] == "."):
        i -= 1
    return float(text[:i]), text[i:].strip().lower()


def _bytes(text: str) -> int:
    number, unit = _split(text)
    return int(number * _UNITS[unit])


def _seconds(text: str) -> float:
    number, unit = _split(text)
    return number * _SECONDS[unit]


def _bool(text: str) -> bool:
    word = text.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    raise ValueError(text)


#: Attribute and field types: what a group's text becomes. `bytes` takes 16KB, 1.5GiB; `seconds` 45ms, 2s.
TYPES: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float, "bool": _bool,
                                          "bytes": _bytes, "seconds": _seconds}

#: fact → {field: type}, the fields its event takes (each from the group of the same name unless
#: `fields:` says another, or a constant from `values:`); and whether a request id is required.
FACTS: dict[str, tuple[dict[str, str], bool]] = {
    "arrived": ({"max_tokens": "int", "temperature": "float", "top_p": "float", "n": "int"}, True),
    "scheduled": ({"priority": "int", "blocks": "int", "remaining_blocks": "int", "queued_s": "seconds"}, True),
    "preempted": ({"reason": "str", "blocks": "int"}, True),
    "first_token": ({}, True),
    "finished": ({"reason": "str", "output_tokens": "int", "prompt_tokens": "int", "ttft_s": "seconds",
                  "itl_s": "seconds", "e2e_s": "seconds"}, True),
    "aborted": ({}, True),
    "freed": ({"reason": "str", "count": "int"}, True),
    "error": ({"type": "str", "message": "str", "fatal": "bool"}, False),
    "queue": ({"running": "int", "waiting": "int", "free_blocks": "int", "total_blocks": "int"}, False),
    "memory": ({"used_bytes": "bytes", "total_bytes": "bytes", "utilization": "float", "cache_bytes": "bytes",
                "kv_blocks_used": "int", "kv_blocks_total": "int"}, False),
    "startup": ({}, False),
    "event": ({}, False),
}
_ATTRIBUTE_FACTS = ("first_token", "startup", "event")  # the facts whose events carry `attributes`
_KEYS = {"name", "match", "fact", "event", "request_id", "request_id_format", "time", "time_format", "fields",
         "values", "attributes", "span_attributes", "override"}


def _fact_event(fact: str, rid: str | None, f: dict, name: str | None, attrs: tuple, span: tuple):
    """The existing event that says what `fact` says (the assembler handles them all already)."""
    g = f.get
    if fact == "arrived":
        return RequestReceived(rid, g("max_tokens"), g("temperature"), g("top_p"), g("n"), None)
    if fact == "scheduled":
        return Scheduled(rid, g("priority", 0), g("blocks", 0), g("remaining_blocks", 0), g("queued_s"))
    if fact == "preempted":
        return Preempted(rid, g("reason", ""), g("blocks", 0))
    if fact == "finished":
        if "ttft_s" in f and "e2e_s" in f:  # durations measured by the engine: the seed summary's phases
            return RequestSummary(rid, g("prompt_tokens", 0), g("output_tokens", 0), f["ttft_s"], g("itl_s", 0.0),
                                  f["e2e_s"])
        return ResponseGenerated(rid, g("reason", "stop"), g("output_tokens"), "")
    if fact == "aborted":
        return RequestsAborted((rid,))
    if fact == "freed":
        return BlockFreed("", rid, g("reason", "completed"), g("count", 1))
    if fact == "error":
        if rid is not None:
            return RequestFailed(rid, g("type", "other"), g("message", ""))
        return EngineError(g("type", "other"), "", g("message", ""), g("fatal", False), "")
    if fact == "queue":
        return QueueState(g("running", 0), g("waiting", 0), g("free_blocks", 0), g("total_blocks", 0))
    if fact == "memory":
        used, total = g("used_bytes", 0), g("total_bytes", 0)
        ratio = g("utilization", used / total if total else 0.0)
        return GpuMemory(used, total, float(ratio), g("cache_bytes", 0), g("kv_blocks_used", 0),
                         g("kv_blocks_total", 0))
    if fact == "startup":
        return StartupFact(attrs)
    if fact == "first_token":
        return RuleEvent(rid, name or "vllm.first_token", attrs, span)
    return RuleEvent(rid, name, attrs, span)


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated rule: its pattern and how its groups become an event."""

    name: str
    pattern: Any                               # compiled re2 (what the rule file said)
    fact: str
    event: str | None
    request_id: int | None                     # group index
    request_id_format: str | None              # "chatcmpl-{}"
    time: int | None                           # group index
    time_format: str                           # iso | epoch | epoch_ms | a strptime format
    fields: tuple[tuple[str, int, Callable], ...]       # (field, group index, convert)
    values: tuple[tuple[str, Any], ...]                  # (field, constant)
    attributes: tuple[tuple[str, int, Callable], ...]    # (key, group index, convert)
    span_attributes: tuple[tuple[str, int, Callable], ...]
    override: bool

    def apply(self, line: bytes):
        """The event this rule makes of a UTF-8 `line`, or None (no match, or a group that does
        not convert). RE2's own matcher gives the groups' byte spans: google-re2's `search`
        wraps it in per-character offset bookkeeping that costs five times the match."""
        spans = self.pattern._regexp.Match(_UNANCHORED, line, 0, len(line))
        if spans[0][0] < 0:
            return None
        try:
            rid = None
            if self.request_id is not None:
                rid = _group(line, spans, self.request_id)
                if not rid:
                    return None
                if self.request_id_format is not None:
                    rid = self.request_id_format.replace("{}", rid)
            f = dict(self.values)
            for field, index, convert in self.fields:
                text = _group(line, spans, index)
                if text is not None:
                    f[field] = convert(text)
            attrs = _attrs(line, spans, self.attributes)
            span = _attrs(line, spans, self.span_attributes)
            event = _fact_event(self.fact, rid, f, self.event, attrs, span)
            if self.time is not None:
                text = _group(line, spans, self.time)
                if text is not None:
                    return Stamped(_time(text, self.time_format), event)
            return event
        except (ValueError, TypeError, KeyError, OverflowError, ZeroDivisionError, ArithmeticError, InvalidOperation):
            return None


def _group(line: bytes, spans, index: int) -> str | None:
    start, end = spans[index]
    return None if start < 0 else line[start:end].decode("utf-8", "replace")


def _attrs(line: bytes, spans, spec) -> tuple:
    out = []
    for key, index, convert in spec:
        text = _group(line, spans, index)
        if text is not None:
            out.append((key, convert(text)))
    return tuple(out)


def _time(text: str, fmt: str) -> int:
    ts = _parse_time(text, fmt)
    if not 0 <= ts < 1 << 63:  # what a span's nanosecond stamp can hold
        raise ValueError(text)
    return ts


def _parse_time(text: str, fmt: str) -> int:
    if fmt in ("epoch", "epoch_ms"):  # exact in decimal: a float loses nanoseconds at today's epoch
        return int(Decimal(text).scaleb(9 if fmt == "epoch" else 6))
    if fmt == "iso":
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T", 1))
    else:
        t = datetime.strptime(text, fmt)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


try:
    from re2 import _re2
    _UNANCHORED = _re2.RE2.Anchor.UNANCHORED
except ImportError:  # a dependency; without it a rule file is refused (load_rules says so)
    _UNANCHORED = None


class Rules:
    """The compiled rule file. `first` runs the override rules (before the built-in grammar),
    `rest` the others (on lines it did not take); each gives (rule name, event) or None."""

    def __init__(self, rules: list[Rule]) -> None:
        import re2

        self.rules = tuple(rules)
        self.names = tuple(r.name for r in rules)
        self._override = _Group([r for r in rules if r.override], re2)
        self._rest = _Group([r for r in rules if not r.override], re2)
        self.has_override = bool(self._override.rules)
        self.first = self._override.take
        self.rest = self._rest.take


_SET_CHUNK = 512    # rules per re2.Set: one Set of 10,000 patterns is over RE2's memory budget
MAX_RULES = 50_000  # past this a rule file is refused (each Set is one scan of every line)


class _Group:
    """Rules tried in file order; a scan of each `re2.Set` (a few hundred rules each) first
    tells which can match at all. A Set that RE2 will not compile is split in two until it
    does; a single rule that will not compile in a Set is refused by name."""

    def __init__(self, rules: list[Rule], re2) -> None:
        self.rules = rules
        self._sets: list[tuple[int, Any]] = []  # (index of its first rule, compiled Set)
        for lo in range(0, len(rules), _SET_CHUNK):
            self._compile(lo, min(len(rules), lo + _SET_CHUNK), re2)

    def _compile(self, lo: int, hi: int, re2) -> None:
        opts = re2.Options()
        opts.log_errors = False
        s = re2.Set.SearchSet(opts)
        for r in self.rules[lo:hi]:
            s.Add(r.pattern.pattern.encode())
        try:
            s.Compile()
        except re2.error:
            if hi - lo == 1:
                raise RuleError(f"rule {self.rules[lo].name!r}: its pattern is too large for RE2 to compile "
                                "(over its memory budget); fix: make it simpler or shorter") from None
            mid = (lo + hi) // 2
            self._compile(lo, mid, re2)
            self._compile(mid, hi, re2)
            return
        self._sets.append((lo, s))

    def take(self, message: str) -> tuple[str, object] | None:
        if not self._sets:
            return None
        line = message.encode("utf-8", "surrogatepass")  # never raises: a lone surrogate stays bytes
        if len(self._sets) == 1:
            hits = self._sets[0][1].Match(line)
        else:
            hits = [lo + i for lo, s in self._sets for i in (s.Match(line) or ())]
        if not hits:
            return None
        rules = self.rules
        for i in sorted(hits):
            event = rules[i].apply(line)
            if event is not None:
                return rules[i].name, event
        return None


# -- loading ----------------------------------------------------------------------------------


def load_rules(path: str) -> Rules:
    """Read and validate a rule file; RuleError (one line) on anything unusable."""
    import yaml

    from bridge.parse import yamlsafe

    try:
        data = yamlsafe.load(path)
    except OSError as exc:
        raise RuleError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yamlsafe.YamlLimitError as exc:
        raise RuleError(f"{path}: {exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise RuleError(f"{path}: not valid YAML{at}; fix the syntax (a list of rules, docs/rules.md)") from None
    return parse_rules(data, path)


def parse_rules(data: Any, origin: str = "rules") -> Rules:
    try:
        import re2
    except ImportError:
        raise RuleError(f"{origin}: user rules need google-re2; fix: pip install google-re2") from None

    if isinstance(data, Mapping) and set(data) == {"rules"}:
        data = data["rules"]
    if not isinstance(data, list) or not data:
        raise RuleError(f"{origin}: expected a non-empty YAML list of rules (- name: …, match: …, fact: …)")
    if len(data) > MAX_RULES:
        raise RuleError(f"{origin}: {len(data):,} rules, more than the {MAX_RULES:,} a rule file may hold "
                        "(every line is scanned against all of them); fix: keep the rules for the lines you have")
    rules, seen = [], set()
    for i, spec in enumerate(data, 1):
        rule = _one(spec, i, origin, re2)
        if rule.name in seen:
            raise RuleError(f"{origin}: rule {rule.name!r} (#{i}): field 'name': used twice; fix: give each rule its own name")
        seen.add(rule.name)
        rules.append(rule)
    try:
        return Rules(rules)
    except RuleError as exc:
        raise RuleError(f"{origin}: {exc}") from None


def _one(spec: Any, i: int, origin: str, re2) -> Rule:
    if not isinstance(spec, Mapping):
        raise RuleError(f"{origin}: rule #{i}: expected a mapping (name, match, fact, …), got {type(spec).__name__}")
    name = spec.get("name")
    label = f"{origin}: rule {name!r} (#{i})" if isinstance(name, str) and name else f"{origin}: rule #{i}"

    def bad(field: str, problem: str, fix: str) -> RuleError:
        return RuleError(f"{label}: field {field!r}: {problem}; fix: {fix}")

    if not isinstance(name, str) or not name.strip():
        raise bad("name", "missing or empty", "give the rule a name (it is counted under it)")
    unknown = sorted(set(map(str, spec)) - _KEYS)
    if unknown:
        raise bad(unknown[0], "unknown field", "use only: " + ", ".join(sorted(_KEYS)))
    pattern = spec.get("match")
    if not isinstance(pattern, str) or not pattern:
        raise bad("match", "missing or not a string", "give a regular expression with named groups (?P<name>…)")
    opts = re2.Options()
    opts.log_errors = False
    try:
        compiled = re2.compile(pattern, opts)
        re2.Set.SearchSet(opts).Add(pattern.encode())  # the form every line meets it in
    except UnicodeEncodeError:
        raise bad("match", "holds a lone surrogate escape", "write the character itself or a \\x{…} escape") from None
    except re2.error as exc:
        msg = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise bad("match", f"not a valid RE2 pattern ({msg})",
                  "RE2 has no backreferences or lookaround; rewrite the pattern without them") from None
    groups = set(compiled.groupindex)
    fact = spec.get("fact")
    if fact not in FACTS:
        raise bad("fact", f"{fact!r} is not a fact", "use one of: " + ", ".join(FACTS))
    field_types, needs_id = FACTS[fact]

    def group(field: str, value: Any) -> int:
        if not isinstance(value, str) or value not in groups:
            known = ", ".join(sorted(groups)) or "none"
            raise bad(field, f"{value!r} is not a named group of match (groups: {known})",
                      f"name a group of the pattern, e.g. (?P<{value if isinstance(value, str) else 'x'}>…)")
        return compiled.groupindex[value]

    rid = spec.get("request_id")
    if rid is None and needs_id:
        raise bad("request_id", f"fact {fact!r} needs the request it is about", "name the group holding the request id")
    if rid is not None and fact in ("queue", "memory", "startup"):
        raise bad("request_id", f"fact {fact!r} is engine-wide", "remove request_id, or use fact: event for one request")
    if rid is not None:
        rid = group("request_id", rid)
    rid_format = spec.get("request_id_format")
    if rid_format is not None and (not isinstance(rid_format, str) or "{}" not in rid_format):
        raise bad("request_id_format", f"{rid_format!r} has no {{}}", "write the id as vLLM logs it, e.g. chatcmpl-{}")
    event = spec.get("event")
    if fact == "event" and (not isinstance(event, str) or not event):
        raise bad("event", "fact 'event' needs the span event's name", "e.g. event: router.forwarded")
    if event is not None and fact not in ("event", "first_token"):
        raise bad("event", f"fact {fact!r} has its own event", "remove it, or use fact: event")
    time = spec.get("time")
    if time is not None:
        time = group("time", time)
    time_format = spec.get("time_format", "iso")
    if time_format not in ("iso", "epoch", "epoch_ms") and not (isinstance(time_format, str) and "%" in time_format):
        raise bad("time_format", f"{time_format!r} is not a time format",
                  "use iso, epoch, epoch_ms or a strptime format such as %d/%b/%Y:%H:%M:%S %z")

    fields_spec = spec.get("fields") or {}
    values_spec = spec.get("values") or {}
    for fname, mapping in (("fields", fields_spec), ("values", values_spec)):
        if not isinstance(mapping, Mapping):
            raise bad(fname, "expected a mapping of field: …", f"e.g. {fname}: {{reason: …}}")
        for key in mapping:
            if key not in field_types:
                raise bad(fname, f"fact {fact!r} has no field {key!r}",
                          "its fields are: " + (", ".join(field_types) or "none (use attributes)"))
    fields = []
    for fld, ftype in field_types.items():
        if fld in fields_spec:
            fields.append((fld, group(f"fields.{fld}", fields_spec[fld]), TYPES[ftype]))
        elif fld in groups and fld not in values_spec:
            fields.append((fld, compiled.groupindex[fld], TYPES[ftype]))
    values = []
    for fld, value in values_spec.items():
        try:
            values.append((fld, TYPES[field_types[fld]](str(value)) if not isinstance(value, bool) else value))
        except (ValueError, KeyError):
            raise bad(f"values.{fld}", f"{value!r} is not a {field_types[fld]}", "give a constant of that type") from None

    def attributes(fname: str) -> tuple:
        raw = spec.get(fname) or {}
        if not isinstance(raw, Mapping):
            raise bad(fname, "expected a mapping of attribute: group or {group, type}",
                      f"e.g. {fname}: {{http.status_code: {{group: status, type: int}}}}")
        if raw and fact not in _ATTRIBUTE_FACTS and fname == "attributes":
            raise bad(fname, f"fact {fact!r} carries no attributes",
                      "use fields, or a second rule with fact: event for the extra attributes")
        if raw and fact != "event" and fname == "span_attributes":
            raise bad(fname, f"fact {fact!r} sets no span attributes", "use fact: event")
        out = []
        for key, how in raw.items():
            if isinstance(how, str):
                g, t = how, "str"
            elif isinstance(how, Mapping):
                g, t = how.get("group"), how.get("type", "str")
            else:
                raise bad(f"{fname}.{key}", "expected a group name or {group, type}", "e.g. {group: ms, type: float}")
            if t not in TYPES:
                raise bad(f"{fname}.{key}", f"type {t!r} is unknown", "use one of: " + ", ".join(TYPES))
            out.append((str(key), group(f"{fname}.{key}", g), TYPES[t]))
        return tuple(out)

    attrs, span = attributes("attributes"), attributes("span_attributes")
    if fact == "startup" and not attrs:
        raise bad("attributes", "fact 'startup' needs at least one attribute", "e.g. attributes: {vendor.driver: drv}")
    override = spec.get("override", False)
    if not isinstance(override, bool):
        raise bad("override", f"{override!r} is not true or false", "override: true runs the rule before the built-in grammar")
    return Rule(name, compiled, fact, event, rid, rid_format, time, time_format, tuple(fields), tuple(values),
                attrs, span, override)
