"""Issue #23: a command line and an agent that speak clearly. Every test drives the real
command (`python -m bridge …`) as a subprocess; expectations come from the input (the sample
log's own lines, the flags given), never from earlier output of the bridge."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
from agentkit import free_port, spawn
from receivers import GrpcReceiver, attrs
from waits import deadline

ROOT = Path(__file__).parent.parent
SAMPLE = ROOT / "bridge" / "samples" / "seed.log"
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_TRACE_BRIDGE_"))}
_SUMMARY = re.compile(r"^\w+ (\d\d-\d\d \d\d:\d\d:\d\d) \S+\] Request (0x[0-9a-f]+): .*total_latency=([\d.]+)(ms|s)$")


def bridge(*args: str, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**ENV, **(env or {})}, timeout=deadline(120) if timeout is None else timeout)


def reported(path: Path = SAMPLE, year: int = 2026) -> list[tuple[str, int, float]]:
    """(request id, summary line's stamp in ns (UTC), total_latency in s) for each summary line."""
    out = []
    for line in path.read_text().splitlines():
        m = _SUMMARY.match(line)
        if m:
            stamp = datetime.strptime(f"{year}-{m[1]}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
            out.append((m[2], int(stamp.timestamp()) * 1_000_000_000, float(m[3]) / (1000 if m[4] == "ms" else 1)))
    return out


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr  # one clean line, no usage dump
    return lines[0]


# -- 1. flags, help, errors ---------------------------------------------------------------------------

SHARED = ("--otlp-endpoint", "--otlp-protocol", "--year", "--timezone", "--ttl", "--slow-ttft-ms", "--slow-itl-ms",
          "--low-free-blocks-pct", "--high-gpu-memory-pct", "--export-error-text")


def _options(help_text: str) -> dict[str, str]:
    """option → its help entry (flag line plus wrapped continuation lines)."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        m = re.match(r"^  (--?[\w-]+)", line)
        if m:
            current = m[1]
            entries[current] = line
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("command", ["replay", "run"])
def test_shared_flags_have_one_spelling_and_every_flag_says_its_default(command):
    p = bridge(command, "--help")
    assert p.returncode == 0, p.stderr
    assert "%%" not in p.stdout
    opts = _options(p.stdout)
    for flag in SHARED:
        assert flag in opts, (command, flag)
    assert "--protocol" not in opts  # the old spelling still works (below) but is not advertised
    for flag, entry in opts.items():
        if flag in ("-h", "--help", "--config", "--print-config"):
            continue
        assert "(default:" in entry, (command, entry)
    # metavars name what to give, not the flag's last word
    assert "--ttl SECONDS" in p.stdout and " UP" not in p.stdout
    if command == "run":
        assert "--export-give-up SECONDS" in p.stdout and "--state-dir DIR" in p.stdout


def test_check_help_has_no_literal_percent_signs():
    p = bridge("check", "--help")
    assert p.returncode == 0 and "%%" not in p.stdout and "(default: 10)" in p.stdout


def test_http_is_accepted_by_replay_and_run_alike(tmp_path):
    p = bridge("run", "--otlp-protocol", "http", "--otlp-endpoint", "http://127.0.0.1:4318", "--print-config")
    assert p.returncode == 0, p.stderr
    assert "otlp_protocol: http/protobuf" in p.stdout
    for flag in ("--otlp-protocol", "--protocol"):  # the old replay spelling is a hidden alias
        p = bridge("replay", str(SAMPLE), flag, "http", "--waterfalls", "0")
        assert p.returncode == 0, p.stderr
    for command in (["run", "--otlp-endpoint", "http://127.0.0.1:1"], ["replay", str(SAMPLE)]):
        line = one_line_error(bridge(*command, "--otlp-protocol", "pigeon"))
        assert "pigeon" in line and "grpc" in line and "http/protobuf" in line


def test_replay_usage_errors_are_one_line_naming_the_fix():
    line = one_line_error(bridge("replay"))
    assert "PATH" in line and "--help" in line
    line = one_line_error(bridge("replay", str(SAMPLE), "--ttl", "soon"))
    assert "--ttl" in line and "soon" in line
    line = one_line_error(bridge("replay", str(SAMPLE), "--slow-ttft-ms", "-5"))
    assert line.count("--slow-ttft-ms") == 1 and "0 or more" in line


def test_a_typoed_config_key_gets_a_did_you_mean(tmp_path):
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text("stat_dir: /tmp/x\n")
    line = one_line_error(bridge("run", "--config", str(cfg), "--print-config"))
    assert "'stat_dir'" in line and "did you mean 'state_dir'" in line
    assert "namespaces" not in line  # not the whole list of keys


@pytest.mark.parametrize("command", [["replay", str(SAMPLE), "--waterfalls", "0"],
                                     ["run", "--otlp-endpoint", "http://127.0.0.1:1", "--print-config"]])
def test_a_typoed_environment_variable_is_warned_about(command):
    p = bridge(*command, env={"VLLM_TRACE_BRIDGE_STAT_DIR": "/tmp/x", "VLLM_TRACE_BRIDGE_PURE": "1",
                              "VLLM_TRACE_BRIDGE_TTL": "30"})
    assert p.returncode == 0, p.stderr
    warned = [json.loads(line) for line in p.stderr.splitlines() if "unknown_environment_variable" in line]
    assert len(warned) == 1, p.stderr  # PURE (used on purpose) and TTL (a setting) are not warned about
    assert "VLLM_TRACE_BRIDGE_STAT_DIR" in warned[0]["problem"]
    assert "did you mean VLLM_TRACE_BRIDGE_STATE_DIR" in warned[0]["problem"]


def test_replay_reads_a_directory_as_its_log_files(tmp_path):
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    (tmp_path / "a.log").write_bytes(b"".join(lines))
    with gzip.open(tmp_path / "a.log.20260215-102300.gz", "wb") as f:  # rotated sibling: read too
        f.write(b"".join(lines))
    (tmp_path / "notes.txt").write_text("not a log\n")
    p = bridge("replay", str(tmp_path), "--waterfalls", "0")
    assert p.returncode == 0, p.stderr
    assert f"lines        {2 * len(lines)} in 2 file(s)" in p.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_line_error(bridge("replay", str(empty)))
    assert str(empty) in line and "*.log" in line
    assert "no such file or directory" in one_line_error(bridge("replay", str(tmp_path / "missing")))


def test_replay_reads_rotated_siblings_before_the_live_file(tmp_path):
    from bridge.cli import log_files

    for i, name in enumerate(["0.log.20260101-000000.gz", "0.log.20260102-000000", "0.log", "1.log"]):
        path = tmp_path / name
        path.write_text("x\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    assert [os.path.basename(p) for p in log_files([str(tmp_path)])] == [
        "0.log.20260101-000000.gz", "0.log.20260102-000000", "0.log", "1.log"]


def test_replay_says_promptly_when_nothing_listens_at_the_endpoint():
    port = free_port()
    proc = spawn([sys.executable, "-m", "bridge", "replay", str(SAMPLE), "--otlp-endpoint",
                  f"http://127.0.0.1:{port}"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    try:
        line = proc.stderr.readline()
        said_after = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait(deadline(10))
    event = json.loads(line)
    assert event["event"] == "export_retrying" and event["endpoint"] == f"http://127.0.0.1:{port}", line
    assert "--otlp-endpoint" in event["fix"]
    # the SDK's own retries would take ~7.6 s before a word: the word comes before that, whatever the
    # machine's start-up time (a scaled allowance over the 1 s a start takes unloaded)
    assert said_after < 6.6 + deadline(1)


# -- 3. the waterfall -----------------------------------------------------------------------------------


def _waterfalls(out: str, ids: str = r"0x[0-9a-f]+") -> list[tuple[str, str, list[str]]]:
    """(request id, head line, phase lines) for each drawn request."""
    found = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        m = re.match(rf"^({ids})  ", line)
        if m:
            phases = []
            for nxt in lines[i + 1:]:
                if not re.match(r"^  \S+\s*\|", nxt):
                    break
                phases.append(nxt)
            found.append((m[1], line, phases))
    return found


def test_waterfall_summary_first_legend_reported_durations_and_one_rule_for_inferred():
    p = bridge("replay", str(SAMPLE), "--waterfalls", "1000")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.index("requests     60") < out.index("legend:") < out.index("0x")
    legend = next(line for line in out.splitlines() if line.startswith("legend:"))
    for symbol in "░▓▒█·¦~≈":
        assert symbol in legend
    drawn = _waterfalls(out)
    by_id: dict[str, list[float]] = {}
    for rid, _, tl in reported():
        by_id.setdefault(rid, []).append(tl)
    checked = 0
    for rid, head, phases in drawn:
        m = re.search(r"e2e ([≈≤≥]?)([\d.]+)(ms|s)(…)?", head)
        shown = float(m[2]) / (1000 if m[3] == "ms" else 1)
        if rid in by_id and not m[1] and not m[4]:
            assert any(abs(shown - tl) < 0.0006 for tl in by_id[rid]), (head, by_id[rid])
            checked += 1
        for phase in phases:
            bar, mark = phase.split("|")[1], phase.split("|")[2][0]
            assert ("¦" in bar) == (mark == "~"), phase  # inferred: drawn ¦ and marked ~, always together
    assert checked == len(reported())  # every reported request shows its own total_latency
    assert "0x7f8c4a001080  finished  e2e 1.739s" in out  # the example: total_latency=1.7390s


def test_waterfall_screens_share_a_time_axis():
    p = bridge("replay", str(SAMPLE), "--waterfalls", "1000")
    lines = p.stdout.splitlines()
    tl_of = {}
    for rid, _, tl in reported():
        tl_of.setdefault(rid, tl)
    axes = [i for i, line in enumerate(lines) if re.match(r"^ {15}0 +[\d.]+m?s$", line)]
    assert len(axes) >= 60 // 8
    for i in axes:
        axis_end = lines[i].split()[-1]
        # every request on this screen fits the axis: its bar never runs past it
        j = i + 2
        while j < len(lines) and not re.match(r"^ {15}0 ", lines[j]) and not lines[j].startswith(("ENGINE", "STARTUP", "≈", "(+")):
            if re.match(r"^  \S+\s*\|", lines[j]):
                assert lines[j].count("|") == 2 and len(lines[j].split("|")[1]) == 48
            j += 1
        assert axis_end.endswith("s")


def test_the_default_waterfall_count_fits_a_screen():
    p = bridge("replay", str(SAMPLE))
    assert p.returncode == 0, p.stderr
    drawn = len(_waterfalls(p.stdout)) + p.stdout.count("\nENGINE ") + p.stdout.count("\nSTARTUP ")
    assert drawn == 10
    assert "more not drawn; --waterfalls N draws more" in p.stdout


@pytest.mark.parametrize("pure", ["", "1"], ids=["c", "pure"])
def test_the_root_span_starts_at_the_reported_arrival(pure):
    """vLLM's total_latency fixes the arrival: summary line's stamp − total_latency. A first line
    stamped earlier in that same second is the stamp's truncation, not an earlier start."""
    with GrpcReceiver() as rx:
        p = bridge("replay", str(SAMPLE), "--otlp-endpoint", rx.endpoint, "--year", "2026", "--timezone", "UTC",
                   env={"VLLM_TRACE_BRIDGE_PURE": pure})
        assert p.returncode == 0, p.stderr
        roots = [s for _, s in rx.spans() if s.name == "vllm.request"]
    checked = 0
    for rid, stamp, tl in reported():
        (root,) = [s for s in roots if attrs(s.attributes)["vllm.request.id"] == rid
                   and abs(attrs(s.attributes).get("vllm.e2e_s", -1) - tl) < 1e-9]
        assert root.start_time_unix_nano == stamp - round(tl * 1e9), rid
        checked += 1
    assert checked == 55
    (example,) = [s for s in roots if attrs(s.attributes)["vllm.request.id"] == "0x7f8c4a001080"
                  and attrs(s.attributes).get("vllm.e2e_s") == 1.739]
    assert example.end_time_unix_nano - example.start_time_unix_nano == 1_739_000_000


# -- 2. the agent says what it follows ------------------------------------------------------------------


def _kubelet(tmp: Path, pod: str, container: str) -> Path:
    d = tmp / "pods" / f"default_{pod}_0a1b2c3d-0000-4000-8000-00000000000{len(pod) % 10}" / container
    d.mkdir(parents=True)
    shutil.copy(SAMPLE, d / "0.log")
    return d / "0.log"


def _run_agent(tmp: Path, *flags: str, seconds: float = 3.0) -> tuple[list[dict], str]:
    port = free_port()
    proc = spawn([sys.executable, "-m", "bridge", "run", "--state-dir", str(tmp / "state"), "--listen",
                  f"127.0.0.1:{port}", "--otlp-endpoint", f"http://127.0.0.1:{free_port()}", *flags],
                 cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = ""
    try:
        until = time.monotonic() + deadline(20)
        while time.monotonic() < until:
            try:
                metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=deadline(2)).read().decode()
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(seconds)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=deadline(2)).read().decode()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=deadline(30))
    return [json.loads(line) for line in err.splitlines()], metrics  # every line JSON, SDK's too


