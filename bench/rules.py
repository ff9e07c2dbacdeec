"""CPU per line of the parse stage with user rules (`--rules`, docs/rules.md), one command:

    python bench/rules.py [--lines 200000] [--runs 3]

Three logs, each parsed by `Parser().parse` (the pipeline's per-line call) without rules and
with a file of 10 rules:

- `upstream mix`: bench/mix.py's upstream-vLLM-like log (84 % chatter, noise and access lines,
  which the grammar knows as carrying nothing: rules see those), no line any rule matches;
- `foreign 10 %`: the same with one line in ten replaced by a foreign line that one of the 10
  rules takes (router access lines, vendor preemption and gauge lines);
- `seed`: the generator's seed-dialect log, every line a lifecycle line the grammar takes
  (rules never see them: the cost is the wrapper's call).

Prints CPU-µs per line (median of runs, process time). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

RULES = r"""
- {name: router, fact: event, event: router.forwarded, match: '^edge-router (?P<ts>\S+) req=(?P<rid>\S+) backend=(?P<b>\S+) upstream_ms=(?P<ms>\d+) status=(?P<st>\d+)$', request_id: rid, request_id_format: 'chatcmpl-{}', time: ts, attributes: {router.backend: b, router.upstream_ms: {group: ms, type: int}}, span_attributes: {http.response.status_code: {group: st, type: int}}}
- {name: npu-evict, fact: preempted, match: '^\[NPU\] evicting seq (?P<rid>0x[0-9a-f]+) \(reason: (?P<reason>\w+), released (?P<blocks>\d+) blocks\)', request_id: rid}
- {name: npu-hbm, fact: memory, match: '^\[NPU\] HBM (?P<used_bytes>\S+)/(?P<total_bytes>\S+) in use'}
- {name: npu-queue, fact: queue, match: '^\[NPU\] queue run=(?P<running>\d+) wait=(?P<waiting>\d+)'}
- {name: npu-sched, fact: scheduled, match: '^\[NPU\] admit seq (?P<rid>0x[0-9a-f]+) blocks=(?P<blocks>\d+)', request_id: rid}
- {name: npu-first, fact: first_token, match: '^\[NPU\] seq (?P<rid>0x[0-9a-f]+) first token', request_id: rid}
- {name: npu-done, fact: finished, match: '^\[NPU\] seq (?P<rid>0x[0-9a-f]+) done reason=(?P<reason>\w+)', request_id: rid}
- {name: npu-abort, fact: aborted, match: '^\[NPU\] seq (?P<rid>0x[0-9a-f]+) cancelled', request_id: rid}
- {name: npu-fail, fact: error, match: '^\[NPU\] seq (?P<rid>0x[0-9a-f]+) failed: (?P<type>\w+)', request_id: rid}
- {name: npu-driver, fact: startup, match: '^\[NPU\] driver (?P<d>\S+) ready', attributes: {vendor.driver: d}}
"""

FOREIGN = [
    "edge-router 2025-01-15T08:01:02.250Z req=r{n} backend=vllm-0 upstream_ms={n} status=200",
    "[NPU] evicting seq 0x7f{n:06x} (reason: hbm_pressure, released 6 blocks)",
    "[NPU] HBM 12GB/64GB in use",
    "[NPU] queue run=3 wait={n}",
    "[NPU] admit seq 0x7f{n:06x} blocks=4",
    "[NPU] seq 0x7f{n:06x} first token",
    "[NPU] seq 0x7f{n:06x} done reason=stop",
]


def _records(lines: list[str]) -> list[tuple[str, str, str]]:
    from bridge.decode import Decoder

    decoder, out, offset = Decoder(year=2025), [], 0
    for line in lines:
        raw = (line + "\n").encode()
        rec = decoder(raw, offset)
        offset += len(raw)
        if rec is not None:
            out.append((rec.message, rec.level, rec.origin))
    return out


def _logs(n: int) -> dict[str, list]:
    from mix import upstream_like_lines

    from bridge.synth import SynthConfig, generate

    base = upstream_like_lines(n)
    rnd = random.Random(7)
    foreign = list(base)
    for i in range(0, n, 10):
        foreign[i] = rnd.choice(FOREIGN).format(n=i)
    lines, _ = generate(SynthConfig(requests=max(10, n // 9), seed=3, noise_ratio=0.0))
    seed = [(message, level, origin) for _ts, _seq, level, origin, message in lines[:n]]
    return {"upstream mix": _records(base), "foreign 10 %": _records(foreign), "seed": seed}


def _cpu_per_line(records, rules) -> float:
    from bridge.parse import Parser

    parse = Parser(rules=rules).parse
    t0 = time.process_time()
    for m, level, origin in records:
        parse(m, level, origin)
    return (time.process_time() - t0) / max(1, len(records)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import yaml

    from bridge.parse import FAST_PARSE
    from bridge.parse.rules import parse_rules

    rules = parse_rules(yaml.safe_load(RULES))
    assert len(rules.rules) == 10
    logs = _logs(args.lines)
    print(f"parse path: {'C' if FAST_PARSE is not None else 'pure Python'}; {args.runs} runs, median CPU-µs per line")
    print("| log | lines | no rules | 10 rules | lines taken by rules |")
    print("|---|---:|---:|---:|---:|")
    from bridge.parse import Parser
    for name, records in logs.items():
        if not records:
            continue
        plain = statistics.median(_cpu_per_line(records, None) for _ in range(args.runs))
        ruled = statistics.median(_cpu_per_line(records, rules) for _ in range(args.runs))
        p = Parser(rules=rules)
        for m, level, origin in records:
            p.parse(m, level, origin)
        taken = sum(p.stats.by_rule.values())
        print(f"| {name} | {len(records):,} | {plain:.2f} | {ruled:.2f} | {taken:,} |")


if __name__ == "__main__":
    main()
