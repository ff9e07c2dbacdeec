"""The span sets every saved input makes, as a canonical dump, and the differences between two
dumps: the proof that a refactor of a stage changed nothing a backend would see.

    python tests/spansets.py dump OUT.jsonl        # every input below, in this process
    python tests/spansets.py compare BEFORE.jsonl AFTER.jsonl

Run `dump` with and without VLLM_TRACE_BRIDGE_PURE=1 (each process loads one path, C fast
paths or pure Python, as `replay` would). The inputs: every log under tests/fixtures (saved
real runs, scenarios, randomized workloads, plugin and upstream excerpts), the corpus
excerpts under tests/corpus (with their year), the packaged seed log, synthetic seed logs
(plain and CRI, fixed seeds) and the hostile corpus's cases. Each goes through
`bridge.pipeline.replay` on its own, with a fixed file mtime (a header stamp without a year
takes it) and at a fixed path (its source, which the ids hash), and its spans go
through the reference OTLP mapping (`export.otlp`). One JSON line
per input: its name, the assembler's counters and every span (trace id, span id, parent,
name, kind, start, end, status, attributes, events, links), spans sorted by (trace id, span
id), attributes by key.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import sys
import shutil
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

_MTIME = 1_800_000_000.0  # 2027-01-15: any fixed time; real mtimes differ between checkouts
_SCRATCH = Path("/tmp/vllm-trace-bridge-spansets")  # the inputs' fixed paths (see `_copy`)


def _value(v):
    """An OTLP AnyValue as plain JSON (type kept: 1 and 1.0 and "1" differ)."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return ["array", [_value(x) for x in v.array_value.values]]
    if kind == "kvlist_value":
        return ["kvlist", _attrs(v.kvlist_value.values)]
    if kind == "bytes_value":
        return ["bytes", v.bytes_value.hex()]
    return [kind, getattr(v, kind) if kind else None]


def _attrs(kvs) -> list:
    return sorted([kv.key, _value(kv.value)] for kv in kvs)


def _span(s) -> dict:
    return {
        "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
        "name": s.name, "kind": s.kind, "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
        "status": [s.status.code, s.status.message], "attributes": _attrs(s.attributes),
        "events": [[e.name, e.time_unix_nano, _attrs(e.attributes)] for e in s.events],
        "dropped_events": s.dropped_events_count,
        "links": [[ln.trace_id.hex(), ln.span_id.hex(), _attrs(ln.attributes)] for ln in s.links],
    }


def _copy(scratch: Path, src: Path) -> str:
    """`src` at the same path under `scratch` in every checkout: a file's path is its source's
    identity, which the trace ids hash."""
    dst = scratch / src.relative_to(ROOT)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return str(dst)


def _inputs(scratch: Path) -> list[tuple[str, str, int | None]]:
    """(name, path, year) of every input, in a fixed order."""
    import yaml

    out: list[tuple[str, str, int | None]] = []
    for p in sorted((HERE / "fixtures").rglob("*")):
        if p.is_file() and (p.suffix == ".log" or p.name.endswith(".log.gz")):
            out.append((str(p.relative_to(ROOT)), _copy(scratch, p), 2025))
    corpus = HERE / "corpus"
    expectations = yaml.safe_load((corpus / "expectations.yaml").read_text())
    for p in sorted(corpus.rglob("*.log")):
        name = str(p.relative_to(corpus))
        out.append((f"tests/corpus/{name}", _copy(scratch, p), (expectations.get(name) or {}).get("year")))
    out.append(("bridge/samples/seed.log", _copy(scratch, ROOT / "bridge" / "samples" / "seed.log"), 2025))
    from bridge.synth import SynthConfig, write_file

    for seed, cri in ((1, False), (2, True), (3, False)):
        path = scratch / f"synth-{seed}{'-cri' if cri else ''}.log"
        write_file(str(path), SynthConfig(requests=1500, seed=seed, cri=cri))
        out.append((f"synth:{path.name}", str(path), 2025))
    from hostile_corpus import CASES

    for case in CASES:
        path = scratch / f"hostile-{case.name}.log"
        path.write_bytes(b"".join(case.lines()))
        out.append((f"hostile:{case.name}", str(path), 2025))
    return out


