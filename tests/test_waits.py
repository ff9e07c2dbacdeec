"""Tests wait on the event, with caps scaled to the machine (tests/waits.py): no fixed wall-clock
cap creeps back in. Every cap in tests/ is `deadline(N)` or a name bound to one; a number written
straight into a wait fails here, naming the file and line."""

from __future__ import annotations

import ast
import os
import time

import pytest
import waits

HERE = os.path.dirname(os.path.abspath(__file__))

#: Keywords that are a wait's cap (hypothesis's `deadline=` too: a per-example wall clock).
CAP_KEYWORDS = {"timeout", "stall", "deadline"}
#: Calls whose positional argument at this index is a cap: Popen.wait(N), Thread.join(N),
#: Event.wait(N), wait_for(cond, N), AgentProc.term(N), the scenario driver's waits.
CAP_POSITIONAL = {"wait": 0, "join": 0, "communicate": 1, "term": 0, "wait_for": 1, "wait_until": 1,
                  "wait_while_progressing": 2, "wait_streaming": 1, "_wait_exit": 1}
HELPERS = {"wait_for", "wait_until", "wait_while_progressing"}
#: Clocks whose reading plus a number is a fixed deadline.
CLOCKS = {"monotonic", "time", "perf_counter"}

#: Places where a number in a cap position is not a test's wait. Each: (file, text on the line, why).
ALLOWED = [
    ("waits.py", "", "the helper itself: its reference figures and default stall"),
    ("test_waits.py", "", "this check and its own examples"),
    ("test_http_transport.py", "timeout=30)", "the transport's own timeout parameter, the behaviour under test"),
    ("test_http_transport.py", "_timeout = 20.0", "the SDK client's timeout, the behaviour under test"),
    ("test_causes.py", "dequeue(timeout=dequeue_timeout)", "text of a vLLM traceback, not code"),
    ("test_agent.py", "t_end = time.monotonic() + 30", "the receiver's 30 s outage: the scenario, not a cap"),
    ("plugin_versions_table.py", "timeout: float = 60", "a maintenance script's request to PyPI, not a test's wait"),
]


def _number(node) -> bool:
    """A literal number, or arithmetic of literal numbers (`2 * 60`, `-1`)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    if isinstance(node, ast.BinOp):
        return _number(node.left) and _number(node.right)
    return False


def _name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _clock(node) -> bool:
    return isinstance(node, ast.Call) and _name(node.func) in CLOCKS and not node.args


def fixed_caps(source: str) -> list[tuple[int, str]]:
    """(line, what) for every fixed-number cap in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            for kw in node.keywords:
                if kw.arg in CAP_KEYWORDS and _number(kw.value):
                    found.append((node.lineno, f"{name}(…, {kw.arg}={ast.unparse(kw.value)})"))
            index = CAP_POSITIONAL.get(name)
            if name in HELPERS and isinstance(node.func, ast.Attribute) and _name(node.func.value) != "waits":
                index = None  # another object's method of the same name (the Phoenix client's wait_for)
            if index is not None and len(node.args) > index and _number(node.args[index]):
                found.append((node.lineno, f"{name}(…{ast.unparse(node.args[index])}…)"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if (_clock(node.left) and _number(node.right)) or (_clock(node.right) and _number(node.left)):
                found.append((node.lineno, f"{ast.unparse(node)} (a fixed deadline)"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            for arg, default in zip(args[len(args) - len(node.args.defaults):], node.args.defaults):
                if (arg.arg in CAP_KEYWORDS or arg.arg.endswith("_timeout")) and _number(default):
                    found.append((node.lineno, f"def {node.name}({arg.arg}={ast.unparse(default)})"))
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
                if default is not None and arg.arg in CAP_KEYWORDS and _number(default):
                    found.append((node.lineno, f"def {node.name}({arg.arg}={ast.unparse(default)})"))
    return found


def _allowed(rel: str, line: str) -> bool:
    return any(os.path.basename(rel) == f and text in line for f, text, _ in ALLOWED)


def test_no_fixed_wall_clock_cap_in_tests():
    offenders = []
    for dirpath, dirnames, files in os.walk(HERE):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "fixtures", "corpus")]
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, HERE)
            with open(path, encoding="utf-8") as fh:
                source = fh.read()
            lines = source.splitlines()
            for lineno, what in fixed_caps(source):
                if not _allowed(rel, lines[lineno - 1]):
                    offenders.append(f"tests/{rel}:{lineno}: {what}")
    assert not offenders, ("fixed wall-clock caps (write deadline(N) from tests/waits.py, or add the line "
                           "to ALLOWED with the reason):\n" + "\n".join(offenders))


@pytest.mark.parametrize("source", [
    "proc.wait(10)", "t.join(2.5)", "subprocess.run(a, timeout=60)", "wait_for(lambda: x, 30)",
    "end = time.monotonic() + 15", "urlopen(u, timeout=2 * 5)", "def f(timeout=60): pass",
    "def g(a, *, stall=9): pass", "proc.communicate(None, 30)", "agent.term(60)", "waits.wait_for(f, 5)",
])
def test_the_check_finds_a_fixed_cap(source):
    assert fixed_caps(source), source


@pytest.mark.parametrize("source", [
    "proc.wait(deadline(10))", "subprocess.run(a, timeout=deadline(60))", "wait_for(lambda: x, cap)",
    "end = time.monotonic() + deadline(15)", "settings(deadline=None)", "def f(timeout=None): pass",
    "x = time.monotonic() - t0", "'-'.join(parts)", "time.sleep(0.2)", "phoenix.wait_for('q', 3)",
])
def test_the_check_lets_a_scaled_cap_pass(source):
    assert not fixed_caps(source), source


def test_the_scale_is_a_factor_of_at_least_one_or_the_variables(monkeypatch):
    measured = waits.time_scale()
    assert measured.factor >= 1.0
    assert waits.deadline(10) == pytest.approx(10 * measured.factor)
    waits.time_scale.cache_clear()
    try:
        monkeypatch.setenv(waits.SCALE_ENV, "3.5")
        assert waits.deadline(10) == pytest.approx(35.0)
        assert waits.SCALE_ENV in waits.time_scale().describe()
        monkeypatch.setenv(waits.SCALE_ENV, "-1")
        waits.time_scale.cache_clear()
        with pytest.raises(ValueError, match=waits.SCALE_ENV):
            waits.time_scale()
    finally:
        monkeypatch.delenv(waits.SCALE_ENV, raising=False)
        waits.time_scale.cache_clear()


def test_a_wait_that_times_out_says_what_how_long_and_the_scale(monkeypatch):
    monkeypatch.setenv(waits.SCALE_ENV, "2")
    waits.time_scale.cache_clear()
    try:
        flag = []
        t = time.monotonic()
        result = waits.wait_for(lambda: "the flag" in flag, waits.deadline(0.1), every=0.02)
        assert not result and time.monotonic() - t >= 0.2
        text = repr(result)
        assert text.startswith("TimedOut(waited 0.2 s for: lambda: \"the flag\" in flag")
        assert text.endswith("cap deadline(0.1) = 0.2 s at time scale 2 (from VTB_TEST_TIME_SCALE))")
        with pytest.raises(AssertionError, match="waited .* for: the flag to be set"):
            waits.wait_until(lambda: flag, waits.deadline(0.05), what="the flag to be set", every=0.02)
        flag.append("the flag")
        assert waits.wait_for(lambda: "the flag" in flag, waits.deadline(0.1)) is True
    finally:
        monkeypatch.delenv(waits.SCALE_ENV, raising=False)
        waits.time_scale.cache_clear()
