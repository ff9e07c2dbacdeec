"""Upstream vLLM messages (reference b–f) → the events they state, written out by hand."""

from dataclasses import astuple

import pytest

from bridge.parse import MALFORMED, Parser, parse_line
from bridge.parse.events import (
    AccessLog, EngineConfig, EngineError, EngineStats, Notice, RequestAdded, RequestFailed, RequestFinished,
    RequestReceived, RequestsAborted, ResponseGenerated, SequencePreempted, StartupFact,
)

SECRET = "Tell nobody: the launch code is 0000"

CASES = [
    # b.1 Received request, every era: only the id and numbers come out
    (f"Received request cmpl-6b5b-0: prompt: '{SECRET}', sampling_params: SamplingParams(n=1, best_of=1, "
     "presence_penalty=0.0, temperature=0.0, top_p=1.0, top_k=-1, stop=[], max_tokens=7, logprobs=None), "
     "prompt_token_ids: [1, 3087], lora_request: None.",
     RequestReceived("cmpl-6b5b-0", 7, 0.0, 1.0, 1, None)),
    (f"Received request chatcmpl-1f2e: prompt: '{SECRET}, params: SamplingParams(n=9, max_tokens=1)', "
     "params: SamplingParams(n=1, temperature=0.7, top_p=0.8, top_k=20, max_tokens=32000), "
     "prompt_token_ids: [151644], lora_request: None, prompt_adapter_request: None.",
     RequestReceived("chatcmpl-1f2e", 32000, 0.7, 0.8, 1, None)),
    ("Received request chatcmpl-5e4d: prompt: 'x', params: SamplingParams(n=1, temperature=0.2, top_p=0.9, "
     "max_tokens=100), prompt_token_ids: [1], prompt_embeds shape: None, lora_request: "
     "LoRARequest(lora_name='sql-lora', lora_int_id=1, lora_path='/adapters/sql').",
     RequestReceived("chatcmpl-5e4d", 100, 0.2, 0.9, 1, "sql-lora")),
    ("Received request chatcmpl-a269fdcb7c6ce890: params: SamplingParams(n=2, temperature=0.6, top_p=0.9, "
     "max_tokens=None), lora_request: None.",
     RequestReceived("chatcmpl-a269fdcb7c6ce890", None, 0.6, 0.9, 2, None)),
    ("Received request embd-1: params: PoolingParams(dimensions=None), lora_request: None.",
     RequestReceived("embd-1", None, None, None, None, None)),
    # b.2
    ("Added request chatcmpl-a269fdcb7c6ce890-a8a65d16.", RequestAdded("chatcmpl-a269fdcb7c6ce890-a8a65d16")),
    ("Added request 0_chatcmpl-77aa-1b2c3d4e.", RequestAdded("0_chatcmpl-77aa-1b2c3d4e")),
    ("Finished request cmpl-6b5b-0.", RequestFinished("cmpl-6b5b-0")),
    ("Aborted request cmpl-6b5b-0.", RequestsAborted(("cmpl-6b5b-0",))),
    ("Aborted request(s) chatcmpl-a-11111111,cmpl-b-0-22222222.", RequestsAborted(("chatcmpl-a-11111111", "cmpl-b-0-22222222"))),
    ("Request chatcmpl-a aborted.", RequestsAborted(("chatcmpl-a",))),
    ("Request chatcmpl-a failed (engine dead).", RequestFailed("chatcmpl-a", "engine_dead", "engine dead")),
    ("Request chatcmpl-a failed (bad request): Invalid input.", RequestFailed("chatcmpl-a", "input", "bad request: Invalid input")),
    ("Request chatcmpl-a failed (input error): prompt is too long.", RequestFailed("chatcmpl-a", "input", "input error: prompt is too long")),
    ("Request chatcmpl-a failed due to CUDA out of memory.", RequestFailed("chatcmpl-a", "oom", "CUDA out of memory")),
    ("Request chatcmpl-a failed.", RequestFailed("chatcmpl-a", "other", "failed")),
    # v1/engine/core.py:1712 (DEBUG), during a drain: the new request is aborted
    ("[shutdown] EngineCore: rejecting new request request_id=chatcmpl-late-1a2b3c4d",
     RequestsAborted(("chatcmpl-late-1a2b3c4d",))),
    # serve/tokenize/serving.py: /tokenize and /detokenize log their input and never reach the engine
    ("Received request tokenize-a1b2c3d4e5f60718: params: None, lora_request: None.", Notice("tokenize_request")),
    # generate/base/serving.py (0.32): an HTTP 500 after the engine ended the request
    ("Request chatcmpl-a failed with an internal error during generation",
     RequestFailed("chatcmpl-a", "other", "an internal error during generation")),
    # async_llm.py logs admission control's HTTP 503 (exceptions.py) under "bad request"
    ("Request chatcmpl-a failed (bad request): The engine is currently busy and cannot accept new requests. "
     "Please try again later or on a different instance..",
     RequestFailed("chatcmpl-a", "overloaded", "bad request: The engine is currently busy and cannot accept new "
                   "requests. Please try again later or on a different instance.")),
    ("Failing the request 147 because there's not enough kv cache blocks to run the entire sequence.",
     RequestFailed("147", "oom", "there's not enough kv cache blocks to run the entire sequence")),
    # vllm-omni's stage worker names the request its AsyncLLM was generating: EngineDeadError's own
    # message is an engine death (near miss: another cause the exception gives; a header-less
    # `Failed on request 3 out of 10` print has no `: ` detail and is no such line)
    ("Failed on request chatcmpl-869f7757a6a736c7: EngineCore encountered an issue. See stack trace (above) for "
     "the root cause.\nTraceback (most recent call last):\n  File \"/w/vllm_omni/entrypoints/omni_stage.py\", line 1393",
     RequestFailed("chatcmpl-869f7757a6a736c7", "engine_dead",
                   "EngineCore encountered an issue. See stack trace (above) for the root cause.")),
    ("Failed on request chatcmpl-b: CUDA out of memory. Tried to allocate 2.00 GiB.",
     RequestFailed("chatcmpl-b", "oom", "CUDA out of memory. Tried to allocate 2.00 GiB.")),
    # b.1 outputs: the text never comes out, even when it imitates the fields
    (f"Generated response chatcmpl-a: output: '{SECRET}, output_token_ids: [1], finish_reason: length', "
     "output_token_ids: [791, 4320, 374], finish_reason: stop",
     ResponseGenerated("chatcmpl-a", "stop", 3, "")),
    ("Generated response chatcmpl-b (streaming delta): output: 'Hel', output_token_ids: [9906], finish_reason: None",
     ResponseGenerated("chatcmpl-b", None, 1, "delta")),
    ("Generated response chatcmpl-b (streaming complete): output: 'Hello', output_token_ids: None, finish_reason: length",
     ResponseGenerated("chatcmpl-b", "length", None, "complete")),
    # c.1
    ("Sequence group cmpl-0a1b-0 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV "
     "cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or "
     "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=51",
     SequencePreempted("cmpl-0a1b-0", "RECOMPUTE", 51)),
    # d.1 / d.2 stats, every optional field
    ("Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 45.6 tokens/s, Running: 1 reqs, Swapped: 2 reqs, "
     "Pending: 3 reqs, GPU KV cache usage: 97.2%, CPU KV cache usage: 0.5%",
     EngineStats(None, 12.3, 45.6, 1, 3, 2, None, None, None, 0.972, 0.005, None, None, None)),
    ("Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 1.2 tokens/s, Running: 0 reqs, Swapped: 0 reqs, "
     "Pending: 0 reqs, GPU KV cache usage: 0.0%, CPU KV cache usage: 0.0%.",
     EngineStats(None, 0.0, 1.2, 0, 0, 0, None, None, None, 0.0, 0.0, None, None, None)),
    ("Running: 3 reqs, Waiting: 0 reqs ", EngineStats(None, None, None, 3, 0, None, None, None, None, None, None, None, None, None)),
    # V1's first engine core (0.7, core.py `_log_stats`): its two queues
    ("RUNNING: 306 | WAITING: 628", EngineStats(None, None, None, 306, 628, None, None, None, None, None, None, None, None,
                                                None)),
    ("Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 4 reqs, Waiting: 5 reqs, "
     "GPU KV cache usage: 10.0%, Prefix cache hit rate: 50.0%",
     EngineStats(None, 1.0, 2.0, 4, 5, None, None, None, None, 0.1, None, 0.5, None, None)),
    ("Engine 000: Avg prompt throughput: 120.4 tokens/s, Avg generation throughput: 88.2 tokens/s, Running: 3 reqs, "
     "Waiting: 1 reqs, Deferred: 2 reqs, Preemptions: 4, GPU KV cache usage: 93.5%, Prefix cache hit rate: 41.0%, "
     "Corrupted: 1 reqs, External prefix cache hit rate: 12.5%, MM cache hit rate: 7.0%",
     EngineStats("000", 120.4, 88.2, 3, 1, None, 2, 4, 1, 0.935, None, 0.41, 0.125, 0.07)),
    ("2 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 6 reqs, "
     "Waiting: 0 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 0.0%INFO 07-28 01:02:03 [x.py:1] glued",
     EngineStats("2 Engines Aggregated", 1.0, 2.0, 6, 0, None, None, None, None, 0.05, None, 0.0, None, None)),
    # e. startup
    ("Initializing an LLM engine (v0.4.0) with config: model='meta-llama/Llama-2-7b-chat-hf', speculative_config=None, "
     "tokenizer='meta-llama/Llama-2-7b-chat-hf'", EngineConfig("0.4.0", "", "meta-llama/Llama-2-7b-chat-hf")),
    ("Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-0.6B', speculative_config=None",
     EngineConfig("0.11.0", "V1", "Qwen/Qwen3-0.6B")),
    ("Loading model weights took 12.5523 GB", StartupFact((("vllm.startup.weights_gib", 12.5523),))),
    ("Model loading took 14.9889 GiB memory and 9.481532 seconds",
     StartupFact((("vllm.startup.weights_gib", 14.9889), ("vllm.startup.load_s", 9.481532)))),
    ("Model loading took 15.0 GB and 10.0 seconds",
     StartupFact((("vllm.startup.weights_gib", 15.0), ("vllm.startup.load_s", 10.0)))),
    # the loader's own read of the weights: a stand-in for load_s (assemble), not load_s itself
    ("Loading weights took 16.18 seconds", StartupFact((("vllm.startup.weights_read_s", 16.18),))),
    ("Memory profiling takes 2.72 seconds\nthe current vLLM instance can use total_gpu_memory (79.15GiB) x "
     "gpu_memory_utilization (0.90) = 71.24GiB\nmodel weights take 7.12GiB; non_torch_memory takes 0.46GiB; PyTorch "
     "activation peak memory takes 1.44GiB; the rest of the memory reserved for KV Cache is 62.22GiB.",
     StartupFact((("vllm.startup.profile_s", 2.72), ("vllm.startup.total_gpu_gib", 79.15),
                  ("vllm.startup.gpu_memory_utilization", 0.9), ("vllm.startup.kv_cache_gib", 62.22)))),
    ("Available KV cache memory: 54.87 GiB", StartupFact((("vllm.startup.kv_cache_gib", 54.87),))),
    ("GPU KV cache size: 162,704 tokens", StartupFact((("vllm.startup.kv_cache_tokens", 162704),))),
    ("Maximum concurrency for 16,000 tokens per request: 10.17x",
     StartupFact((("vllm.startup.max_model_len", 16000), ("vllm.startup.max_concurrency", 10.17)))),
    ("# GPU blocks: 7448, # CPU blocks: 512", StartupFact((("vllm.startup.gpu_blocks", 7448), ("vllm.startup.cpu_blocks", 512)))),
    ("# CUDA blocks: 7191, # CPU blocks: 2048", StartupFact((("vllm.startup.gpu_blocks", 7191), ("vllm.startup.cpu_blocks", 2048)))),
    ("# cuda blocks: 7191, # CPU blocks: 512", StartupFact((("vllm.startup.gpu_blocks", 7191), ("vllm.startup.cpu_blocks", 512)))),
    ("vLLM API server version 0.6.5", StartupFact((("vllm.version", "0.6.5"),))),
    ("init engine (profile, create kv cache, warmup model) took 25.31 seconds", StartupFact((("vllm.startup.init_s", 25.31),))),
    # b.3 uvicorn
    ('INFO:     10.80.23.18:51408 - "POST /v1/chat/completions HTTP/1.1" 200 OK', AccessLog("POST", "/v1/chat/completions", 200)),
    ('INFO:     10.0.0.7:40112 - "POST /v1/completions?x=1 HTTP/1.1" 500 Internal Server Error', AccessLog("POST", "/v1/completions", 500)),
    ("INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)", Notice("http_server")),
    # noise: progress bars are understood to carry nothing (the checkpoint's shards' bar is a
    # startup line: only a start reads them)
    ("Loading pt checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.23s/it]", Notice("noise")),
    ("Processed prompts: 100%|██████████| 67/67 [00:16<00:00,  4.02it/s]", Notice("noise")),
    # but a graph capture's own bar is a startup line (capture happens once, while the engine starts)
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:03<00:00, 19.30it/s]",
     StartupFact(())),
    # compile / precompile lines of any platform are startup lines; a graph's own compile time is told
    ("Precompile input_embeddings_merger --> {'num_tokens': 16}", StartupFact(())),
    ("Compilation of sample finished in 1.25 [secs].",
     StartupFact((("vllm.startup.precompile_s", 1.25), ("vllm.startup.precompiled_graphs", 1)))),
    ("Compilation finished in 3.53 [secs].",
     StartupFact((("vllm.startup.precompile_s", 3.53), ("vllm.startup.precompiled_graphs", 1)))),
    ("Compiling a graph for dynamic shape takes 20.51 s", StartupFact(())),
    ("Starting torch.compile", StartupFact(())),
    ("Initial profiling/warmup run took 0.81 s", StartupFact(())),
    # a worker's kernel warm-up while it starts (model_executor/warmup/kernel_warmup.py), and the CPU runner's
    ("Warming up FlashInfer attention.", StartupFact(())),
    ("Warming up model for the compilation...", StartupFact(())),
    ("JIT kernel warmup finished in 1.20s.", StartupFact(())),
]