def test_agent_logs_what_it_follows_and_why_not_the_rest(tmp_path):
    followed = _kubelet(tmp_path, "vllm-0", "vllm")
    skipped = _kubelet(tmp_path, "myserver-0", "server")
    plain = tmp_path / "other" / "x.log"
    plain.parent.mkdir()
    shutil.copy(SAMPLE, plain)
    events, metrics = _run_agent(tmp_path, "--include", str(tmp_path / "pods/*/*/*.log"),
                                 "--include", str(tmp_path / "other/*.log"), "--progress-interval", "0.5",
                                 "--export-give-up", "1", "--containers", "*vllm*")  # names decide here
    by = {}
    for e in events:
        by.setdefault(e["event"], []).append(e)
    assert {e["path"] for e in by["file_followed"]} == {str(followed), str(plain)}
    (plain_line,) = [e for e in by["file_followed"] if e["path"] == str(plain)]
    assert "not a kubelet path" in plain_line["note"]
    (skip,) = by["file_skipped"]
    assert skip["path"] == str(skipped) and skip["kind"] == "filter"
    assert "'server'" in skip["reason"] and "containers" in skip["reason"] and "*vllm*" in skip["reason"]
    assert 'vllm_trace_bridge_files_skipped{reason="filter"} 1.0' in metrics
    assert "vllm_trace_bridge_files_watched 2.0" in metrics
    # export trouble and progress: their own JSON lines, the SDK's too (no plain text on stderr)
    assert by.get("export_progress"), list(by)
    assert by.get("opentelemetry_log") or by.get("export_retrying"), list(by)
    (stopped,) = by["agent_stopped"]
    assert stopped["requests_finished"] > 0
    assert ("note" in stopped) == (stopped["requests_open"] > 0)  # open requests at stop are explained


