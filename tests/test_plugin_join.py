"""The plugin's seed lines (engine core) and vLLM's own lines (API server) for one request
join into one trace: captured from real vLLM 0.32 with the plugin (tests/plugin/)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from bridge.pipeline import replay

FIXTURE = Path(__file__).parent / "fixtures" / "plugin" / "v1_plugin.log"


def timelines(path) -> dict:
    out = []
    replay([str(path)], [out.append])
    return {t.request_id: t for t in out if hasattr(t, "phases")}


def test_plugin_and_upstream_lines_join_per_request():
    got = timelines(FIXTURE)
    assert sorted(got) == ["chatcmpl-plugintest-000", "cmpl-plugintest-001-0"]
    for rid, t in got.items():
        names = [p.name for p in t.phases]
        assert {"queued", "prefill", "decode", "freed"} <= set(names), (rid, names)
        assert t.attrs["gen_ai.request.max_tokens"] == 300       # from the API server's Received line
        assert t.attrs["vllm.request.internal_id"].startswith(rid + "-")  # from its Added line
        assert t.outcome == "finished"
    assert got["cmpl-plugintest-001-0"].attrs["vllm.preemptions"] == 1
    assert got["cmpl-plugintest-001-0"].attrs["gen_ai.operation.name"] == "text_completion"
    # without the plugin's queued= field, time_in_queue is arrival → scheduled
    t = got["chatcmpl-plugintest-000"]
    assert t.attrs["gen_ai.latency.time_in_queue"] == t.attrs["vllm.queue_s"] > 0


def test_the_engine_queue_time_is_vllms_time_in_queue(tmp_path):
    log = tmp_path / "q.log"
    log.write_text(FIXTURE.read_text().replace(
        "Scheduling request chatcmpl-plugintest-000: priority=0, num_scheduled_blocks=1, remaining_blocks=10",
        "Scheduling request chatcmpl-plugintest-000: priority=0, num_scheduled_blocks=1, remaining_blocks=10, "
        "queued=0.020ms"))
    t = timelines(log)["chatcmpl-plugintest-000"]
    assert t.attrs["gen_ai.latency.time_in_queue"] == t.attrs["vllm.engine_queue_s"] == 0.02 / 1000
    assert t.attrs["vllm.queue_s"] > 0.005  # arrival → scheduled: tokenising and hand-off included


def test_seed_lines_that_keep_v1s_internal_suffix_still_join(tmp_path):
    """A plugin (or a patched vLLM) that logs the engine-side id `<id>-<8 hex>` joins too."""
    text = FIXTURE.read_text()
    internal = dict(re.findall(r"Added request ((\S+?))-[0-9a-f]{8}\.", text))
    suffixed = re.sub(r"(Scheduling request|Preempting request|\] Request|for request) (chatcmpl-plugintest-000|cmpl-plugintest-001-0)",
                      lambda m: f"{m[1]} {m[2]}-0badf00d", text)
    assert internal and suffixed != text
    log = tmp_path / "suffixed.log"
    log.write_text(suffixed)
    got = timelines(log)
    assert sorted(got) == ["chatcmpl-plugintest-000", "cmpl-plugintest-001-0"], sorted(got)
    for t in got.values():
        assert {"queued", "prefill", "decode", "freed"} <= {p.name for p in t.phases}


DEFAULT = Path(__file__).parent / "fixtures" / "plugin" / "v1_plugin_default.log"


def test_default_plugin_lines_give_every_phase_with_vllms_own_durations():
    """Captured from real vLLM 0.32 with the plugin's default settings (no per-block lines), 4
    requests on a 12-block cache. The engine core frees a request's blocks (`Freed 4 blocks`)
    before the API server logs its summary, which carries vLLM's own TTFT and e2e."""
    got = timelines(DEFAULT)
    text = DEFAULT.read_text()
    assert sorted(got) == ["chatcmpl-plugintest-000", "chatcmpl-plugintest-003", "cmpl-plugintest-001-0",
                           "cmpl-plugintest-002-0"]
    for rid, t in got.items():
        phases = {p.name: p for p in t.phases}
        assert {"queued", "prefill", "decode", "freed"} <= set(phases), (rid, sorted(phases))
        assert t.outcome == "finished" and t.attrs["vllm.kv_blocks.freed"] == 4
        summary = re.search(rf"\] Request {re.escape(rid)}: .*ttft=([\d.]+)ms, .*total_latency=([\d.]+)s", text)
        ttft_s, e2e_s = float(summary[1]) / 1e3, float(summary[2])
        queued, gen, freed = phases["queued"], phases["decode"], phases["freed"]
        assert abs((gen.start_ns - queued.start_ns) / 1e9 - ttft_s) < 1e-6
        assert abs((gen.end_ns - queued.start_ns) / 1e9 - e2e_s) < 1e-6
        # freed: the engine's release, which came before the API server logged the end
        release = re.search(rf"^(\S+) .*Freed 4 blocks for request {re.escape(rid)},", text, re.M)[1]
        release_ns = int(datetime.fromisoformat(release[:19]).replace(tzinfo=timezone.utc).timestamp()) * 10**9 \
            + int(release[20:29])
        assert freed.start_ns == freed.end_ns == release_ns <= gen.end_ns
    preempted = {rid: t.attrs["vllm.preemptions"] for rid, t in got.items()}
    assert preempted == {"chatcmpl-plugintest-000": 0, "chatcmpl-plugintest-003": 2,
                         "cmpl-plugintest-001-0": 0, "cmpl-plugintest-002-0": 1}


EXACT_FIXTURE = FIXTURE.with_name("v1_plugin_exact.log")  # the plugin's `t=` lines, block lines on


def test_exact_plugin_lines_give_each_boundary_the_time_the_line_states():
    """Captured from real vLLM 0.32 (10 requests, 8 running, a 12-block cache: 8 preemptions),
    per-block lines on, kept as a plain file (one-second headers). Every boundary the plugin
    timed is the `t=` of its line, read here straight from the text, never the header."""
    text = EXACT_FIXTURE.read_text()
    def ns(seconds: str, fraction: str) -> int:
        return int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0"))

    preempting: dict[str, list[int]] = {}
    for m in re.finditer(r"Preempting request (\S+): .*?, t=(\d+)\.(\d+)", text):
        preempting.setdefault(m[1], []).append(ns(m[2], m[3]))
    got = timelines(EXACT_FIXTURE)
    assert len(got) == 10
    for rid, t in got.items():
        names = [p.name for p in t.phases]
        assert names[:4] == ["preprocess", "queued", "prefill", names[3]] and "decode" in names, (rid, names)
        pre = [p for p in t.phases if p.name == "preempted"]
        assert [p.start_ns for p in pre] == preempting.get(rid, []), rid
        assert all(p.end_ns > p.start_ns for p in pre), rid
        first = re.search(r"Scheduling request " + re.escape(rid) + r": .*?queued=([\d.]+)ms, t=(\d+)\.(\d+)", text)
        queued = next(p for p in t.phases if p.name == "queued")
        assert queued.end_ns == ns(first[2], first[3])
        assert abs((queued.end_ns - queued.start_ns) - float(first[1]) * 1e6) <= 1
        end = re.search(r"Request " + re.escape(rid) + r": .*?total_latency=([\d.]+)s, t=(\d+)\.(\d+)", text)
        assert next(p for p in t.phases if p.name == "decode").end_ns == ns(end[2], end[3])
    assert sum(len([p for p in t.phases if p.name == "preempted"]) for t in got.values()) == 8