@pytest.mark.parametrize("message,expected", CASES, ids=[f"{i}-{type(e).__name__}" for i, (_, e) in enumerate(CASES)])
def test_upstream_lines(message, expected):
    got = parse_line(message)
    assert type(got) is type(expected), got
    if any(isinstance(v, tuple) for v in astuple(expected)):
        assert got == expected
    else:
        assert astuple(got) == pytest.approx(astuple(expected))


def test_torch_s_exception_raised_from_is_no_exception_line():
    """A C++ block's `Exception raised from …` names where torch raised, not an exception class: the
    bare `Exception` is read only with its colon."""
    ev = parse_line("Exception raised from ncclCommWatchdog at /torch/csrc/ProcessGroupNCCL.cpp:1", "")
    assert not isinstance(ev, EngineError)
    block = parse_line("[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout\n"
                       "Exception raised from ncclCommWatchdog at /torch/csrc/ProcessGroupNCCL.cpp:1", "")
    assert isinstance(block, EngineError) and block.exception_type == ""


def test_a_cut_args_line_names_the_model_vllm_serve_was_given():
    """`vllm serve <model>` sets the model from its positional (`model_tag`): where the args line
    is cut inside the `model` key's value, that is the model; a whole `model` key wins over it."""
    cut = "args: Namespace(subparser='serve', model_tag='/models/qwen', config='', host=None, model='/models/q"
    assert parse_line(cut, "INFO") == StartupFact((("gen_ai.request.model", "/models/qwen"),))
    whole = "args: Namespace(subparser='serve', model_tag='tag', model='/models/qwen2', port=8000)"
    assert parse_line(whole, "INFO") == StartupFact((("gen_ai.request.model", "/models/qwen2"),))


