"""Real logs users pasted in public issues, replayed, against what an operator reads in them.

Each excerpt under `tests/corpus/<platform>/` is kept verbatim with its source; its expectations
in `tests/corpus/expectations.yaml` were written from the log alone, before the bridge ever ran
on it (README there). One test per excerpt and per expectation, so a miss names what was missed.
Expectations the bridge does not meet yet are listed in `GAPS` (strict xfail): the table says
what is missing, the expectation itself stays as the operator wrote it.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from bridge.assemble.timeline import EngineTimeline, RequestTimeline
from bridge.parse.rules import load_rules
from bridge.pipeline import ReplayConfig, replay

CORPUS = Path(__file__).parent / "corpus"


class _Loader(yaml.SafeLoader):
    """YAML without its timestamp type: `at` stays the text the operator wrote (its digits say
    its resolution)."""


_Loader.yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
                                   for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
EXPECTATIONS = yaml.load((CORPUS / "expectations.yaml").read_text(encoding="utf-8"), Loader=_Loader)
ASPECTS = ("incidents", "error", "engine", "at", "startup", "requests")
STARTUP = "startup"
#: startup facts an operator names → the span attribute that carries them
FACT_KEYS = {"model": "gen_ai.request.model", "version": "vllm.version"}

#: (excerpt, aspect) → the gap that keeps the bridge from meeting it. Strict: a fixed gap fails
#: here until its row is removed.
GAPS: dict[tuple[str, str], str] = {}


@functools.cache
def _replayed(name: str) -> tuple[list[RequestTimeline], list[EngineTimeline], list[EngineTimeline]]:
    """An excerpt's timelines, replayed as a user would: with the rule file the operator wrote for
    it (`rules:`, under `tests/corpus/rules/`) where a build's own lines need one (`docs/rules.md`:
    what `check` lists is taught so), else the built-in grammar alone."""
    out: list = []
    exp = EXPECTATIONS[name]
    rules = load_rules(str(CORPUS / "rules" / exp["rules"])) if "rules" in exp else None
    replay([str(CORPUS / name)], [out.append], ReplayConfig(year=exp["year"], rules=rules))
    requests = [t for t in out if isinstance(t, RequestTimeline)]
    engines = sorted((t for t in out if isinstance(t, EngineTimeline)), key=lambda t: t.start_ns)
    return requests, [t for t in engines if t.kind != STARTUP], [t for t in engines if t.kind == STARTUP]


def _cases():
    for name, exp in EXPECTATIONS.items():
        for aspect in ASPECTS:
            if aspect not in exp or (aspect in ("error", "engine", "at") and not exp.get("incidents")):
                continue
            marks = []
            gap = GAPS.get((name, aspect))
            if gap:
                marks.append(pytest.mark.xfail(strict=True, reason=gap))
            yield pytest.param(name, aspect, marks=marks, id=f"{name}:{aspect}")


def _ns(stamp: str) -> tuple[int, int]:
    """An ISO stamp → (ns, resolution in ns): to the second unless it has a fraction."""
    dt = datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc)
    if "." in stamp:
        digits = len(stamp.rsplit(".", 1)[1])
        return int(dt.timestamp() * 10**digits) * 10 ** (9 - digits), 10 ** (9 - digits)
    return int(dt.timestamp()) * 10**9, 10**9


def test_every_excerpt_has_its_source_and_file():
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.log")}
    assert on_disk == set(EXPECTATIONS)
    for name, exp in EXPECTATIONS.items():
        assert exp["source"].startswith("https://github.com/"), name
        assert {"platform", "wrapper", "year", "incidents"} <= set(exp), name
    assert not set(GAPS) - {(n, a) for n, e in EXPECTATIONS.items() for a in e}, "a GAPS row names no expectation"


@pytest.mark.parametrize("name, aspect", list(_cases()))
def test_corpus(name, aspect):
    exp = EXPECTATIONS[name]
    requests, incidents, startups = _replayed(name)
    want = exp[aspect]
    if aspect == "incidents":
        assert len(incidents) == want, [(i.kind, i.error_type, i.attrs.get("vllm.process")) for i in incidents]
        return
    if aspect in ("error", "engine", "at"):
        assert incidents, "no incident"
        first = incidents[0]
        if aspect == "error":
            assert first.error_type == want, (first.kind, first.message[:200])
        elif aspect == "engine":
            assert want in str(first.attrs.get("vllm.process", "")), first.attrs
        else:
            ns, resolution = _ns(want)
            assert first.start_ns // resolution * resolution == ns, datetime.fromtimestamp(
                first.start_ns / 1e9, timezone.utc).isoformat()
        return
    if aspect == "startup":
        if want is False:
            assert not startups, [s.attrs for s in startups]
            return
        assert startups, "no startup span"
        for key, value in want.items():
            if key == "failed":
                assert any(s.error_type for s in startups) == value, [s.attrs for s in startups]
                continue
            attr = FACT_KEYS.get(key, f"vllm.startup.{key}")
            got = [s.attrs[attr] for s in startups if attr in s.attrs]
            assert got, f"no {attr} in {[s.attrs for s in startups]}"
            if isinstance(value, str):
                assert value in got
            else:
                assert any(abs(g - value) <= 1e-3 * max(1.0, abs(value)) for g in got), (attr, got, value)
        return
    # a request is found by the id its client knows or by the one vLLM's engine gave it (V1's
    # `<id>-<8 hex>`, `vllm.request.internal_id`), whichever the line named it by
    by_id: dict[str, list[RequestTimeline]] = {}
    for r in requests:
        by_id.setdefault(r.request_id, []).append(r)
        internal = (r.attrs or {}).get("vllm.request.internal_id")
        if internal and internal != r.request_id:
            by_id.setdefault(internal, []).append(r)
    for rid, outcome in want.items():
        assert rid in by_id, f"{rid} not among {sorted(by_id)}"
        if outcome != "seen":
            assert [r.error_type for r in by_id[rid]] == [outcome], [(r.outcome, r.error_type) for r in by_id[rid]]


#: Every family of lines `check` leaves unknown in the corpus, and why none is a line of vLLM's own
#: serving path: (pattern over the family's masked template, what writes it). A new family fails
#: the test below until it is taught (a vLLM line) or listed here with its writer; a row no family
#: matches any more fails it too.
NOT_VLLM: tuple[tuple[str, str], ...] = (
    # the paste, not any log
    (r"(?:\.{3,}|\[\.\.\.\]|--|\(skipped traceback\) \.+)$", "the user's elision or separator in the paste"),
    (r"\.{3,}INFO: <n> - ", "uvicorn's access line with the user's '....' elision glued before it (vllm-ascend-1170)"),
    (r"(?:\$ |root@|python |static --|--no-enable|✗ kubectl|'…' (?:vllm serve|export|python|CUDA_VISIBLE)"
     r"|\([\w<>]+\) '…'$|\([\w-]+\) root@|'…' kubectl logs |vllm serve '…'$)",
     "the user's shell prompt (a conda environment's name before it) and command line"),
    (r"tonyaw: ?", "the user's own debug prints added to a fork of vLLM"),
    (r"kl '…'$", "the user's alias for `kubectl logs <pod>`"),
    (r"Defaulted container '…' out of: ", "kubectl's note on the container it shows"),
    (r"vllm is running on: ", "the user's script's print before vLLM starts"),
    (r"(?:=== <n>-INFO =+|vllm instantiated\.|final model parameters:)$",
     "mellea's test harness's own prints once its vLLM backend is up"),
    # tracebacks the paste damaged: vLLM's source lines inside a traceback, no log line
    (r"raise \w+\($", "a frame's source line whose indentation the paste lost, cut from its traceback before the "
                     "exception line (qwen-295)"),
    (r"(?:Please verify the following requirements:|<n>\. (?:Provide a valid|Specify a local))",
     "the second and later lines of an exception's message (vLLM's ValueError for an invalid repository id): no "
     "log line; the exception line is read (model_load)"),
    # wrappers and their own lines
    (r"<n> kserve\.trace Received request ", "KServe's own request log line (its sampling parameters)"),
    (r"(?:<n> )?uvicorn\.access INFO: ", "uvicorn's access logger in KServe's format"),
    (r"(?:\[<n>-<n>-<n> <n>\] |DEBUG )?LMCache[: ]|The KV cache will not be stored\.|Initialized NIXL agent: NixlRole\.",
     "LMCache's own logger (and its NIXL backend's print)"),
    (r"(?:src(?:/\S*?\.rs|<path>):<n>: |'…' (?:vLLM route_completion|Using direct URL mode))",
     "vllm-router's (Rust) own lines"),
    (r"- run_vllm_api_server\.py:<n> - ", "Tenstorrent's launcher script's logger"),
    (r"default_\S+ \S+ '…' -- Encountered failure while handling request ",
     "Ray Serve's replica logger (deployment, replica, request id) reporting the request the engine failed"),
    (r"controller <n> (?:\S+\.py:<n> -|--) ", "Ray Serve's controller's own logger (its level and full-date stamp "
                                             "read by decode)"),
    (r"(?:Tensor parallel size: <n>|Using BFloat<n> precision|Initializing LLM pipeline|Available GPU memory: \{.*\})$",
     "livepeer's app logger (its Python logging frame `- app.pipelines.llm - INFO - ` taken off by decode, as any "
     "application's that relays vLLM's output)"),
    (r"- runners\.py\[line:<n>\] - ERROR: Exception in callback |handle: <Handle ",
     "asyncio's exception handler, through the app's logger (vLLM's own error lines follow)"),
    (r"vllm<n>\.service: ", "systemd's unit status"),
    (r"\[ERROR:swift\] ", "ms-swift's own logger (its rollout worker reporting the call that failed)"),
    (r"\[llama-swap\] ", "llama-swap's own access line for the call it proxied to vLLM"),
    (r"'…' Waiting for the vLLM server to start at ", "InstructLab's own logger (`LEVEL <date> <module>:<line>: `, its "
                                                      "level and stamp taken off by decode) polling for the server"),
    (r"I <n>-<n> <n> log_lib\.py:<n>\] ", "SkyPilot's own logger (glog-like `I MM-DD HH:MM:SS file:line]`)"),
    (r"xinference\.\S+ <n> (?:INFO|WARNING|ERROR) ", "Xinference's own logger (`<asctime> <module> <pid> <level>`) beside "
                                                   "the vLLM engine it embeds (its `Generate finished, request_id: …`)"),
    (r"Dequeued prefill request: ", "NVIDIA Dynamo's prefill worker's own print (its NATS prefill queue)"),
    (r"\[PHASE \w+ \{", "kaggle-tpu-lab's launcher's own phase marker"),
    (r"(?:`torch_dtype` is deprecated|Using a slow image processor as `use_fast`|Special tokens have been added in the "
     r"vocabulary)", "transformers' warnings (a deprecated config key, the slow image processor, added special tokens) "
                    "inside vLLM's processes"),
    (r"авг <n> <n> llm python<n>\[<n>\]: (?:SM<n>|tokens=)", "a fork's (1cat-vllm) kernel debug print, through journald"),
    # libraries and runtimes inside vLLM's processes
    (r"\(raylet\) A worker died or was killed ", "Ray's raylet reporting a worker process that died (its list of "
                                                 "possible causes)"),
    (r"(?:The actor is dead because|Set the environment variable HYDRA_FULL_ERROR)",
     "Ray's actor-death detail and Hydra's hint, continuation lines of their errors"),
    (r"(?:logging\.cc:<n>: |PC: @ )", "Ray's (absl) fatal-signal handler (its C++ logger's stamp taken off)"),
    (r"(?:Stack|Current thread <hex>) \(most recent call first\):", "Python's faulthandler"),
    (r"frame #<n>: ", "torch's C++ (c10) backtrace"),
    (r"'…' vllm \(APIServer pid=<n>\) \(EngineCore_DP<n> pid=<n>\) \[rank<n>\]:W<n> ",
     "torch inductor's warning (ComboKernels) through stern's columns"),
    (r"cuda<n> \[<n>\] NCCL INFO ", "NCCL's own INFO lines"),
    (r"\[Gloo\] Rank ", "Gloo's own line"),
    (r"<n>-<n>-<n> <n> NIXL INFO _api\.py", "the NIXL library's own logger"),
    (r"(?:Backend UCX was instantiated$|error handling callback was invoked with status )",
     "the NIXL library's own prints (its agent creating the UCX backend, its UCX error callback)"),
    (r"\[<hex>\.<n>\] \[[\w<>]+ ?:<n>(?: ?:<n>)?\] +[\w<>]+\.c:<n> +UCX +(?:ERROR|WARN|INFO|DIAG) ",
     "UCX's own logger (`[<epoch>] [host:pid:thread] file.c:line UCX LEVEL`), the transport under NIXL"),
    (r"python<n>: '…'$", "the C library's assertion message (`python3: <file>:<line>: <function>: Assertion … failed.`, "
                        "here Mooncake's transfer engine), cut by the store's window before its message"),
    (r":<n>:\w+\.cpp :<n> ?: <hex> us: ", "ROCm's HIP runtime debug trace (AMD_LOG_LEVEL)"),
    (r"\[aiter\] ", "AMD AITER's own logger (the ROCm kernel library inside vLLM's workers)"),
    (r"<n>-<n>-<n> <n> - INFO - autotuner\.py:<n> - flashinfer\.jit: ",
     "FlashInfer's own logger (its JIT autotuner, Python logging's default format) inside vLLM's workers"),
    (r"\[ERROR\] <n>-<n>-<n>-<n> \(PID:<n>, Device:-<n>, RankID:-<n>\) ERR<n> ", "Ascend CANN's own error line"),
    (r"(?:For debugging consider passing (?:CUDA_LAUNCH_BLOCKING|AMD_SERIALIZE_KERNEL)=<n>$|(?:HIP|CUDA) kernel errors "
     r"might be asynchronously reported|Compile with `TORCH_USE_(?:CUDA|HIP)_DSA` to enable)", "the later lines of torch's CUDA / HIP error message (its hints), with no header "
                                 "after the exception line they belong to"),
    (r"Warning: You are sending unaut", "huggingface_hub's warning about unauthenticated requests to the Hub"),
    (r"(?:Repository Not Found for url|Please make sure you specified the correct|If you are trying to access a "
     r"private or gated repo|Invalid username or password)", "huggingface_hub's error message, its later lines"),
    # batch F
    (r"(?:Waiting for (?:more )?workers to be ready\.|Current: <n>, Required: <n>)$",
     "NVIDIA Dynamo's own prints while it waits for its vLLM worker to register (dynamo-288)"),
    (r"(?:Including non-PyTorch memory, this process has|Of the allocated memory <n> GiB is allocated by PyTorch|If "
     r"reserved but unallocated memory is large try setting$|'…' to avoid fragmentation\.$|See documentation for "
     r"Memory Management '…'|GPU <n> has a total capacity of )", "torch's CUDA OOM message, its sentences broken onto "
                                                              "lines of their own by the user "
     "(llm-d-infra-195), after the exception line read as the OOM"),
    (r"(?:Lifespan: |\[INIT_COMMUNICATOR\] )", "verifiers' vllm_server's own logger (its `<date> - <module> - "
                                               "LEVEL - ` frame taken off by decode)"),
    (r"If this is not desired, please set os\.environ\['…'\]\.$",
     "torch's cpp_extension UserWarning (TORCH_CUDA_ARCH_LIST), its second line"),
    (r"The above exception was the direct cause of the following exception:$",
     "Python's chained-traceback separator, unprefixed, left alone because the cause before it was cut from its "
     "header (vllm-3839: that cause, Ray's actor-death line, is read on its own)"),
    (r"\Z", "a log viewer's tab-only separator after every line of its copy (vllm-42389)"),
    (r"(?:-{20}$|For simplicity, JAX has removed its internal frames)",
     "JAX's traceback-filtering note and its separator, in tpu-inference's engine core"),
    (r"\[Memory Profiling Analysis\]$", "Intel llm-scaler's own memory-analysis print in its patched worker"),
    # malformed lines (a rule's start, a rest it cannot read), listed by `check` since session 17
    (r"(?:args: Namespace\(.*[^)]|init e|Engine <n>: Avg prompt throughput: <n> tokens/s, Avg generation throughput|"
     r".*Avg prompt throughput: <n> tokens/s, Avg generation throughput: <n> tokens/s, Running:)$",
     "vLLM's lines (the args, `init engine …`, a stats line) cut where the store's window ended: each excerpt's "
     "last line, read whole in every other excerpt"),
    (r"Process EngineCore_(?:DP)?<n>:$", "Python multiprocessing's header for a process that raised, printed to "
                                        "stderr apart from its traceback (vLLM's logger writes that traceback)"),
    (r"INFO [\w.]+\.py:<n> -- ", "Ray's own logger (`INFO worker.py:N -- Started a local Ray instance.`, the "
                                  "compiled DAG's)"),
    (r"Exception raised in creation task: The actor died because ",
     "Ray's RayActorError message (an actor's creation task raised; the traceback after it says why)"),
    (r"Loaded nixl metadata from engine ", "NVIDIA Dynamo's patch of vLLM 0.7 (its own NIXL metadata exchange, "
                                           "not in upstream vLLM)"),
    (r"Starting RunnerServer from ", "BentoML's own line (OpenLLM's runner server)"),
    (r"INFO uvicorn\.access pid:<n> role:", "Xinference's uvicorn access logger (its own format)"),
    (r"INFO \| '…' - ", "tt-metal's own loguru lines (its model config)"),
    # batch G
    (r"(?:Downloading Model to directory: |Retriving file lock$|Starting vllm server$)",
     "gpustack's own worker logger (`<ISO stamp> - <module> - LEVEL - `, taken off by decode) and its download "
     "prints before it starts vLLM"),
    (r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):__main__:", "the user's Ray Serve app's own logger (Python logging's "
                                                         "default `LEVEL:name:message`) printing a traceback"),
    (r"\(RayWorkerWrapper pid=<n>\) (?:Backend UCX was instantiated$|Initialized NIXL agent: )",
     "the NIXL library's own prints (its UCX backend, its agent) behind Ray's worker column inside an engine core"),
    (r"'…' prompt='…', prompt_token_ids=\[", "FastChat's own stdout print of vLLM's RequestOutput (its "
                                             "`| INFO | stdout |` frame taken off by decode)"),
    (r"Request finished: req <id> finish_reason=", "a patched build's per-request line (syv-ai/qwen38-27b-rtx3090's "
                                                   "patch series, not upstream vLLM's; the qwen38-147 GAPS row names it)"),
    (r"Engine <n>: Avg prompt throughput: <n> tokens/s, Avg generation t$",
     "vLLM's stats line cut by the store's window inside a word (tt-inference-server-3359's last line)"),
)


def test_no_unknown_line_family_is_vllm_s_own():
    """`check` over every excerpt: each family of lines it does not understand is one of
    `NOT_VLLM` (a writer other than vLLM's serving path, or paste damage a GAPS row names)."""
    import re

    from bridge.check import check_file, families

    fams = families([check_file(str(p)) for p in sorted(CORPUS.rglob("*.log"))])
    patterns = [(re.compile(p), p) for p, _ in NOT_VLLM]
    unexplained = [t for t, _, _ in fams if not any(rx.match(t) for rx, _ in patterns)]
    assert not unexplained, unexplained
    stale = [p for rx, p in patterns if not any(rx.match(t) for t, _, _ in fams)]
    assert not stale, stale
