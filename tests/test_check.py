"""`vllm-trace-bridge check`: recognition per kind, version family, unknown templates."""

import io
from pathlib import Path

import pytest

from bridge.check import check_file, template
from bridge.cli import main

ROOT = Path(__file__).parent
SAMPLE = ROOT.parent / "bridge" / "samples" / "seed.log"
FIXTURES = ROOT / "fixtures" / "upstream"

FAMILIES = {
    "v0_4_plain.log": "V0 ≤0.7 (vLLM 0.4.0)",
    "v0_6_mq.log": "V0 ≤0.7 (vLLM 0.6.5)",
    "v0_8_bracket.log": "V0 0.8+ (vLLM 0.8.0)",
    "nccl_ray.log": "V0 0.8+ (vLLM 0.9.0)",
    "v1_modern.log": "V1 (vLLM 0.14.0)",
    "v1_early_prefixes.log": "V1 (vLLM 0.8.4)",
    "v1_colour_prefix.log": "V1 (vLLM 0.12.0)",
    "v1_model_load.log": "V1 (vLLM 0.10.1)",
    "v1_engine_dead.log": "V1",
    "shipper.log": "V1",
}


def test_the_shipped_sample_is_fully_recognised_as_the_seed_dialect():
    r = check_file(str(SAMPLE))
    assert (r.family, r.recognised, r.unrecognised_lines, r.malformed_lines) == ("seed dialect", r.records, 0, 0)
    assert r.records == 762 and r.recognised_pct == 100.0


@pytest.mark.parametrize("name,family", sorted(FAMILIES.items()))
def test_every_fixture_is_fully_recognised_and_its_family_named(name, family):
    r = check_file(str(FIXTURES / name))
    assert r.unrecognised_lines == 0 and r.malformed_lines == 0, r.unrecognised
    assert r.recognised == r.records > 0
    assert r.family == family


def test_fixture_kinds_are_counted_as_written():
    r = check_file(str(FIXTURES / "v1_modern.log"))
    assert r.by_kind == {
        "engine_config": 1, "engine_stats": 2, "http_access": 1, "http_server": 2,
        "request_aborted": 1, "request_added": 6, "request_failed": 1, "request_received": 5,
        # the API server's non-default args name the model; the graph capture's progress bar is a startup line
        "response_generated": 3, "startup": 8,
    }
    r = check_file(str(FIXTURES / "v1_engine_dead.log"))
    assert (r.physical_lines, r.records, r.joined) == (24, 10, 14)


def test_unknown_lines_are_listed_as_masked_templates():
    r = check_file(str(FIXTURES / "unknown.log"))
    assert (r.records, r.recognised, r.unrecognised_lines) == (6, 0, 6)
    assert r.unrecognised.most_common() == [
        ("hello from a sidecar <n>", 3), ("Frobnicated widget <hex> in <n> ms", 2), ("custom-app: user=<n> logged in", 1)]


def test_templates_mask_ids_hex_numbers_and_quoted_text():
    assert template("Added request chatcmpl-a269fdcb7c6ce890-a8a65d16 after 12.5 ms") == "Added request <id> after <n> ms"
    assert template("block 0x7f8c4a at deadbeef01 said 'my prompt'\nmore") == "block <hex> at <hex> said '…'"


def test_cli_check_prints_the_report_and_totals():
    out = io.StringIO()
    code = main(["check", str(SAMPLE), str(FIXTURES / "unknown.log")], env={}, out=out)
    text = out.getvalue()
    assert code == 0
    assert "family        seed dialect" in text and "recognised    762 (100.0 %)" in text
    assert "top unrecognised templates:" in text and "hello from a sidecar <n>" in text
    assert "total         762/768 records recognised (99.2 %) in 2 files" in text


def test_cli_check_missing_file_is_a_usage_error(capsys):
    assert main(["check", "/nonexistent.log"], env={}, out=io.StringIO()) == 2
    assert "no such file" in capsys.readouterr().err


def test_templates_mask_paths_and_padding():
    """Lines that differ by a path or by how a terminal padded them are one family."""
    assert template("Loading from /models/llama/x.bin   ") == template("Loading from C:\\Users\\me\\x.bin") \
        == "Loading from <path>"
    assert template("(EngineCore pid=7)     raise ValueError(") == "(EngineCore pid=<n>) raise ValueError("


def test_families_of_unknown_lines_across_files_fit_one_screen(tmp_path):
    """check on many files: each family of unknown lines once, its lines and files counted, the
    biggest first, at most `top` rows and one more for the rest."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("sidecar: synced /data/a/1.bin in 3 ms\nsidecar: synced /data/b/2.bin in 4 ms\nfoo 1\n")
    b.write_text("sidecar: synced /srv/c/3.bin in 5 ms\nbar 0x1f\n")
    out = io.StringIO()
    assert main(["check", str(a), str(b)], env={}, out=out) == 0
    text = out.getvalue()
    section = text[text.index("line families not understood"):].splitlines()
    assert section[0] == "line families not understood across 2 files (3 families; lines, files):"
    assert section[1].split() == ["3", "2", "sidecar:", "synced", "<path>", "in", "<n>", "ms"]
    assert sorted(" ".join(line.split()[2:]) for line in section[2:4]) == ["bar <hex>", "foo <n>"]
    reports = [check_file(str(p)) for p in (a, b)]
    # a line a rule's start claims but whose rest it cannot read (malformed) is not understood
    # either: it is a family too (`--rules` takes it)
    c = tmp_path / "c.log"
    c.write_text("INFO 06-09 05:30:58 [loggers.py:236] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg gen\n")
    from bridge.check import families
    assert families([check_file(str(c))]) == [("Engine <n>: Avg prompt throughput: <n> tokens/s, Avg gen", 1, 1)]
    from bridge.check import render_families
    short = render_families(reports, top=1).splitlines()
    assert len(short) == 3 and short[2].split()[:2] == ["2", "…"]
