"""A run's numbers at a glance: outcomes, latency percentiles, preemptions, errors, diagnoses."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bridge.assemble.timeline import EngineTimeline, RequestTimeline, Timeline
from bridge.export.duration import BOUNDED_E2E, REPORTED_E2E, e2e


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats
    return ordered[int(rank) - 1]


@dataclass(slots=True)
class Summary:
    outcomes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    diagnoses: Counter = field(default_factory=Counter)
    incidents: Counter = field(default_factory=Counter)
    queue_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    e2e_stamped: int = 0    # finished, e2e between two lines' stamps (vLLM reported none)
    e2e_bounded: int = 0    # finished, but no line states the end (or the start): left out of e2e
    preemptions: int = 0
    preempted_requests: int = 0
    startups: Counter = field(default_factory=Counter)  # model (or "?") → engine startups seen

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    def __call__(self, t: Timeline) -> None:
        if isinstance(t, EngineTimeline):
            if t.kind == "startup":
                self.startups[str(t.attrs.get("gen_ai.request.model", "?"))] += 1
            else:
                self.incidents[t.kind] += 1
            return
        self._request(t)

    def _request(self, t: RequestTimeline) -> None:
        a = t.attrs
        self.outcomes[t.outcome] += 1
        if t.error_type:
            self.errors[t.error_type] += 1
        for d in a.get("vllm.diagnosis", ()):
            self.diagnoses[d] += 1
        for key, values in (("vllm.queue_s", self.queue_s), ("vllm.ttft_s", self.ttft_s)):
            if key in a:
                values.append(a[key])
        how, low, _high = e2e(t)
        if how == REPORTED_E2E:
            self.e2e_s.append(low / 1e9)
        elif t.outcome == "finished":  # a failure's time to fail is no latency of the service
            if how == BOUNDED_E2E:
                self.e2e_bounded += 1
            else:
                self.e2e_s.append(low / 1e9)
                self.e2e_stamped += 1
        n = a.get("vllm.preemptions", 0)
        self.preemptions += n
        self.preempted_requests += bool(n)

    def render(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.1f} ms"

        def counts(c: Counter) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"

        lines = [
            f"requests     {self.requests} ({counts(self.outcomes)})",
            f"{'':13}{'p50':>12}{'p95':>12}{'n':>8}",
        ]
        for name, values in (("queue", self.queue_s), ("ttft", self.ttft_s), ("e2e", self.e2e_s)):
            lines.append(f"{name:13}{ms(percentile(values, 50)):>12}{ms(percentile(values, 95)):>12}{len(values):>8}")
        lines += [
            f"preemptions  {self.preemptions} in {self.preempted_requests} requests",
            f"errors       {counts(self.errors)}",
            f"diagnosis    {counts(self.diagnoses)}",
            f"engine       {counts(self.incidents)}",
        ]
        if self.startups:
            lines.append(f"startups     {counts(self.startups)}")
        # Why e2e counts what it counts, said once rather than left to guess.
        if self.e2e_stamped:
            lines.append(f"note         e2e: {self.e2e_stamped} finished requests had no duration reported by vLLM "
                         "(no total_latency line, no plugin): measured between their first and last lines' stamps")
        if self.e2e_bounded:
            lines.append(f"note         e2e: {self.e2e_bounded} finished requests are left out: no line states when "
                         "they ended (vLLM V1 logs no end for a completion; the plugin does), only a range")
        unfinished = self.requests - sum(self.outcomes[o] for o in ("finished",))
        if unfinished:
            lines.append(f"note         e2e: {unfinished} requests that did not finish (failed, timed out, aborted, "
                         "incomplete) are left out")
        return "\n".join(lines)
