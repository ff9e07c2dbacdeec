"""Inputs are bounded before they are expanded (issue 37, point 2): YAML an operator hands the
agent, a rule set of thousands of rules, a checkpoint that is not what the agent wrote."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from bridge.parse import yamlsafe
from bridge.parse.rules import MAX_RULES, RuleError, load_rules, parse_rules
from bridge.tail.checkpoint import CheckpointStore
from waits import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _laughs(levels: int = 9, width: int = 9) -> list[str]:
    """Anchors that refer to anchors: `width ** levels` values in `levels + 1` lines."""
    items = ["&a [" + ",".join(["'lol'"] * width) + "]"]
    for i in range(1, levels):
        items.append(f"&a{i} [" + ",".join([f"*a{i - 1}" if i > 1 else "*a"] * width) + "]")
    return items


def _under_1gib():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def _run(*args: str) -> subprocess.CompletedProcess:
    """The CLI under a 1 GiB address-space limit: expanding a bomb would fail with a MemoryError
    traceback, not the one-line refusal."""
    return subprocess.run([sys.executable, "-m", "bridge", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=deadline(300), preexec_fn=_under_1gib)


@pytest.mark.parametrize("flag", ["--config", "--rules"])
def test_a_billion_laughs_is_refused_in_one_line_naming_the_file(tmp_path, flag):
    path = tmp_path / "bomb.yaml"
    items = _laughs()
    if flag == "--config":
        path.write_text("include:\n" + "".join(f"  - {x}\n" for x in items))
        args = ["run", "--config", str(path)]
    else:
        path.write_text("".join(f"- {x}\n" for x in items))
        args = ["run", "--rules", str(path), "--include", str(tmp_path / "*.log")]
    r = _run(*args, "--otlp-endpoint", "http://127.0.0.1:9", "--state-dir", str(tmp_path / "state"))
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "aliases are expanded" in lines[0], r.stderr[-2000:]


def test_depth_aliases_and_size_each_have_a_limit(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("include: " + "[" * 200 + "]" * 200 + "\n")
    with pytest.raises(yamlsafe.YamlLimitError, match="deeper than"):
        yamlsafe.load(str(deep))
    many = tmp_path / "aliases.yaml"
    many.write_text("a: &x 1\nb: [" + ",".join(["*x"] * 200) + "]\n")
    with pytest.raises(yamlsafe.YamlLimitError, match="more than 100 aliases"):
        yamlsafe.load(str(many), max_aliases=100)
    assert yamlsafe.load(str(many))["b"] == [1] * 200  # under the limits: the ordinary document
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    r = _run("run", "--config", str(big), "--otlp-endpoint", "http://127.0.0.1:9")
    assert r.returncode == 2 and str(big) in r.stderr and "larger than 1 MiB" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1


def test_ten_thousand_rules_compile_in_groups_and_each_takes_its_own_line(tmp_path):
    n = 10_000
    path = tmp_path / "rules.yaml"
    with open(path, "w") as f:
        for i in range(n):
            f.write(f"- {{name: r{i}, fact: aborted, match: 'CANCEL{i} (?P<rid>\\S+) tail=(?P<x>\\w+)', "
                    "request_id: rid}\n")
    rules = load_rules(str(path))  # raised re2's "failed to compile Set" with one Set for all
    for i in (0, 1, 511, 512, 4321, n - 1):
        name, event = rules.rest(f"CANCEL{i} q{i} tail=abc")
        assert name == f"r{i}" and event.request_ids == (f"q{i}",)
    assert rules.rest(f"CANCEL{n} q tail=abc") is None
    assert rules.rest("CANCEL5 q5") is None  # the Set hit, the rule's own pattern did not


def test_more_rules_than_the_limit_are_refused_clearly():
    spec = [{"name": f"r{i}", "fact": "aborted", "match": f"X{i} (?P<rid>\\S+)", "request_id": "rid"}
            for i in range(MAX_RULES + 1)]
    with pytest.raises(RuleError, match=f"more than the {MAX_RULES:,}"):
        parse_rules(spec, "big.yaml")


def test_a_huge_checkpoint_is_refused_without_reading_it(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    with open(state / "checkpoints.json", "wb") as f:
        f.truncate(1 << 30)  # 1 GiB (sparse): read whole, it cost 1.3 GB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loaded = CheckpointStore(str(state)).load()
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert loaded.files is None and loaded.used == "none"
    assert "larger than" in loaded.damaged[0]
    assert grew_mb < 100, grew_mb