def test_agent_warns_when_it_follows_nothing(tmp_path):
    events, metrics = _run_agent(tmp_path, "--include", str(tmp_path / "nowhere/*/*.log"), seconds=1.0)
    (warning,) = [e for e in events if e["event"] == "following_nothing"]
    assert warning["level"] == "warning"
    assert warning["include"] == {str(tmp_path / "nowhere/*/*.log"): f"{tmp_path / 'nowhere'} does not exist"}
    assert "vllm_trace_bridge_files_watched 0.0" in metrics


def test_the_summary_says_why_some_requests_have_no_e2e():
    p = bridge("replay", str(SAMPLE), "--waterfalls", "0")
    total = int(re.search(r"^requests     (\d+) ", p.stdout, re.M)[1])
    with_latency = len(reported())  # the sample's own total_latency lines
    assert re.search(rf"^e2e .* {with_latency}$", p.stdout, re.M)
    # every request of the sample without a total_latency line did not finish (timeout, failure,
    # or cut off): the note says so, with their count
    assert f"note         e2e: {total - with_latency} requests that did not finish" in p.stdout


def test_an_inferred_queued_scheduled_boundary_is_drawn_one_way():
    """With one-second stamps the split of ttft between queued and scheduled is not known; the
    issue's two requests drew it two ways (all queued / all scheduled). Now both phases show the
    range they lie in, which is arrival → first token: the log's own ttft."""
    ttft = {}
    for line in SAMPLE.read_text().splitlines():
        m = re.search(r"Request (0x[0-9a-f]+): .*ttft=([\d.]+)ms, .*total_latency=([\d.]+)s", line)
        if m:
            ttft[(m[1], round(float(m[3]), 3))] = float(m[2])
    p = bridge("replay", str(SAMPLE), "--waterfalls", "1000")
    checked = 0
    for rid, head, phases in _waterfalls(p.stdout):
        e2e = re.search(r"e2e ([\d.]+)(ms|s)", head)  # None when not reported (≈, ≤, ≥): no ttft either
        if e2e is None:
            continue
        key = (rid, round(float(e2e[1]) / (1000 if e2e[2] == "ms" else 1), 3))
        named = {ph.split("|")[0].strip(): ph for ph in phases}
        if key not in ttft or "queued" not in named or "prefill" not in named:
            continue
        q, s = named["queued"].split("|")[2], named["prefill"].split("|")[2]
        if "~" in q or "~" in s:
            assert q == s == f"~{'≤' + format(ttft[key], '.1f') + 'ms':>9}", (rid, q, s, ttft[key])
            checked += 1
    assert checked >= 2  # the 0x7f8c4a0010b0 and 0x7f8c4a001080 among them


