"""Run log files through the whole replay pipeline (`bridge.pipeline.replay`, what `replay`
runs) in this process, and print one JSON line per file: the exception that escaped (if any),
every stage's counters, each request's id, outcome and tokens, a digest of the timelines
(attribute order included) and of the OTLP bytes, and how long it took.

Run as `python tests/hostile_replay.py FILE...`, with and without VLLM_TRACE_BRIDGE_PURE=1, so
each process loads its own path (C fast paths or pure Python) as `replay` would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bridge.assemble.timeline import RequestTimeline  # noqa: E402
from bridge.export.batch import OtlpSink  # noqa: E402
from receivers import CapturingTransport  # noqa: E402
from bridge.pipeline import ReplayConfig, replay  # noqa: E402


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj


def run(path: str) -> dict:
    transport = CapturingTransport()
    sink = OtlpSink(transport, {"service.name": "vllm"}, max_batch=256)
    timelines: list = []

    def collect(t) -> None:
        timelines.append(t)

    t0 = time.perf_counter()
    try:
        stats = replay([path], [collect, sink], ReplayConfig(year=2025))
        sink.flush()
        error = None
    except BaseException as exc:  # noqa: BLE001 - what escaped is the finding
        stats, error = None, f"{type(exc).__name__}: {str(exc)[:200]}"
    seconds = time.perf_counter() - t0
    requests = [[t.request_id, t.outcome, t.attrs.get("gen_ai.usage.input_tokens"),
                 t.attrs.get("gen_ai.usage.output_tokens"), t.start_ns, t.end_ns]
                for t in timelines if isinstance(t, RequestTimeline)]
    digest = hashlib.sha256()
    for t in timelines:
        digest.update(repr(t).encode("utf-8", "backslashreplace"))
        digest.update(repr([list(t.attrs)] + [list(p.attrs) for p in getattr(t, "phases", ())]).encode(
            "utf-8", "backslashreplace"))
    wire = hashlib.sha256(b"".join(transport.payloads)).hexdigest()
    return {"error": error, "stats": _plain(stats), "requests": requests, "timelines": digest.hexdigest(),
            "spans_bytes": sum(map(len, transport.payloads)), "wire": wire, "seconds": seconds}


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(json.dumps({"path": path, **run(path)}), flush=True)
