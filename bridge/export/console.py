"""The embedded default: each request as a waterfall in the terminal, no collector needed.

Drawn after the run (the summary comes first), in screens of `SCREEN` requests that share one
time axis, so bars compare across requests. Durations vLLM reported (total_latency, ttft) are
shown as reported; one measured between two lines' stamps is marked `≈`; one whose end no line
states is shown as the range it lies in (`a…b`), never as a number. The footer says why, once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from bridge.assemble.timeline import INFERRED, EngineTimeline, Phase, RequestTimeline, Timeline
from bridge.export.duration import BOUNDED_E2E, REPORTED_E2E, STAMPED_E2E, e2e

_BAR = {"preprocess": "-", "queued": "░", "prefill": "▓", "preempted": "▒", "decode": "█", "freed": "·"}
LEGEND = ("legend: - preprocess  ░ queued  ▓ prefill  ▒ preempted  █ decode  · freed  "
          "¦…¦ ~≤ a boundary inferred: the phase lies within that range  ≈ e2e between two lines' stamps  "
          "≤b a…b e2e whose end no line states")
SCREEN = 8  # requests per shared time axis: one terminal screen


def _secs(ns: int) -> str:
    s = ns / 1e9
    return f"{s * 1000:.1f}ms" if s < 1 else f"{s:.3f}s"


def _e2e_text(how: str, low: int, high: int) -> str:
    if how == REPORTED_E2E:
        return _secs(low)
    if how == STAMPED_E2E:
        return "≈" + _secs(low)
    if high < 0:
        return f"≥{_secs(low)}"
    return f"≤{_secs(high)}" if low <= 0 else f"{_secs(low)}…{_secs(high)}"


def _extent(i: int, phases: list[Phase]) -> tuple[int, int]:
    """Where the lines place phase `i`. One rule for every inferred boundary: a boundary it
    shares with the phase next to it (in lifecycle order) can lie anywhere between their far
    ends (their sum is known, the split is not), so both are drawn over that whole range. A
    phase with no inferred boundary is drawn where it is."""
    p = phases[i]
    start, end = p.start_ns, p.end_ns
    before = phases[i - 1] if i > 0 else None
    after = phases[i + 1] if i + 1 < len(phases) else None
    if before is not None and before.end_ns == start and INFERRED in (before.end_timing, p.start_timing):
        start = before.start_ns
    if after is not None and after.start_ns == end and INFERRED in (after.start_timing, p.end_timing):
        end = after.end_ns
    return start, end


class Selection:
    """Which requests `replay` draws: by id (`--request`), failed ones (`--errors`), the N
    slowest (`--slowest`). A sink in front of the waterfall; it hands on what it keeps when
    the run is over (`drain`), since the slowest are known only then. The slowest are ranked on
    measured durations: a request whose end no line states has only a range, and is not ranked."""

    def __init__(self, ids: Sequence[str] = (), errors: bool = False, slowest: int = 0) -> None:
        self._ids = frozenset(ids)
        self._errors = errors
        self._slowest = slowest
        self._kept: list[Timeline] = []
        self._ranked: list[tuple[int, int, RequestTimeline]] = []  # (e2e ns, arrival order, t): a heap
        self.unranked = 0  # requests left out of --slowest: no measured e2e

    def __call__(self, t: Timeline) -> None:
        if self._ids and not (isinstance(t, RequestTimeline) and self._ids & _names(t)):
            return
        if self._errors and not (isinstance(t, EngineTimeline) or t.error_type):
            return
        if not self._slowest:
            self._kept.append(t)
        elif isinstance(t, RequestTimeline):
            how, low, _high = e2e(t)
            if how == BOUNDED_E2E:
                self.unranked += 1
                return
            item = (low, -len(self._ranked) - self.unranked, t)
            if len(self._ranked) < self._slowest:
                heapq.heappush(self._ranked, item)
            else:
                heapq.heappushpop(self._ranked, item)

    def drain(self, sink: Callable[[Timeline], None]) -> None:
        kept = self._kept or [t for _ns, _o, t in sorted(self._ranked, key=lambda x: (-x[0], -x[1]))]
        for t in kept:
            sink(t)


def _names(t: RequestTimeline) -> set[str]:
    """Every id a user may search a request by: the bridge's, the one the client received."""
    return {t.request_id, str(t.attrs.get("gen_ai.response.id", "")), str(t.attrs.get("vllm.request.id", ""))}