def test_the_follower_says_why_it_skips_unreadable_files_and_directories(tmp_path, monkeypatch):
    """Unit level (tests run as root, who may read anything): an open refused with EACCES and a
    directory matching the glob are skipped with their reasons, once, and counted by kind."""
    from bridge.tail import follow

    (tmp_path / "a.log").write_text("x\n")
    (tmp_path / "b.log").write_text("y\n")
    (tmp_path / "dir.log").mkdir()
    real_open = follow._open

    def refuse(path):
        if path.endswith("b.log"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path)

    monkeypatch.setattr(follow, "_open", refuse)
    now = [100.0]
    f = follow.Follower(follow.Filters((str(tmp_path / "*.log"),)), clock=lambda: now[0])
    f.discover(first_round=True)
    changes = {(c.action, os.path.basename(c.path), c.kind) for c in f.take_changes()}
    assert changes == {("followed", "a.log", ""), ("skipped", "b.log", "unreadable"),
                       ("skipped", "dir.log", "not_a_file")}
    assert "permission denied" in f.skipped[str(tmp_path / "b.log")][1]
    f.discover()
    assert f.take_changes() == []  # said once, not on every look
    assert f.skipped_by_kind() == {"filter": 0, "unreadable": 1, "loop": 0, "not_a_file": 1, "duplicate": 0}
    monkeypatch.setattr(follow, "_open", real_open)  # made readable: followed, no longer skipped
    (tmp_path / "b.log").write_text("y2\n")
    f._listings.clear()
    f.discover()
    assert f.take_changes() == []  # tried again only after its backoff
    now[0] += follow.RETRY_FIRST_S
    f.discover()
    assert [(c.action, os.path.basename(c.path)) for c in f.take_changes()] == [("followed", "b.log")]
    assert f.skipped_by_kind()["unreadable"] == 0
    f.close()


