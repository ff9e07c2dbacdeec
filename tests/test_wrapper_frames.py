"""Decode: vLLM's lines inside the frames real logs put around them (issue #35). Each case is
the shape of a corpus excerpt (tests/corpus/), reduced to one or two lines."""

from __future__ import annotations

from bridge.decode import Decoder
from bridge.decode.stream import RecordStream


def _records(*lines: str):
    stream = RecordStream(Decoder(year=2025))
    out = []
    for i, line in enumerate(lines):
        out += stream((line + "\n").encode(), i * 1000)
    return out + stream.flush()


def test_a_header_without_seconds_or_with_a_rendered_bracket_is_vllm_s_header():
    a, b = _records("(EngineCore_DP0 pid=2776) ERROR 11-03 23:14 [core.py:710] EngineCore encountered a fatal error.",
                    "(APIServer pid=1) INFO 10-20 03:20:50 [serving_chat.py:1136[] Generating")
    assert (a.level, a.origin, a.process, a.message) == ("ERROR", "core.py:710", "EngineCore_DP0 pid=2776",
                                                          "EngineCore encountered a fatal error.")
    assert a.ts_ns % 60_000_000_000 == 0  # the minute's start
    assert (b.level, b.origin, b.message) == ("INFO", "serving_chat.py:1136", "Generating")


def test_a_level_that_lost_its_first_letter_at_the_line_start():
    (r,) = _records("NFO 12-17 10:47:07 [loader.py:458] Loading weights took 3.44 seconds")
    assert (r.level, r.origin, r.message) == ("INFO", "loader.py:458", "Loading weights took 3.44 seconds")


def test_ray_colour_codes_whose_esc_became_a_space_and_a_serve_replica_prefix():
    a, b = _records(" [36m(RayWorkerVllm pid=5085) [0m [E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog caught",
                    "(ServeReplica:app:LLMDeployment pid=12249, ip=10.0.155.99) INFO 07-01 10:00:00 [core.py:1] x")
    assert (a.process, a.message) == ("RayWorkerVllm pid=5085", "[E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog caught")
    assert (b.process, b.level, b.message) == ("ServeReplica:app:LLMDeployment pid=12249, ip=10.0.155.99", "INFO", "x")


def test_a_wrapper_relaying_a_child_s_lines_is_taken_off_and_the_cut_traceback_is_one_record():
    for wrap in ("2024-11-18T16:43:45,497 [INFO ] W-9000-model_1.0-stdout MODEL_LOG - ",  # TorchServe (log4j)
                 "2025-06-06T19:02:34.252Z DEBUG dynamo_run::subprocess: "):             # Dynamo (Rust tracing)
        (r,) = _records(wrap + '  File "/v/engine.py", line 586, in run_mp_engine',
                        wrap + "    engine = MQLLMEngine.from_vllm_config(",
                        wrap + 'RuntimeError: boom')
        assert r.message == ('  File "/v/engine.py", line 586, in run_mp_engine\n'
                             "    engine = MQLLMEngine.from_vllm_config(\nRuntimeError: boom"), wrap
        assert r.clock == "shipper"
