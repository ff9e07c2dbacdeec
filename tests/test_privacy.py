"""Privacy by default (issue #17, part 2): parameters only from their own field, error text
redacted, incidents fanned out without text, `check` masks literals. Expectations are written
by hand from the input lines."""

import os
import re
import time

import pytest

from bridge.parse import parse_line
from bridge.parse.events import RequestReceived
from bridge.parse.literals import mask_literals, redact_error_text
from waits import deadline

MARK = "ZZSECRET42"

# Real vLLM SamplingParams repr order (v0.11+): stop strings come BEFORE max_tokens, so a stop
# string that imitates `, max_tokens=` is the first such text in the line.
_V1_HEAD = "Received request chatcmpl-a269fdcb7c6ce890: params: SamplingParams(n=1, presence_penalty=0.0, " \
           "frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.6, top_p=0.9, top_k=0, min_p=0.0, seed=None, "

RECEIVED = [
    # a stop string imitating the parameters, with `)` and both quote kinds inside
    (_V1_HEAD + "stop=['), n=5, max_tokens=7, temperature=9', \"it's ), top_p=0.01\", 'x\\', n=6'], "
     "stop_token_ids=[], bad_words=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens=2048, "
     "min_tokens=0, logprobs=None), lora_request: None.",
     RequestReceived("chatcmpl-a269fdcb7c6ce890", 2048, 0.6, 0.9, 1, None)),
    # a stop string imitating a LoRA request, and no real one
    (_V1_HEAD + "stop=[\"lora_request: LoRARequest(lora_name='x', lora_int_id=1).\"], max_tokens=16), "
     "lora_request: None.",
     RequestReceived("chatcmpl-a269fdcb7c6ce890", 16, 0.6, 0.9, 1, None)),
    # the real LoRA request after a stop string that names another adapter
    (_V1_HEAD + "stop=[\"lora_name='evil'\"], max_tokens=16), lora_request: "
     "LoRARequest(lora_name='sql-lora', lora_int_id=1, lora_path='/adapters/sql').",
     RequestReceived("chatcmpl-a269fdcb7c6ce890", 16, 0.6, 0.9, 1, "sql-lora")),
    # v0.6-era line: the prompt comes first and imitates everything after it
    (f"Received request chatcmpl-1f2e: prompt: '{MARK} params: SamplingParams(n=9, max_tokens=1), "
     "lora_request: LoRARequest(lora_name=\\'x\\'), prompt_token_ids: [1]', params: SamplingParams(n=1, "
     "temperature=0.7, top_p=0.8, top_k=20, stop=[], max_tokens=32000), prompt_token_ids: [151644, 8948], "
     "lora_request: None, prompt_adapter_request: None.",
     RequestReceived("chatcmpl-1f2e", 32000, 0.7, 0.8, 1, None)),
    # a double-quoted prompt repr (the prompt holds a ') with the imitation inside
    ("Received request cmpl-6b5b-0: prompt: \"it's lora_name='x', n=3, max_tokens=4\", sampling_params: "
     "SamplingParams(n=2, best_of=2, temperature=0.8, top_p=0.95, stop=[], max_tokens=512), "
     "prompt_token_ids: [1, 9038], lora_request: None.",
     RequestReceived("cmpl-6b5b-0", 512, 0.8, 0.95, 2, None)),
    # a line cut inside the prompt: the quote never closes, so nothing after it is trusted
    (f"Received request cmpl-cut-0: prompt: '{MARK} SamplingParams(n=9, max_tokens=1), lora_request: "
     "LoRARequest(lora_name='x')",
     RequestReceived("cmpl-cut-0", None, None, None, None, None)),
    ("Received request cmpl-cut-1: params: SamplingParams(n=1, max_tokens=3), lora_request: LoRARequest(lora_name=",
     RequestReceived("cmpl-cut-1", 3, None, None, 1, None)),
    ("Received request cmpl-cut-2: params: SamplingParams(n=1, max_tokens=3), lora_request: LoRARequest(lora_name='a\\'",
     RequestReceived("cmpl-cut-2", 3, None, None, 1, None)),
]


