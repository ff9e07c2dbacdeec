"""The shape of the house, read from the source with `ast`: data flows tail → decode → parse →
assemble → export, and so do imports — a stage imports only itself and the stages before it,
and no stage imports the tail (what reads files): the stages after it know a file only as the
values in `core` (a line's `Source`, its position), which every layer may import and which
imports none of them. Agent, cli, pipeline, check, telemetry, config and logs sit on top; the
vLLM plugin (loaded inside vLLM's process) and the synthetic generator import no stage. And no
module imports itself through others (no cycle), lazy imports inside functions included."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = "core"  # the values every stage shares (bridge/core): below the stages, imports none of them
STAGES = ("tail", "decode", "parse", "assemble", "export")
TOP = ("agent", "faults", "resume", "skip", "sources", "detect", "delivery", "health", "cli", "pipeline", "check", "telemetry", "config", "logs", "inject",
       "plugin_dist", "__main__")
ALONE = ("vllm_plugin", "synth")  # import nothing of the bridge but themselves


def _modules() -> dict[str, str]:
    """Dotted module name → file, for every .py under bridge/."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "bridge")):
        for f in files:
            if f.endswith(".py") or (f.startswith("_fast") and f.endswith(".c")):  # C extensions too
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT).rsplit(".", 1)[0].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = path
    return out


def _imports(path: str, name: str, known: set[str]) -> set[str]:
    """Bridge modules `path` imports, anywhere in the file (TYPE_CHECKING and lazy imports too)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            # `from bridge.assemble import ids` imports the submodule when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t.startswith("bridge") and t != "bridge" and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    """Module → the bridge modules it imports. A package's own `__init__` loading one of its
    submodules is not an edge: importing the submodule runs the `__init__` anyway, so that is
    how packages are built (vllm_plugin's lazy `hooks`), not a cycle between modules."""
    mods = _modules()
    known = set(mods)
    return {name: {t for t in _imports(path, name, known) if not t.startswith(name + ".")}
            for name, path in mods.items() if path.endswith(".py")}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def back_edges(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the flow: a stage importing a later stage, the tail or the top; core
    importing anything of the bridge outside itself; a lone package importing anything of the
    bridge outside itself, or a module of no known layer."""
    bad = []
    for src, targets in graph.items():
        sp = _part(src)
        for dst in targets:
            dp = _part(dst)
            if sp == dp:
                continue
            if sp in TOP:
                ok = dp in STAGES or dp in TOP or dp == CORE
            elif sp in STAGES:
                ok = dp == CORE or (dp in STAGES[1:] and STAGES.index(dp) < STAGES.index(sp))
            else:  # core, ALONE, or a new package nobody placed yet
                ok = False
            if not ok:
                bad.append(f"{src} → {dst}")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle's members found by a depth-first search (one path per cycle found)."""
    found, state = [], {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def test_every_package_is_placed():
    parts = {_part(m) for m in _graph()} - {""}
    placed = set(STAGES) | set(TOP) | set(ALONE) | {CORE}
    assert parts <= placed, parts - placed


def test_imports_follow_the_pipeline():
    assert back_edges(_graph()) == []


def test_no_import_cycle():
    assert cycles(_graph()) == []


def test_the_checks_catch_what_they_look_for():
    """The checkers themselves: a back edge, a lone package reaching in, and a cycle are found."""
    g = {
        "bridge.parse.gateway": {"bridge.assemble.context"},
        "bridge.assemble.context": set(),
        "bridge.vllm_plugin.hooks": {"bridge.parse.seed"},
        "bridge.tail.follow": {"bridge.decode.source"},
        "bridge.export.wire": {"bridge.assemble.timeline", "bridge.agent", "bridge.core.source"},
        "bridge.assemble.state": {"bridge.tail.files", "bridge.core.position"},
        "bridge.core.source": {"bridge.tail.source"},
        "bridge.decode.record": {"bridge.core"},
        "bridge.agent": {"bridge.core.source", "bridge.tail.follow"},
    }
    assert back_edges(g) == ["bridge.assemble.state → bridge.tail.files", "bridge.core.source → bridge.tail.source",
                             "bridge.export.wire → bridge.agent", "bridge.parse.gateway → bridge.assemble.context",
                             "bridge.tail.follow → bridge.decode.source", "bridge.vllm_plugin.hooks → bridge.parse.seed"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("source, expected", [
    ("from bridge.assemble import ids\n", {"bridge.assemble.ids"}),
    ("from bridge.assemble import Assembler\n", {"bridge.assemble"}),
    ("import bridge.parse.seed\n", {"bridge.parse.seed"}),
    ("def f():\n    from bridge.export.otlp import engine_spans\n", {"bridge.export.otlp"}),
    ("import os\n", set()),
])
def test_imports_are_read_as_written(tmp_path, source, expected):
    f = tmp_path / "m.py"
    f.write_text(source)
    known = set(_modules())
    assert _imports(str(f), "bridge.cli", known) == expected


def test_the_shared_values_are_defined_in_core_only():
    """`Source` and the position's layout are defined once, in core: a stage that needs them
    imports them from there, never a copy of its own that could drift."""
    shared = {"Source", "GEN_SHIFT", "IN_FILE"}
    where: dict[str, list[str]] = {}
    for name, path in _modules().items():
        if not path.endswith(".py"):
            continue
        for node in ast.parse(open(path, encoding="utf-8").read(), path).body:
            names = [node.name] if isinstance(node, ast.ClassDef) else [
                t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
            for n in set(names) & shared:
                where.setdefault(n, []).append(name)
    assert where == {"Source": ["bridge.core.source"], "GEN_SHIFT": ["bridge.core.position"],
                     "IN_FILE": ["bridge.core.position"]}


def test_the_agent_knows_nothing_of_fault_injection():
    """The fault-injection tests wrap the agent's stages from outside (cli gives it
    `faults.stages_from_env`'s hooks); nothing of the agent's own imports reaches `faults`."""
    graph = _graph()
    reach, todo = set(), ["bridge.agent"]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in reach:
                reach.add(m)
                todo.append(m)
    assert "bridge.faults" not in reach
    assert "bridge.faults" in graph["bridge.cli"]
