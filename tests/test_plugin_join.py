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


N_GT_1 = Path(__file__).parent / "fixtures" / "scenarios" / "plugin_n_gt_1"


def _client_requests() -> list[dict]:
    import json
    return json.loads((N_GT_1 / "truth.json").read_text())["requests"]


def _logged_id(r: dict) -> str:
    return r["response_id"] + ("-0" if r["kind"] == "completion" else "")


def _children(text: str, rid: str) -> list[tuple[float, float, int, int]]:
    """(ttft s, e2e s, generated, end ns) of each child summary the plugin wrote for `rid`,
    read from the text: vLLM names an n>1 request's children `<i>_<id>`."""
    out = []
    for m in re.finditer(rf"\] Request \d+_{re.escape(rid)}: prompt_tokens=\d+, generated_tokens=(\d+), "
                         r"ttft=([\d.]+)ms, itl=[\d.]+ms, total_latency=([\d.]+)s, t=(\d+)\.(\d+)", text):
        out.append((float(m[2]) / 1e3, float(m[3]), int(m[1]), int(m[4]) * 10**9 + int(m[5].ljust(9, "0"))))
    return out


def test_n_gt_1_children_are_one_request_counted_as_the_response_counts_them():
    """Real vLLM 0.32 with the plugin, n=2 and 3, streamed and not, some at once: the plugin's
    lines name vLLM's children (`0_cmpl-…-0`, `1_cmpl-…-0`). Each client request is one root,
    with the `usage` the client got (prompt once, completions summed over the n choices), the
    first token of the first child and the end of the last (vLLM answers when all n are done)."""
    text = (N_GT_1 / "server.log").read_text()
    got = timelines(N_GT_1 / "server.log")
    clients = _client_requests()
    assert sorted(got) == sorted(_logged_id(r) for r in clients)
    for r in clients:
        t = got[_logged_id(r)]
        assert t.outcome == "finished", t.request_id
        assert t.attrs["gen_ai.usage.input_tokens"] == r["usage"]["prompt_tokens"], t.request_id
        assert t.attrs["gen_ai.usage.output_tokens"] == r["usage"]["completion_tokens"], t.request_id
        phases = {p.name: p for p in t.phases}
        assert [p.name for p in t.phases].count("decode") == 1
        if r["n"] == 1:
            continue
        children = _children(text, t.request_id)
        assert len(children) == r["n"]
        arrival = phases["preprocess"].start_ns
        assert phases["decode"].end_ns == max(c[3] for c in children)
        assert abs((phases["decode"].start_ns - arrival) / 1e9 - min(c[0] for c in children)) < 2e-6
        assert abs((phases["decode"].end_ns - arrival) / 1e9 - max(c[1] for c in children)) < 2e-6
        assert arrival <= r["t_first_byte_ns"] and phases["decode"].end_ns <= r["t_end_ns"]
        if r["kind"] == "chat" and not r["stream"]:
            assert sorted(t.attrs["gen_ai.response.finish_reasons"]) == sorted(r["finish_reasons"])


def test_n_gt_1_children_join_with_the_plugin_lines_alone(tmp_path):
    """Without `--enable-log-requests` only the plugin names requests: its children still make
    one root per client request, under the id the client's response carries."""
    text = (N_GT_1 / "server.log").read_text()
    plugin_only = tmp_path / "server.log"
    plugin_only.write_text("".join(line for line in text.splitlines(keepends=True)
                                   if "[request_logger.py" not in line and "[async_llm.py" not in line))
    got = timelines(plugin_only)
    clients = _client_requests()
    assert sorted(got) == sorted(_logged_id(r) for r in clients)
    for r in clients:
        t = got[_logged_id(r)]
        assert t.attrs["gen_ai.usage.output_tokens"] == r["usage"]["completion_tokens"], t.request_id
        assert t.outcome == "finished"


