"""What the plugin's `, internal_id=<engine id>` costs the parse stage: the real plugin_debug
recording parsed as it is, and with the field added after `t=` on its Scheduling, Preempting and
`Freed <n> blocks` lines, as the plugin writes them since it states vLLM's engine id.

    python bench/plugin_ids.py [--runs 9]

CPU per line (`time.process_time`, the least of the runs: noise only adds), C paths as loaded
(`VLLM_TRACE_BRIDGE_PURE=1` for the Python reference). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from bridge.decode import Decoder
from bridge.parse import Parser

LOG = Path(__file__).resolve().parent.parent / "tests/fixtures/scenarios/plugin_debug/server.log"
_ENGINE_LINE = re.compile(r"(?:Scheduling request|Freed \d+ blocks for request|Preempting request) (\S+?)[:,].*?t=[\d.]+")


def _with_ids(raw: bytes) -> bytes:
    text = raw.decode("utf-8", "replace")
    m = _ENGINE_LINE.search(text)
    if m is None or "internal_id" in text:
        return raw
    return (text[:m.end()] + f", internal_id={m[1]}-0a1b2c3d" + text[m.end():]).encode()


def _per_line_us(lines: list[bytes], runs: int) -> float:
    dec, offset, records = Decoder(), 0, []
    for raw in lines:
        rec = dec(raw, offset)
        offset += len(raw)
        if rec is not None:
            records.append(rec)
    parser, best = Parser(), float("inf")
    for _ in range(runs):
        t = time.process_time()
        for _ in range(5):
            for rec in records:
                parser.parse(rec.message, rec.level, rec.origin)
        best = min(best, time.process_time() - t)
    return best / 5 / len(records) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=9)
    runs = ap.parse_args().runs
    lines = LOG.read_bytes().splitlines(keepends=True)
    with_ids = [_with_ids(raw) for raw in lines]
    stated = sum(b"internal_id=" in raw for raw in with_ids)
    print(f"{LOG.name}: {len(lines)} lines, {stated} stating internal_id=")
    print(f"parse without the field  {_per_line_us(lines, runs):.3f} CPU-µs/line")
    print(f"parse with the field     {_per_line_us(with_ids, runs):.3f} CPU-µs/line")


if __name__ == "__main__":
    main()
