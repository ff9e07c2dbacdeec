"""Upstream framing (reference a.1–a.4) and multi-line joining, line by line, expected by hand."""

from datetime import datetime

import pytest

from bridge.decode import Decoder
from bridge.decode.joiner import Joiner

NS = 1_000_000_000
E = "\x1b"


def ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp()) * NS


def decode(line: str, year: int = 2025):
    return Decoder(year=year)(line.encode() + b"\n", 0)


@pytest.mark.parametrize("line,process,level,origin,message", [
    ("INFO 01-22 18:27:20 metrics.py:449] Avg prompt", "", "INFO", "metrics.py:449", "Avg prompt"),
    ("INFO 04-10 03:35:45 [async_llm.py:204] Added request x.", "", "INFO", "async_llm.py:204", "Added request x."),
    ("DEBUG 10-22 09:33:49 [v1/engine/core.py:123] step", "", "DEBUG", "v1/engine/core.py:123", "step"),
    ("(APIServer pid=1) INFO 10-22 09:33:49 [logger.py:43] Received", "APIServer pid=1", "INFO", "logger.py:43", "Received"),
    ("(EngineCore_DP0 pid=77352) INFO 10-22 09:33:49 [kv_cache_utils.py:1087] GPU KV cache size: 162,704 tokens",
     "EngineCore_DP0 pid=77352", "INFO", "kv_cache_utils.py:1087", "GPU KV cache size: 162,704 tokens"),
    ("(Worker_TP0 pid=11) INFO 10-22 09:33:49 [gpu_worker.py:298] x", "Worker_TP0 pid=11", "INFO", "gpu_worker.py:298", "x"),
    ("(VllmWorker rank=0 pid=5) INFO 10-22 09:33:49 [a.py:1] x", "VllmWorker rank=0 pid=5", "INFO", "a.py:1", "x"),
    ("(VllmWorker TP0 pid=5) INFO 10-22 09:33:49 [a.py:1] x", "VllmWorker TP0 pid=5", "INFO", "a.py:1", "x"),
    (f"{E}[1;36m(VllmWorkerProcess pid=521){E}[0;0m INFO 12-18 09:00:05 multiproc_worker_utils.py:222] ready",
     "VllmWorkerProcess pid=521", "INFO", "multiproc_worker_utils.py:222", "ready"),
    ("(RayWorkerWrapper pid=206994, ip=192.168.10.25) INFO 06-10 12:00:00 [a.py:1] x",
     "RayWorkerWrapper pid=206994, ip=192.168.10.25", "INFO", "a.py:1", "x"),
    # colour: level in green, timestamp and [file:line] in grey, coloured process prefix
    (f"{E}[36m(APIServer pid=1){E}[0m {E}[32mINFO{E}[0m {E}[90m12-05 14:00:00 [api_server.py:1896]{E}[0m v",
     "APIServer pid=1", "INFO", "api_server.py:1896", "v"),
    # VLLM_LOGGING_PREFIX: literal text before the level
    ("(APIServer pid=1) [pod-a] WARNING 12-05 14:00:12 [a.py:9] w", "APIServer pid=1", "WARNING", "a.py:9", "w"),
    ("myprefix|ERROR 12-05 14:00:12 [a.py:9] e", "", "ERROR", "a.py:9", "e"),
    # header-less writers keep their process
    ("(APIServer pid=1) INFO:     10.0.0.1:5 - \"GET /health HTTP/1.1\" 200 OK", "APIServer pid=1", "", "",
     "INFO:     10.0.0.1:5 - \"GET /health HTTP/1.1\" 200 OK"),
    ("(EngineCore pid=104) Traceback (most recent call last):", "EngineCore pid=104", "", "", "Traceback (most recent call last):"),
])
def test_headers_prefixes_and_colour(line, process, level, origin, message):
    r = decode(line)
    assert (r.process, r.level, r.origin, r.message) == (process, level, origin, message)