@pytest.mark.parametrize("message,expected", RECEIVED, ids=range(len(RECEIVED)))
def test_parameters_come_only_from_their_own_field(message, expected):
    assert parse_line(message, "INFO") == expected
    assert MARK not in repr(parse_line(message, "INFO"))


def test_received_scan_is_linear_in_the_line_length():
    # brackets, quotes and `, ` everywhere: any rescanning or backtracking shows at this size
    filler = "(, [" * 50_000 + "'\\'" * 50_000 + "\"" * 3
    line = (f"Received request cmpl-x-0: prompt: '{filler}', params: SamplingParams(n=1, stop=['{filler}'], "
            "max_tokens=3), lora_request: None.")
    t = time.perf_counter()
    event = parse_line(line, "INFO")
    assert time.perf_counter() - t < 1.0
    assert event == RequestReceived("cmpl-x-0", 3, None, None, 1, None)


REDACT = [
    # (message, redacted) written from the rule: quoted literals and long literals go, words stay
    (f"ValueError: 1 validation error for ChatCompletionRequest messages.0.content Input should be a valid "
     f"string [type=string_type, input_value={{'role': 'user', 'content': '{MARK}'}}, input_type=dict]",
     "ValueError: 1 validation error for ChatCompletionRequest messages.0.<redacted> Input should be a valid "
     "string [type=string_type, input_value={<redacted>: <redacted>, <redacted>: <redacted>}, input_type=dict]"),
    (f"jinja2.exceptions.UndefinedError: '{MARK}' is undefined",
     "jinja2.exceptions.UndefinedError: <redacted> is undefined"),
    (f"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens: \"{MARK}",
     "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens: <redacted>"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
     "for the root cause.",
     "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
     "for the root cause."),
    (f"KeyError: b'{MARK}' in data:{MARK}aGVsbG8gd29ybGQgaGVsbG8gd29ybGQgaGVsbG8=",
     "KeyError: b<redacted> in <redacted>"),
    (r"RuntimeError: 'a\'b' then 'c", "RuntimeError: <redacted> then <redacted>"),
    ("", ""),
    # printed unquoted by vLLM 0.32 (review of 2026-12-02): the token ids a grammar rejected
    # (v1/core/sched/scheduler.py, structured_output/backend_xgrammar.py), a model name in
    # backticks (entrypoints/serve/engine/serving.py), a bytes repr that starts like a contraction,
    # and a pydantic location's client-chosen key
    ("Unexpected: grammar rejected tokens [9707, 11, 1879, 0] for request chatcmpl-9-8f5c0771. Terminating request.",
     "Unexpected: grammar rejected tokens <redacted> for request chatcmpl-9-8f5c0771. Terminating request."),
    ("Failed to advance FSM for request r-1 for tokens (42,). Please file an issue.",
     "Failed to advance FSM for request r-1 for tokens <redacted>. Please file an issue."),
    ("Unexpected: grammar rejected tokens [9707] for request r-1. Terminating request.",
     "Unexpected: grammar rejected tokens <redacted> for request r-1. Terminating request."),
    ("Failed to advance FSM for request r-1 for tokens [42, 7]. Please file an issue.",
     "Failed to advance FSM for request r-1 for tokens <redacted>. Please file an issue."),
    (f"The model `{MARK}` does not exist.", "The model <redacted> does not exist."),
    (f"cannot decode b's {MARK} tail'", "cannot decode b<redacted>"),
    (f"1 validation error for ChatCompletionRequest logit_bias.PATIENT-{MARK} Input should be a valid number",
     "1 validation error for ChatCompletionRequest logit_bias.<redacted> Input should be a valid number"),
    ("the model's answer isn't ready", "the model's answer isn't ready"),
    # a second review's cases: pydantic 2's own layout (a location line per error, keys with
    # spaces), an unclosed backtick before a quoted literal, a capital letter's apostrophe
    (f"2 validation errors for ChatCompletionRequest\nlogit_bias.patient {MARK} doe\n  Input should be a valid "
     f"number [type=float_parsing, input_value='x', input_type=str]\nlogit_bias.SSN-{MARK}\n  Input should be a "
     "valid number [type=float_parsing, input_value='y', input_type=str]",
     "2 validation errors for ChatCompletionRequest\nlogit_bias.<redacted>\n  Input should be a valid "
     "number [type=float_parsing, input_value=<redacted>, input_type=str]\nlogit_bias.<redacted>\n  Input should "
     "be a valid number [type=float_parsing, input_value=<redacted>, input_type=str]"),
    (f"Error near ` in template: 'Hello ` {MARK} and more'", "Error near <redacted><redacted>"),
    (f"grade B's threshold rejected prompt '{MARK}' for this request",
     "grade B's threshold rejected prompt <redacted> for this request"),
    # a third review's cases: a literal quoted by hand with an apostrophe inside, a plural
    # possessive before a literal, a backticked value cut by a line break
    (f"bad request: Tool 'don't {MARK} leaks' is not defined", "bad request: Tool <redacted> is not defined"),
    (f"users' input x '{MARK} words' y", "users' input x <redacted> y"),
    (f"The model `foo\n{MARK}` does not exist.", "The model <redacted> does not exist."),
]