def test_a_ray_actor_s_other_words_are_no_error():
    """Only Ray's line saying why an actor died is read without a header; other lines that begin
    like it stay unread."""
    for message in ("The actor is alive.", "The actor is deadline-bound", "the actor is dead because x"):
        assert parse_line(message, "") is None, message


def test_a_compile_word_in_another_line_is_no_startup_line():
    """Only the compile / capture lines' own starts open a startup span: CUDA's hint under an
    error (`Compile with …`) and a line that merely mentions compiling stay what they were."""
    for message in ("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
                    "Compilation cache directory is not writable", "Capturing is disabled"):
        for level in ("", "INFO"):
            assert not isinstance(Parser().parse(message, level, "x.py:1"), StartupFact), (message, level)


def test_prompt_and_output_text_never_reach_an_event():
    for message, _ in CASES:
        assert SECRET not in repr(parse_line(message))


ERRORS = [
    # (message, level, error.type, exception type, fatal)
    # Ray's RayActorError detail on a line of its own (its exception line cut, or a chained
    # traceback's separator between it and the AsyncEngineDeadError it caused)
    ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
     "Worker unexpectedly exits with a connection error code 2. End of file.", "", "distributed", "", True),
    # CUDA's sticky errors poison the device's context: the engine dies of them, no OOM
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "ERROR", "engine_dead", "RuntimeError",
     False),
    ("torch.AcceleratorError: CUDA error: device-side assert triggered", "ERROR", "engine_dead", "AcceleratorError",
     False),
    # Python's bare `Exception` (multiproc_executor's wait_for_ready raises it), a failed start
    ("Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace "
     "for root cause.", "", "model_load", "Exception", True),
    # vLLM's sleep-mode allocator's own print (cumem_allocator.cpp), no header
    ("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62", "", "oom", "", False),
    ("CUDA Error: invalid argument at /workspace/csrc/cumem_allocator.cpp:62", "", "other", "", False),
    # a start refused: less free memory than the share asked of the device
    ("ValueError: Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU memory utilization "
     "(0.9, 3.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.", "ERROR",
     "oom", "ValueError", False),
    ("Engine iteration timed out. This should never happen!", "ERROR", "timeout", "", True),
    ("Engine background task failed\nTraceback (most recent call last):\n  File \"a.py\", line 1\n"
     "asyncio.exceptions.CancelledError\n\nThe above exception was the direct cause of the following exception:\n\n"
     "Traceback (most recent call last):\n  File \"b.py\", line 2\nTimeoutError", "ERROR", "timeout", "TimeoutError", True),
    ("AsyncEngineDeadError: Background loop has errored already.", "", "engine_dead", "AsyncEngineDeadError", True),
    ("MQEngineDeadError: Engine loop is not running. Inspect the stacktrace to find the original error: "
     "RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')", "", "oom", "MQEngineDeadError", True),
    ("EngineCore encountered a fatal error.\nTraceback (most recent call last):\n  File \"core.py\", line 701\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB.", "ERROR", "oom", "OutOfMemoryError", True),
    ("AsyncLLM output_handler failed.\nTraceback (most recent call last):\n  File \"x.py\", line 4\n"
     "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
     "ERROR", "engine_dead", "EngineDeadError", True),
    ("Worker VllmWorkerProcess pid 1159 died, exit code: -6", "ERROR", "engine_dead", "", True),
    ("Worker proc VllmWorker-1 died unexpectedly, shutting down executor.", "ERROR", "engine_dead", "", True),
    ("AsyncLLMEngine has failed, terminating server process", "CRITICAL", "engine_dead", "", True),
    # shm_broadcast's wait for a reader: a process hangs (vLLM #25566), not a failed communication
    ("No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are "
     "hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).", "INFO", "timeout", "", False),
    # multiproc_executor.py worker_main's logger.exception while it builds the worker
    ("WorkerProc failed to start.\nTraceback (most recent call last):\n  File \"multiproc_executor.py\", line 485, in "
     "worker_main", "ERROR", "model_load", "", True),
    ("[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
     "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600059 milliseconds before timing out.\n"
     "[rank0]:[E ProcessGroupNCCL.cpp:577] [Rank 0] To avoid data inconsistency, we are taking the entire process down.",
     "", "distributed", "", True),
    ("[PG 2 Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping debug info.", "", "distributed", "", True),
    ("EngineCore failed to start.\nTraceback (most recent call last):\n  File \"default_loader.py\", line 110\n"
     "RuntimeError: Cannot find any model weights with `/models/m`", "ERROR", "model_load", "RuntimeError", True),
    ("Traceback (most recent call last):\n  File \"hub.py\", line 1\nOSError: We couldn't connect to "
     "'https://huggingface.co' to load this file. huggingface_hub.errors.LocalEntryNotFoundError", "", "model_load", "OSError", False),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
     "the engine.", "", "oom", "ValueError", False),
    ("Error in chat completion stream generator.", "ERROR", "other", "", False),
    ("RuntimeError: something unexpected", "", "other", "RuntimeError", False),
]


