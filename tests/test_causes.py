"""Failure causes by what an error says (issue #35): the root cause over its wrappers, lists of
possible causes as no evidence, frames' source lines as no cause. Each case is a line vLLM or
its neighbours print (the corpus, tests/test_corpus.py, has them as users pasted them)."""

from __future__ import annotations

import pytest

from bridge.parse.upstream import classify, engine_error

FRAME = '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 244, in get_response\n'


@pytest.mark.parametrize("text, error_type", [
    # a frame's source line is no cause: `dequeue_timeout` is not a timeout
    (FRAME + "    status, result = w.worker_response_mq.dequeue(timeout=dequeue_timeout)\n"
     "RuntimeError: Worker failed with error 'CUDA error: device-side assert triggered", "engine_dead"),
    # Ray names the OOM killer among possible causes: no evidence of an OOM
    ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\nThe actor is dead "
     "because its worker process has died. There are some potential root causes. (1) The process is killed by "
     "SIGKILL by OOM killer due to high memory usage.", "distributed"),
    # the root cause wins over its wrapper
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "oom"),
    ("ValueError: To serve at least one request with the model's max seq len (131072), (4.11 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (4.0 GiB).", "oom"),
    ("RESOURCE_EXHAUSTED: Error loading program 'jit__multi_slice': Attempting to reserve 6.14G", "oom"),
    ("huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-68a1)", "model_load"),
    ("Fatal Python error: Segmentation fault\n\nStack (most recent call first):\n"
     '  File "/x/vllm/worker/model_runner.py", line 725 in capture_model', "engine_dead"),
    # a fatal error while the engine is built is a failed start; its exception cut off, the frames tell
    ("[Rank:0] FATAL ERROR :: MODULE:PT_LAZY Error\nTraceback (most recent call last):\n"
     '  File "/v/engine/multiprocessing/engine.py", line 378, in run_mp_engine\n'
     "    engine = MQLLMEngine.from_engine_args(engine_args=engine_args,", "model_load"),
    ("EngineCore hit an exception: Traceback (most recent call last):\n"
     '  File "/v/v1/engine/core.py", line 374, in run_engine_core\n    engine_core = EngineCoreProc(*args, **kwargs)',
     "model_load"),
    ("Error in chat completion stream generator.\nTraceback (most recent call last):\n"
     '  File "/v/v1/engine/async_llm.py", line 378, in output_handler\n'
     "    outputs = await engine_core.get_output_async()", "engine_dead"),
    # the executor lost a worker: the engine core's busy loop raises it and the engine dies
    ("RuntimeError: Executor failed.", "engine_dead"),
    # near miss: another RuntimeError names no death
    ("RuntimeError: Expected all tensors to be on the same device", "other"),
])
def test_cause(text, error_type):
    assert classify(text) == error_type


def test_a_fatal_signal_is_a_death_and_a_torch_warning_block_no_error():
    assert engine_error("Fatal Python error: Segmentation fault").fatal
    from bridge.parse import Parser
    warning = ("[W530 17:23:59.243033714 OperatorEntry.cpp:154] Warning: Warning only once for all operators\n"
               "  Overriding a previously registered kernel for the same operator and the same dispatch key")
    assert type(Parser().parse(warning, "", "")).__name__ == "Notice"


def test_v1_s_client_told_by_its_engine_core_s_signal_is_an_engine_death():
    """core_client.py (0.8–0.9) logs this when the engine core signalled it had failed (SIGUSR1):
    an engine death, or a failed start where the frames with it are a start's (batch E, lmm-r1-68)."""
    line = "Got fatal signal from worker processes, shutting down. See stack trace above for root cause issue."
    ev = engine_error(line)
    assert (ev.error_type, ev.fatal) == ("engine_dead", True)
    start = ('Traceback (most recent call last):\n  File "/v/vllm/v1/engine/core.py", line 380, in run_engine_core\n'
             "    engine_core = EngineCoreProc(*args, **kwargs)\n" + line)
    assert classify(start) == "model_load"
    # near miss: a worker's own signal line names no engine death
    assert engine_error("Received signal 15, shutting down.").error_type != "engine_dead"


