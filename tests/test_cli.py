import io
import subprocess
import sys
from pathlib import Path

from bridge.cli import main
from waits import deadline

SAMPLE = str(Path(__file__).parent.parent / "bridge" / "samples" / "seed.log")


def run(*argv, env=None):
    out = io.StringIO()
    return main(list(argv), env=env or {}, out=out), out.getvalue()


def test_sample_without_endpoint_draws_waterfalls_and_a_summary():
    code, out = run("replay", SAMPLE, "--waterfalls", "5")
    assert code == 0
    assert out.count("|") >= 10 and "decode" in out
    assert "requests     60 (" in out
    assert "(+" in out and "more not drawn" in out
    assert "0 malformed" in out


def test_missing_file_is_a_usage_error(capsys):
    code, _ = run("replay", "/nonexistent/vllm.log")
    assert code == 2
    assert "no such file" in capsys.readouterr().err


def test_bad_timezone_names_the_flag(capsys):
    code, _ = run("replay", SAMPLE, "--timezone", "Mars/Olympus")
    assert code == 2
    assert "--timezone" in capsys.readouterr().err


def test_bad_protocol_from_environment_is_named(capsys):
    code, _ = run("replay", SAMPLE, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                                         "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})
    assert code == 2
    assert "grpc or http/protobuf" in capsys.readouterr().err


def test_negative_threshold_is_rejected(capsys):
    code, _ = run("replay", SAMPLE, "--slow-ttft-ms", "-1")
    assert code == 2
    assert "--slow-ttft-ms" in capsys.readouterr().err


def test_console_script_runs_as_a_process():
    proc = subprocess.run([sys.executable, "-m", "bridge", "replay", SAMPLE, "--waterfalls", "0"],
                          capture_output=True, text=True, timeout=deadline(60))
    assert proc.returncode == 0, proc.stderr
    assert "requests     60" in proc.stdout