def test_each_child_of_n_gt_1_is_preempted_and_rescheduled_on_its_own(tmp_path):
    """vLLM schedules and preempts an n>1 request's children apart: a child's preemption ends
    when that child is rescheduled, not when a sibling is (lines in the plugin's format)."""
    lines = [
        "Scheduling request 0_cmpl-p-0: priority=0, num_scheduled_blocks=1, remaining_blocks=4, queued=0.100ms, t=100.000000",
        "Scheduling request 1_cmpl-p-0: priority=0, num_scheduled_blocks=1, remaining_blocks=3, queued=0.100ms, t=100.001000",
        "Preempting request 0_cmpl-p-0: reason=kv_cache_full, preempted_blocks=1, t=100.200000",
        "Preempting request 1_cmpl-p-0: reason=kv_cache_full, preempted_blocks=1, t=100.300000",
        "Scheduling request 1_cmpl-p-0: priority=0, num_scheduled_blocks=1, remaining_blocks=3, t=100.400000",
        "Scheduling request 0_cmpl-p-0: priority=0, num_scheduled_blocks=1, remaining_blocks=3, t=100.500000",
        "Request 1_cmpl-p-0: prompt_tokens=5, generated_tokens=10, ttft=20.000ms, itl=5.000ms, total_latency=0.900000s, t=100.899900",
        "Request 0_cmpl-p-0: prompt_tokens=5, generated_tokens=12, ttft=10.000ms, itl=5.000ms, total_latency=1.000000s, t=100.999900",
    ]
    log = tmp_path / "p.log"
    log.write_text("".join(f"INFO 01-01 00:01:40 [hooks.py:1] {x}\n" for x in lines))
    (t,) = timelines(log).values()
    assert t.request_id == "cmpl-p-0" and t.outcome == "finished"
    pre = [(p.start_ns, p.end_ns) for p in t.phases if p.name == "preempted"]
    assert pre == [(100_200_000_000, 100_500_000_000), (100_300_000_000, 100_400_000_000)]
    assert t.attrs["gen_ai.usage.output_tokens"] == 22 and t.attrs["gen_ai.usage.input_tokens"] == 5
    decode = next(p for p in t.phases if p.name == "decode")
    assert decode.end_ns == 100_999_900_000 and decode.start_ns == 99_999_900_000 + 10_000_000


def test_an_aborted_request_on_a_plain_file_starts_at_its_exact_arrival(tmp_path):
    """A plain file's header says only the second. An aborted request gets no summary; its
    receipt (12:00:00, any time in that second) came before the engine's arrival, which the
    plugin states to the µs: the root starts there, not up to 1 s before the client sent it,
    and the abort line's end is not before the request's own earlier exact line."""
    log = tmp_path / "a.log"
    base = 1767268800  # 2026-01-01T12:00:00Z
    log.write_text(
        "INFO 01-01 12:00:00 [request_logger.py:65] Received request chatcmpl-ab: params: SamplingParams(n=1), lora_request: None.\n"
        "INFO 01-01 12:00:00 [async_llm.py:552] Added request chatcmpl-ab-0123abcd.\n"
        f"INFO 01-01 12:00:00 [hooks.py:220] Scheduling request chatcmpl-ab: priority=0, num_scheduled_blocks=1, remaining_blocks=9, queued=0.100ms, t={base}.700000\n"
        "INFO 01-01 12:00:00 [async_llm.py:783] Request chatcmpl-ab aborted.\n")
    (t,) = timelines(log).values()
    assert t.error_type == "aborted"
    assert t.start_ns == base * 10**9 + 699_900_000 and t.start_timing == "inferred"
    assert t.end_ns >= base * 10**9 + 700_000_000


FRONTEND = Path(__file__).parent / "fixtures" / "plugin" / "v1_plugin_frontend.log"
# vLLM's own record of that run (its /metrics at the end): 7 successes, 9 preemptions.
FRONTEND_SUCCESS, FRONTEND_PREEMPTIONS = 7, 9