def test_a_request_the_front_end_refused_for_its_input_is_the_client_s_without_its_header():
    """vLLM's OpenAI front end (serving_*.py) logging only the exception of a request it refused
    (its `Error in preprocessing prompt inputs` header not pasted): the client's input, no engine
    incident (batch E, mineru-4868). The same words from the engine, or a death in serving, stay errors."""
    from bridge.parse import Parser
    refused = ("ValueError: 'max_tokens' or 'max_completion_tokens' is too large: 8192. This model's maximum context "
               "length is 8192 tokens and your request has 1210 input tokens (8192 > 8192 - 1210).")
    ev = Parser().parse(refused, "ERROR", "serving_chat.py:257")
    assert type(ev).__name__ == "Notice" and ev.kind == "client_error"
    # near misses: the engine core's error, and the serving handler reporting the engine dead
    assert type(Parser().parse(refused, "ERROR", "core.py:710")).__name__ == "EngineError"
    dead = Parser().parse("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "ERROR",
                          "serving_chat.py:932")
    assert type(dead).__name__ == "EngineError" and dead.error_type == "engine_dead"


def test_a_prompt_that_could_not_be_processed_is_the_client_s():
    from bridge.parse import Parser
    ev = Parser().parse("Error in preprocessing prompt inputs\nTraceback (most recent call last):", "ERROR",
                        "serving_completion.py:131")
    assert type(ev).__name__ == "Notice" and ev.kind == "client_error"


# -- vLLM serving-path lines `check` called unknown (issue #35), each as vLLM's source formats it --

from bridge.parse import Parser  # noqa: E402
from bridge.parse.events import (  # noqa: E402
    AccessLog, EngineError, Notice, RequestFailed, RequestFinished, RequestsAborted, RequestWaiting, SequencePreempted,
    StartupFact)

