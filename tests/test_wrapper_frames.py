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
                 "2025-06-06T19:02:34.252Z DEBUG dynamo_run::subprocess: ",              # Dynamo (Rust tracing)
                 "2025-06-27 12:57:51,690 - __main__ - INFO - ",                        # an app's Python logging
                 "2023-12-15 00:46:02 | ERROR | stderr | "):                           # FastChat's, pipe-separated
        (r,) = _records(wrap + '  File "/v/engine.py", line 586, in run_mp_engine',
                        wrap + "    engine = MQLLMEngine.from_vllm_config(",
                        wrap + 'RuntimeError: boom')
        assert r.message == ('  File "/v/engine.py", line 586, in run_mp_engine\n'
                             "    engine = MQLLMEngine.from_vllm_config(\nRuntimeError: boom"), wrap
        assert r.clock == "shipper"


def test_fastchat_s_pipe_separated_frame_is_taken_off_but_not_a_padded_level_or_a_name_with_colons():
    """FastChat's `%(asctime)s | %(levelname)s | %(name)s | ` (its workers' stderr relayed at ERROR):
    the frame goes, the line after it is read as vLLM wrote it (batch E, fastchat-2817)."""
    a, b = _records("2023-12-15 00:46:02 | ERROR | stderr | Traceback (most recent call last):",
                    "2023-12-15 00:46:03 | INFO | model_worker | Register to controller")
    assert (a.message, a.clock) == ("Traceback (most recent call last):", "shipper")
    assert b.message == "Register to controller"
    # near misses: loguru pads its level and names a `module:function:line` cell, no second bar
    (r,) = _records("2025-06-27 09:47:30.997 | INFO     | models.config:__init__:455 - Inferring device name")
    assert r.message.startswith("INFO     | models.config")
    (r,) = _records("2023-12-15 00:46:02 | ERROR | stderr Traceback (most recent call last):")
    assert r.message.startswith("ERROR | stderr Traceback")


def test_a_log_viewer_s_table_row_around_its_stamp_is_taken_off_but_loguru_s_columns_are_not_a_table():
    (r,) = _records("U | 2025-07-18 11:29:37.824 | worker |   | ray.exceptions.ActorDiedError: The actor died")
    assert (r.message, r.clock) == ("ray.exceptions.ActorDiedError: The actor died", "shipper")
    # loguru's own line starts with its stamp (no cell before it): its level cell is its line's
    (r,) = _records("2025-06-27 09:47:30.997 | INFO     | models.config:__init__:455 - Inferring device name: N150")
    assert r.message.startswith("INFO     | models.config")


def test_records_before_the_first_stamp_take_its_time_not_the_file_s_mtime():
    mtime = 1.9e9  # the file was last written long after its lines
    stream = RecordStream(Decoder(year=2025, mtime=mtime))
    out = list(stream(b"Traceback (most recent call last):\n", 0))
    out += stream(b'  File "/v/core.py", line 1, in run\n', 36)
    out += stream(b"RuntimeError: boom\n", 74)
    assert stream.held_position == 0  # held until a stamp comes: a resume re-reads them
    out += stream(b"INFO 10-01 16:06:04 [core.py:1] next\n", 93)
    out += stream.flush()
    assert [r.message.split("\n")[0] for r in out] == ["Traceback (most recent call last):", "next"]
    assert out[0].ts_ns == out[1].ts_ns < mtime * 1e9 and out[0].clock == "anchored"
    assert stream.held_position is None


def test_without_any_stamp_the_records_keep_what_they_had():
    stream = RecordStream(Decoder(year=2025, mtime=1.9e9))
    out = [*stream(b"just a line\n", 0), *stream(b"another\n", 12), *stream.flush()]
    assert [r.message for r in out] == ["just a line", "another"]
    assert {r.ts_ns for r in out} == {int(1.9e9 * 1e9)}


def test_a_torch_line_with_a_rank_and_no_thread_id_has_its_own_stamp():
    (r,) = _records("[rank2]:[E1001 16:06:04.537131842 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught")
    assert r.clock == "header" and r.ts_ns % 1_000_000_000 == 537131842


def test_torch_npu_s_error_report_has_its_own_stamp():
    (r,) = _records("(APIServer pid=585) [ERROR] 2025-12-05-07:51:07 (PID:585, Device:-1, RankID:-1) ERR99999 UNKNOWN")
    assert r.clock == "header" and r.process == "APIServer pid=585" and r.message.startswith("[ERROR] 2025-12-05")


def test_a_bracketed_stamp_of_a_ci_runner_or_ray_s_cpp_logger_wins_over_the_header():
    a, b, c = _records("  | [2025-03-10T15:07:20Z] ERROR 03-10 08:07:20 [core.py:302] EngineCore hit an exception",
                       "[2024-02-27 16:09:19,123 E 1234 5678] logging.cc:361: *** SIGSEGV received",
                       " [36m(RayWorkerWrapper pid=7) [0m [rank0]:[E ProcessGroupNCCL.cpp:1] x")
    assert (a.level, a.clock, a.message) == ("ERROR", "shipper", "EngineCore hit an exception")
    assert a.ts_ns == 1741619240 * 10**9  # 15:07:20Z, not the header's local 08:07:20
    assert (b.clock, b.message) == ("shipper", "logging.cc:361: *** SIGSEGV received")
    assert b.ts_ns == 1709050159 * 10**9 + 123_000_000
    assert c.process == "RayWorkerWrapper pid=7"  # a colour code is no stamp


def test_a_viewer_s_column_read_before_a_header_is_taken_off_the_lines_without_one():
    a, b = _records("kserve-container INFO 09-02 06:44:03 [__init__.py:245] No platform detected",
                       "kserve-container Traceback (most recent call last):",
                       'kserve-container   File "<frozen runpy>", line 198, in _run_module_as_main')
    assert (a.level, a.message) == ("INFO", "No platform detected")
    assert b.message == 'Traceback (most recent call last):\n  File "<frozen runpy>", line 198, in _run_module_as_main'


def test_torch_s_c10_stamp_with_an_unpadded_month_times_the_traceback_before_it():
    """c10's logger writes `[W505 14:36:29.719…]` for May 5: that stamp, not the wall clock, times
    the unstamped traceback before it (a file's first stamp anchors what came before)."""
    from datetime import datetime, timezone

    records = _records("RuntimeError: CUDA error: an illegal memory access was encountered",
                       "[rank0]:[W505 14:36:29.719250907 ProcessGroupNCCL.cpp:1496] Warning: WARNING: "
                       "destroy_process_group() was not called before program exit")
    assert {datetime.fromtimestamp(r.ts_ns // 10**9, timezone.utc).isoformat() for r in records} == \
        {"2025-05-05T14:36:29+00:00"}
