"""Real logs users pasted in public issues, replayed, against what an operator reads in them.

Each excerpt under `tests/corpus/<platform>/` is kept verbatim with its source; its expectations
in `tests/corpus/expectations.yaml` were written from the log alone, before the bridge ever ran
on it (README there). One test per excerpt and per expectation, so a miss names what was missed.
Expectations the bridge does not meet yet are listed in `GAPS` (strict xfail): the table says
what is missing, the expectation itself stays as the operator wrote it.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from bridge.assemble.timeline import EngineTimeline, RequestTimeline
from bridge.pipeline import ReplayConfig, replay

CORPUS = Path(__file__).parent / "corpus"


class _Loader(yaml.SafeLoader):
    """YAML without its timestamp type: `at` stays the text the operator wrote (its digits say
    its resolution)."""


_Loader.yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
                                   for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
EXPECTATIONS = yaml.load((CORPUS / "expectations.yaml").read_text(encoding="utf-8"), Loader=_Loader)
ASPECTS = ("incidents", "error", "engine", "at", "startup", "requests")
STARTUP = "startup"
#: startup facts an operator names → the span attribute that carries them
FACT_KEYS = {"model": "gen_ai.request.model", "version": "vllm.version"}

#: (excerpt, aspect) → the gap that keeps the bridge from meeting it. Strict: a fixed gap fails
#: here until its row is removed.
GAPS: dict[tuple[str, str], str] = {
}


@functools.cache
def _replayed(name: str) -> tuple[list[RequestTimeline], list[EngineTimeline], list[EngineTimeline]]:
    out: list = []
    replay([str(CORPUS / name)], [out.append], ReplayConfig(year=EXPECTATIONS[name]["year"]))
    requests = [t for t in out if isinstance(t, RequestTimeline)]
    engines = sorted((t for t in out if isinstance(t, EngineTimeline)), key=lambda t: t.start_ns)
    return requests, [t for t in engines if t.kind != STARTUP], [t for t in engines if t.kind == STARTUP]


def _cases():
    for name, exp in EXPECTATIONS.items():
        for aspect in ASPECTS:
            if aspect not in exp or (aspect in ("error", "engine", "at") and not exp.get("incidents")):
                continue
            marks = []
            gap = GAPS.get((name, aspect))
            if gap:
                marks.append(pytest.mark.xfail(strict=True, reason=gap))
            yield pytest.param(name, aspect, marks=marks, id=f"{name}:{aspect}")


def _ns(stamp: str) -> tuple[int, int]:
    """An ISO stamp → (ns, resolution in ns): to the second unless it has a fraction."""
    dt = datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc)
    if "." in stamp:
        digits = len(stamp.rsplit(".", 1)[1])
        return int(dt.timestamp() * 10**digits) * 10 ** (9 - digits), 10 ** (9 - digits)
    return int(dt.timestamp()) * 10**9, 10**9


def test_every_excerpt_has_its_source_and_file():
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.log")}
    assert on_disk == set(EXPECTATIONS)
    for name, exp in EXPECTATIONS.items():
        assert exp["source"].startswith("https://github.com/"), name
        assert {"platform", "wrapper", "year", "incidents"} <= set(exp), name
    assert not set(GAPS) - {(n, a) for n, e in EXPECTATIONS.items() for a in e}, "a GAPS row names no expectation"


@pytest.mark.parametrize("name, aspect", list(_cases()))
def test_corpus(name, aspect):
    exp = EXPECTATIONS[name]
    requests, incidents, startups = _replayed(name)
    want = exp[aspect]
    if aspect == "incidents":
        assert [(i.kind, i.error_type) for i in incidents] == [(i.kind, i.error_type) for i in incidents[:want]]
        assert len(incidents) == want, [(i.kind, i.error_type, i.attrs.get("vllm.process")) for i in incidents]
        return
    if aspect in ("error", "engine", "at"):
        assert incidents, "no incident"
        first = incidents[0]
        if aspect == "error":
            assert first.error_type == want, (first.kind, first.message[:200])
        elif aspect == "engine":
            assert want in str(first.attrs.get("vllm.process", "")), first.attrs
        else:
            ns, resolution = _ns(want)
            assert first.start_ns // resolution * resolution == ns, datetime.fromtimestamp(
                first.start_ns / 1e9, timezone.utc).isoformat()
        return
    if aspect == "startup":
        if want is False:
            assert not startups, [s.attrs for s in startups]
            return
        assert startups, "no startup span"
        for key, value in want.items():
            if key == "failed":
                assert any(s.error_type for s in startups) == value, [s.attrs for s in startups]
                continue
            attr = FACT_KEYS.get(key, f"vllm.startup.{key}")
            got = [s.attrs[attr] for s in startups if attr in s.attrs]
            assert got, f"no {attr} in {[s.attrs for s in startups]}"
            if isinstance(value, str):
                assert value in got
            else:
                assert any(abs(g - value) <= 1e-3 * max(1.0, abs(value)) for g in got), (attr, got, value)
        return
    by_id: dict[str, list[RequestTimeline]] = {}
    for r in requests:
        by_id.setdefault(r.request_id, []).append(r)
    for rid, outcome in want.items():
        assert rid in by_id, f"{rid} not among {sorted(by_id)}"
        if outcome != "seen":
            assert [r.error_type for r in by_id[rid]] == [outcome], [(r.outcome, r.error_type) for r in by_id[rid]]
