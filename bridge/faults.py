"""Fault injection, for the tests that run a real agent process (tests/test_agent_faults.py).

`VLLM_TRACE_BRIDGE_INJECT_FAULT` names a stage and a marker; `stages_from_env` then gives the
agent, at its construction (cli), `pipeline.Stages` hooks that wrap that stage so it raises on
a line carrying the marker, standing for any bug a line could trigger. The agent itself knows
nothing of faults; unset (as in production) it gets the plain hooks.
"""

from __future__ import annotations

import threading

from bridge.pipeline import Stages


class InjectedFault(RuntimeError):
    """Raised by the fault-injection hook (tests): stands for any bug a line could trigger."""


def injected_faults(env) -> dict[str, str]:
    """`VLLM_TRACE_BRIDGE_INJECT_FAULT=decode:MARK,parse:MARK,assemble:MARK`: that stage raises
    on a line containing MARK (assemble: a line whose origin, `file.py:LINE`, does). For the
    fault-injection tests of a real agent process; unset (always, in production) it costs one
    truth test per line. `hang:MARK`: reading such a line blocks the main loop for ever (the
    /healthz test)."""
    out = {}
    for item in (env.get("VLLM_TRACE_BRIDGE_INJECT_FAULT") or "").split(","):
        stage, _, marker = item.partition(":")
        if stage.strip() in ("decode", "parse", "assemble", "hang") and marker:
            out[stage.strip()] = marker
    return out


class PoisonedLines:
    """A batch's lines for the fault-injection tests: raises at a decode-poisoned line after
    moving past it, as a decoder raising on it would leave the batch."""

    __slots__ = ("_lines", "_i", "_faults")

    def __init__(self, lines: list, faults: dict[str, str]) -> None:
        self._lines, self._i, self._faults = lines, 0, faults

    def __iter__(self):
        return self

    def __next__(self):
        if self._i >= len(self._lines):
            raise StopIteration
        item = self._lines[self._i]
        self._i += 1
        marker = self._faults.get("hang")
        if marker is not None and marker.encode() in item[1]:
            threading.Event().wait()  # a read that never returns (a hung mount, a deadlock)
        maybe_fail(self._faults, "decode", item[1])
        return item

    def __length_hint__(self) -> int:
        return len(self._lines) - self._i


def failing(faults: dict[str, str], stage: str, fn):
    """`fn` (parse, or the assembler's feed), raising first where the per-line path would: on
    the stage's marker in the message (parse) or in the record's origin (assemble)."""
    def call(first, *rest):
        maybe_fail(faults, stage, first if stage == "parse" else first.origin)
        return fn(first, *rest)
    return call


def maybe_fail(faults: dict[str, str], stage: str, text) -> None:
    marker = faults.get(stage)
    if marker is not None and (marker.encode() if isinstance(text, bytes) else marker) in text:
        raise InjectedFault(stage)


class FaultyStages(Stages):
    """The agent's stages, each raising on its marked lines (`injected_faults`)."""

    def __init__(self, faults: dict[str, str]) -> None:
        self._faults = faults

    def lines(self, lines):
        return PoisonedLines(lines, self._faults)

    def parse(self, parse):
        return failing(self._faults, "parse", parse)

    def feed(self, feed):
        return failing(self._faults, "assemble", feed)


def stages_from_env(env) -> Stages:
    """The hooks the agent runs its stages through: faulty ones when the environment asks."""
    faults = injected_faults(env)
    return FaultyStages(faults) if faults else Stages()