def dump(out_path: str) -> None:
    from bridge import pipeline
    from bridge.assemble.timeline import RequestTimeline
    from bridge.export.otlp import engine_spans, request_spans
    from bridge.pipeline import ReplayConfig, replay

    real_os = pipeline.os
    pipeline.os = types.SimpleNamespace(stat=lambda p: types.SimpleNamespace(st_mtime=_MTIME))
    inputs = spans_total = 0
    try:
        with open(_SCRATCH.with_suffix(".lock"), "w") as lock, open(out_path, "w") as out:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one dump at a time uses the fixed paths
            shutil.rmtree(_SCRATCH, ignore_errors=True)
            for name, path, year in _inputs(_SCRATCH):
                timelines: list = []
                try:
                    stats = replay([path], [timelines.append], ReplayConfig(year=year))
                    error = None
                    counters = dataclasses.asdict(stats.assemble)
                    counters["line_errors"] = stats.line_errors
                except Exception as exc:  # noqa: BLE001 - what escaped is the finding
                    error, counters = f"{type(exc).__name__}: {exc}", {}
                spans = []
                for t in timelines:
                    spans += request_spans(t) if isinstance(t, RequestTimeline) else engine_spans(t)
                rows = sorted((_span(s) for s in spans), key=lambda d: (d["trace_id"], d["span_id"], d["name"]))
                out.write(json.dumps({"input": name, "error": error, "stats": counters, "spans": rows},
                                     sort_keys=True) + "\n")
                inputs += 1
                spans_total += len(rows)
    finally:
        pipeline.os = real_os
    print(f"{inputs} inputs, {spans_total} spans -> {out_path}")


def _load(path: str) -> dict[str, dict]:
    """A dump by input. A counter at 0 is left out: one that a change adds (or drops) is no
    difference while it counts nothing."""
    with open(path) as f:
        dumps = {d["input"]: d for d in map(json.loads, f)}
    for d in dumps.values():
        d["stats"] = {k: v for k, v in d["stats"].items() if v != 0}
    return dumps


def compare(a_path: str, b_path: str, limit: int = 40) -> int:
    """Print every difference; return how many inputs differ."""
    a, b = _load(a_path), _load(b_path)
    differ = 0
    spans = sum(len(d["spans"]) for d in a.values())
    for name in sorted(a.keys() | b.keys()):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            differ += 1
            print(f"{name}: only in {'after' if x is None else 'before'}")
            continue
        if x == y:
            continue
        differ += 1
        print(f"== {name}")
        for key in ("error", "stats"):
            if x[key] != y[key]:
                print(f"  {key}: {x[key]} -> {y[key]}")
        xs = {(s["trace_id"], s["span_id"], s["name"]): s for s in x["spans"]}
        ys = {(s["trace_id"], s["span_id"], s["name"]): s for s in y["spans"]}
        shown = 0
        for k in sorted(xs.keys() | ys.keys()):
            if xs.get(k) == ys.get(k):
                continue
            shown += 1
            if shown > limit:
                continue
            if k not in ys:
                print(f"  - {k[2]} {k[0]}/{k[1]} only before")
            elif k not in xs:
                print(f"  + {k[2]} {k[0]}/{k[1]} only after")
            else:
                for field in xs[k]:
                    if xs[k][field] != ys[k][field]:
                        print(f"  ~ {k[2]} {k[1]} {field}: {xs[k][field]} -> {ys[k][field]}")
        if shown > limit:
            print(f"  … {shown - limit} more spans differ")
    print(f"compared {len(a)} inputs ({spans} spans before, {sum(len(d['spans']) for d in b.values())} after): "
          f"{differ} inputs differ")
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.out)
    else:
        sys.exit(1 if compare(args.before, args.after) else 0)


if __name__ == "__main__":
    main()
