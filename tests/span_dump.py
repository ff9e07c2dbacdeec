"""What a backend sees for every saved input, to compare a change's before and after: each
fixture and corpus directory (and each of its files alone), the seed sample and any logs in
$SYNTH_DIR are replayed in process, their timelines encoded by `wire.WireEncoder` and by the
reference `ProtoEncoder`, decoded with the opentelemetry-proto stubs and written as canonical
JSON (ids in hex), one file per input; `_summary.json` says whether the two encoders agreed.

    cd CHECKOUT && python tests/span_dump.py OUTDIR          # C paths
    cd CHECKOUT && VLLM_TRACE_BRIDGE_PURE=1 python tests/span_dump.py OUTDIR2
    diff -r OUTDIR OUTDIR2                                    # only _summary.json's "fast"
"""

from __future__ import annotations

import base64
import glob
import json
import os
import sys

sys.path.insert(0, os.getcwd())  # the checkout's bridge, as the tests import it

from google.protobuf.json_format import MessageToDict  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from bridge.export.reference import ProtoEncoder  # noqa: E402
from bridge.export.wire import FAST_REQUEST, WireEncoder  # noqa: E402
from bridge.pipeline import replay  # noqa: E402

IDS = ("trace_id", "span_id", "parent_span_id")
SKIP = (".json", ".md", ".yaml", ".yml", ".txt", ".py")


def canon(payload: bytes) -> dict:
    """The request as JSON, ids in hex."""
    def fix(x, key=None):
        if isinstance(x, dict):
            return {k: fix(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [fix(v) for v in x]
        return base64.b64decode(x).hex() if key in IDS and isinstance(x, str) else x
    return fix(MessageToDict(ExportTraceServiceRequest.FromString(payload), preserving_proto_field_name=True))


def inputs():
    files = sorted(p for root in ("tests/fixtures", "tests/corpus")
                   for p in glob.glob(f"{root}/**/*", recursive=True) if os.path.isfile(p) and not p.endswith(SKIP))
    by_dir: dict[str, list[str]] = {}
    for f in files:
        by_dir.setdefault(os.path.dirname(f), []).append(f)
    for d, fs in sorted(by_dir.items()):
        yield d, fs  # a directory's files together (rotations and restarts are one stream)
        if len(fs) > 1:
            for f in fs:
                yield f, [f]  # and each alone
    yield "bridge/samples/seed.log", ["bridge/samples/seed.log"]
    for f in sorted(glob.glob(os.path.join(os.environ.get("SYNTH_DIR", "/nonexistent"), "*.log"))):
        yield f, [f]


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    summary: dict = {"fast": FAST_REQUEST is not None}
    for name, paths in inputs():
        got: list = []
        try:
            replay(paths, [got.append])
        except Exception as exc:  # noqa: BLE001 - recorded: before and after must agree on it too
            summary[name] = f"replay raised {exc!r}"
            continue
        res = {}
        for label, encoder in (("wire", WireEncoder), ("proto", ProtoEncoder)):
            enc = encoder({"service.name": "vllm"})
            for t in got:
                enc.add(t)
            res[label] = canon(enc.take().payload)
        same = res["wire"] == res["proto"]
        summary[name] = {"timelines": len(got), "wire==proto": same}
        stem = os.path.join(out, name.replace("/", "__"))
        with open(stem + ".json", "w") as fh:
            json.dump(res["wire"], fh, indent=0, sort_keys=True)
        if not same:
            with open(stem + ".proto.json", "w") as fh:
                json.dump(res["proto"], fh, indent=0, sort_keys=True)
    with open(os.path.join(out, "_summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1, sort_keys=True)
    rows = {k: v for k, v in summary.items() if k != "fast"}
    print(len(rows), "inputs;", sum(v["timelines"] for v in rows.values() if isinstance(v, dict)), "timelines;",
          "wire != proto:", [k for k, v in rows.items() if isinstance(v, dict) and not v["wire==proto"]],
          "; replay raised:", [k for k, v in rows.items() if isinstance(v, str)])


if __name__ == "__main__":
    main(sys.argv[1])
