"""Quoted literals in log text: found in linear time, so user text can be stepped over or masked.

vLLM prints what users typed (prompts, stop strings, the values a validation error quotes) as
Python reprs: `'…'` or `"…"` with backslash escapes. A rule that reads a field must step over
them whole (a stop string may hold `)`, quotes or `max_tokens=7`), and text that leaves the
node must not carry them. Every scan here is one left-to-right pass: no pattern can backtrack.
"""

from __future__ import annotations

import os
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


def literal_end(text: str, i: int, prose: bool = False) -> int:
    """Index just past the literal whose opening quote is `text[i]`; `len(text)` when it is never
    closed (a cut line): what follows an open quote is all user text. `prose`: the text may be
    quoted by hand (`Tool '{name}' is not defined`) rather than be a repr, so a `'` followed by a
    letter or digit is an apostrophe inside the literal (`'don't …'`), not its end."""
    q = text[i]
    body, n = _BODY[q], len(text)
    j = body.match(text, i + 1).end()
    while prose and q == "'" and j + 1 < n and text[j + 1].isalnum():
        j = body.match(text, j + 1).end()
    return j + 1 if j < n and text[j] == q else n


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


def opens_literal(text: str, i: int) -> bool:
    """Whether the quote at `i` opens a literal: not an apostrophe inside a word (`model's`) or
    ending one (`users' input`), unless that word is a string prefix (`b's …'` is a bytes literal)."""
    if not (text[i] == "'" and i > 0 and text[i - 1].isalpha()
            and (_CONTRACTION.match(text, i + 1) or i + 1 == len(text) or text[i + 1].isspace())):
        return True
    # `b's …'` reads as a bytes literal only in the lower case Python writes it (a repr):
    # `grade B's` is a word with its apostrophe
    return text[i - 1] == "b" and (i < 2 or not text[i - 2].isalnum()) and text.find("'", i + 1) > 0


def mask_literals(text: str, mask: str = REDACTED, keep: re.Pattern = DOTTED_NAME, plain=None) -> str:
    """`text` with every quoted literal (an unclosed one runs to the end) and every long
    literal (except those `keep` matches whole) replaced by `mask`. Plain words stay.
    `plain(segment, mask)`: more to mask in the text between literals."""
    out: list[str] = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _QUOTE.search(text, pos)
        if m is None:
            out.append(_mask_long(text[pos:], mask, keep, plain))
            break
        i = m.start()
        if not opens_literal(text, i):
            out.append(_mask_long(text[pos:i + 1], mask, keep, plain))
            pos = i + 1
            continue
        out.append(_mask_long(text[pos:i], mask, keep, plain))
        out.append(mask)
        pos = literal_end(text, i, prose=True)
    return "".join(out)


def _mask_long(text: str, mask: str, keep: re.Pattern, plain=None) -> str:
    if plain is not None:
        text = plain(text, mask)
    if len(text) <= LONG:
        return text
    return _TOKEN.sub(lambda m: m[0] if keep.fullmatch(m[0]) else mask, text)


#: What vLLM prints unquoted that a user chose, outside quoted literals: a backticked value
#: (`The model `x` does not exist.`) and a list of numbers (the token ids a grammar rejected,
#: `for tokens [9707, 11]`). Linear: no two adjacent runs can share the same characters.
_UNQUOTED_USER = re.compile(r"`[^`]*`?|[\[(]\s*-?\d+(?:\s*,\s*-?\d+)*(?:\s*,)?\s*[\])]")
#: A pydantic ValidationError: `N validation error(s) for Model`, then per error its location
#: (`field.key.0`) on a line of its own, or on the same line when the record was flattened.
_PYDANTIC_HEAD = re.compile(r"validation errors? for \w+")
_PYDANTIC_MESSAGE = re.compile(r" (?:Input should|Field required|Value error|Extra inputs|String should|List should|"
                               r"Dictionary should|Assertion failed|JSON input|Invalid JSON|Tuple should|Object has|"
                               r"Unable to|Missing|Unexpected)")


def _location(loc: str) -> str:
    """A pydantic location: the field (the request schema's) and list indexes stay; what follows
    may be a key the client chose (`logit_bias.<key>`, `chat_template_kwargs.<key>`) and goes."""
    head, dot, rest = loc.partition(".")
    if not dot:
        return loc
    return head + "." + ".".join(p if p.isdigit() else REDACTED for p in rest.split("."))