@pytest.mark.parametrize("message,level,error_type,exc_type,fatal", ERRORS)
def test_errors_are_classified(message, level, error_type, exc_type, fatal):
    ev = parse_line(message, level)
    assert isinstance(ev, EngineError), ev
    assert (ev.error_type, ev.exception_type, ev.fatal) == (error_type, exc_type, fatal)
    assert ev.message and len(ev.message) <= 1024


@pytest.mark.parametrize("message,error_type,exc_type", [
    # a label someone put before a pasted exception line: the exception is read
    ("[Error] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "oom", "OutOfMemoryError"),
    ("报错：ValueError: Cannot find any model weights with `/data/qwen`", "other", "ValueError"),
    ("〔问题〕 OSError: We couldn't connect to 'https://huggingface.co' to load this file.", "other", "OSError"),
    # a launcher relaying the API server's last line behind its process name, without vLLM's pid
    ("(APIServer) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
     "model_load", "RuntimeError"),
])
def test_an_exception_line_behind_a_users_label_is_read(message, error_type, exc_type):
    ev = parse_line(message)
    assert isinstance(ev, EngineError), ev
    assert (ev.error_type, ev.exception_type) == (error_type, exc_type)
    assert not ev.message.startswith(("[", "报", "〔", "("))


@pytest.mark.parametrize("message", [
    "Request failed: openai.BadRequestError: Error code: 400",  # a program's own message, ASCII colon
    "[2025-03-01] RuntimeError: boom",                         # a bracketed stamp is no label
    "[Error] the RuntimeError class is raised when nothing else fits",  # no exception line after it
])
def test_text_before_an_exception_that_is_no_label_is_not_read_as_one(message):
    assert not isinstance(parse_line(message), EngineError)


def test_a_gpu_memory_access_fault_is_a_death_even_while_starting():
    # ROCm's runtime prints it and aborts the process, like a fatal signal
    ev = parse_line("Memory access fault by GPU node-1 (Agent handle: 0x55d04a2c1e30) on address 0x7f2a1c000000. "
                    "Reason: Page not present or supervisor privilege.")
    assert isinstance(ev, EngineError) and (ev.error_type, ev.fatal) == ("engine_dead", True)
    ev = parse_line("Traceback (most recent call last):\n  File \"core.py\", line 9, in _initialize_kv_caches\n"
                    "    self.profile_run()\nMemory access fault by GPU node-2 (Agent handle: 0x1) on address 0x2. "
                    "Reason: Unknown.")
    assert isinstance(ev, EngineError) and ev.error_type == "engine_dead"
    # the key's other lines are what they were
    assert parse_line("Memory profiling takes 4.25 seconds", "INFO") == StartupFact((("vllm.startup.profile_s", 4.25),))


def test_the_cpu_swap_space_running_out_is_memory():
    ev = parse_line("RuntimeError: Aborted due to the lack of CPU swap space. Please increase the swap space to "
                    "avoid this error.")
    assert isinstance(ev, EngineError) and ev.error_type == "oom"
    # the start's warning about a large swap space is no error
    assert not isinstance(parse_line("Possibly too large swap space. 16.00 GiB out of the 31.00 GiB total CPU memory "
                                     "is allocated for the swap space.", "WARNING", "config.py:1"), EngineError)


def test_a_device_runtime_out_of_resources_is_memory():
    ev = parse_line("Exception in worker VllmWorkerProcess: HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed "
                    "to allocate the necessary resources.", "ERROR")
    assert isinstance(ev, EngineError) and ev.error_type == "oom"
    ev = parse_line("RuntimeError: UR backend failed. UR backend returns:40 (UR_RESULT_ERROR_OUT_OF_RESOURCES)")
    assert isinstance(ev, EngineError) and ev.error_type == "oom"
    # the same runtime's other failures say nothing of memory
    ev = parse_line("RuntimeError: UR backend failed. UR backend returns:20 (UR_RESULT_ERROR_DEVICE_LOST)")
    assert isinstance(ev, EngineError) and ev.error_type != "oom"


def test_a_banner_copied_with_a_terminals_row_padding_still_names_its_model():
    ev = parse_line("Initializing a V0 LLM engine (v0.8.4) with config: model='                     Qwen/Qwen2.5-0.5B"
                    "-Instruct', speculative_config=None, tokenizer='Qwen/Qwen2.5-0.5B-Instruct'", "INFO")
    assert (ev.version, ev.model) == ("0.8.4", "Qwen/Qwen2.5-0.5B-Instruct")
    ev = parse_line("Initializing a V0 LLM engine (v0.8.4) with config: model='/models/my model', dtype=auto", "INFO")
    assert ev.model == "/models/my model"  # one space is the path's own


def test_the_engine_cores_input_dump_is_its_death_in_either_form():
    # dump_input.py before 0.9.2 logged the dump's first line alone, its config on the next one
    for message in ("Dumping input data", "Dumping input data for V1 LLM engine (v0.10.1) with config: model='m', "):
        ev = parse_line(message, "ERROR")
        assert isinstance(ev, EngineError) and (ev.error_type, ev.fatal) == ("engine_dead", True), message
    # the dump's other lines say nothing of their own
    ev = parse_line("Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[])", "ERROR")
    assert not (isinstance(ev, EngineError) and ev.fatal)


def test_a_ray_serve_replica_that_failed_to_construct_is_a_failed_start():
    tb = ("Traceback (most recent call last):\n"
          "  File \"/opt/ray/serve/_private/replica.py\", line 965, in initialize_and_get_metadata\n"
          "    await self._replica_impl.initialize(deployment_config)\n"
          "RuntimeError: CUDA error: no kernel image is available for execution on the device")
    assert parse_line(tb).error_type == "model_load"
    tb = ("Traceback (most recent call last):\n"
          "  File \"/opt/ray/serve/_private/deployment_state.py\", line 690, in check_ready\n"
          "    ) = ray.get(self._ready_obj_ref)")
    assert parse_line(tb).error_type == "model_load"
    # a replica's request handler failing while serving is no start
    tb = ("Traceback (most recent call last):\n"
          "  File \"/opt/ray/serve/_private/replica.py\", line 1200, in handle_request\n"
          "    return await self._user_callable_wrapper.call_user_method(request)\n"
          "  File \"/opt/vllm/v1/engine/async_llm.py\", line 400, in output_handler\n"
          "    outputs = await engine_core.get_output_async()")
    assert parse_line(tb).error_type == "engine_dead"


def test_info_lines_that_only_sound_alike_are_not_errors():
    assert parse_line("Worker ready; awaiting tasks", "INFO") == Notice("startup_info")
    assert not isinstance(parse_line("Killing local vLLM worker processes", "INFO"), EngineError)


def test_keyed_near_misses_are_malformed_and_the_rest_unrecognised():
    assert parse_line("Added request", "INFO") is MALFORMED
    assert parse_line("Sequence group x is doing fine", "WARNING") is MALFORMED
    assert parse_line("Frobnicated widget 3", "INFO") is None
    assert parse_line("hello from a sidecar") is None


def test_seed_lines_still_win_on_shared_keys():
    from bridge.parse.events import GpuMemory, QueueState
    assert isinstance(parse_line("Running queue: 3 requests, waiting queue: 5 requests, free blocks: 12/64"), QueueState)
    assert isinstance(parse_line("GPU memory usage: 14.2GB/16.0GB (88.75%), cache usage: 8.1GB, kv_cache blocks: 512/640"),
                      GpuMemory)


def test_parser_counts_notices_by_their_kind():
    p = Parser()
    p("Processed prompts:  50%|█████     | 1/2 [00:01<00:01,  1.23s/it]")
    p("Added request x.", "INFO")
    p("nothing", "INFO")
    s = p.snapshot()
    assert s.by_kind == {"noise": 1, "request_added": 1} and s.unrecognised == 1


def test_the_api_server_listening_ends_a_start_and_its_routes_do_not():
    for message in ("Starting vLLM API server on http://0.0.0.0:8000", "Starting vLLM server on http://0.0.0.0:8080",
                    "Starting vLLM API server 0 on http://0.0.0.0:8000"):
        assert parse_line(message, "INFO") == StartupFact((), listening=True), message
    for message in ("Available routes are:", "Route: /health, Methods: GET"):
        assert not isinstance(parse_line(message, "INFO"), StartupFact), message


def test_the_engine_client_names_the_engine_core_that_died():
    ev = parse_line("Engine core proc EngineCore_DP1 died unexpectedly, shutting down client.", "ERROR")
    assert isinstance(ev, EngineError) and (ev.error_type, ev.core, ev.worker) == ("engine_dead", "EngineCore_DP1", "")


@pytest.mark.parametrize("fast", [None, "c"], ids=["pure", "c"])
def test_what_the_model_loader_prints_is_a_line_of_the_start(fast):
    """Whatever a model loader's module prints (vLLM's `*_loader.py`, `weight_utils.py`, the old
    `loader.py`; tpu-inference's MoE weight padding in `moe_weights.py`) is the model being loaded:
    a startup line, by the module that wrote it, on the C path and the pure one alike. Near misses:
    the same words from another module stay chatter, and a loader's error stays an error. (A line
    vLLM's notices know by its words, `Using model weights format …`, stays that notice.)"""
    from bridge.parse import FAST_PARSE
    parse = Parser(fast=FAST_PARSE if fast else None).parse
    for message, origin in (("w13_weight_w1 shape after padding: (128, 2816, 1024)", "moe_weights.py:193"),
                            ("Prefetching checkpoint files: 20% (2/4)", "weight_utils.py:792"),
                            ("Prefetching checkpoint files into page cache finished in 18.81s", "weight_utils.py:815"),
                            ("Model impl type is vllm", "model_loader.py:318"),
                            ("No model.safetensors.index.json found in remote.", "default_loader.py:262"),
                            ("Filesystem type for checkpoints: EXT4.", "base_loader.py:56"),
                            ("Loading weights with BitsAndBytes quantization.", "vllm.model_executor.model_loader."
                                                                              "bitsandbytes_loader")):
        for level in ("INFO", "DEBUG", "WARNING"):
            assert parse(message, level, origin) == StartupFact(()), (message, origin, level)
    for message, origin in (("w13_weight_w1 shape after padding: (128, 2816, 1024)", "fused_moe.py:193"),
                            ("Prefetching checkpoint files: 20% (2/4)", "utils.py:792"),
                            ("Loading weights with BitsAndBytes quantization.", "downloader.py:3")):
        assert not isinstance(parse(message, "INFO", origin), StartupFact), (message, origin)
    assert isinstance(parse("Shard 3 of the checkpoint is missing", "ERROR", "default_loader.py:280"), EngineError)


def test_a_worker_s_rpc_that_raised_is_the_engine_s_death_unless_it_was_starting():
    """`WorkerProc hit an exception.` (multiproc_executor's busy loop) with its cause cut off: a
    batch's RPC failed and the engine core goes down with it (`engine_dead`, not said fatal: the
    core's own line says that); under a start's frames it is a failed start. Near miss: a cause
    the worker's traceback names wins."""
    ev = parse_line("WorkerProc hit an exception.\nTraceback (most recent call last):\n  File \"/wo", "ERROR")
    assert (ev.error_type, ev.fatal) == ("engine_dead", False)
    starting = parse_line("WorkerProc hit an exception.\nTraceback (most recent call last):\n  File \"/v/gpu_worker.py\","
                          " line 3, in compile_or_warm_up_model\n    self.model_runner.capture_model()\n", "ERROR")
    assert starting.error_type == "model_load"
    oom = parse_line("WorkerProc hit an exception.\nTraceback (most recent call last):\n  File \"/v/x.py\", line 1, in f\n"
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "ERROR")
    assert oom.error_type == "oom"