@pytest.mark.parametrize("message,expected", REDACT, ids=range(len(REDACT)))
def test_error_text_redaction(message, expected):
    assert redact_error_text(message) == expected
    assert MARK not in redact_error_text(message)


def test_masking_is_linear():
    text = "'" + "\\'" * 200_000 + " x" * 200_000 + "a" * 400_000 + "'" * 1001
    t = time.perf_counter()
    mask_literals(text)
    mask_literals(text[1:])
    from bridge.check import template
    template("x " + "a-" * 1_000_000)
    template("x " + "ab " * 500_000 + "'" + "a" * 100)
    redact_error_text("[1,1" + " " * 1_000_000)  # quadratic in the spaces with the first list pattern
    redact_error_text("(" + "1, " * 300_000)
    redact_error_text("1 validation errors for X " + "a." * 300_000)
    assert time.perf_counter() - t < 1.5


def test_export_error_text_setting_from_file_environment_and_flag():
    from bridge.cli import _parser
    from bridge.config import ConfigError, load

    assert load(None, {}, {})[0].export_error_text is False
    assert load({"export_error_text": True}, {}, {})[0].export_error_text is True
    env = {"VLLM_TRACE_BRIDGE_EXPORT_ERROR_TEXT": "true"}
    assert load(None, env, {})[0].export_error_text is True
    assert load(None, env, {"export_error_text": False})[0].export_error_text is False
    with pytest.raises(ConfigError, match="export_error_text .*expected true or false"):
        load(None, {"VLLM_TRACE_BRIDGE_EXPORT_ERROR_TEXT": "maybe"}, {})
    run = _parser().parse_args(["run", "--export-error-text"])
    assert run.cfg_export_error_text is True
    assert _parser().parse_args(["run"]).cfg_export_error_text is None
    assert _parser().parse_args(["replay", "x.log", "--export-error-text"]).export_error_text is True


CHECK = [
    # a quote opened before the 160-character cut and closed after it (the old mask saw it open)
    ("INFO 11-30 08:00:00 [custom.py:1] " + "w " * 50 + f"prompt was '{MARK} {'y ' * 30}' done",
     "INFO <n>-<n> <n> [custom.py:<n>] " + "w " * 50 + "prompt was '…' done"),
    # a quote never closed (a cut prompt): masked to the end of the line
    (f"custom: prompt='It was a dark night {MARK} and more", "custom: prompt='…'"),
    # a long literal: a blob with no spaces
    (f"sidecar payload data:{MARK}aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ= end", "sidecar payload '…' end"),
    # dotted names and ids keep their shape; a contraction is no quote
    ("vllm.entrypoints.openai.serving_chat.Something: model's chatcmpl-a269fdcb7c6ce890-a8a65d16aaaaaaaa",
     "vllm.entrypoints.openai.serving_chat.Something: model's <id>"),
]


@pytest.mark.parametrize("message,expected", CHECK, ids=range(len(CHECK)))
def test_check_templates_mask_literals_before_cutting(message, expected):
    from bridge.check import template

    assert template(message) == expected
    assert "ZZSECRET" not in template(message)  # not even with its digits masked