def test_a_waterfall_names_the_incident_a_request_was_in_flight_for():
    """The sample's CUDA OOM (`Failed to allocate memory for request 0x7f8c4a001140`) was an
    incident while others ran: their waterfalls name its kind and type. The event carries no
    text (privacy), so nothing is printed where a message would be: never `None`."""
    out = bridge("replay", "bridge/samples/seed.log", "--waterfalls", "100").stdout
    assert "  ! engine incident in flight: cuda_oom, error.type oom" in out
    assert not [line for line in out.splitlines() if line.startswith("  ! ") and "None" in line]


@pytest.mark.parametrize("containers_first", [False, True])
def test_a_file_reached_by_its_symlink_and_its_real_path_is_followed_once(tmp_path, containers_first):
    """kubelet's /var/log/containers/*.log are symlinks to /var/log/pods/…/0.log. Included both
    ways, one file was followed twice under two source keys, and every request went out as two
    traces (found by a review). Followed once, by its real path, the other name skipped."""
    from bridge.tail import follow

    real = tmp_path / "pods" / "llm_vllm-0_3f2a9c1e-1111-2222-3333-444455556666" / "vllm" / "0.log"
    real.parent.mkdir(parents=True)
    real.write_text("x\n")
    (tmp_path / "containers").mkdir()
    link = tmp_path / "containers" / ("vllm-0_llm_vllm-" + "ab" * 32 + ".log")
    link.symlink_to(real)
    globs = [str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "containers/*.log")]
    f = follow.Follower(follow.Filters(tuple(reversed(globs) if containers_first else globs)))
    f.discover(first_round=True)
    assert [tf.path for tf in f.files] == [str(real)]
    assert f.skipped[str(link)][0] == "duplicate" and str(real) in f.skipped[str(link)][1]
    f.discover()
    assert [tf.path for tf in f.files] == [str(real)] and f.skipped_by_kind()["duplicate"] == 1
    f.close()