def test_shipper_stamp_wins_over_the_header_and_is_stripped():
    r = decode("2025-10-22T09:33:49.250Z (APIServer pid=1) INFO 10-22 09:33:48 [logger.py:43] hello")
    assert (r.clock, r.ts_ns) == ("shipper", ns("2025-10-22T09:33:49+00:00") + NS // 4)
    assert (r.process, r.message) == ("APIServer pid=1", "hello")
    r = decode("2025-10-22 09:33:50,500 +02:00 INFO:     Shutting down")
    assert (r.clock, r.ts_ns, r.message) == ("shipper", ns("2025-10-22T07:33:50+00:00") + NS // 2, "INFO:     Shutting down")


def test_a_level_before_a_full_date_stamp_gives_the_stamp():
    # Python logging's `%(levelname)s %(asctime)s …` (Ray Serve's controller and proxy, many apps)
    r = decode("WARNING 2025-03-04 10:11:12,250 proxy 12 proxy_state.py:99 - Proxy is unhealthy.")
    assert (r.clock, r.ts_ns, r.level) == ("shipper", ns("2025-03-04T10:11:12+00:00") + NS // 4, "")
    assert r.message == "proxy 12 proxy_state.py:99 - Proxy is unhealthy."
    r = decode("(ProxyActor pid=5) ERROR 2025-03-04 10:11:13,500 proxy 5 -- Request failed.")
    assert (r.process, r.clock, r.ts_ns) == ("ProxyActor pid=5", "shipper", ns("2025-03-04T10:11:13+00:00") + NS // 2)
    assert r.message == "proxy 5 -- Request failed."
    # vLLM's header is still the header; a level then words is no stamp
    r = decode("INFO 03-04 10:11:12 [api_server.py:1] ok")
    assert (r.level, r.clock, r.message) == ("INFO", "header", "ok")
    r = decode("ERROR 2025 was the year it failed")
    assert (r.level, r.message) == ("", "ERROR 2025 was the year it failed")


def test_other_junk_before_the_header_is_dropped():
    r = decode("kubernetes.var.log.containers.vllm stdout: INFO 10-22 09:33:49 [a.py:1] m")
    assert (r.level, r.message, r.clock) == ("INFO", "m", "header")


def test_trailing_carriage_return_marks_a_continued_message():
    d = Decoder(year=2025)
    a = d(b"INFO 12-18 09:00:33 worker.py:241] Memory profiling takes 2.72 seconds\r\n", 0)
    b = d(b"INFO 12-18 09:00:33 worker.py:241] model weights take 7.12GiB\n", 80)
    assert (a.continued, a.message) == (True, "Memory profiling takes 2.72 seconds")
    assert b.continued is False


def feed(lines: list[str], year: int = 2025) -> tuple[list, Joiner]:
    d, j, out, offset = Decoder(year=year), Joiner(), [], 0
    for line in lines:
        raw = line.encode() + b"\n"
        rec = d(raw, offset)
        offset += len(raw)
        if rec is not None:
            out.extend(j(rec))
    tail = j.flush()
    if tail is not None:
        out.append(tail)
    return out, j


def test_header_repeating_traceback_joins_into_its_error_and_releases_at_the_last_line():
    h = "ERROR 03-20 11:02:05 [async_llm_engine.py:70] "
    lines = [h + "Engine background task failed\r", h + "Traceback (most recent call last):\r",
             h + "  File \"x.py\", line 1, in f\r", h + "asyncio.exceptions.CancelledError"]
    d, j = Decoder(year=2025), Joiner()
    got = []
    for i, line in enumerate(lines):
        got.append(j(d(line.encode() + b"\n", i * 100)))
    assert got[:3] == [(), (), ()]
    (rec,) = got[3]  # released by its own last line, not held until the next one
    assert rec.message == ("Engine background task failed\nTraceback (most recent call last):\n"
                           "  File \"x.py\", line 1, in f\nasyncio.exceptions.CancelledError")
    assert (rec.offset, rec.level, rec.origin) == (0, "ERROR", "async_llm_engine.py:70")
    assert j.stats.lines_joined == 3 and j.flush() is None


def test_three_line_memory_profiling_message_is_one_record():
    h = "INFO 12-18 09:00:33 worker.py:241] "
    out, _ = feed([h + "Memory profiling takes 2.72 seconds\r", h + "the current vLLM instance can use x\r",
                   h + "model weights take 7.12GiB", "INFO 12-18 09:00:34 a.py:1] next"])
    assert [r.message.count("\n") for r in out] == [2, 0]


def test_raw_chained_traceback_with_pid_and_rank_prefixes():
    p = "(EngineCore pid=104) "
    out, _ = feed([
        p + "Process EngineCore:", p + "Traceback (most recent call last):", p + "  File \"a.py\", line 1, in <module>",
        p + "    x()", p + "    ^^^", p + "ValueError: bad", "", p + "The above exception was the direct cause of the following exception:",
        "", p + "Traceback (most recent call last):", p + "  File \"b.py\", line 2", p + "RuntimeError: Engine core initialization failed.",
        "(APIServer pid=1) INFO:     Shutting down",
        "[rank0]: Traceback (most recent call last):", "[rank0]:   File \"c.py\", line 3", "[rank0]: KeyError: 'x'",
    ])
    assert len(out) == 3
    assert out[0].process == "EngineCore pid=104" and out[0].message.startswith("Process EngineCore:\nTraceback")
    assert out[0].message.endswith("RuntimeError: Engine core initialization failed.")
    assert out[1].message == "INFO:     Shutting down"
    assert out[2].message.count("\n") == 2


def test_torch_cpp_block_is_one_record():
    r = "[rank1]:"
    out, _ = feed([
        r + "[E321 12:15:00.408271257 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout",
        r + "[E321 12:15:00.408612329 ProcessGroupNCCL.cpp:695] [Rank 1] To avoid data inconsistency, we are taking the entire process down.",
        "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 (most recent call first):",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f1e6d16c446 in libc10.so)",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        "  what():  [PG 0 Rank 1] Process group watchdog thread terminated with exception",
        "INFO 06-10 12:15:01 [a.py:1] after",
    ])
    assert [r.message.count("\n") for r in out] == [5, 0]


def test_ordinary_lines_pass_straight_through():
    d, j = Decoder(year=2025), Joiner()
    rec = d(b"INFO 01-15 08:01:00 [async_llm.py:368] Added request x.\n", 0)
    assert j(rec) == (rec,)


def test_a_pending_error_line_is_released_by_the_next_line_and_by_flush():
    out, _ = feed(["ERROR 01-15 08:01:00 [a.py:1] boom", "INFO 01-15 08:01:00 [a.py:2] fine"])
    assert [r.message for r in out] == ["boom", "fine"]
    out, _ = feed(["ERROR 01-15 08:01:00 [a.py:1] boom"])
    assert [r.message for r in out] == ["boom"]


def test_crlf_files_are_not_joined_into_one_record():
    lines = [f"INFO 01-15 08:01:0{i} [async_llm.py:368] Added request r{i}.\r" for i in range(8)]
    out, _ = feed(lines)
    assert len(out) >= 6  # after a few lines the joiner stops taking `\r` as vLLM's marker


def test_groups_are_cut_at_the_bound():
    d, j = Decoder(year=2025), Joiner(max_lines=5)
    out = []
    for i, line in enumerate(["Traceback (most recent call last):"] + ["  File \"x.py\", line 1"] * 20):
        out.extend(j(d(line.encode() + b"\n", i)))
    tail = j.flush()
    assert j.stats.cut >= 1 and out and out[0].message.count("\n") == 4
    assert tail is None or tail.message


# -- paste and terminal damage, read by how it is made (joiner.py's docstring) ------------------

from bridge.decode.stream import FAST, RecordStream  # noqa: E402


def _records(lines: list[str], fast) -> list:
    """A plain file's lines through the decoder and joiner, as replay reads them."""
    out, offset = [], 0
    framed = []
    for line in lines:
        raw = line.encode() + b"\n"
        framed.append((offset, raw))
        offset += len(raw)
    return list(RecordStream(Decoder(year=2025), fast=fast).over(framed))


PATHS = [pytest.param(None, id="python")] + ([pytest.param(FAST, id="c")] if FAST is not None else [])


@pytest.mark.parametrize("fast", PATHS)
def test_a_pretty_printed_json_record_is_one_record_timed_by_its_own_stamp(fast):
    # python-json-logger with json_indent=4, exc_info as the formatter's string
    lines = ["{",
             '    "asctime": "2025-09-14 21:05:11,042",',
             '    "levelname": "ERROR",',
             '    "name": "vllm.v1.engine.core",',
             '    "message": "EngineCore encountered a fatal error.",',
             '    "exc_info": "Traceback (most recent call last):\\n  File \\"core.py\\", line 7, in run\\n'
             'torch.OutOfMemoryError: CUDA out of memory.",',
             '    "vllm_process_name": "EngineCore_DP0",',
             '    "process": 88',
             "}",
             "INFO 09-14 21:05:12 [launcher.py:80] Shutting down FastAPI HTTP server."]
    recs = _records(lines, fast)
    assert len(recs) == 2
    rec = recs[0]
    assert (rec.level, rec.origin, rec.process, rec.clock) == ("ERROR", "vllm.v1.engine.core", "EngineCore_DP0 pid=88",
                                                               "json")
    assert rec.ts_ns == ns("2025-09-14T21:05:11+00:00") + 42_000_000
    assert rec.message.startswith("EngineCore encountered a fatal error.\nTraceback") and rec.message.endswith(
        "CUDA out of memory.")
    assert (rec.offset, rec.end_offset) == (0, recs[1].offset)
    assert recs[1].message == "Shutting down FastAPI HTTP server."


@pytest.mark.parametrize("fast", PATHS)
def test_a_pretty_printed_json_record_cut_before_its_end_is_read_from_its_complete_members(fast):
    # cut inside exc_info, given as a list of lines: the members before the cut are the record
    lines = ["{", '  "asctime": "2025-03-02 10:00:01,500",', '  "levelname": "CRITICAL",',
             '  "message": "Uncaught exception",', '  "exc_info": [', '    "Traceback (most recent call last):",',
             '    "huggingface_hub.errors.GatedRepoError: 403 Client Error.",', '    "File \\"/x/hub.py\\", li']
    (rec,) = _records(lines, fast)
    assert (rec.level, rec.clock, rec.ts_ns) == ("CRITICAL", "json", ns("2025-03-02T10:00:01+00:00") + NS // 2)
    assert rec.message == ("Uncaught exception\nTraceback (most recent call last):\n"
                           "huggingface_hub.errors.GatedRepoError: 403 Client Error.")


@pytest.mark.parametrize("fast", PATHS)
def test_a_brace_block_that_is_no_json_record_is_not_read_as_one(fast):
    # a Python dict printed over lines (single quotes: no JSON), then a `{` a header line follows
    lines = ["{", "    'model': 'facebook/opt-125m',", "    'dtype': 'auto',", "}", "{",
             "INFO 09-14 21:05:12 [api_server.py:1] vLLM API server version 0.10.1"]
    recs = _records(lines, fast)
    assert [(r.level, r.message) for r in recs] == [
        ("", "{\n    'model': 'facebook/opt-125m',\n    'dtype': 'auto',\n}"), ("", "{"),
        ("INFO", "vLLM API server version 0.10.1")]


def _width(rows: list[str], width: int) -> list[str]:
    """What a terminal `width` columns wide shows of `rows`: each cut every `width` columns."""
    return [row[i:i + width] for row in rows for i in range(0, max(len(row), 1), width)]


@pytest.mark.parametrize("fast", PATHS)
def test_rows_a_terminal_wrapped_are_one_line_again(fast):
    rows = ["Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/model_runner.py", line 1250, in profile_run',
            "    self.execute_model(model_input, kv_caches, intermediate_tensors)",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
            "23.64 GiB of which 1.12 GiB is free.",
            "INFO 05-02 08:00:03 [launcher.py:80] Shutting down FastAPI HTTP server."]
    shown = _width(rows, 80)
    assert len(shown) > len(rows) and all(len(r) <= 80 for r in shown)
    recs = _records(shown, fast)
    assert [r.message for r in recs] == ["\n".join(rows[:4]), "Shutting down FastAPI HTTP server."]


@pytest.mark.parametrize("fast", PATHS)
def test_rows_that_only_look_wrapped_stay_apart(fast):
    long_row = "x" * 90
    lines = [
        "RuntimeError: " + "a" * 69 + ".",  # 84 columns, the widest so far, then a new sentence: no word cut
        "Check the model path.",
        "ValueError: " + "b" * 40,          # shorter than the widest row: no terminal wrapped it
        "cdefg",
        long_row,                            # 90 columns, cut inside a word: the terminal's width
        "continued",
        "y" * 120,                           # wider than that: no terminal wrapped these rows
        "  (indented: no wrapped rest)",
        "w" * 130 + ".so",                   # the widest row, ending in a word: then a new line, capitalised
        "Memory access fault by GPU node-3",
        "z" * 90,                            # as wide as the width learnt before, which is void now
        "zz",
    ]
    recs = _records(lines, fast)
    assert [r.message for r in recs] == [lines[0], "Check the model path.", lines[2], "cdefg",
                                         long_row + "continued", "y" * 120, "  (indented: no wrapped rest)",
                                         "w" * 130 + ".so", "Memory access fault by GPU node-3", "z" * 90, "zz"]


@pytest.mark.parametrize("fast", PATHS)
def test_a_traceback_whose_indentation_was_squashed_is_one_record(fast):
    # pasted outside a code block: the renderer collapsed each line's leading spaces
    lines = ["Traceback (most recent call last):",
             'File "/opt/vllm/vllm/v1/engine/core.py", line 83, in __init__',
             "self._initialize_kv_caches(vllm_config)",
             'File "/opt/vllm/vllm/v1/worker/gpu_worker.py", line 210, in determine_available_memory',
             "self.model_runner.profile_run()",
             "RuntimeError: CUDA error: out of memory",
             "Loading the next model now"]
    recs = _records(lines, fast)
    assert [r.message for r in recs] == ["\n".join(lines[:6]), lines[6]]
    # a line that names a file is no frame: it starts nothing
    recs = _records(['File "config.json" not found, using defaults', "done"], fast)
    assert [r.message for r in recs] == ['File "config.json" not found, using defaults', "done"]


@pytest.mark.parametrize("fast", PATHS)
def test_a_cut_tracebacks_leading_source_line_joins_the_frame_after_it(fast):
    lines = ["2025-02-11 09:15:02,120 [INFO ] W-9000-llm-stdout MODEL_LOG -     engine = build_engine(args)",
             '2025-02-11 09:15:02,121 [INFO ] W-9000-llm-stdout MODEL_LOG -   File "/app/serve.py", line 40, in build_engine',
             "2025-02-11 09:15:02,121 [INFO ] W-9000-llm-stdout MODEL_LOG -     raise OSError(path)"]
    (rec,) = _records(lines, fast)
    assert rec.message.split("\n")[0] == "    engine = build_engine(args)"
    assert rec.ts_ns == ns("2025-02-11T09:15:02+00:00") + 120_000_000
    # an indented line no frame follows is left as it was
    recs = _records(["    max_model_len: 4096", "tensor_parallel_size: 2"], fast)
    assert [r.message for r in recs] == ["    max_model_len: 4096", "tensor_parallel_size: 2"]


def test_wrapped_rows_without_end_are_cut_at_the_size_bound():
    d, j = Decoder(year=2025), Joiner(max_chars=4096)
    out, offset = [], 0
    for i in range(400):
        row = ("ab" * 50) if i else ("RuntimeError: " + "x" * 86)  # 100 columns, each the rest of the last
        raw = row.encode() + b"\n"
        rec = d(raw, offset)
        offset += len(raw)
        out.extend(j(rec))
    tail = j.flush()
    out += [tail] if tail is not None else []
    assert j.stats.cut >= 1 and all(len(r.message) <= 4096 + 100 for r in out)
    assert sum(len(r.message) for r in out) == 100 * 400


@pytest.mark.parametrize("fast", PATHS)
def test_records_run_together_into_one_line_are_read_each_on_its_own(fast):
    """A paste that lost the newlines between vLLM's records (`kubectl logs` output quoted in a
    comment) is one line holding several headers: each record is read with its own header, level
    and origin, and begins at the byte where it starts (a resume from there reads it whole). Near
    misses: a line that starts with a header (the only kind the C path takes) is one record even
    where its message quotes another header, and one header behind a wrapper's frame stays one
    record (parse unwraps it)."""
    flat = ("(base) [root@localhost ~]# kubectl logs pod/llama3 INFO 06-09 05:30:55 [__init__.py:239] Automatically "
            "detected platform cuda. INFO 06-09 05:30:58 [api_server.py:1043] vLLM API server version 0.8.6 "
            "(APIServer pid=7) ERROR 06-09 05:30:59 [core.py:1] EngineCore failed to start.")
    recs = _records([flat, "INFO 06-09 05:31:00 [x.py:1] next"], fast)
    assert [(r.level, r.origin, r.process, r.message) for r in recs] == [
        ("INFO", "__init__.py:239", "", "Automatically detected platform cuda."),
        ("INFO", "api_server.py:1043", "", "vLLM API server version 0.8.6"),
        ("ERROR", "core.py:1", "APIServer pid=7", "EngineCore failed to start."),
        ("INFO", "x.py:1", "", "next")]
    raw = flat.encode()
    assert [r.offset for r in recs[:3]] == [0, raw.index(b"INFO 06-09 05:30:58"), raw.index(b"(APIServer")]
    assert [r.end_offset for r in recs[:3]] == [recs[1].offset, recs[2].offset, len(raw) + 1]
    assert [r.ts_ns % 60_000_000_000 // 1_000_000_000 for r in recs[:3]] == [55, 58, 59]
    one = ("INFO 06-09 05:30:55 [logger.py:1] Received request x: prompt: 'say INFO 06-09 05:30:58 [a.py:1] hi "
           "INFO 06-09 05:30:59 [b.py:2] bye', params: SamplingParams(n=1), lora_request: None.")
    wrapped = "2025-06-09 05:30:55.123 1 kserve INFO [model.py:1] INFO 06-09 05:30:55 [c.py:3] Added request x."
    for line in (one, "(APIServer pid=7) " + one, wrapped):
        assert len(_records([line], fast)) == 1, line


@pytest.mark.parametrize("fast", PATHS)
def test_a_bare_exception_line_ends_its_traceback(fast):
    """Python's bare `Exception: …` (vLLM's `Exception: WorkerProc initialization failed …`) is a
    traceback's last line like any `…Error:`: it joins the traceback, which is one record."""
    lines = ["Traceback (most recent call last):",
             '  File "/v/multiproc_executor.py", line 422, in wait_for_ready',
             "    raise e from None",
             "Exception: WorkerProc initialization failed due to an exception in a background process.",
             "Process EngineCore_0:"]
    recs = _records(lines, fast)
    assert recs[0].message.endswith("in a background process.") and recs[0].message.count("\n") == 3


@pytest.mark.parametrize("fast", PATHS)
def test_a_relay_s_label_and_stream_before_its_stamp_are_taken_off(fast):
    """A sidecar relaying the server's output (`[VllmSidecar <id>]: <ISO Z> 1 stdout: `): its label
    and the stream it read are taken off, its UTC stamp is the line's time (over vLLM's local,
    year-less header), and the line under it is read as it is (uvicorn's access line too). Near
    misses: a label not followed by a full date, and torch's `[rank0]: `, are no relay."""
    from bridge.decode.record import CLOCK_SHIPPER
    recs = _records(["[VllmSidecar kooEr8C]: 2024-11-13T03:15:08.672Z 1 stdout: CRITICAL 11-12 19:15:08 "
                     "launcher.py:99] MQLLMEngine is already dead, terminating server process",
                     '[VllmSidecar kooEr8C]: 2024-11-13T03:15:08.673Z 1 stdout: INFO:     127.0.0.1:41034 - '
                     '"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error'], fast)
    assert [(r.level, r.clock, r.message[:11]) for r in recs] == [
        ("CRITICAL", CLOCK_SHIPPER, "MQLLMEngine"), ("", CLOCK_SHIPPER, "INFO:     1")]
    assert recs[0].ts_ns == int(datetime.fromisoformat("2024-11-13T03:15:08.672+00:00").timestamp() * 1000) * 10**6
    for line in ("[VllmSidecar kooEr8C]: started at 2024-11-13T03:15:08Z", "[rank0]: 2024-11-13T03:15:08Z x"):
        (rec,) = _records([line], fast)
        assert rec.clock != CLOCK_SHIPPER, line
