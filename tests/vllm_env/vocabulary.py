"""The words of vLLM's own messages, for `bridge/parse/vllm_words.txt`.

    ~/.cache/vllm-trace-bridge/vllm-venv/bin/python tests/vllm_env/vocabulary.py > bridge/parse/vllm_words.txt

Every ASCII word (a run of anything but whitespace and ASCII punctuation, lower-cased) of the string constants inside
`raise …(…)`, `assert …, msg` and logger calls (`logger.warning(…)` and the like), and the
names of the classes, in the installed vLLM and the structured-output libraries whose messages
reach a request's failure line (lark, llguidance, outlines_core, xgrammar's Python); and of
pydantic's validation errors (`pydantic_core._pydantic_core.list_all_errors()`: each error's type and message
template), which vLLM reports for a request that does not fit its schema. A request's failure text keeps only
these words by default (`bridge.parse.literals.redact_request_error`): a word a client chose
is not among them unless vLLM happens to use it too. With a path argument, prints the words of
that installed tree instead (the test that the shipped list still covers vLLM uses it)."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys

WORD = re.compile(r"[^\s!-/:-@\[-`{-~]+")  # bridge.parse.literals.WORD: whitespace and ASCII punctuation split
PACKAGES = ("vllm", "lark", "llguidance", "outlines_core", "xgrammar")
_LOG_CALLS = {"debug", "info", "warning", "warning_once", "info_once", "debug_once", "error", "exception",
              "critical", "warn", "fatal"}


def _message_nodes(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            yield node.exc
        elif isinstance(node, ast.Assert) and node.msg is not None:
            yield node.msg
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LOG_CALLS:
            yield node


def words_of(root: str) -> set[str]:
    out: set[str] = set()
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                try:
                    tree = ast.parse(f.read())
                except SyntaxError:
                    continue
            out.update(w.lower() for n in ast.walk(tree) if isinstance(n, ast.ClassDef) for w in WORD.findall(n.name))
            for node in _message_nodes(tree):
                for n in ast.walk(node):
                    if isinstance(n, ast.Constant) and isinstance(n.value, str):
                        out.update(w.lower() for w in WORD.findall(n.value) if w.isascii())
    return out


def installed_words() -> set[str]:
    out: set[str] = set()
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            out |= words_of(list(spec.submodule_search_locations)[0])
    try:
        import pydantic_core
    except ImportError:
        return out
    for error in pydantic_core._pydantic_core.list_all_errors():
        for key in ("type", "message_template_python", "message_template_json"):
            text = error.get(key) or ""
            out.update(w.lower() for w in WORD.findall(text) if w.isascii())
    return out


if __name__ == "__main__":
    found = words_of(sys.argv[1]) if len(sys.argv) > 1 else installed_words()
    sys.stdout.write("".join(w + "\n" for w in sorted(found)))