# --- end to end: the marker never leaves the node ------------------------------------------------

def _json_record(stamp: str, level: str, name: str, message: str, exc: str) -> str:
    import json
    return json.dumps({"asctime": stamp, "levelname": level, "name": name, "message": message, "exc_info": exc,
                       "processName": "MainProcess", "process": 1, "vllm_process_name": "APIServer"})


def _marked_log() -> list[str]:
    """A V1 log whose user text carries MARK wherever vLLM prints user text, as vLLM words it
    (reference b.1, b.2, f; tests/fixtures/upstream/v1_engine_dead.log)."""
    api, core = "(APIServer pid=1) ", "(EngineCore_DP0 pid=7) "
    lines = [
        # prompt (pre-v0.11 INFO line), stop strings imitating parameters and a LoRA request
        f"{api}INFO 12-01 09:00:00 [logger.py:43] Received request chatcmpl-p1: prompt: '<|user|>{MARK} "
        f"n=9, max_tokens=1', params: SamplingParams(n=1, temperature=0.7, top_p=1.0, stop=['{MARK}', "
        f"\"lora_request: LoRARequest(lora_name='{MARK}')\"], max_tokens=64), prompt_token_ids: [1, 2], "
        "lora_request: None.",
        f"{api}DEBUG 12-01 09:00:00 [logger.py:60] Request chatcmpl-p1 details: prompt: '{MARK}', "
        "prompt_token_ids: [1, 2], prompt_embeds shape: None.",
        f"{api}INFO 12-01 09:00:00 [async_llm.py:316] Added request chatcmpl-p1-1a2b3c4d.",
        f"{api}INFO 12-01 09:00:01 [logger.py:71] Generated response chatcmpl-p1: output: '{MARK} says hi', "
        "output_token_ids: [5, 6], finish_reason: stop",
        # input validation error quoting the client's value
        f"{api}INFO 12-01 09:00:02 [logger.py:43] Received request chatcmpl-p2: params: SamplingParams(n=1, "
        "temperature=1.0, top_p=1.0, max_tokens=16), lora_request: None.",
        f"{api}INFO 12-01 09:00:02 [async_llm.py:441] Request chatcmpl-p2 failed (input error): 1 validation "
        "error for ChatCompletionRequest messages.0.content Input should be a valid string [type=string_type, "
        f"input_value={{'type': 'text', 'text': '{MARK}'}}, input_type=dict].",
        # a request in flight when the engine dies
        f"{api}INFO 12-01 09:00:03 [logger.py:43] Received request chatcmpl-p4: params: SamplingParams(n=1, "
        "temperature=1.0, top_p=1.0, max_tokens=16), lora_request: None.",
        f"{api}INFO 12-01 09:00:03 [async_llm.py:316] Added request chatcmpl-p4.",
        # chat template error (logger.exception: a traceback, user text in a frame and in the last line)
        f"{api}ERROR 12-01 09:00:04 [serving_chat.py:222] Error in preprocessing prompt inputs",
        f"{api}ERROR 12-01 09:00:04 [serving_chat.py:222] Traceback (most recent call last):",
        f"{api}ERROR 12-01 09:00:04 [serving_chat.py:222]   File \"<template>\", line 1, in top-level template code",
        f"{api}ERROR 12-01 09:00:04 [serving_chat.py:222]     messages = [{MARK} from the client]",
        f"{api}ERROR 12-01 09:00:04 [serving_chat.py:222] jinja2.exceptions.UndefinedError: '{MARK}' is undefined",
        # JSON format: exc_info with the client's text
        _json_record("2026-12-01 09:00:05,100", "ERROR", "vllm.entrypoints.openai.serving_chat",
                     "Error in preprocessing prompt inputs",
                     f"Traceback (most recent call last):\n  File \"chat_utils.py\", line 9, in parse\n"
                     f"    {MARK}\nValueError: Unknown part type: '{MARK}'"),
        # engine death whose text quotes a prompt, fanned out to chatcmpl-p4
        f"{core}ERROR 12-01 09:00:06 [core.py:710] EngineCore encountered a fatal error.",
        f"{core}ERROR 12-01 09:00:06 [core.py:710] Traceback (most recent call last):",
        f"{core}ERROR 12-01 09:00:06 [core.py:710]   File \"core.py\", line 701, in run_engine_core",
        f"{core}ERROR 12-01 09:00:06 [core.py:710] RuntimeError: bad sequence for prompt '{MARK}'",
        f"{api}INFO 12-01 09:00:06 [async_llm.py:441] Request chatcmpl-p4 failed (engine dead).",
        # lines the bridge does not know: an unclosed quote and a long literal (check's templates)
        f"sidecar: user typed 'It was a dark night {MARK} and",
        f"sidecar: payload data:{MARK}aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ=",
        f"{api}INFO 12-01 09:00:07 [logger.py:43] Received request chatcmpl-p5: something '{MARK}",
    ]
    out, second = [], "00"
    for line in lines:  # the runtime's stamp: the header's second (a traceback's lines share it)
        m = re.search(r"12-01 09:00:(\d\d)|2026-12-01 09:00:(\d\d)", line)
        second = (m[1] or m[2]) if m else second
        out.append(f"2026-12-01T09:00:{second}.000000000Z stdout F {line}")
    return out


