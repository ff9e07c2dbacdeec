"""The words of vLLM's own messages, for `bridge/parse/vllm_words.txt`.

    ~/.cache/vllm-trace-bridge/vllm-venv/bin/python tests/vllm_env/vocabulary.py > bridge/parse/vllm_words.txt

Every ASCII word of three letters or more, or a short English one (a run of anything but whitespace and ASCII punctuation, lower-cased) of the string constants inside
`raise …(…)`, `assert …, msg` and logger calls (`logger.warning(…)` and the like), and the
names of the API server's classes (request schemas, named in pydantic's errors), in the code
that serves requests (not benchmarks, examples or tests) of the installed vLLM and the structured-output libraries whose messages
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


# Code no request's failure goes through: benchmarks, examples, tests and their data.
_NOT_SERVING = re.compile(r"(?:^|/)(?:benchmarks?|snapshot|examples?|tests?|testing)(?:/|\.py$)|_test\.py$|/test_[^/]*$")
# Words of one or two letters that are English (`at 1`, `is out of`): any other would let a
# value spelled out letter by letter (`s.e.c.r.e.t`) through.
SHORT_WORDS = frozenset("a an as at be by do go id if in is it me my no of ok on or so to up us we s".split())


def _keep(word: str) -> bool:
    return word.isascii() and (len(word) > 2 or word in SHORT_WORDS)


def words_of(root: str) -> set[str]:
    out: set[str] = set()
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not name.endswith(".py") or _NOT_SERVING.search(os.path.relpath(path, os.path.dirname(root))):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                try:
                    tree = ast.parse(f.read())
                except SyntaxError:
                    continue
            if "/entrypoints/" in path:  # a request schema's name, in pydantic's errors
                out.update(w.lower() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                           for w in WORD.findall(n.name) if _keep(w.lower()))
            for node in _message_nodes(tree):
                for n in ast.walk(node):
                    if isinstance(n, ast.Constant) and isinstance(n.value, str):
                        out.update(w.lower() for w in WORD.findall(n.value) if _keep(w.lower()))
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
            out.update(w.lower() for w in WORD.findall(text) if _keep(w.lower()))
    return out


if __name__ == "__main__":
    found = words_of(sys.argv[1]) if len(sys.argv) > 1 else installed_words()
    sys.stdout.write("".join(w + "\n" for w in sorted(found)))
