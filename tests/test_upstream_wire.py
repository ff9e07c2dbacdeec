"""Upstream fixtures → `replay` → a real gRPC OTLP receiver; expectations written by hand from
the fixtures (tests/fixtures/upstream/, copied from the formats in the reference)."""

from __future__ import annotations

import io
from datetime import datetime
from pathlib import Path

import pytest
from receivers import GrpcReceiver, attrs

from bridge.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "upstream"
NS = 1_000_000_000
ERROR = 2


def ts(iso: str) -> int:
    return int(datetime.fromisoformat(iso + "+00:00").timestamp() * 1_000_000) * 1000


@pytest.fixture(scope="module")
def received():
    """Every fixture replayed into one receiver: path name → (roots by request id, other spans)."""
    with GrpcReceiver() as rx:
        for path in sorted(FIXTURES.glob("*.log")):
            out = io.StringIO()
            year = "2025" if path.name.startswith(("shipper", "v0_8", "nccl", "v1_model", "v1_colour", "v1_early")) else "2026"
            if path.name.startswith(("v0_4", "v0_6")):
                year = "2024"
            code = main(["replay", str(path), "--otlp-endpoint", rx.endpoint, "--year", year], env={}, out=out)
            assert code == 0, out.getvalue()
    by_file: dict[str, tuple[dict, list]] = {}
    for res, span in rx.spans():
        name = Path(res["log.file.path"]).name
        roots, others = by_file.setdefault(name, ({}, []))
        a = attrs(span.attributes)
        if span.name == "vllm.request":
            assert a["vllm.request.id"] not in roots, "one root per request"
            roots[a["vllm.request.id"]] = (span, a)
        else:
            others.append((span, a))
    return by_file, rx


def root(received, file, rid):
    return received[0][file][0][rid]


def spans_named(received, file, name):
    return [(s, a) for s, a in received[0][file][1] if s.name == name]


def test_v1_chat_request_joins_received_added_and_generated(received):
    span, a = root(received, "v1_modern.log", "chatcmpl-a269fdcb7c6ce890")
    assert (span.start_time_unix_nano, span.end_time_unix_nano) == (ts("2026-01-15T08:01:00"), ts("2026-01-15T08:01:05"))
    assert a["vllm.outcome"] == "finished" and a["vllm.timing.end"] == "observed"
    assert a["gen_ai.request.model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert a["vllm.version"] == "0.14.0"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.response.id"] == "chatcmpl-a269fdcb7c6ce890"
    assert a["vllm.request.internal_id"] == "chatcmpl-a269fdcb7c6ce890-a8a65d16"
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"], a["gen_ai.request.top_p"]) == (2048, 0.6, 0.9)
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.usage.output_tokens"] == 7
    assert a["vllm.process"] == "APIServer pid=1"
    assert "error.type" not in a


def test_v1_completion_children_and_failures(received):
    file = "v1_modern.log"
    roots = received[0][file][0]
    assert set(roots) == {"chatcmpl-a269fdcb7c6ce890", "cmpl-5c1d9e2f3a4b6c70-0", "chatcmpl-77aa88bb99cc00dd",
                          "chatcmpl-deadbeefcafef00d", "chatcmpl-0123456789abcdef"}
    span, a = roots["cmpl-5c1d9e2f3a4b6c70-0"]
    assert (a["vllm.outcome"], a["error.type"], span.status.code) == ("aborted", "aborted", ERROR)
    assert (a["gen_ai.operation.name"], a["gen_ai.response.id"]) == ("text_completion", "cmpl-5c1d9e2f3a4b6c70")
    assert span.end_time_unix_nano == ts("2026-01-15T08:01:08")
    _, a = roots["chatcmpl-77aa88bb99cc00dd"]  # n=2: both `{i}_` children joined the one request
    assert (a["vllm.outcome"], a["gen_ai.request.n"], a["gen_ai.usage.output_tokens"]) == ("finished", 2, 3)
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert roots["chatcmpl-deadbeefcafef00d"][1]["vllm.outcome"] == "aborted"
    _, a = roots["chatcmpl-0123456789abcdef"]
    assert (a["vllm.outcome"], a["error.type"]) == ("failed", "input")