_LINES = [
    # v1/core/sched/scheduler.py: logger.debug("%s is still in WAITING_FOR_REMOTE_KVS state.", request_id)
    ("cmpl-c7da0225-0 is still in WAITING_FOR_REMOTE_KVS state.", "DEBUG", "scheduler.py:345",
     RequestWaiting("cmpl-c7da0225-0", "WAITING_FOR_REMOTE_KVS")),
    # nixl/pull_scheduler.py: "NIXLConnector request_finished(%s), request_status=%s, kv_transfer_params=%s"
    ("NIXLConnector request_finished(chatcmpl-e081), request_status=FINISHED_LENGTH_CAPPED, "
     "kv_transfer_params={'do_remote_decode': True}", "DEBUG", "nixl_connector.py:614", RequestFinished("chatcmpl-e081")),
    ("NixlPushConnector request_finished(cmpl-9-0), request_status=FINISHED_ABORTED, kv_transfer_params=None",
     "DEBUG", "push_scheduler.py:217", RequestsAborted(("cmpl-9-0",))),
    # mooncake_connector.py: "MooncakeConnector request_finished, req_id=%s, request_status=%s, …"
    ("MooncakeConnector request_finished, req_id=chatcmpl-7, request_status=FINISHED_ERROR, kv_transfer_params={}",
     "DEBUG", "mooncake_connector.py:1124", RequestFailed("chatcmpl-7", "other", "request_status=FINISHED_ERROR")),
    # the same connector holding a finished prefill's blocks for the decode: no end of its own
    ("NIXLConnector request_finished(chatcmpl-e081) waiting for 480 seconds before releasing blocks", "DEBUG",
     "pull_scheduler.py:259", Notice("kv_transfer")),
    # gpu_model_runner.py (V1 >= 0.19): logger.info("Profiling CUDA graph memory: %s", ", ".join(graph_groups))
    ("Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)", "INFO",
     "gpu_model_runner.py:5876", StartupFact((("vllm.startup.cuda_graphs", 86), ("vllm.startup.cuda_graph_largest", 512)))),
    # V0's preemption warning pasted without its header, the space after the header kept
    (" Sequence group 221 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
     "total_num_cumulative_preemption=101", "", "", SequencePreempted("221", "RECOMPUTE", 101)),
    # vLLM's record relayed by NVIDIA Dynamo (`<ISO> LEVEL module.function: message`, the stamp taken off by decode)
    ("ERROR multiproc_worker_utils.run: Worker VllmWorkerProcess pid 8773 died, exit code: -15   ", "", "",
     EngineError),
    (" INFO multiproc_worker_utils.run: Killing local vLLM worker processes   ", "", "", Notice("startup_info")),
    # the same relay whose stamp lost its first digit in a paste (decode could not take it off)
    ("025-06-12T11:14:08.162Z ERROR multiproc_worker_utils.run: Worker VllmWorkerProcess pid 8773 died, exit code: -15",
     "", "", EngineError),
    # an empty line a V1 worker wrote: its prefix, nothing after it
    ("(VllmWorker TP1 pid=5311)", "", "", Notice("noise")),
    # lines a start prints once while it loads its model and builds its workers: startup lines
    # parallel_state.py: "rank %d in world size %d is assigned as DP rank %d, PP rank %d, …"
    ("rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, EP rank 0", "INFO",
     "parallel_state.py:1425", StartupFact(())),
    # the loader's time: a startup line whose figure stands in for load_s (batch E)
    ("Loading weights took 24.84 seconds", "INFO", "default_loader.py:384",
     StartupFact((("vllm.startup.weights_read_s", 24.84),))),
    ("Loading weights from /dev/shm/m/model-00017-of-000017.safetensors", "INFO", "weight_utils.py:122", StartupFact(())),
    # tpu-inference's runner and worker, vllm-gaudi's sampler warm-up
    ("Init model | hbm=[(16.43, 31.25), (16.43, 31.25)]GiB", "INFO", "tpu_jax_runner.py:310", StartupFact(())),
    ("Init mesh | mesh=Mesh('data': 1, 'model': 4)", "INFO", "tpu_jax_runner.py:287", StartupFact(())),
    ("Starting sampler warmup...", "INFO", "hpu_model_runner.py:4675", StartupFact(())),
    # what a start sets up once and says with no number: the checkpoint's shards read (tqdm's bar),
    # the executor's message queue
    ("Loading safetensors checkpoint shards:   0% Completed | 0/10 [00:00<?, ?it/s]", "", "", StartupFact(())),
    ("vLLM message queue communication handle: Handle(local_reader_ranks=[0], buffer_handle=(1, 10485760, 10, "
     "'psm_0d5af338'), local_subscribe_addr='ipc:///tmp/x', remote_subscribe_addr=None, remote_addr_ipv6=False)",
     "INFO", "shm_broadcast.py:289", StartupFact(())),
    # uvicorn's access line whose `INFO:     ` a paste lost
    ('127.0.0.1:57122 - "POST /v1/chat/completions HTTP/1.1" 200 OK', "", "", AccessLog("POST", "/v1/chat/completions", 200)),
]


