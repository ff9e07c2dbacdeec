"""Privacy by default (issue #17, part 2): parameters only from their own field, error text
redacted, incidents fanned out without text, `check` masks literals. Expectations are written
by hand from the input lines."""

import time

import pytest

from bridge.parse import parse_line
from bridge.parse.events import RequestReceived
from bridge.parse.literals import mask_literals, redact_error_text

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
     "ValueError: 1 validation error for ChatCompletionRequest messages.0.content Input should be a valid "
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
