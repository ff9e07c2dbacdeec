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
])
def test_cause(text, error_type):
    assert classify(text) == error_type


def test_a_fatal_signal_is_a_death_and_a_torch_warning_block_no_error():
    assert engine_error("Fatal Python error: Segmentation fault").fatal
    from bridge.parse import Parser
    warning = ("[W530 17:23:59.243033714 OperatorEntry.cpp:154] Warning: Warning only once for all operators\n"
               "  Overriding a previously registered kernel for the same operator and the same dispatch key")
    assert type(Parser().parse(warning, "", "")).__name__ == "Notice"


def test_a_prompt_that_could_not_be_processed_is_the_client_s():
    from bridge.parse import Parser
    ev = Parser().parse("Error in preprocessing prompt inputs\nTraceback (most recent call last):", "ERROR",
                        "serving_completion.py:131")
    assert type(ev).__name__ == "Notice" and ev.kind == "client_error"