class Waterfall:
    """Keeps up to `limit` timelines (requests and engine incidents) and counts the rest;
    `render()` draws them."""

    def __init__(self, width: int = 48, limit: int | None = 10):
        self._width = width
        self._limit = limit
        self._kept: list[Timeline] = []
        self.skipped = 0

    @property
    def drawn(self) -> int:
        return len(self._kept)

    def __call__(self, t: Timeline) -> None:
        if self._limit is not None and len(self._kept) >= self._limit:
            self.skipped += 1
            return
        self._kept.append(t)

    def render(self) -> str:
        out = [LEGEND]
        seen: set[str] = set()  # which footnotes the drawn requests need
        requests: list[RequestTimeline] = []

        def flush() -> None:
            if requests:
                text, marks = self._screen(requests)
                out.append(text)
                seen.update(marks)
                requests.clear()

        for t in self._kept:
            if isinstance(t, EngineTimeline):
                flush()
                out.append(self._engine(t))
            else:
                requests.append(t)
                if len(requests) == SCREEN:
                    flush()
        flush()
        if STAMPED_E2E in seen:
            out.append("≈ vLLM reported no duration for these requests (no total_latency line, no plugin): "
                       "e2e is measured between their first and last lines' stamps, as exact as those stamps")
        if BOUNDED_E2E in seen:
            out.append("≤b, a…b: no line states when these requests ended (vLLM V1 logs no end for a "
                       "completion; the plugin does): each ended after its last line (a, when a line after "
                       "its start names it) and by the first line that showed it gone (b). They are left "
                       "out of the summary's e2e percentiles")
        if INFERRED in seen:
            out.append("¦ a boundary no line states: the phase lies somewhere in the range drawn")
        if self.skipped:
            out.append(f"(+{self.skipped} more not drawn; --waterfalls N draws more)")
        return "\n".join(out) + "\n"

    def _screen(self, requests: list[RequestTimeline]) -> tuple[str, set[str]]:
        """One screen of requests on one time axis: each bar starts at its request's start."""
        span = max(1, max(max(t.end_ns - t.start_ns, *e2e(t)[1:]) for t in requests))
        w = self._width
        axis = f"  {'':13}0{'':{w - 1 - len(_secs(span))}}{_secs(span)}"
        lines = [axis, f"  {'':13}|{'-' * w}|"]
        marks: set[str] = set()
        for t in requests:
            text, m = self._request(t, span)
            lines.append(text)
            marks |= m
        return "\n".join(lines), marks

    def _request(self, t: RequestTimeline, span: int) -> tuple[str, set[str]]:
        a = t.attrs
        how, low, high = e2e(t)
        marks = {how}
        head = [t.request_id, t.outcome.upper() if t.error_type else t.outcome, f"e2e {_e2e_text(how, low, high)}"]
        if "vllm.ttft_s" in a:
            head.append(f"ttft {a['vllm.ttft_s'] * 1000:.1f}ms")
        if a.get("vllm.preemptions"):
            head.append(f"preempted×{a['vllm.preemptions']}")
        if a.get("vllm.diagnosis"):
            head.append("[" + ", ".join(a["vllm.diagnosis"]) + "]")
        lines = ["  ".join(head)]
        w = self._width
        for i, p in enumerate(t.phases):
            start, end = _extent(i, t.phases)
            lo = min(int((start - t.start_ns) * w / span), w - 1)
            hi = min(max(lo + 1, int(round((end - t.start_ns) * w / span))), w)
            cells = [" "] * w
            for i in range(lo, hi):
                cells[i] = _BAR.get(p.name, "#")
            inferred = (start, end) != (p.start_ns, p.end_ns) or INFERRED in (p.start_timing, p.end_timing)
            if inferred:  # the phase lies somewhere in this range: its ends are drawn ¦
                cells[lo] = cells[hi - 1] = "¦"
            if inferred:
                marks.add(INFERRED)
            label = p.name if p.name != "preempted" else f"preempted#{p.index}"
            shown = f"≤{_secs(end - start)}" if inferred else _secs(p.end_ns - p.start_ns)
            lines.append(f"  {label:13}|{''.join(cells)}|{'~' if inferred else ' '}{shown:>9}")
        if t.error_type:
            lines.append(f"  ✗ {t.error_type}: {t.error_message}")
        for e in t.events:
            if e.name == "vllm.engine.incident":
                # The event carries the incident's kind and type only (its text is on the
                # incident's own span, which the waterfall draws separately).
                lines.append(f"  ! engine incident in flight: {e.attrs.get('vllm.incident.kind')}, "
                             f"error.type {e.attrs.get('error.type')}")
        return "\n".join(lines), marks

    @staticmethod
    def _engine(t: EngineTimeline) -> str:
        if t.kind == "startup":
            a = t.attrs
            what = ", ".join(f"{k.rsplit('.', 1)[-1]} {a[k]}" for k in (
                "gen_ai.request.model", "vllm.version", "vllm.startup.kv_cache_tokens",
                "vllm.startup.gpu_blocks", "vllm.startup.max_concurrency") if k in a)
            tail = f"\n  ✗ {t.error_type}: {t.message}" if t.error_type else ""
            return f"STARTUP  {_secs(t.end_ns - t.start_ns)}  {what}{tail}"
        return (f"ENGINE {t.kind}  {_secs(t.end_ns - t.start_ns)}  affected {len(t.affected)} requests\n"
                f"  ✗ {t.error_type}: {t.message}")