def test_the_api_server_line_alone_gives_every_phase_at_vllms_own_stamps():
    """Captured from real vLLM 0.32 with this plugin's defaults (engine core untouched): one
    line per request from the API server. Every phase boundary is a stamp the line states; the
    preemptions are vLLM's (its /metrics count), the aborted client's request ends aborted."""
    got = timelines(FRONTEND)
    text = FRONTEND.read_text()
    assert "Scheduling request" not in text and "Freed " not in text  # no engine-core line
    finished = {rid: t for rid, t in got.items() if t.outcome == "finished"}
    assert len(finished) == FRONTEND_SUCCESS
    assert sum(t.attrs["vllm.preemptions"] for t in got.values()) == FRONTEND_PREEMPTIONS
    for rid, t in finished.items():
        line = re.search(rf"\] Request {re.escape(rid)}: .*", text)[0]
        stamp = {k: int(s) * 10**9 + int(f.ljust(9, "0")) for k, s, f in re.findall(r"(\w+)=(\d+)\.(\d+)", line)}
        ph = {p.name: p for p in t.phases if p.name != "preempted"}
        assert list(ph) == ["preprocess", "queued", "prefill", "decode"], (rid, list(ph))
        assert (ph["preprocess"].start_ns, ph["preprocess"].end_ns) == (stamp["arrival"], stamp["queued_at"])
        assert (ph["queued"].start_ns, ph["queued"].end_ns) == (stamp["queued_at"], stamp["scheduled_at"])
        assert (ph["prefill"].start_ns, ph["prefill"].end_ns) == (stamp["scheduled_at"], stamp["first_token_at"])
        assert (ph["decode"].start_ns, ph["decode"].end_ns) == (stamp["first_token_at"], stamp["last_token_at"])
        assert t.end_ns == stamp["t"] and t.start_ns == stamp["arrival"]
        assert t.attrs["gen_ai.request.max_tokens"] in (8, 300)  # joined with vLLM's own Received line
        assert all(p.start_timing != "inferred" and p.end_timing != "inferred" for p in t.phases)
    gone = got["cmpl-plugintest-gone-0"]
    assert gone.outcome == "aborted" and gone.attrs["gen_ai.usage.output_tokens"] == 89
    assert {"queued", "prefill", "decode"} <= {p.name for p in gone.phases}
    tp = got["cmpl-plugintest-tp-0"]
    assert (tp.parent.trace_id.hex(), tp.parent.span_id.hex()) == ("4bf92f3577b34da6a3ce929d0e0e4736",
                                                                   "00f067aa0ba902b7")
    assert all(t.parent is None for rid, t in got.items() if rid != "cmpl-plugintest-tp-0")


def test_client_context_off_ignores_the_logged_traceparent():
    from bridge.assemble import AssembleConfig
    from bridge.pipeline import ReplayConfig

    out = []
    replay([str(FRONTEND)], [out.append], ReplayConfig(assemble=AssembleConfig(client_context=False)))
    tp = next(t for t in out if getattr(t, "request_id", "") == "cmpl-plugintest-tp-0")
    assert tp.parent is None and "vllm.trace_context" not in tp.attrs


def test_old_plugin_lines_and_old_bridges_stay_compatible():
    """The new line begins as the seed summary did: an old bridge's grammar (the summary's
    fields, `t=`, then anything) reads it as a finished request; the `ended` line it leaves
    unrecognised, never calls finished."""
    old_summary = re.compile(r"Request ([^\s:,]+): prompt_tokens=(\d+), generated_tokens=(\d+), ttft=[\d.]+ms, "
                             r"itl=[\d.]+ms, total_latency=[\d.]+s(?:, t=\d+\.\d+)?")
    lines = [x.split("[trace_bridge.py:1] ", 1)[1] for x in FRONTEND.read_text().splitlines() if "trace_bridge.py" in x]
    assert sum(bool(old_summary.match(x)) for x in lines) == FRONTEND_SUCCESS
    assert not any(old_summary.match(x) for x in lines if " ended: " in x)
