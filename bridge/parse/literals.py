"""Quoted literals in log text: found in linear time, so user text can be stepped over or masked.

vLLM prints what users typed (prompts, stop strings, the values a validation error quotes) as
Python reprs: `'…'` or `"…"` with backslash escapes. A rule that reads a field must step over
them whole (a stop string may hold `)`, quotes or `max_tokens=7`), and text that leaves the
node must not carry them. Every scan here is one left-to-right pass: no pattern can backtrack.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

#: The body of a literal after its opening quote, up to (not including) its closing quote or the
#: end of the text: the unrolled `(?:[^q\\]|\\.)*`, linear and free of backtracking.
_BODY = {q: re.compile(rf"[^{q}\\]*(?:\\.[^{q}\\]*)*", re.S) for q in "'\""}
#: An apostrophe in an English contraction (`model's`, `don't`, `I'm`) opens no literal.
_CONTRACTION = re.compile(r"(?:s|t|m|d|re|ve|ll)(?![\w'])")
_QUOTE = re.compile(r"['\"]")
#: A run this long with no space is a literal (a blob, a token list, an unquoted value) unless it
#: is a dotted name (`vllm.v1.engine.exceptions.EngineDeadError:`), which says what failed.
LONG = 32
_TOKEN = re.compile(r"[^\s'\"]{%d,}" % (LONG + 1))
DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+:?")


def literal_end(text: str, i: int) -> int:
    """Index just past the literal whose opening quote is `text[i]`; `len(text)` when it is never
    closed (a cut line): what follows an open quote is all user text."""
    q = text[i]
    j = _BODY[q].match(text, i + 1).end()
    return j + 1 if j < len(text) and text[j] == q else len(text)


_LITERAL = re.compile(r"'[^'\\]*(?:\\.[^'\\]*)*'?|\"[^\"\\]*(?:\\.[^\"\\]*)*\"?", re.S)


def _blank(m: re.Match) -> str:
    return "_" * (m.end() - m.start())


def blank_literals(text: str) -> str:
    """`text` with every quoted literal (quotes included; an unclosed one to the end) overwritten
    by `_`, positions unchanged: for text that is a Python repr, what remains is its structure,
    so a field can be found with plain `find` and read from `text` at the same index."""
    if "'" not in text and '"' not in text:
        return text
    return _LITERAL.sub(_blank, text)


#: A string prefix right before a quote (`b'…'`, `rb'…'`) opens a literal, whatever follows.
_PREFIX = re.compile(r"(?<![\w])(?:[bBrRuUfF]|[bB][rR]|[rR][bB]|[fF][rR]|[rR][fF])$")


def opens_literal(text: str, i: int) -> bool:
    """Whether the quote at `i` opens a literal: not an apostrophe inside a word (`model's`),
    unless that word is a string prefix (`b's …'` is a bytes literal)."""
    if not (text[i] == "'" and i > 0 and text[i - 1].isalpha() and _CONTRACTION.match(text, i + 1)):
        return True
    return _PREFIX.search(text, max(0, i - 3), i) is not None


def mask_literals(text: str, mask: str = REDACTED, keep: re.Pattern = DOTTED_NAME) -> str:
    """`text` with every quoted literal (an unclosed one runs to the end) and every long
    literal (except those `keep` matches whole) replaced by `mask`. Plain words stay."""
    out: list[str] = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _QUOTE.search(text, pos)
        if m is None:
            out.append(_mask_long(text[pos:], mask, keep))
            break
        i = m.start()
        if not opens_literal(text, i):
            out.append(_mask_long(text[pos:i + 1], mask, keep))
            pos = i + 1
            continue
        out.append(_mask_long(text[pos:i], mask, keep))
        out.append(mask)
        pos = literal_end(text, i)
    return "".join(out)


def _mask_long(text: str, mask: str, keep: re.Pattern) -> str:
    if len(text) <= LONG:
        return text
    return _TOKEN.sub(lambda m: m[0] if keep.fullmatch(m[0]) else mask, text)


#: What vLLM prints unquoted that a user chose: a backticked value (`The model `x` does not
#: exist.`), a list of numbers (the token ids a grammar rejected, `for tokens [9707, 11]`), and
#: a pydantic error's location past its field where a key is not a schema-like name
#: (`logit_bias.<key>`; `messages.0.content` stays).
_UNQUOTED_USER = re.compile(
    r"`[^`\n]*`?"
    r"|[\[(]\s*-?\d+(?:\s*,\s*-?\d+)+\s*,?\s*[\])]"
    r"|(?<=validation error for )(?:\w+\s+)?[A-Za-z_]\w*\.\S+"
    r"|(?<=validation errors for )(?:\w+\s+)?[A-Za-z_]\w*\.\S+")


_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]*|\d+")


def _mask_unquoted(m: re.Match) -> str:
    text = m[0]
    if text[0] not in "`[(":  # a pydantic location: the field and schema-like names stay, other keys go
        head, *rest = text.split(".")
        return ".".join([head] + [p if _SCHEMA_NAME.fullmatch(p) else REDACTED for p in rest])
    return REDACTED


def redact_error_text(text: str) -> str:
    """Error text as it may leave the node by default: the error class and vLLM's own words
    stay; quoted strings and long literals (where a user's prompt, stop strings or values
    appear in validation, template and traceback messages), backticked values, lists of
    numbers (token ids) and a pydantic location's keys become `<redacted>`."""
    if not text:
        return text
    return mask_literals(_UNQUOTED_USER.sub(_mask_unquoted, text))