def test_an_end_no_line_states_is_a_range_that_holds_the_clients_end_and_stays_out_of_e2e():
    """vLLM V1 logs no end for a completion: without the plugin its end is the next line that
    shows the engine idle. The waterfall shows such a request's e2e as a bound (`≤b`, `a…b`),
    never as a number, the bound holds the end the client itself saw (its record, not the
    bridge's), and the summary leaves the request out of the e2e percentiles, saying why."""
    import json

    fixture = ROOT / "tests" / "fixtures" / "scenarios" / "queue_pressure"
    truth = json.loads((fixture / "truth.json").read_text())
    p = bridge("replay", str(fixture / "server.log"), "--waterfalls", "1000")
    assert p.returncode == 0, p.stderr
    ended = {}
    for t in truth["requests"]:
        if t["kind"] == "completion" and t["response_id"]:
            ended[t["response_id"] + "-0" if not t["response_id"].endswith("-0") else t["response_id"]] = t
    bounded = 0
    for rid, head, _phases in _waterfalls(p.stdout, r"(?:chat)?cmpl-\S+"):
        m = re.search(r"e2e (?:≤|[\d.]+(?:ms|s)…)([\d.]+)(ms|s)", head)
        if rid not in ended:
            continue
        assert m is not None, head  # a completion's end is stated by no line: never a plain number
        high = float(m[1]) / (1000 if m[2] == "ms" else 1)
        t = ended[rid]
        # the bound runs from the root's start (vLLM's `Received request`, after the client's
        # send) to the engine's idle line, after the client's end
        assert (t["t_end_ns"] - t["t_send_ns"]) / 1e9 <= high + 0.001, (head, t)
        bounded += 1
    assert bounded == len(ended) > 0
    summary = p.stdout[:p.stdout.index("legend:")]
    n = int(re.search(r"^e2e .* (\d+)$", summary, re.M)[1])
    left_out = int(re.search(r"e2e: (\d+) finished requests are left out", summary)[1])
    assert left_out == len(ended) and n + left_out == len(truth["requests"])
    assert "one-second" not in p.stdout  # CRI stamps are nanoseconds: no such excuse is printed


