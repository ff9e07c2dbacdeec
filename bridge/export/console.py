"""The embedded default: each request as a waterfall in the terminal, no collector needed."""

from __future__ import annotations

from typing import TextIO

from bridge.assemble.timeline import EngineTimeline, RequestTimeline, Timeline

_BAR = {"preprocess": "-", "queued": "░", "prefill": "▓", "preempted": "▒", "decode": "█", "freed": "·"}


def _secs(ns: int) -> str:
    s = ns / 1e9
    return f"{s * 1000:.1f}ms" if s < 1 else f"{s:.3f}s"


class Waterfall:
    """Draws up to `limit` requests (phases as bars on the request's own time axis) and
    engine incidents; counts the rest so the summary can say what was not drawn."""

    def __init__(self, out: TextIO, width: int = 48, limit: int | None = 100):
        self._out = out
        self._width = width
        self._limit = limit
        self.drawn = 0
        self.skipped = 0

    def __call__(self, t: Timeline) -> None:
        if self._limit is not None and self.drawn >= self._limit:
            self.skipped += 1
            return
        self.drawn += 1
        self._out.write(self._engine(t) if isinstance(t, EngineTimeline) else self._request(t))

    def _request(self, t: RequestTimeline) -> str:
        a = t.attrs
        head = [t.request_id, t.outcome.upper() if t.error_type else t.outcome, f"e2e {_secs(t.end_ns - t.start_ns)}"]
        if "vllm.ttft_s" in a:
            head.append(f"ttft {a['vllm.ttft_s'] * 1000:.1f}ms")
        if a.get("vllm.preemptions"):
            head.append(f"preempted×{a['vllm.preemptions']}")
        if a.get("vllm.diagnosis"):
            head.append("[" + ", ".join(a["vllm.diagnosis"]) + "]")
        lines = ["  ".join(head)]
        span = max(t.end_ns - t.start_ns, 1)
        w = self._width
        for p in t.phases:
            lo = int((p.start_ns - t.start_ns) * w / span)
            hi = max(lo + 1, int(round((p.end_ns - t.start_ns) * w / span)))
            hi = min(hi, w)
            lo = min(lo, w - 1)
            bar = " " * lo + _BAR.get(p.name, "#") * (hi - lo) + " " * (w - hi)
            mark = "~" if "inferred" in (p.start_timing, p.end_timing) else " "
            label = p.name if p.name != "preempted" else f"preempted#{p.index}"
            lines.append(f"  {label:13}|{bar}|{mark}{_secs(p.end_ns - p.start_ns):>9}")
        if t.error_type:
            lines.append(f"  ✗ {t.error_type}: {t.error_message}")
        for e in t.events:
            if e.name == "vllm.engine.incident":
                lines.append(f"  ! engine {e.attrs.get('vllm.incident.kind')}: {e.attrs.get('exception.message')}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _engine(t: EngineTimeline) -> str:
        if t.kind == "startup":
            a = t.attrs
            what = ", ".join(f"{k.rsplit('.', 1)[-1]} {a[k]}" for k in (
                "gen_ai.request.model", "vllm.version", "vllm.startup.kv_cache_tokens",
                "vllm.startup.gpu_blocks", "vllm.startup.max_concurrency") if k in a)
            tail = f"\n  ✗ {t.error_type}: {t.message}" if t.error_type else ""
            return f"STARTUP  {_secs(t.end_ns - t.start_ns)}  {what}{tail}\n"
        return (f"ENGINE {t.kind}  {_secs(t.end_ns - t.start_ns)}  affected {len(t.affected)} requests\n"
                f"  ✗ {t.error_type}: {t.message}\n")