def test_no_phase_is_invented_from_thin_logs(received):
    for file, (roots, others) in received[0].items():
        for rid, (span, a) in roots.items():
            children = [s for s, _ in others if s.parent_span_id == span.span_id]
            assert children == [], (file, rid)


def test_startup_span_gathers_the_startup_lines(received):
    (span, a), = spans_named(received, "v1_modern.log", "vllm.startup")
    assert (span.start_time_unix_nano, span.end_time_unix_nano) == (ts("2026-01-15T08:00:00"), ts("2026-01-15T08:00:30"))
    assert span.status.code != ERROR
    assert a["gen_ai.request.model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert (a["vllm.version"], a["vllm.engine.version"]) == ("0.14.0", "V1")
    assert (a["vllm.startup.weights_gib"], a["vllm.startup.load_s"]) == (14.9889, 9.481532)
    assert (a["vllm.startup.kv_cache_gib"], a["vllm.startup.kv_cache_tokens"]) == (54.87, 449472)
    assert (a["vllm.startup.max_model_len"], a["vllm.startup.max_concurrency"]) == (131072, 3.43)
    assert a["vllm.startup.init_s"] == 25.31
    (span, a), = spans_named(received, "v0_6_mq.log", "vllm.startup")
    assert (a["vllm.startup.profile_s"], a["vllm.startup.total_gpu_gib"]) == (2.72, 79.15)
    assert (a["vllm.startup.gpu_memory_utilization"], a["vllm.startup.kv_cache_gib"]) == (0.9, 62.22)
    assert (a["vllm.startup.gpu_blocks"], a["vllm.startup.cpu_blocks"]) == (72812, 9362)
    assert a["vllm.startup.max_concurrency"] == 35.55


def test_v1_engine_death_by_oom_fails_every_request_in_flight(received):
    file = "v1_engine_dead.log"
    for rid in ("chatcmpl-feedfacefeedface", "cmpl-beadbeadbeadbead-0"):
        span, a = root(received, file, rid)
        assert (a["vllm.outcome"], a["error.type"], span.status.code) == ("failed", "oom", ERROR)
        assert span.end_time_unix_nano == ts("2026-10-22T09:33:52")
        names = [e.name for e in span.events]
        assert "vllm.engine.incident" in names and "exception" in names
    # One death, one incident: the core's traceback, the process's, and the API server's
    # EngineDeadError (3 error records in the same second) are one `oom` span.
    engines = spans_named(received, file, "vllm.engine")
    assert [a["error.type"] for _, a in engines] == ["oom"]
    assert engines[0][1]["vllm.incident.lines"] == 3
    first = next((s, a) for s, a in engines if a.get("vllm.process") == "EngineCore_DP0 pid=7" and a["vllm.incident.fatal"])
    exc = attrs(first[0].events[0].attributes)
    assert exc["exception.type"] == "OutOfMemoryError"
    assert "exception.stacktrace" not in exc  # only with --export-error-text (test_privacy)
    # each request links to every incident it was in flight for, by the incident span's own ids
    incident_spans = {(s.trace_id, s.span_id) for s, _ in engines}
    for rid in ("chatcmpl-feedfacefeedface", "cmpl-beadbeadbeadbead-0"):
        span, _ = root(received, file, rid)
        links = [(link.trace_id, link.span_id) for link in span.links]
        incidents = [e for e in span.events if e.name == "vllm.engine.incident"]
        assert len(links) == len(incidents) >= 1 and set(links) <= incident_spans
        assert all("exception.message" not in attrs(e.attributes) for e in incidents)
    assert first[1]["vllm.requests_affected"] == 2


def test_v0_lines_preemption_finish_abort_and_model(received):
    file = "v0_4_plain.log"
    span, a = root(received, file, "cmpl-6b5b4a1a2f7c4c1e9e4d3c2b1a0f9e8d-0")
    assert a["vllm.outcome"] == "finished"
    assert span.end_time_unix_nano - span.start_time_unix_nano == 2 * NS
    assert a["gen_ai.request.model"] == "meta-llama/Llama-2-7b-chat-hf"
    span, a = root(received, file, "cmpl-0a1b2c3d4e5f60718293a4b5c6d7e8f9-0")
    assert (a["vllm.outcome"], a["vllm.preemptions"]) == ("aborted", 1)
    assert {"preempted", "memory_pressure"} <= set(a["vllm.diagnosis"])
    pre = [attrs(e.attributes) for e in span.events if e.name == "vllm.preempted"]
    assert pre == [{"vllm.preemption.mode": "RECOMPUTE", "vllm.preemption.cumulative": 1}]
    stats = [attrs(e.attributes) for e in span.events if e.name == "vllm.engine_stats"]
    assert stats[0]["vllm.queue.swapped"] == 0 and stats[0]["vllm.kv_cache.gpu_usage"] == pytest.approx(0.972)


def test_v0_multiprocess_request_with_no_end_line_is_incomplete(received):
    span, a = root(received, "v0_6_mq.log", "chatcmpl-1f2e3d4c5b6a79880716253443526170")
    assert (a["vllm.outcome"], a["vllm.timing.end"], a["vllm.timing"]) == ("incomplete", "inferred", "inferred")
    assert a["vllm.end_inferred"] is True  # closed when a stats line showed the engine idle
    # running at 09:01:05 (`Running: 1 reqs`), gone at 09:01:15 (`Running: 0 reqs`): it ends there
    assert span.end_time_unix_nano == ts("2024-12-18T09:01:15")
    span, a = root(received, "v0_6_mq.log", "chatcmpl-aa11bb22cc33dd44ee55ff6677889900")
    assert (a["vllm.outcome"], a["error.type"]) == ("failed", "engine_dead")  # worker died


def test_v0_8_engine_iteration_timeout(received):
    span, a = root(received, "v0_8_bracket.log", "chatcmpl-5e4d3c2b1a09f8e7d6c5b4a392817065")
    assert (a["vllm.outcome"], a["error.type"]) == ("failed", "timeout")
    assert a["vllm.lora.name"] == "sql-lora"
    assert a["gen_ai.request.model"] == "mistralai/Mistral-7B-Instruct-v0.3"


def test_nccl_watchdog_is_one_distributed_incident(received):
    file = "nccl_ray.log"
    span, a = root(received, file, "chatcmpl-1111222233334444")
    assert (a["vllm.outcome"], a["error.type"]) == ("failed", "distributed")
    engines = spans_named(received, file, "vllm.engine")
    # The shm broadcast hang, the C++ watchdog block that takes the process down, and the
    # heartbeat monitor after it are one engine death: one span.
    assert len(engines) == 1
    assert all(a["error.type"] == "distributed" for _, a in engines)
    watchdog = [a for _, a in engines if a.get("vllm.process") == "RayWorkerWrapper pid=206994, ip=192.168.10.25"
                and a["vllm.incident.fatal"]]
    assert len(watchdog) == 1


def test_shipper_stamps_give_sub_second_timing(received):
    span, a = root(received, "shipper.log", "chatcmpl-0000aaaa1111bbbb")
    assert span.start_time_unix_nano == ts("2025-10-22T09:33:49.123456")
    assert span.end_time_unix_nano == ts("2025-10-22T09:33:50.950000")
    assert (a["vllm.outcome"], a["gen_ai.usage.output_tokens"]) == ("finished", 3)


def test_model_load_failure_ends_the_startup_with_an_error(received):
    file = "v1_model_load.log"
    assert received[0][file][0] == {}
    (span, a), = spans_named(received, file, "vllm.startup")
    assert (span.status.code, a["error.type"]) == (ERROR, "model_load")
    assert a["gen_ai.request.model"] == "/models/missing-model"
    # The core's traceback and the API server's "Engine core initialization failed": one failure
    assert [x["error.type"] for _, x in spans_named(received, file, "vllm.engine")] == ["model_load"]


def test_colour_and_prefixes_do_not_change_what_is_understood(received):
    span, a = root(received, "v1_colour_prefix.log", "chatcmpl-c0ffee0000000001")
    assert (a["vllm.outcome"], a["gen_ai.request.model"]) == ("aborted", "Qwen/Qwen3-0.6B")
    (span, a), = spans_named(received, "v1_colour_prefix.log", "vllm.startup")
    assert (a["vllm.startup.kv_cache_tokens"], a["vllm.startup.profile_s"]) == (162704, 1.52)


def test_early_v1_process_prefixes_name_their_writers(received):
    file = "v1_early_prefixes.log"
    span, a = root(received, file, "chatcmpl-9f8e7d6c5b4a39281706f5e4d3c2b1a0")
    assert "vllm.process" not in a  # the API server had no prefix before v0.10.1
    assert (a["vllm.outcome"], a["error.type"], a["gen_ai.request.model"]) == ("failed", "engine_dead", "google/gemma-2-9b-it")
    assert span.end_time_unix_nano == ts("2025-04-20T10:01:30")
    (_, s), = spans_named(received, file, "vllm.startup")
    assert (s["vllm.process"], s["vllm.startup.kv_cache_tokens"], s["vllm.startup.max_concurrency"]) == (
        "EngineCore_0 pid=9", 1234560, 150.7)
    assert s["vllm.startup.load_s"] == 8.120001  # the last worker to report wins
    # The worker's death and the core's fatal error a moment later are one death: one span, named
    # for the first line that said the engine was gone.
    incidents = [a for _, a in spans_named(received, file, "vllm.engine")]
    assert [(a["vllm.process"], a["vllm.incident.lines"]) for a in incidents] == [("VllmWorker TP0 pid=7", 2)]


SECRET_PROMPT = "my secret prompt: the password is hunter2"
SECRET_OUTPUT = "my secret answer: the vault opens at dawn"


def test_prompt_and_generated_text_never_leave_the_bridge(tmp_path):
    log = tmp_path / "private.log"
    a = "(APIServer pid=1) "
    log.write_text(
        f"{a}INFO 01-15 08:01:00 [logger.py:37] Received request chatcmpl-0000000000000001: prompt: "
        f"'<|user|>\\n{SECRET_PROMPT}', params: SamplingParams(n=1, temperature=0.7, top_p=1.0, max_tokens=64), "
        "prompt_token_ids: [1, 2, 3], lora_request: None, prompt_adapter_request: None.\n"
        f"{a}DEBUG 01-15 08:01:00 [logger.py:48] Request chatcmpl-0000000000000001 details: prompt: '{SECRET_PROMPT}', "
        "prompt_token_ids: [1, 2, 3], prompt_embeds shape: None.\n"
        f"{a}INFO 01-15 08:01:00 [async_llm.py:368] Added request chatcmpl-0000000000000001-0a0b0c0d.\n"
        f"{a}INFO 01-15 08:01:02 [logger.py:71] Generated response chatcmpl-0000000000000001: output: "
        f"'{SECRET_OUTPUT}', output_token_ids: [5, 6], finish_reason: stop\n"
        f"{a}INFO 01-15 08:01:03 [logger.py:37] Received request chatcmpl-0000000000000002: prompt: "
        f"'{SECRET_PROMPT}', params: SamplingParams(n=1, max_tokens=8), prompt_token_ids: [1], lora_request: None.\n"
        f"{a}ERROR 01-15 08:01:04 [core.py:1] EngineCore encountered a fatal error.\n"
    )
    with GrpcReceiver() as rx:
        code = main(["replay", str(log), "--otlp-endpoint", rx.endpoint, "--year", "2026"], env={}, out=io.StringIO())
    assert code == 0 and rx.raw
    blob = b"".join(rx.raw)
    for secret in (SECRET_PROMPT, SECRET_OUTPUT, "hunter2", "vault opens"):
        assert secret.encode() not in blob
    roots = [s for _, s in rx.spans() if s.name == "vllm.request"]
    assert len(roots) == 2  # and the requests themselves did arrive
