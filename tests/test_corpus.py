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
GAPS: dict[tuple[str, str], str] = {
    ("hpu/vllm-fork-1557-rank-warmup-notimplemented.log", "error"):
        "a rank-prefixed traceback whose indentation the paste squashed is not joined: its frames are lost",
    ("cuda/vllm-27194-bracket-artifact-stream.log", "incidents"):
        "a header whose ']' came through as '[]' ([serving_chat.py:1136[]) is not read as vLLM's header",
    ("cuda/vllm-27194-bracket-artifact-stream.log", "error"):
        "a header whose ']' came through as '[]' ([serving_chat.py:1136[]) is not read as vLLM's header",
    ("cuda/vllm-27194-bracket-artifact-stream.log", "at"):
        "a header whose ']' came through as '[]' ([serving_chat.py:1136[]) is not read as vLLM's header",
    ("cuda/vllm-2734-ray-nccl-ansi-remnant.log", "incidents"):
        "Ray's ESC-less colour code after a leading space (' [36m(RayWorkerVllm …) [0m') is not taken off",
    ("cuda/vllm-2734-ray-nccl-ansi-remnant.log", "error"):
        "Ray's ESC-less colour code after a leading space (' [36m(RayWorkerVllm …) [0m') is not taken off",
    ("cuda/vllm-2734-ray-nccl-ansi-remnant.log", "engine"):
        "Ray's ESC-less colour code after a leading space (' [36m(RayWorkerVllm …) [0m') is not taken off",
    ("cuda/vllm-2734-ray-nccl-ansi-remnant.log", "at"):
        "Ray's ESC-less colour code after a leading space (' [36m(RayWorkerVllm …) [0m') is not taken off",
    ("cuda/vllm-8978-nccl-all-ranks.log", "at"):
        "an unstamped line before the first stamp takes the file's mtime, not the next stamp",
    ("ascend/vllm-ascend-4744-init-failed-ascend-stamp.log", "at"):
        "CANN's '[ERROR] 2025-12-05-07:51:07' stamp is not read; unstamped lines take the file's mtime",
    ("ascend/vllm-ascend-1249-raw-traceback-init-failed.log", "at"):
        "CANN's '[ERROR] 2025-06-17-01:09:15' stamp is not read; unstamped lines take the file's mtime",
    ("ascend/vllm-ascend-6242-triton-compile-failed-start.log", "error"):
        "a worker failure told only by the command that failed (clang++): nothing read says the engine was starting",
    ("cpu/kserve-4657-container-prefix-import-traceback.log", "incidents"):
        "a 'kserve-container ' column before each line is not taken off",
    ("cpu/kserve-4657-container-prefix-import-traceback.log", "at"):
        "a 'kserve-container ' column before each line is not taken off",
    ("cuda/vllm-28028-header-without-seconds.log", "incidents"):
        "a header stamp with no seconds ('11-03 23:14') is not read as vLLM's header",
    ("cuda/vllm-28028-header-without-seconds.log", "error"):
        "a header stamp with no seconds ('11-03 23:14') is not read as vLLM's header",
    ("cuda/vllm-28028-header-without-seconds.log", "engine"):
        "a header stamp with no seconds ('11-03 23:14') is not read as vLLM's header",
    ("cuda/vllm-28028-header-without-seconds.log", "at"):
        "a header stamp with no seconds ('11-03 23:14') is not read as vLLM's header",
    ("cuda/torchserve-3365-model-log-hf-fetch.log", "incidents"):
        "TorchServe's '… [INFO ] W-9000-model_1.0-stdout MODEL_LOG - ' wrapper is not taken off",
    ("cuda/torchserve-3365-model-log-hf-fetch.log", "error"):
        "TorchServe's '… [INFO ] W-9000-model_1.0-stdout MODEL_LOG - ' wrapper is not taken off",
    ("cuda/torchserve-3365-model-log-hf-fetch.log", "at"):
        "TorchServe's '… [INFO ] W-9000-model_1.0-stdout MODEL_LOG - ' wrapper is not taken off",
    ("cuda/ray-54812-serve-replica-executor-init.log", "incidents"):
        "a Ray Serve replica's prefix ('(ServeReplica:app:Deployment pid=…, ip=…)') is not taken off",
    ("cuda/ray-54812-serve-replica-executor-init.log", "engine"):
        "a Ray Serve replica's prefix ('(ServeReplica:app:Deployment pid=…, ip=…)') is not taken off",
    ("cuda/roll-256-raw-engine-core-busy-loop.log", "error"):
        "a raw traceback whose indentation the paste damaged is not joined into one record",
    ("cuda/dynamo-1422-debug-wrapped-traceback.log", "incidents"):
        "Dynamo's 'ISO-Z DEBUG dynamo_run::subprocess: ' relay of a subprocess's lines is not taken off",
    ("cuda/dynamo-1422-debug-wrapped-traceback.log", "error"):
        "Dynamo's 'ISO-Z DEBUG dynamo_run::subprocess: ' relay of a subprocess's lines is not taken off",
    ("cuda/dynamo-1422-debug-wrapped-traceback.log", "at"):
        "Dynamo's 'ISO-Z DEBUG dynamo_run::subprocess: ' relay of a subprocess's lines is not taken off",
    ("cuda/dynamo-1492-worker-died-sigterm-start.log", "error"):
        "the death line lost its stamp's first digit in the paste and is not read; the traceback alone reads as a failed start",
    ("cuda/vllm-14574-buildkite-utc-vs-local.log", "at"):
        "a CI runner's '  | [ISO Z]' stamp does not win over vLLM's local-time header",
    ("cuda/vllm-3053-sigsegv-ray-logging-cc.log", "at"):
        "an unstamped first line takes the file's mtime; Ray's logging.cc stamp is not read",
    ("xpu/arc-b70-4-kv-cache-short-wrapped.log", "error"):
        "a terminal-wrapped exception line is split into two records: the KV-cache message is not read whole",
    ("cuda/higgs-audio-123-hub-401-then-restart.log", "at"):
        "an unstamped line before the first stamp takes the file's mtime, not the next stamp",
    ("cuda/runpod-213-iso-ns-stamps-engine-init.log", "incidents"):
        "a traceback fragment under ISO-ns stamps, with no exception line, makes no incident",
    ("cuda/runpod-213-iso-ns-stamps-engine-init.log", "error"):
        "a traceback fragment under ISO-ns stamps, with no exception line, makes no incident",
    ("cuda/runpod-213-iso-ns-stamps-engine-init.log", "at"):
        "a traceback fragment under ISO-ns stamps, with no exception line, makes no incident",
    ("ascend/vllm-ascend-1987-npu-oom-one-line.log", "incidents"):
        "an exception line behind a user's label ('【BUG】：') is not read",
    ("ascend/vllm-ascend-1987-npu-oom-one-line.log", "error"):
        "an exception line behind a user's label ('【BUG】：') is not read",
    ("ascend/vllm-ascend-644-v1-engine-exception-visual.log", "error"):
        "a traceback fragment entirely inside the model's forward: nothing read says it was serving",
    ("cuda/vllm-13957-engine-iteration-timeout-app-logger.log", "at"):
        "an unstamped traceback before the app's stamped line takes the file's mtime",
    ("cuda/vllm-32761-json-pretty-uncaught-401.log", "incidents"):
        "a pretty-printed (multi-line) JSON record is not read",
    ("cuda/vllm-32761-json-pretty-uncaught-401.log", "error"):
        "a pretty-printed (multi-line) JSON record is not read",
    ("cuda/vllm-32761-json-pretty-uncaught-401.log", "at"):
        "a pretty-printed (multi-line) JSON record is not read",
    ("cuda/kserve-5056-model-server-failed-init.log", "at"):
        "the unstamped traceback before KServe's stamped line takes the file's mtime, not the next stamp",
    ("cuda/vllm-11931-v0-device-assert-interleaved-stderr.log", "error"):
        "a raw stderr traceback interleaved with the logged one splits it: the CUDA assert is not read with its frames",
}


@functools.cache
def _replayed(name: str) -> tuple[list[RequestTimeline], list[EngineTimeline], list[EngineTimeline]]:
    out: list = []
    replay([str(CORPUS / name)], [out.append], ReplayConfig(year=EXPECTATIONS[name]["year"]))
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
    by_id: dict[str, list[RequestTimeline]] = {}
    for r in requests:
        by_id.setdefault(r.request_id, []).append(r)
    for rid, outcome in want.items():
        assert rid in by_id, f"{rid} not among {sorted(by_id)}"
        if outcome != "seen":
            assert [r.error_type for r in by_id[rid]] == [outcome], [(r.outcome, r.error_type) for r in by_id[rid]]