# -- what `replay` draws: --request, --errors, --slowest; the user's own text on their terminal ---------


def test_replay_draws_the_request_the_client_names_by_the_id_it_received():
    import json

    fixture = ROOT / "tests" / "fixtures" / "scenarios" / "queue_pressure"
    wanted = json.loads((fixture / "truth.json").read_text())["requests"][1]["response_id"]  # the client's id
    p = bridge("replay", str(fixture / "server.log"), "--request", wanted)
    assert p.returncode == 0, p.stderr
    drawn = _waterfalls(p.stdout, r"(?:chat)?cmpl-\S+")
    assert [rid for rid, _h, _p in drawn] in ([wanted], [wanted + "-0"])
    p = bridge("replay", str(fixture / "server.log"), "--request", "cmpl-no-such-request")
    assert "no request matches" in p.stdout and not _waterfalls(p.stdout, r"(?:chat)?cmpl-\S+")


def test_replay_errors_draws_exactly_the_failed_requests_and_the_incidents():
    text = SAMPLE.read_text()
    # from the log itself: each request's own failure line (timeout, failed allocation)
    failed = set(re.findall(r"Request (0x[0-9a-f]+) timed out", text)) | set(
        re.findall(r"Failed to allocate memory for request (0x[0-9a-f]+)", text))
    p = bridge("replay", str(SAMPLE), "--errors", "--waterfalls", "1000")
    assert p.returncode == 0, p.stderr
    drawn = _waterfalls(p.stdout)
    assert {rid for rid, _h, _p in drawn} == failed
    assert all(re.search(r"  (FAILED|TIMEOUT)  ", head) for _rid, head, _p in drawn)
    assert p.stdout.count("\nENGINE ") == 3  # model load, CUDA OOM, NCCL timeout: one line each in the log


def test_replay_slowest_draws_the_longest_requests_slowest_first():
    """From the log: each summary's total_latency, and each timeout's `after Ns` (a measured
    duration too: a stamped one, exact to the one-second stamps)."""
    durations = [(tl, False) for _rid, _ts, tl in reported()]
    durations += [(float(s), True) for s in re.findall(r"timed out after ([\d.]+)s", SAMPLE.read_text())]
    longest = sorted(durations, reverse=True)[:4]
    p = bridge("replay", str(SAMPLE), "--slowest", "4")
    assert p.returncode == 0, p.stderr
    shown = []
    for _rid, head, _p in _waterfalls(p.stdout):
        m = re.search(r"e2e (≈?)([\d.]+)(ms|s)", head)
        shown.append((float(m[2]) / (1000 if m[3] == "ms" else 1), bool(m[1])))
    assert len(shown) == 4
    for (got, got_stamped), (want, stamped) in zip(shown, longest):
        assert got_stamped == stamped and abs(got - want) < (1.0 if stamped else 0.0006), (shown, longest)
    assert "--slowest -1" in one_line_error(bridge("replay", str(SAMPLE), "--slowest", "-1"))


def test_the_terminal_shows_the_users_own_error_text_and_export_still_redacts_it():
    path = re.search(r"No such file or directory: ('[^']+')", SAMPLE.read_text())[1]
    p = bridge("replay", str(SAMPLE), "--errors")
    assert path in p.stdout and "<redacted>" not in p.stdout
    with GrpcReceiver() as rx:
        p = bridge("replay", str(SAMPLE), "--otlp-endpoint", rx.endpoint, "--otlp-protocol", "grpc")
        assert p.returncode == 0, p.stderr
        sent = b"".join(rx.raw)
    assert b"No such file or directory" in sent  # the model-load incident was exported ...
    assert path.strip("'").encode() not in sent  # ... without the path, by default