@pytest.mark.parametrize("fast", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("message, level, origin, want", _LINES, ids=[m[:40] for m, *_ in _LINES])
def test_a_serving_path_line_is_read_by_what_it_means(message, level, origin, want, fast):
    """The C fast path and the Python rules agree (fast=False is the Python reference)."""
    parser = Parser() if fast else Parser(fast=None)
    got = parser.parse(message, level, origin)
    if isinstance(want, type):
        assert type(got) is want and got.error_type == "engine_dead" and got.fatal, got
    else:
        assert got == want
    assert parser.snapshot().unrecognised == 0


@pytest.mark.parametrize("fast", [True, False], ids=["c", "python"])
def test_other_lines_under_those_starts_are_no_startup_lines(fast):
    """Near misses: `Using …` and `vLLM is using …` name much a server also prints while it serves;
    pynccl's lines come again when a trainer's weight sync builds a communicator (trl-3408)."""
    parser = Parser() if fast else Parser(fast=None)
    for message in ("Using max model len 4096", "vLLM is using the V1 engine", "Found 2 GPUs",
                    "Found nccl from library libnccl.so.2", "vLLM is using nccl==2.26.2"):
        assert not isinstance(parser.parse(message, "INFO", "x.py:1"), StartupFact), message
    assert parser.snapshot().malformed == {}  # no prefilter key of their own: no near miss either


@pytest.mark.parametrize("fast", [True, False], ids=["c", "python"])
def test_a_rank_line_that_is_no_rank_assignment_is_no_startup_line(fast):
    parser = Parser() if fast else Parser(fast=None)
    assert not isinstance(parser.parse("rank 3 is slow to answer", "INFO", "parallel_state.py:1"), StartupFact)


def test_an_unknown_line_of_an_engine_module_is_still_unknown_in_both_paths():
    """The C path now leaves a request/engine module's unmatched line to Python, which counts it."""
    for parser in (Parser(), Parser(fast=None)):
        for _ in range(2):  # the second call finds the module cached
            assert parser.parse("something new the scheduler says", "DEBUG", "scheduler.py:1") is None
        assert parser.snapshot().unrecognised == 2


# -- a death by a signal, then a traceback that tells only where it was raised (issue #35) --

from bridge.assemble.timeline import EngineTimeline  # noqa: E402
from bridge.pipeline import ReplayConfig, replay  # noqa: E402

_DIED = "ERROR 06-12 11:14:08 [multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 9 died, exit code: {}\n"
_KILLING = "INFO 06-12 11:14:08 [multiproc_worker_utils.py:123] Killing local vLLM worker processes\n"
#: V0's MQ engine being built (engine/multiprocessing/engine.py), the exception line cut off
_START_TRACEBACK = ("Traceback (most recent call last):\n"
                    '  File "/w/vllm/engine/multiprocessing/engine.py", line 586, in run_mp_engine\n'
                    "    engine = MQLLMEngine.from_vllm_config(\n")


def _incidents(tmp_path, text: str) -> list[EngineTimeline]:
    log = tmp_path / "vllm.log"
    log.write_text(text, encoding="utf-8")
    out: list = []
    replay([str(log)], [out.append], ReplayConfig(year=2025))
    return [t for t in out if isinstance(t, EngineTimeline) and t.kind != "startup"]


@pytest.mark.parametrize("text, basis", [
    ("Worker VllmWorkerProcess pid 9 died, exit code: -9", "signal"),
    ("Worker proc VllmWorker-0 died unexpectedly (exit code: -11), shutting down executor.", "signal"),
    ("Fatal Python error: Segmentation fault", "signal"),
    ("Memory access fault by GPU node-2 (Agent handle: 0x5) on address 0x7f. Reason: Page not present", "signal"),
    # a process that exited on its own (sys.exit(1)) was not killed by a signal
    ("Worker VllmWorkerProcess pid 9 died, exit code: 1", "said"),
    (_START_TRACEBACK.rstrip("\n"), "frames"),
    (_START_TRACEBACK + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "said"),
])
def test_what_an_error_s_type_rests_on(text, basis):
    assert engine_error(text).basis == basis


def test_a_traceback_after_a_signal_death_does_not_make_it_a_failed_start(tmp_path):
    (inc,) = _incidents(tmp_path, _DIED.format(-9) + _KILLING + _START_TRACEBACK)
    assert inc.error_type == "engine_dead" and inc.attrs["vllm.incident.lines"] == 2  # both records


def test_a_cause_the_traceback_states_still_wins_over_a_signal_death(tmp_path):
    (inc,) = _incidents(tmp_path, _DIED.format(-9) + _KILLING + _START_TRACEBACK
                        + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    assert inc.error_type == "oom"


def test_a_worker_that_exited_on_its_own_while_starting_is_a_failed_start(tmp_path):
    """Near miss: exit code 1 is no signal, so the traceback's start frames still tell a failed start."""
    (inc,) = _incidents(tmp_path, _DIED.format(1) + _KILLING + _START_TRACEBACK)
    assert inc.error_type == "model_load"


V = '  File "/usr/local/lib/python3.12/dist-packages/'


@pytest.mark.parametrize("text, error_type", [
    # a worker taking its device, a TPU runner building its mesh: only while the engine starts
    (V + 'vllm/v1/worker/gpu_worker.py", line 436, in init_device\n    torch.cuda.set_device(self.device)\n'
     "RuntimeError: CUDA error: invalid device ordinal", "model_load"),
    (V + 'jax/experimental/mesh_utils.py", line 815, in create_device_mesh\n    raise ValueError(\n'
     "ValueError: Number of devices 4 must equal the product of mesh_shape (1, 8)", "model_load"),
    # the API server's entry: what leaves run_server is a server that could not be set up
    (V + 'vllm/entrypoints/cli/serve.py", line 27, in cmd\n    uvloop.run(run_server(args))\n'
     "OSError: [Errno 98] Address already in use", "model_load"),
    # ... but Ctrl-C coming out of it is a stop, no failure
    (V + 'vllm/entrypoints/cli/serve.py", line 27, in cmd\n    uvloop.run(run_server(args))\nKeyboardInterrupt',
     "other"),
    # the model's forward with no start frame around it: a batch being served
    (V + 'vllm/model_executor/models/llama.py", line 400, in forward\n    hidden_states = self.model(input_ids)\n'
     + V + 'torch/nn/modules/module.py", line 1747, in _call_impl\n    return forward_call(*args, **kwargs)\n'
     "RuntimeError: The size of tensor a (4) must match the size of tensor b (8)", "engine_dead"),
    # the same forward under the start's profile run: the start failed
    (V + 'vllm/v1/worker/gpu_model_runner.py", line 2980, in profile_run\n    hidden_states = self._dummy_run(n)\n'
     + V + 'vllm/model_executor/models/llama.py", line 400, in forward\n    hidden_states = self.model(input_ids)\n'
     "RuntimeError: The size of tensor a (4) must match the size of tensor b (8)", "model_load"),
    # a compile that failed: vLLM compiles while it starts, unless a serving frame says otherwise
    ("RuntimeError: Worker failed with error 'Command '['/usr/bin/gcc', '/tmp/tmpx/main.c', '-O3', '-shared']' "
     "returned non-zero exit status 1.', please check the stack trace above for the root cause", "model_load"),
    (V + 'torch/_dynamo/convert_frame.py", line 1453, in __call__\n    result = self._inner_convert(', "model_load"),
    (V + 'vllm/v1/worker/gpu_model_runner.py", line 2064, in execute_model\n    model_output = self.model(\n'
     "torch._inductor.exc.InductorError: LoweringException: AssertionError", "engine_dead"),
    # a worker building its process groups (parallel_state's GroupCoordinator), the exception cut off
    ("Traceback (most recent call last):\n" + V + 'vllm/distributed/parallel_state.py", line 908, in '
     "init_model_parallel_group\n    return GroupCoordinator(\n" + V + 'vllm/distributed/device_communicators/'
     'pynccl.py", line 99, in __init__\n    self.comm: ncclComm_t = self.nccl.ncclCommInitRank(', "model_load"),
    # a worker process being built (multiproc_executor's worker_main), the exception cut off
    ("Traceback (most recent call last):\n" + V + 'vllm/v1/executor/multiproc_executor.py", line 485, in '
     "worker_main\n    worker = WorkerProc(*args, **kwargs)", "model_load"),
    # V0's dump of a model execution that raised, like V1's `Dumping input data`
    ("Writing input of failed execution to /tmp/err_execute_model_input_20250417-043638.pkl...", "engine_dead"),
    (V + 'vllm/worker/model_runner_base.py", line 116, in _wrapper\n    return func(*args, **kwargs)\n'
     + V + 'vllm/executor/multiproc_worker_utils.py", line 233, in _run_worker_process\n'
     "    output = run_method(worker, method, args, kwargs)\n"
     "Exception in worker VllmWorkerProcess while processing method start_worker_execution_loop.", "engine_dead"),
])
def test_the_phase_of_an_error_by_where_it_was_raised(text, error_type):
    """Issue #35: an error that names no cause is typed by the phase its frames (or what it says
    of a compile) belong to; frames from vLLM's, torch's and the TPU runners' sources."""
    assert classify(text) == error_type


def test_a_ctrl_c_at_the_api_server_s_entry_fails_no_start(tmp_path):
    from bridge.assemble.timeline import EngineTimeline
    from bridge.pipeline import ReplayConfig, replay

    log = tmp_path / "stop.log"
    log.write_text("INFO 05-01 10:00:00 [api_server.py:1000] vLLM API server version 0.9.0\n"
                   "Traceback (most recent call last):\n"
                   + V + 'vllm/entrypoints/cli/serve.py", line 27, in cmd\n    uvloop.run(run_server(args))\n'
                   "KeyboardInterrupt\n")
    out: list = []
    replay([str(log)], [out.append], ReplayConfig(year=2025))
    engines = [t for t in out if isinstance(t, EngineTimeline)]
    startups = [t for t in engines if t.kind == "startup"]
    assert len(startups) == 1 and not startups[0].error_type
    assert "model_load" not in {t.error_type for t in engines}


def test_the_engine_core_the_client_saw_die_is_the_incident_s(tmp_path):
    """The API server's monitor names the data-parallel engine that died: the incident is that
    engine's, with no prefix to say who wrote the line and with the API server's (then named as
    its reporter, `vllm.reported_by`). Near miss: where the engine's own process logged first (a
    worker of it), that process stays the one named, and no reporter is added."""
    line = "ERROR 01-29 08:37:48 [core_client.py:564] Engine core proc EngineCore_DP1 died unexpectedly, " \
           "shutting down client.\n"
    (inc,) = _incidents(tmp_path, line)
    assert (inc.error_type, inc.attrs["vllm.process"], inc.attrs["vllm.dp.rank"]) == ("engine_dead", "EngineCore_DP1", 1)
    assert "vllm.reported_by" not in inc.attrs
    (inc,) = _incidents(tmp_path, "(APIServer pid=7) " + line)
    assert (inc.attrs["vllm.process"], inc.attrs["vllm.dp.rank"], inc.attrs["vllm.reported_by"]) == \
        ("EngineCore_DP1", 1, "APIServer pid=7")
    worker = "(Worker_DP1_TP0 pid=9) ERROR 01-29 08:37:47 [multiproc_executor.py:1] RuntimeError: CUDA error: " \
             "an illegal memory access was encountered\n"
    (inc,) = _incidents(tmp_path, worker + "(APIServer pid=7) " + line)
    assert (inc.attrs["vllm.process"], inc.attrs["vllm.dp.rank"]) == ("Worker_DP1_TP0 pid=9", 1)
    assert "vllm.reported_by" not in inc.attrs


def test_a_second_api_server_listening_after_requests_opens_no_second_start(tmp_path):
    """The API server's `Starting vLLM server on …` ends a start (and opens one where the lines begin
    with it); a second API server's, after the start went out with the first request, is no new start."""
    log = tmp_path / "vllm.log"
    log.write_text(
        "(APIServer pid=1) INFO 12-03 16:22:40 [api_server.py:1] vLLM API server version 0.32.0\n"
        "(ApiServer_0 pid=2) INFO 12-03 16:22:55 [entry.py:140] Starting vLLM server on http://127.0.0.1:8000\n"
        "(ApiServer_0 pid=2) INFO 12-03 16:22:56 [logger.py:49] Received request chatcmpl-a: params: "
        "SamplingParams(n=1), lora_request: None.\n"
        "(ApiServer_1 pid=3) INFO 12-03 16:22:57 [entry.py:140] Starting vLLM server on http://127.0.0.1:8000\n",
        encoding="utf-8")
    out: list = []
    replay([str(log)], [out.append], ReplayConfig(year=2026))
    starts = [t for t in out if isinstance(t, EngineTimeline) and t.kind == "startup"]
    assert len(starts) == 1 and starts[0].end_ns > starts[0].start_ns  # it ends as the first server listens
    log.write_text("(APIServer pid=1) INFO 04-08 20:32:02 [api_server.py:573] Starting vLLM server on "
                   "http://0.0.0.0:8080\n", encoding="utf-8")
    out.clear()
    replay([str(log)], [out.append], ReplayConfig(year=2026))
    assert [t.kind for t in out if isinstance(t, EngineTimeline)] == ["startup"]


_WAIT = ("(EngineCore_DP0 pid=7) INFO 12-09 11:{:02d}:53 [shm_broadcast.py:466] No available shared memory broadcast "
         "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
         "time-consuming work (e.g. compilation).\n")


def test_a_hang_reported_every_minute_is_one_incident(tmp_path):
    """shm_broadcast repeats its report every 60 s while one wait lasts: one hang, one incident."""
    (inc,) = _incidents(tmp_path, "".join(_WAIT.format(m) for m in range(25, 29)))
    assert inc.error_type == "timeout" and not inc.attrs["vllm.incident.fatal"]


def test_a_hang_reported_again_after_a_long_quiet_is_a_new_incident(tmp_path):
    """Near miss: reports more than two intervals apart are two hangs."""
    assert len(_incidents(tmp_path, _WAIT.format(25) + _WAIT.format(28))) == 2


def test_two_engines_hanging_the_same_minutes_are_two_incidents(tmp_path):
    """Data-parallel engines report their own waits, interleaved: one hang each, however many reports."""
    dp1 = _WAIT.replace("EngineCore_DP0 pid=7", "EngineCore_DP1 pid=8").replace(":53 ", ":54 ")
    text = "".join(dp1.format(25) + _WAIT.format(26) + dp1.format(26) + _WAIT.format(27) for _ in (0,))
    incidents = _incidents(tmp_path, text)
    assert sorted(i.attrs["vllm.process"] for i in incidents) == ["EngineCore_DP0 pid=7", "EngineCore_DP1 pid=8"]


_CORE_FAILED = ("(EngineCore pid={}) ERROR 03-28 12:39:08 [core.py:1101] EngineCore encountered a fatal error.\n"
                "(EngineCore pid={}) ERROR 03-28 12:39:08 [core.py:1101] RuntimeError: Executor failed.\n")


def test_two_engine_cores_failing_at_once_are_two_incidents(tmp_path):
    """An engine core with no data-parallel index is its own engine (vllm-omni's stages, two LLMs in
    one program): two of them dying in the same second are an incident each, each a death. Near miss:
    one engine core's lines, however many, are one incident."""
    incidents = _incidents(tmp_path, _CORE_FAILED.format(7, 7) + _CORE_FAILED.format(8, 8))
    assert sorted((i.attrs["vllm.process"], i.error_type) for i in incidents) == [
        ("EngineCore pid=7", "engine_dead"), ("EngineCore pid=8", "engine_dead")]
    assert all(i.attrs["vllm.incident.fatal"] and "vllm.dp.rank" not in i.attrs for i in incidents)
    (one,) = _incidents(tmp_path, _CORE_FAILED.format(7, 7) + _CORE_FAILED.format(7, 7))
    assert (one.attrs["vllm.process"], one.error_type) == ("EngineCore pid=7", "engine_dead")


_DEAD = "(APIServer pid=1) INFO 06-25 04:34:{:02d} [async_llm.py:345] Request cmpl-{}-0 failed (engine dead).\n"


def _replayed(tmp_path, text: str) -> tuple[list, list]:
    from bridge.assemble.timeline import RequestTimeline
    log = tmp_path / "vllm.log"
    log.write_text(text, encoding="utf-8")
    out: list = []
    replay([str(log)], [out.append], ReplayConfig(year=2025))
    return ([t for t in out if isinstance(t, EngineTimeline) and t.kind != "startup"],
            [t for t in out if isinstance(t, RequestTimeline)])


def test_requests_failed_as_the_engine_is_dead_are_its_death(tmp_path):
    """vLLM fails a request `(engine dead)` only once its engine died: with no line of the death
    before them (a log begun late), the first is the death, one incident, and every request it
    names failed with it. Near misses: an error line of the death first is the one incident still;
    the same lines during a deliberate stop are the stop's, no death."""
    incidents, requests = _replayed(tmp_path, "".join(_DEAD.format(1, rid) for rid in ("a", "b", "c")))
    (inc,) = incidents
    assert inc.error_type == "engine_dead" and inc.attrs["vllm.incident.fatal"]
    assert sorted((r.request_id, r.error_type) for r in requests) == [
        ("cmpl-a-0", "engine_dead"), ("cmpl-b-0", "engine_dead"), ("cmpl-c-0", "engine_dead")]
    error_first = ("(APIServer pid=1) ERROR 06-25 04:34:01 [async_llm.py:420] vllm.v1.engine.exceptions."
                   "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.\n")
    incidents, requests = _replayed(tmp_path, error_first + _DEAD.format(1, "a") + _DEAD.format(2, "b"))
    assert [i.error_type for i in incidents] == ["engine_dead"]
    assert {r.error_type for r in requests} == {"engine_dead"}
    stop = "(APIServer pid=1) INFO 06-25 04:34:00 [launcher.py:254] [shutdown] API server: shutdown triggered\n"
    incidents, requests = _replayed(tmp_path, stop + _DEAD.format(1, "a"))
    assert not incidents and [r.error_type for r in requests] == ["shutdown"]


def _engines(tmp_path, text: str) -> tuple[list[EngineTimeline], list[EngineTimeline]]:
    """(incidents, startup spans) of a log."""
    log = tmp_path / "vllm.log"
    log.write_text(text, encoding="utf-8")
    out: list = []
    replay([str(log)], [out.append], ReplayConfig(year=2025))
    engines = [t for t in out if isinstance(t, EngineTimeline)]
    return [t for t in engines if t.kind != "startup"], [t for t in engines if t.kind == "startup"]


_START = ("(EngineCore pid=2) INFO 06-10 16:39:18 [kv_cache_utils.py:1708] GPU KV cache size: 821,083 tokens\n"
          "(Worker_TP0 pid=3) INFO 06-10 16:39:20 [gpu_model_runner.py:1] Capturing CUDA graphs (decode): 8/8\n")
_RPC_RAISED = ("(Worker_TP0 pid=3) ERROR 06-10 16:39:42 [multiproc_executor.py:962] WorkerProc hit an exception.\n"
               "(Worker_TP0 pid=3) ERROR 06-10 16:39:42 [multiproc_executor.py:962] Traceback (most recent call last):\n")


def test_a_worker_s_call_that_raised_while_the_engine_is_built_fails_the_start(tmp_path):
    """A worker's call that raised (its cause cut off) while the engine is still being built, no
    line yet saying it is up, is the start's call: a failed start, its startup span failed. Near
    misses: once the API server listens, or the engine's loop logged its stats, the same lines are
    the engine's death while serving, and the start stays a good one."""
    incidents, startups = _engines(tmp_path, _START + _RPC_RAISED)
    assert [i.error_type for i in incidents] == ["model_load"]
    assert [s.error_type for s in startups] == ["model_load"]
    for up in ("(APIServer pid=1) INFO 06-10 16:39:30 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000\n",
               "(APIServer pid=1) INFO 06-10 16:39:30 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
               "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, "
               "Prefix cache hit rate: 0.0%\n"):
        incidents, startups = _engines(tmp_path, _START + up + _RPC_RAISED)
        assert [i.error_type for i in incidents] == ["engine_dead"], up
        assert [s.error_type for s in startups] == [""], up
