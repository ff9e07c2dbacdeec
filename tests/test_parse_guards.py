"""Rule guards (`upstream._starting`, `parse.GUARDS`): a guard may only rule out lines its rule
would refuse anyway, and the C fast path answers a guarded key's other lines as chatter."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.parse import GUARDS, RULES, Parser, parse_line
from bridge.parse import upstream
from bridge.parse.events import EngineError, EngineStats, Notice, StartupFact
from bridge.parse.upstream import literal_head


@pytest.mark.parametrize("pattern, head", [
    ("abc", "abc"),
    (r"Initializing an? (?:(V[01]) )?LLM", "Initializing a"),  # `n?` may be absent
    (r"torch\.compile takes", "torch"),
    ("ab*c", "a"), ("ab+c", "ab"), ("ab{0,2}c", "a"),
    ("abc|xyz", ""),  # the other branch starts elsewhere
    ("ab(?:c|d)e", "ab"),  # an inner `|` is fine
    (r"a\|b|c", ""), (r"[|]ab", ""), ("(x)y", ""), (".x", ""), ("", ""),
])
def test_literal_head(pattern, head):
    assert literal_head(pattern) == head


_PATTERNS = [p for _, p, _ in upstream._FACTS] + [upstream._BANNER, upstream._ERROR_TEXT] + [
    re.compile(p) for p in ("abc|xyz", "an?b", r"x\.y*", "ab{0,2}c", "(?:ab|cd)e", "a[|]b|c")]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_every_match_starts_with_the_literal_head(data):
    pattern = data.draw(st.sampled_from(_PATTERNS))
    text = data.draw(st.from_regex(re.compile(r"\A(?:" + pattern.pattern + ")", pattern.flags)))
    assert pattern.match(text)
    assert text.startswith(literal_head(pattern.pattern)), (pattern.pattern, text)


def test_guards_cover_exactly_the_keys_whose_rules_are_all_guarded():
    assert "Engi" in GUARDS and "Memo" in GUARDS
    assert "Requ" not in GUARDS and "GPU " not in GUARDS  # seed rules share these keys, unguarded
    for key, prefixes in GUARDS.items():
        assert all(hasattr(rule, "prefixes") for rule in RULES[key])
        assert prefixes and all(p.startswith(key) or key.startswith(p) for p in prefixes)


@pytest.mark.parametrize("message, level, origin, expected", [
    # what the guarded keys' rules still take
    ("Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
     "Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.5%, Prefix cache hit rate: 0.0%",
     "INFO", "loggers.py:116", EngineStats),
    ("Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 1024",
     "INFO", "core.py:90", StartupFact),
    ("EngineCore failed to start.", "ERROR", "core.py:700", EngineError),
    ("Memory profiling takes 3.50 seconds", "INFO", "worker.py:1", StartupFact),
    # what they now leave to the chatter answer, without running
    ("EngineCore waiting for work.", "DEBUG", "core.py:688", Notice),
    ("Memory usage after step: 3.1 GiB", "INFO", "gpu_worker.py:305", Notice),
    ("Initialized 1 workers", "INFO", "executor.py:3", Notice),
])
def test_guarded_keys_parse_as_before(message, level, origin, expected):
    for parser in (Parser(), Parser(fast=None)):
        assert type(parser.parse(message, level, origin)) is expected
    assert type(parse_line(message, level, origin)) is expected


def test_a_guarded_keys_unknown_line_from_an_engine_module_stays_malformed():
    """No rule ran and fallback knows nothing: a keyed line is malformed, on both paths."""
    for parser in (Parser(), Parser(fast=None)):
        parser.parse("EngineCore did something new", "INFO", "core.py:1")
        parser.parse("EngineCore did something new", "INFO", "core.py:1")  # origin cached now
        assert parser.snapshot().malformed == {"Engi": 2}
