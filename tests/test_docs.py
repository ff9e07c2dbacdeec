"""The docs tell the truth about the code they describe: every relative link in README.md,
docs/*.md and the READMEs under deploy/ resolves (file, and heading when there is an anchor); every flag given to a
`vllm-trace-bridge` command exists on that command; every `VLLM_TRACE_BRIDGE_*` variable
named exists in the code; every agent setting is documented, and docs/configuration.md is
what docs/gen_config.py makes of bridge/config.py today."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from bridge import cli, plugin_dist
from bridge.config import DOC, ENV_PREFIX, FIELDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")) + sorted(
    # the chart's and the compose demo's READMEs: read by users, so held to the same checks
    os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "deploy")) for f in fs if f.endswith(".md"))

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces → dashes."""
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    body = _FENCE.sub("", _text(path))
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.*)$", body, re.M)}


def broken_links(path: str) -> list[str]:
    bad = []
    for target in _LINK.findall(_FENCE.sub("", _text(path))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            bad.append(f"{target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


# A section named in prose: `README's "Deploy"`, `docs/deploy.md, "Plain manifests"`, `the chart
# README, "Permissions"`. The comments of deploy/ files point readers at sections this way too.
_SECTION_REF = re.compile(r"(?P<chart>chart )?(?P<file>\bREADME\b(?:\.md)?|[\w./-]+\.md)(?:'s)?,? (?:section )?"
                          r"\"(?P<name>[^\"\n]{2,80})\"")
SECTION_SOURCES = PAGES + sorted(
    os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "deploy"))
    for f in fs if f.endswith((".py", ".yaml", ".txt", ".tpl")) or f == "Dockerfile")


def broken_section_refs(path: str) -> list[str]:
    """Each section named in prose that its file lacks (no heading, nor bold lead-in, starting
    with that name). `README` is the repository's, or the chart's after `chart `."""
    bad = []
    for m in _SECTION_REF.finditer(_text(path)):
        name = m["file"]
        if name.startswith("README"):
            dest = os.path.join(ROOT, "deploy", "helm", "vllm-trace-bridge", "README.md") if m["chart"] \
                else os.path.join(ROOT, "README.md")
        else:
            dest = next((c for c in (os.path.join(os.path.dirname(path), name), os.path.join(ROOT, name))
                         if os.path.exists(c)), None)
            if dest is None:
                bad.append(f"{name}: no such file")
                continue
        body = _FENCE.sub("", _text(dest))
        titles = [t.strip().lower() for t in re.findall(r"^#{1,6}\s+(.*)$|^\*\*([^*]+)\*\*", body, re.M)
                  for t in t if t]
        if not any(t.startswith(m["name"].lower()) for t in titles):
            bad.append(f'{name}, "{m["name"]}": no such section')
    return bad


@pytest.mark.parametrize("source", SECTION_SOURCES, ids=lambda p: os.path.relpath(p, ROOT))
def test_sections_named_in_prose_exist(source):
    assert broken_section_refs(source) == []


