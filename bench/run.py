"""The benchmark suite, one command:

    python bench/run.py [--lines 1000000] [--runs 3] [--quick] [--root DIR]

Generates its data under bench/out/ (cached), runs each measurement `--runs` times, each in a
fresh process, and prints a table of medians (with the min–max over runs):

- replay end to end: `python -m bridge replay FILE --otlp-endpoint …` on a generated
  seed-dialect log (~10 lines and ~5 spans per request) into a real OTLP gRPC receiver running
  in its own process. CPU is user+sys of the bridge process alone (rusage), so the figures
  hold on a shared machine; lines/s and spans/s are per CPU-second.
- parse only: the parse stage (`Parser`) over the messages of an upstream-vLLM-like mix where
  most lines are not request lines; and decode+parse over the same raw lines.
- bytes per in-flight request: tracemalloc around an Assembler fed 100,000 Scheduling lines
  of requests that never finish (everything it keeps, divided by 100,000).
- flood: requests that never finish, arriving for longer than the TTL: the number open and
  the traced memory stay bounded because of TTL eviction.

Figures, not assertions: CI does not run or gate on this. `--root DIR` benchmarks another
checkout of the bridge (e.g. an older commit exported with `git archive`) with the same data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# -- workers: each runs in its own process, with `root` first on sys.path -----------------

def worker_parse(root: str, n: int) -> dict:
    import time

    from bridge.decode import Decoder
    from bridge.parse import Parser
    from bridge.parse.events import Notice
    from mix import upstream_like_lines

    raw = [(line + "\n").encode() for line in upstream_like_lines(n)]
    decoder = Decoder(year=2025)
    records = []
    offset = 0
    for r in raw:
        rec = decoder(r, offset)
        offset += len(r)
        if rec is not None:
            records.append((rec.message, rec.level, rec.origin))
    parser = Parser()
    parse = getattr(parser, "parse", parser)  # the pipeline's per-line call (older roots: the parser)
    t0 = time.process_time()
    for m, level, origin in records:
        parse(m, level, origin)
    parse_s = time.process_time() - t0

    decoder, parser = Decoder(year=2025), Parser()
    parse = getattr(parser, "parse", parser)
    t0 = time.process_time()
    offset = 0
    for r in raw:
        rec = decoder(r, offset)
        offset += len(r)
        if rec is not None:
            parse(rec.message, rec.level, rec.origin)
    both_s = time.process_time() - t0
    stats = parser.snapshot()

    # The same call on lines unlike the mix's: every test fixture's records (real vLLM captures and
    # the per-version upstream fixtures: start-up, failures, tracebacks), cycled to `n`.
    from pathlib import Path

    from bridge.decode.stream import RecordStream
    from bridge.tail import read_lines
    fixture_records = []
    for path in sorted(Path(root, "tests", "fixtures").glob("*/*.log")):
        stream = RecordStream(Decoder(year=2025))
        fixture_records += [(r.message, r.level, r.origin) for r in stream.over(read_lines(str(path)))]
    cycled = (fixture_records * (n // max(len(fixture_records), 1) + 1))[:n]
    parse = Parser().parse
    t0 = time.process_time()
    for m, level, origin in cycled:
        parse(m, level, origin)
    fixture_s = time.process_time() - t0
    # what the lines were, by what the parser made of them
    events = [Parser()(m, level, origin) for m, level, origin in records]
    request = sum(1 for e in events if e is not None and getattr(e, "request_id", None) is not None
                  or type(e).__name__ == "RequestDetails")
    return {"parse_lps": len(records) / parse_s, "decode_parse_lps": len(raw) / both_s,
            "fixture_lps": len(cycled) / fixture_s, "fixture_records": len(fixture_records),
            "recognised_share": stats.recognised / max(stats.lines, 1),
            "request_share": request / max(len(events), 1),
            "notice_share": sum(isinstance(e, Notice) for e in events) / max(len(events), 1)}


def _scheduling_lines(n: int, per_second: int) -> list[bytes]:
    out = []
    for i in range(n):
        s = 1_000 + i // per_second
        stamp = f"02-15 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
        out.append(f"INFO {stamp} scheduler.py:234] Scheduling request 0x7f{i:010x}: priority=0, "
                   f"num_scheduled_blocks=4, remaining_blocks=2\n".encode())
    return out


def worker_inflight(root: str, n: int) -> dict:
    import gc
    import tracemalloc

    from bridge.assemble import AssembleConfig, Assembler
    from bridge.decode import Decoder
    from bridge.tail.source import source_for
    from bridge.parse import Parser

    lines = _scheduling_lines(n, per_second=2_000)
    decoder, parser = Decoder(year=2025), Parser()
    emitted = []
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    asm = Assembler(source_for("/var/log/vllm.log"), emitted.append, AssembleConfig(ttl_s=10**9))
    offset = 0
    for raw in lines:
        rec = decoder(raw, offset)
        offset += len(raw)
        asm.feed(rec, parser(rec.message))
    del rec
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert asm.open_requests == n and not emitted
    return {"bytes_per_request": (after - before) / n}


def worker_flood(root: str, n: int, ttl: float, per_second: int) -> dict:
    import gc
    import tracemalloc

    from bridge.assemble import AssembleConfig, Assembler
    from bridge.decode import Decoder
    from bridge.tail.source import source_for
    from bridge.parse import Parser

    lines = _scheduling_lines(n, per_second=per_second)
    decoder, parser = Decoder(year=2025), Parser()
    emitted = [0]

    def count(_t) -> None:
        emitted[0] += 1

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    asm = Assembler(source_for("/var/log/vllm.log"), count, AssembleConfig(ttl_s=ttl))
    max_open = 0
    offset = 0
    half_peak = 0
    for i, raw in enumerate(lines):
        rec = decoder(raw, offset)
        offset += len(raw)
        asm.feed(rec, parser(rec.message))
        if i % 1000 == 0:
            max_open = max(max_open, asm.open_requests)
        if i == n // 2:
            half_peak = tracemalloc.get_traced_memory()[1] - before
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    return {"max_open": max_open, "evicted": asm.stats.requests_evicted, "peak_mb": peak / 1e6,
            "peak_first_half_mb": half_peak / 1e6, "bound": ttl * per_second}


WORKERS = {"parse": worker_parse, "inflight": worker_inflight, "flood": worker_flood}


def run_worker(root: str, name: str, *args) -> dict:
    code = (f"import sys, json; sys.path[:0] = [{root!r}, {HERE!r}]; import run; "
            f"print(json.dumps(run.WORKERS[{name!r}]({root!r}, *{list(args)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the end-to-end replay ------------------------------------------------------------------

def replay_once(root: str, path: str, endpoint: str, lines: int) -> dict:
    import time

    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "replay", path, "--otlp-endpoint", endpoint],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read().decode()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"replay failed ({proc.returncode}):\n{out}")
    spans = int(out.split("export       ")[1].split(" spans")[0])
    cpu = ru.ru_utime + ru.ru_stime
    return {"cpu_s": cpu, "us_per_line": cpu / lines * 1e6, "lines_per_s": lines / cpu, "spans_per_s": spans / cpu,
            "spans": spans, "wall_s": wall, "rss_mb": ru.ru_maxrss / 1024}


# -- the table ------------------------------------------------------------------------------

def _row(name: str, values: list[float], fmt: str, note: str = "") -> str:
    med = statistics.median(values)
    spread = f"{format(min(values), fmt)}–{format(max(values), fmt)}" if len(values) > 1 else ""
    return f"| {name} | {format(med, fmt)} | {spread} | {note} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000, help="lines in the replay log (default 1M)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement (default 3)")
    ap.add_argument("--quick", action="store_true", help="100k-line replay, smaller parse and flood runs")
    ap.add_argument("--root", default=ROOT, help="checkout of the bridge to measure (default: this one)")
    ap.add_argument("--only", choices=["replay", "parse", "memory"], action="append",
                    help="run only these measurements (repeatable)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    lines = 100_000 if args.quick else args.lines
    only = set(args.only or ["replay", "parse", "memory"])
    rows = []

    if "replay" in only:
        sys.path.insert(0, HERE)
        from replay_cpu import ensure_log

        path, n = ensure_log(lines, cri=False)
        rx = subprocess.Popen([sys.executable, os.path.join(HERE, "receiver.py")], stdout=subprocess.PIPE, text=True)
        try:
            endpoint = f"http://127.0.0.1:{rx.stdout.readline().strip()}"
            runs = [replay_once(root, path, endpoint, n) for _ in range(args.runs)]
        finally:
            rx.terminate()
            received = rx.communicate(timeout=120)[0].strip()
        note = f"{n:,} lines, {runs[0]['spans']:,} spans per run; receiver, all runs: {received}"
        rows += [
            _row("replay CPU-µs per line (whole process)", [r["us_per_line"] for r in runs], ".2f", note),
            _row("replay lines per CPU-second", [r["lines_per_s"] for r in runs], ",.0f"),
            _row("replay spans per CPU-second", [r["spans_per_s"] for r in runs], ",.0f"),
            _row("replay wall seconds", [r["wall_s"] for r in runs], ".1f", "2 shared cores: wall is noisy"),
            _row("replay peak RSS MB", [r["rss_mb"] for r in runs], ".1f"),
        ]

    if "parse" in only:
        n = 200_000 if args.quick else 1_000_000
        res = [run_worker(root, "parse", n) for _ in range(args.runs)]
        note = (f"{n:,} upstream-like lines (bench/mix.py): {res[0]['request_share']:.0%} request lines, "
                f"{res[0]['notice_share']:.0%} chatter, {res[0]['recognised_share']:.0%} recognised")
        rows += [
            _row("parse only, lines per CPU-second", [r["parse_lps"] for r in res], ",.0f", note),
            _row("decode+parse, lines per CPU-second", [r["decode_parse_lps"] for r in res], ",.0f",
                 "raw lines: header, timestamp, message, prefilter"),
            _row("parse only, fixture records, per CPU-second", [r["fixture_lps"] for r in res], ",.0f",
                 f"the {res[0]['fixture_records']} records of tests/fixtures (real vLLM captures, per-version "
                 f"fixtures: start-up, failures, tracebacks) cycled to {n:,}"),
        ]

    if "memory" in only:
        res = [run_worker(root, "inflight", 100_000) for _ in range(args.runs)]
        rows.append(_row("Python heap bytes per in-flight request", [r["bytes_per_request"] for r in res], ",.0f",
                         "tracemalloc, 100,000 open requests (Scheduling lines)"))
        n, ttl, rate = (200_000, 20.0, 1_000) if args.quick else (1_000_000, 60.0, 2_000)
        fl = [run_worker(root, "flood", n, ttl, rate) for _ in range(max(1, args.runs // 2))]
        rows.append(_row("flood: most requests open at once", [r["max_open"] for r in fl], ",.0f",
                         f"{n:,} never-finishing requests at {rate:,}/s, TTL {ttl:.0f} s "
                         f"(bound ≈ {ttl * rate:,.0f}); {fl[0]['evicted']:,} evicted"))
        rows.append(_row("flood: peak traced MB", [r["peak_mb"] for r in fl], ".1f",
                         f"after half the flood: {fl[0]['peak_first_half_mb']:.1f} MB (flat: bounded)"))

    rows += ["| latency p50 / p99 | n/a | | agent mode, see issue 4 |",
             "| idle CPU | n/a | | agent mode, see issue 4 |"]
    print(f"\nbridge at {root}, {args.runs} run(s) each, Python {sys.version.split()[0]}\n")
    print("| measurement | median | min–max | notes |")
    print("|---|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