def _mask_pydantic(text: str) -> str:
    m = _PYDANTIC_HEAD.search(text)
    if m is None:
        return text
    rest = text[m.end():]
    if "\n" in rest:  # pydantic's own layout: a location line (not indented), then its message
        lines = rest.split("\n")
        return text[:m.end()] + "\n".join([lines[0]] + [_location(x) if x and not x[0].isspace() else x
                                                       for x in lines[1:]])
    body = rest.lstrip(" ")
    lead = rest[:len(rest) - len(body)]
    msg = _PYDANTIC_MESSAGE.search(body)
    loc, tail = (body[:msg.start()], body[msg.start():]) if msg else (body, "")
    return text[:m.end()] + lead + _location(loc) + tail


def _mask_plain(text: str, mask: str) -> str:
    return _UNQUOTED_USER.sub(mask, text)


#: A value a message ends on after a label (`Invalid type: x.`): one word, the shape of a
#: value echoed back, not of vLLM's own prose; a number (`max allowed: 4096`) stays.
_LABELLED_VALUE = re.compile(r"(?<=: )(?![-+]?\d[\d.,]*$)[^\s<>]+?(?=\.?$)")  # a number stays


#: A word: a run of anything but whitespace and ASCII punctuation (so `max_tokens` is two words,
#: and text in any script is words too). tests/vllm_env/vocabulary.py splits vLLM's text alike.
WORD = re.compile(r"[^\s!-/:-@\[-`{-~]+")
_NUMBER = re.compile(r"[0-9]+")
MAX_REQUEST_ERROR = 1024  # characters of a request's failure text kept (vLLM's own are far shorter)
_MASKS = re.compile(r"%s(?:[ ,]*%s)+" % (re.escape(REDACTED), re.escape(REDACTED)))


class Vocabulary:
    """The words of vLLM's own messages (`vllm_words.txt`, made by tests/vllm_env/vocabulary.py
    from vLLM's source), read at the first request failure: most runs never need them. A list
    that cannot be read (an install that left it out) is empty: every word is masked, nothing
    raises."""

    __slots__ = ("_path", "_words")

    def __init__(self, path: str | None = None) -> None:
        self._path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_words.txt")
        self._words: frozenset[str] | None = None

    def __contains__(self, word: str) -> bool:
        if self._words is None:
            try:
                with open(self._path, encoding="utf-8", errors="replace") as f:
                    self._words = frozenset(f.read().split())
            except OSError:
                self._words = frozenset()
        return word.lower() in self._words


VLLM_WORDS = Vocabulary()


def only_vllm_words(text: str, words=VLLM_WORDS) -> str:
    """`text` with every word vLLM's own messages never use masked (runs of them as one mask);
    numbers (ASCII digits), punctuation and masks already there stay. What a client typed into
    a value vLLM echoes unquoted (`Invalid type: SECRET words, expected object`, `Rule SECRET
    not found`) is masked, in any script, unless the client typed a word vLLM uses too."""
    def keep(m: re.Match) -> str:
        w = m[0]
        return w if w == "redacted" or _NUMBER.fullmatch(w) or (w.isascii() and w in words) else REDACTED

    out = WORD.sub(keep, text)
    out = _MASKS.sub(REDACTED, out)
    return out if len(out) <= MAX_REQUEST_ERROR else out[:MAX_REQUEST_ERROR] + "…"


def redact_request_error(text: str) -> str:
    """Why one request failed, as it may leave the node by default: `redact_error_text` of its
    first line, the one-word value it ends on after a label masked, and then every word that is
    not one of vLLM's own (`only_vllm_words`). A client error describes what the client sent;
    the lines after the first repeat it in other forms (a regex under a caret, a grammar rule)
    and go, and so does a value echoed back unquoted (`Grammar error: Invalid type: x`)."""
    # The first line alone, and no longer than a few times what is kept: the masks read one
    # line at a time, and a cut literal only masks more.
    first = redact_error_text(text.split("\n", 1)[0][:4 * MAX_REQUEST_ERROR])
    first = _LABELLED_VALUE.sub(REDACTED, first) if not first.endswith(REDACTED) else first
    return only_vllm_words(first)


def redact_error_text(text: str) -> str:
    """Error text as it may leave the node by default: the error class and vLLM's own words
    stay; quoted strings and long literals (where a user's prompt, stop strings or values
    appear in validation, template and traceback messages), backticked values, lists of
    numbers (token ids) and a pydantic location's keys become `<redacted>`."""
    if not text:
        return text
    return mask_literals(_mask_pydantic(text), plain=_mask_plain)