def test_the_section_check_finds_missing_sections(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n## Real heading: more\n**Bold lead:** text\n")
    page = tmp_path / "a.md"
    page.write_text('see b.md, "Real heading" and b.md\'s "Bold lead", but b.md, "Gone" and the '
                    'README\'s "No such heading at all" and c.md, "X y"\n')
    assert broken_section_refs(str(page)) == ['b.md, "Gone": no such section',
                                              'README, "No such heading at all": no such section',
                                              "c.md: no such file"]


def test_the_link_check_finds_broken_links(tmp_path):
    (tmp_path / "b.md").write_text("# Real heading\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md) [ok](b.md#real-heading) [web](https://x.org/y) [no](c.md) "
                    "[no](b.md#missing)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(str(page)) == ["c.md: no such file", "b.md#missing: no heading #missing"]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, `plugin`'s own commands as `plugin wheel` and `plugin install`."""
    def subs(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    out = dict(subs(cli._parser()))
    out.update({f"plugin {name}": p for name, p in subs(out["plugin"]).items()})
    return out


def command_flags(text: str) -> list[tuple[str, str]]:
    """(command, --flag) for each flag written after `vllm-trace-bridge <command>`, up to the
    end of the command (line end without a trailing backslash, or a closing backquote)."""
    out = []
    for m in re.finditer(r"vllm-trace-bridge (replay|run|check|inject|plugin wheel|plugin install)\b((?:\\\n|[^\n`|])*)",
                         text):
        out += [(m[1], f) for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m[2])]
    return out


def test_flags_in_the_docs_exist():
    subs = _subparsers()
    known = {name: {o for a in p._actions for o in a.option_strings} for name, p in subs.items()}
    seen = [(os.path.relpath(p, ROOT), c, f) for p in PAGES for c, f in command_flags(_text(p))]
    assert seen, "the docs show no vllm-trace-bridge command with flags"
    assert [s for s in seen if s[2] not in known[s[1]]] == []


def test_the_flag_check_reads_commands():
    text = ("`vllm-trace-bridge replay --year 2025 f.log` and pip --no-deps\n"
            "vllm-trace-bridge run --include 'x' \\\n  --state-dir /s\n--not-this\n"
            "a | vllm-trace-bridge inject --image i - | kubectl apply -f -\n"
            "vllm-trace-bridge plugin install --target /d")
    assert command_flags(text) == [("replay", "--year"), ("run", "--include"), ("run", "--state-dir"),
                                   ("inject", "--image"), ("plugin install", "--target")]


def _source_text() -> str:
    parts = []
    for top in ("bridge", "tests", "bench", "deploy"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".c", ".sh", ".yaml", ".tpl")) and f != "test_docs.py":
                    parts.append(_text(os.path.join(dirpath, f)))
    return "\n".join(parts)


def test_variables_in_the_docs_exist():
    code = _source_text()
    named = {v for p in PAGES for v in re.findall(r"\bVLLM_TRACE_BRIDGE_[A-Z0-9_]*[A-Z0-9]\b", _text(p))}
    settings = {ENV_PREFIX + name.upper() for name in FIELDS}
    assert sorted(v for v in named if v not in settings and v not in code) == []


def test_every_setting_is_documented():
    assert sorted(FIELDS) == sorted(DOC), "describe each AgentConfig field in bridge.config.DOC"
    page = _text(os.path.join(ROOT, "docs", "configuration.md"))
    for name in FIELDS:
        assert f"| `{name}` | `--{name.replace('_', '-')}` | `{ENV_PREFIX}{name.upper()}` |" in page, name


def test_configuration_page_is_generated_from_the_code():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "gen_config.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_readme_is_a_front_door():
    text = _text(os.path.join(ROOT, "README.md"))
    assert len(text.encode()) <= 12 * 1024
    first = text.index("pip install . && vllm-trace-bridge replay bridge/samples/seed.log")
    assert first < text.index("pip install '.[test]' && python -m pytest") < text.index("\n## Replay")
    for page in ("replay", "agent", "deploy", "plugin", "trace-context", "configuration", "span-contract",
                 "troubleshooting", "performance", "upstream-vllm"):
        assert f"(docs/{page}.md)" in text, page


def test_metrics_in_the_docs_exist():
    """Every `vllm_trace_bridge_*` metric the docs name is one /metrics serves."""
    from bridge.telemetry import AgentCollector

    snapshot = {"lines_read": 0, "lines_by_kind": {}, "lines_unrecognised": 0, "lines_malformed": 0,
                "invalid_utf8": 0, "lines_oversized": 0, "lines_long": 0, "partials_joined": 0,
                "framing_errors": 0, "requests_open": 0, "requests_emitted": 0, "requests_evicted": 0,
                "engine_incidents": 0, "spans_sent": 0, "spans_retried": 0, "spans_dropped": 0,
                "skipped_delivered": 0, "queued_spans": 0, "latencies": [], "behind": {}, "files_watched": 0,
                "rotations": {}, "file_errors": {}, "checkpoint_age": 0, "checkpoint_delivered_listed": 0,
                "memory_pauses": 0,
                "join": {"gateway_entries": 0, "gateway_skipped": 0, "joined": 0, "expired": 0, "overflow": 0,
                         "contexts_dropped": 0, "waiting": 0}}
    served = set()
    for family in AgentCollector(lambda: snapshot).collect():
        served.add(family.name + "_total" if family.type == "counter" else family.name)
        served.update(s.name for s in family.samples)
    named = {m for p in PAGES for m in re.findall(r"\bvllm_trace_bridge_[a-z0-9_]*[a-z0-9]", _text(p))}
    named.discard(plugin_dist.MODULE)  # the plugin's module name (its wheel, its directory), not a metric
    # Short names in backticks; docs/rules.md's are rule fields (`kv_blocks_total`), not metrics.
    short = {m for p in PAGES if not p.endswith("rules.md") for m in re.findall(r"`([a-z_]+(?:_total|_seconds|_spans|_open|_watched|_waiting|"
                                                   r"_behind))(?:\{[a-z]+\})?`", _text(p))}
    named |= {"vllm_trace_bridge_" + m.removeprefix("vllm_trace_bridge_") for m in short - set(FIELDS)}
    assert sorted(named - served) == []