@pytest.fixture
def marked_log(tmp_path):
    from agentkit import pod_log

    path = pod_log(tmp_path)
    with open(path, "w") as f:
        f.write("\n".join(_marked_log()) + "\n")
    return path


def _replay_bytes(path, *flags) -> bytes:
    import io

    from receivers import GrpcReceiver

    from bridge.cli import main

    with GrpcReceiver() as rx:
        out = io.StringIO()
        assert main(["replay", path, "--otlp-endpoint", rx.endpoint, *flags], env={}, out=out) == 0, out.getvalue()
    assert rx.requests, "nothing was exported"
    return b"".join(rx.raw)


def test_marker_never_leaves_the_node_by_replay_or_check(marked_log):
    import io

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from receivers import attrs

    from bridge.cli import main

    sent = _replay_bytes(marked_log)
    assert MARK.encode() not in sent
    spans = [s for rs in ExportTraceServiceRequest.FromString(sent).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    roots = {attrs(s.attributes)["vllm.request.id"]: s for s in spans if s.name == "vllm.request"}
    assert set(roots) >= {"chatcmpl-p1", "chatcmpl-p2", "chatcmpl-p4"}
    # parameters from their own field, not from the prompt or the stop strings
    p1 = attrs(roots["chatcmpl-p1"].attributes)
    assert (p1["gen_ai.request.max_tokens"], p1["gen_ai.request.n"]) == (64, 1) and "vllm.lora.name" not in p1
    # the validation error keeps its words, not the client's value
    assert "<redacted>" in roots["chatcmpl-p2"].status.message
    assert "validation error for ChatCompletionRequest" in roots["chatcmpl-p2"].status.message
    # the engine's death reaches p4 as a type, a time and a link to the incident span
    engines = {(s.trace_id, s.span_id) for s in spans if s.name == "vllm.engine"}
    assert engines  # how many: the assembler's incident grouping (test_lifecycle), not this test's
    p4 = roots["chatcmpl-p4"]
    assert attrs(p4.attributes)["error.type"] == "engine_dead"
    assert p4.links and {(link.trace_id, link.span_id) for link in p4.links} <= engines
    assert all("exception.stacktrace" not in attrs(e.attributes) for s in spans for e in s.events)

    out = io.StringIO()
    assert main(["check", marked_log], env={}, out=out) == 0
    assert "top unrecognised templates" in out.getvalue() and "ZZSECRET" not in out.getvalue()


def test_export_error_text_sends_error_text_and_tracebacks(marked_log):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from receivers import attrs

    sent = _replay_bytes(marked_log, "--export-error-text")
    assert MARK.encode() in sent
    spans = [s for rs in ExportTraceServiceRequest.FromString(sent).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    traces = [attrs(e.attributes).get("exception.stacktrace", "") for s in spans for e in s.events]
    assert any(MARK in t for t in traces)  # a traceback, as logged
    p2 = next(s for s in spans if attrs(s.attributes).get("vllm.request.id") == "chatcmpl-p2")
    assert f"'text': '{MARK}'" in p2.status.message
    # an incident still reaches other requests without its text, even when the operator opted in
    p4 = next(s for s in spans if attrs(s.attributes).get("vllm.request.id") == "chatcmpl-p4")
    assert MARK not in p4.SerializeToString().decode("utf-8", "replace")


def test_marker_never_leaves_the_node_by_the_agent(marked_log, tmp_path):
    from agentkit import AgentProc, Receiver, free_port, wait_for
    from receiver_proc import read_requests

    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint, "--linger", "0")
    try:
        agent.start()
        assert wait_for(lambda: sum(s.name == "vllm.request" for s in rx.spans()) >= 3
                        and sum(s.name == "vllm.engine" for s in rx.spans()) >= 1, deadline(30)), "not everything arrived"
        assert agent.term()[0] == 0
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.kill9()
        rx.stop()
    assert MARK.encode() not in b"".join(read_requests(rx.out))
    with open(agent.stderr_path, encoding="utf-8", errors="replace") as f:
        logs = f.read()
    assert "agent_started" in logs and MARK not in logs


# --- links: the C encoder writes them as wire.py and the reference mapping do ----------------------

def _linked_timeline(kinds_and_occurrences, error: bool):
    from bridge.assemble.timeline import IncidentEvent, IncidentRef, RequestTimeline, SpanEvent
    from bridge.tail.source import source_for

    gauge = SpanEvent("vllm.queue_state", 3, {"vllm.queue.running": 2})
    events = [gauge] + [IncidentEvent("vllm.engine.incident", 5 + i, {"error.type": "oom", "vllm.incident.kind": k},
                                      IncidentRef(k, occ) if occ is not None else None)
                        for i, (k, occ) in enumerate(kinds_and_occurrences)]
    return RequestTimeline(source_for("/var/log/pods/ns_pod_0123/vllm/0.log"), "chatcmpl-a", "1", 1, 10, "observed",
                           "observed", "failed" if error else "finished", "engine_dead" if error else None,
                           "engine failed" if error else "", {"vllm.request.id": "chatcmpl-a"}, events, 0, [], 0, 1)


@pytest.mark.parametrize("incidents", [
    [("nccl_timeout", "17.0")],
    [("cuda_oom", "5.0"), ("engine_dead", "5.1"), ("é", "6.0")],
    [("cuda_oom", None)],  # an incident event without a reference: no link
    [],
])
@pytest.mark.parametrize("error", [False, True])
def test_links_are_encoded_alike_by_c_python_and_the_reference(incidents, error):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from bridge.export import wire
    from bridge.export.ids import incident_ids
    from bridge.export.otlp import request_spans
    from bridge.export.wire import WireEncoder

    t = _linked_timeline(incidents, error)
    payloads = []
    for fast in ([wire.FAST_REQUEST] if wire.FAST_REQUEST is not None else []) + [None]:
        enc = WireEncoder({"service.name": "vllm"}, fast=fast)
        enc.add(t)
        payloads.append(enc.take().payload)
    assert len(set(payloads)) == 1  # C (when built) and Python: the same bytes
    (span,) = [s for rs in ExportTraceServiceRequest.FromString(payloads[0]).resource_spans
               for ss in rs.scope_spans for s in ss.spans]
    assert span == request_spans(t)[0]
    want = [incident_ids(t.source.key, k, occ) for k, occ in incidents if occ is not None]
    assert [(link.trace_id, link.span_id) for link in span.links] == want


def test_a_cut_output_cannot_set_the_finish_reason():
    from bridge.parse import MALFORMED
    from bridge.parse.events import ResponseGenerated

    cut = f"Generated response chatcmpl-a: output: '{MARK}, output_token_ids: [1], finish_reason: {MARK}"
    assert parse_line(cut, "INFO") is MALFORMED
    whole = (f"Generated response chatcmpl-a: output: \"{MARK}', output_token_ids: [1], finish_reason: x\", "
             "output_token_ids: [7, 8], finish_reason: length")
    assert parse_line(whole, "INFO") == ResponseGenerated("chatcmpl-a", "length", 2, "")


@pytest.mark.parametrize("reason,expected", [
    # vLLM 0.32's own lines (a review's capture, tests/fixtures/real_vllm/v032_canaries_info.log)
    (f"bad request: Grammar error: Invalid type: {MARK}", "bad request: Grammar error: Invalid type: <redacted>"),
    (f"bad request: Grammar error: Invalid type: {MARK}.", "bad request: Grammar error: Invalid type: <redacted>."),
    (f'bad request: Grammar error: at 1(8): invalid regex "{MARK}([" (in regex): regex parse error:\n    {MARK}([\n'
     f"               ^\nerror: unclosed character class\n   1 | start: /{MARK}([/",
     "bad request: Grammar error: at 1<redacted>: invalid regex <redacted> (in regex): regex parse error:"),
    ("bad request: This model's maximum context length is 4096 tokens. However, your prompt contains at least "
     "4097 input tokens", "bad request: This model's maximum context length is 4096 tokens. However, your prompt "
     "contains at least 4097 input tokens"),
    ("internal error", "internal error"),
    # a number it ends on is vLLM's limit or the client's count, not text (a review: masked)
    ("bad request: max_tokens is too large, max allowed: 4096.", "bad request: max_tokens is too large, max allowed: 4096."),
])
def test_a_request_failure_keeps_its_first_line_and_not_a_value_it_echoes(reason, expected):
    from bridge.parse.literals import redact_request_error

    assert redact_request_error(reason) == expected


@pytest.mark.parametrize("reason,expected", [
    # what a review showed passing the list of shapes (session 9's note): a value vLLM echoes
    # unquoted, with more text after it or in the middle of its sentence
    (f"bad request: Grammar error: Invalid type: {MARK} {MARK}b {MARK}c",
     "bad request: Grammar error: Invalid type: <redacted>"),
    (f"bad request: Grammar error: Invalid type: {MARK}, expected object",
     "bad request: Grammar error: Invalid type: <redacted>, expected object"),
    (f"bad request: Invalid grammar specification: Rule {MARK} not found",
     "bad request: Invalid grammar specification: Rule <redacted> not found"),
    (f"bad request: 'dict' object has no attribute {MARK}", "bad request: <redacted> object has no attribute <redacted>"),
    # vLLM's own words and numbers stay
    ("bad request: Requested sample logprobs of 50, which is greater than max allowed: 20 (parameter=logprobs, "
     "value=50).", "bad request: Requested sample logprobs of 50, which is greater than max allowed: 20 "
     "(parameter=logprobs, value=50)."),
    ("bad request: Token id 999999 is out of vocabulary.", "bad request: Token id 999999 is out of vocabulary."),
    # in any script, digits of other scripts and words glued to vLLM's by `_` or `-` included
    ("bad request: Invalid type: 秘密の値 ١٢٣ max_tokens-ZZSECRET42",
     "bad request: Invalid type: <redacted> max_tokens-<redacted>"),
    # a value spelled out letter by letter; a Kelvin sign that lower-cases to ASCII `k`
    ("bad request: Invalid type: z.q.x.j, expected object",
     "bad request: Invalid type: <redacted>.<redacted>.<redacted>.<redacted>, expected object"),
    ("bad request: Invalid type: \u212aey", "bad request: Invalid type: <redacted>"),
])
def test_a_request_failure_keeps_only_words_vllm_itself_uses(reason, expected):
    from bridge.parse.literals import redact_request_error

    assert redact_request_error(reason) == expected


def test_a_vocabulary_that_cannot_be_read_masks_every_word(tmp_path):
    from bridge.parse.literals import Vocabulary, only_vllm_words

    words = Vocabulary(str(tmp_path / "missing.txt"))
    assert only_vllm_words("bad request: Rule x not found at 12", words) == "<redacted>: <redacted> 12"


def test_a_request_failure_text_is_bounded():
    from bridge.parse.literals import MAX_REQUEST_ERROR, redact_request_error

    out = redact_request_error("bad request: " + "invalid type " * 100_000)
    assert len(out) == MAX_REQUEST_ERROR + 1 and out.endswith("…")


@pytest.mark.real_vllm
def test_the_vocabulary_covers_the_installed_vllm():
    """`bridge/parse/vllm_words.txt` holds every word of the messages of the vLLM the tests run
    (tests/vllm_env/vocabulary.py): after a vLLM upgrade a new word would be masked, never
    leaked, but the list should be made again (the command is in that script)."""
    import subprocess
    from pathlib import Path

    venv = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache" / "vllm-trace-bridge" / "vllm-venv"))
    if not (venv / "bin" / "python").exists():
        pytest.skip("no vLLM venv (tests/vllm_env/install.sh)")
    root = Path(__file__).resolve().parent.parent
    made = subprocess.run([str(venv / "bin" / "python"), str(root / "tests" / "vllm_env" / "vocabulary.py")],
                          capture_output=True, text=True, check=True, timeout=deadline(300)).stdout.split()
    shipped = set((root / "bridge" / "parse" / "vllm_words.txt").read_text(encoding="ascii").split())
    assert len(made) > 5000
    assert set(made) - shipped == set()
    assert MARK.lower() not in shipped
    # the script splits vLLM's text into words as the bridge splits a failure line
    script = (root / "tests" / "vllm_env" / "vocabulary.py").read_text(encoding="utf-8")
    from bridge.parse.literals import WORD
    assert f'WORD = re.compile(r"{WORD.pattern}")' in script


REAL = os.path.join(os.path.dirname(__file__), "fixtures", "real_vllm")


@pytest.mark.parametrize("name", ["v032_canaries_info", "v032_canaries_debug"])
def test_no_canary_a_client_sent_leaves_the_node(name):
    """A review drove a real vLLM 0.32 (INFO; DEBUG with --log-error-stack) with a canary in
    every field a client controls, valid and invalid requests. Nothing the bridge exports may
    hold one, but the request ids (X-Request-Id is the client's id for its request). Before
    this commit two leaked: a json_schema type (`Grammar error: Invalid type: CANARYIx10`)
    and an invalid regex repeated on the lines after the first."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sent = _replay_bytes(os.path.join(REAL, name + ".log"))
    request = ExportTraceServiceRequest.FromString(sent)
    leaks = []
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                texts = [s.name, s.status.message] + [
                    str(kv.value) for kv in s.attributes if kv.key not in ("vllm.request.id", "gen_ai.response.id")]
                texts += [str(kv.value) for e in s.events for kv in e.attributes]
                leaks += [t for t in texts if "CANARY" in t]
    assert leaks == []


@pytest.mark.parametrize("name", ["v032_canaries_info", "v032_canaries_debug"])
def test_a_client_error_is_not_an_engine_incident(name):
    """vLLM logs a request for a model it does not serve at ERROR (`Error with model …
    code=404`), and with --log-error-stack every refused request too. The engine was fine
    (the client's record: later requests answered 200). Before this commit each became an
    engine incident, and a model named `…-died` an engine death that failed every completion
    in flight (5 of them answered 200 in this capture)."""
    import json

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from receivers import attrs

    sent = _replay_bytes(os.path.join(REAL, name + ".log"))
    spans = [s for rs in ExportTraceServiceRequest.FromString(sent).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    engines = [attrs(s.attributes) for s in spans if s.name == "vllm.engine"]
    assert [e for e in engines if e.get("vllm.incident.fatal") or e.get("error.type") == "engine_dead"] == []
    assert not any(e.name == "vllm.engine.incident" for s in spans for e in s.events)
    with open(os.path.join(REAL, name + ".truth.json")) as f:
        truth = json.load(f)["requests"]
    answered = {t["resp_id"] for t in truth if t["status"] == 200 and t["ended"] == "complete" and t["resp_id"]}
    roots = {attrs(s.attributes)["vllm.request.id"]: attrs(s.attributes) for s in spans if s.name == "vllm.request"}
    wrong = {rid: a["vllm.outcome"] for rid, a in roots.items() if rid in answered and a["vllm.outcome"] != "finished"}
    assert wrong == {}
    assert not any(rid.startswith("tokenize-") for rid in roots)  # DEBUG's `Request tokenize-… details`
