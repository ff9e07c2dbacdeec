"""What the agent shows of itself: the /readyz answer and the /metrics figures.

Its own module so that the Agent supervises files, feeds the pipeline and hands timelines to
delivery, while everything an operator reads about it is gathered in one place, from the
agent's parts, read-only. `bridge.telemetry` serves what this returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bridge.assemble.join import ContextJoin
from bridge.delivery import Delivery
from bridge.detect import Detector
from bridge.parse import Parser
from bridge.parse.gateway import GatewayParser
from bridge.resume import Checkpointer
from bridge.sources import SourceState
from bridge.tail.follow import Follower


@dataclass(slots=True)
class AgentCounters:
    """The agent's own counts, kept by the agent and read here."""

    lines_read: int = 0
    skipped_delivered: int = 0  # lines of requests delivered before a restart, not fed again
    memory_pauses: int = 0
    line_errors: dict[str, int] = field(default_factory=dict)  # stage → lines skipped because it raised


class Health:
    def __init__(self, counters: AgentCounters, parser: Parser, sources: dict[str, SourceState],
                 follower: Follower, delivery: Delivery, checkpointer: Checkpointer, endpoint: str,
                 join: ContextJoin | None, gateway_parser: GatewayParser, detector: Detector | None = None) -> None:
        self.ready = False  # set by the agent once its first look for files is done
        self.turned_at: float | None = None  # time.monotonic() of the main loop's last turn
        self.stall_timeout = float("inf")
        self._counters, self._parser, self._sources = counters, parser, sources
        self._follower, self._delivery, self._checkpointer = follower, delivery, checkpointer
        self._endpoint, self._join, self._gateway_parser = endpoint, join, gateway_parser
        self._detector = detector

    def liveness(self) -> bool | str:
        """/healthz: True, or how long the main loop has been stuck (a hung read, a deadlock):
        then the kubelet restarts the agent, which resumes from its checkpoint."""
        turned = self.turned_at
        if turned is None:
            return True  # starting: /readyz says so
        stuck = time.monotonic() - turned
        if stuck > self.stall_timeout:
            return f"main loop stuck: it has not turned for {stuck:.0f} s (stall_timeout {self.stall_timeout:g} s)"
        return True

    def readiness(self) -> bool | str:
        """/readyz: True, or why the agent is not ready: starting, or its checkpoint cannot be
        saved (a fault of this node, which a new pod would share). A collector outage is not
        one: every agent of a DaemonSet would turn unready at once and a rollout would stall on
        the backend, while the agent itself is fine (it queues, pauses reading, retries and
        catches up). The outage is named in `degraded`, /readyz's body and /metrics instead."""
        if not self.ready:
            return "starting"
        if self._checkpointer.failing:
            return f"checkpoint not saved: {self._checkpointer.store.path} (retrying each second)"
        return True

    def degraded(self) -> str | None:
        """What /readyz names while still ready: the export failing (retrying)."""
        if self._delivery.failing:
            return f"export failing: {self._endpoint} does not accept spans (retrying)"
        return None

    def progress_counts(self) -> dict[str, int]:
        """The few figures of the `export_progress` and `agent_stopped` log lines."""
        s = self._delivery.stats
        emitted = open_ = 0
        for st in list(self._sources.values()):
            if st.assembler is not None:
                emitted += st.assembler.stats.requests_emitted
                open_ += st.assembler.open_requests
        return {"spans_sent": s.spans_sent, "spans_retried": s.spans_retried, "spans_dropped": s.spans_dropped,
                "queued_spans": s.queued_spans, "requests_finished": emitted, "requests_open": open_,
                "files_followed": len(self._follower.files)}

    def snapshot(self) -> dict:
        """Every /metrics figure (bridge.telemetry names and types them)."""
        decode = {"lines": 0, "invalid_utf8": 0, "partials_joined": 0, "framing_errors": 0, "times_out_of_range": 0}
        assemble = {"requests_emitted": 0, "requests_evicted": 0, "requests_capped": 0, "engine_incidents": 0,
                    "clock_jumps": 0, "no_action": 0}
        open_requests = listed = 0
        for st in list(self._sources.values()):
            listed += len(st.delivered)
            for stream in list(st.streams.values()):
                for k in decode:
                    decode[k] += getattr(stream.decoder.stats, k)
            if st.assembler is not None:
                open_requests += st.assembler.open_requests
                for k in assemble:
                    assemble[k] += getattr(st.assembler.stats, k)
        c = self._counters
        p = self._parser.snapshot()
        f = self._follower.stats
        s = self._delivery.stats
        written = self._checkpointer.store.written_at
        join = self._join
        return {
            "lines_read": c.lines_read,
            "lines_by_kind": dict(p.by_kind), "lines_unrecognised": p.unrecognised,
            "lines_malformed": sum(p.malformed.values()), "invalid_utf8": decode["invalid_utf8"],
            "lines_oversized": f.lines_oversized, "lines_long": f.lines_long, "partials_joined": decode["partials_joined"],
            "framing_errors": decode["framing_errors"], "times_out_of_range": decode["times_out_of_range"],
            "bytes_cut": f.bytes_cut,
            "requests_open": open_requests, **assemble,
            "spans_sent": s.spans_sent, "spans_retried": s.spans_retried, "spans_dropped": s.spans_dropped,
            "queued_spans": s.queued_spans, "latencies": list(s.latencies),
            "skipped_delivered": c.skipped_delivered,
            "behind": self._follower.behind(), "unread": self._follower.unread(),
            "files_watched": len(self._follower.files),
            "files_open": self._follower.open_count, "files_open_budget": self._follower.max_open,
            "files_parked_total": f.files_parked, "files_reopened": f.files_reopened,
            "files_skipped": self._follower.skipped_by_kind(),
            "files_detected": None if self._detector is None else {
                "vllm": self._detector.stats.vllm, "not_vllm": self._detector.stats.not_vllm,
                "named": self._detector.stats.named},
            "rotations": dict(f.rotations), "file_errors": dict(f.errors),
            "checkpoint_age": (time.time() - written) if written else 0.0,
            "checkpoint_delivered_listed": listed,
            "memory_pauses": c.memory_pauses,
            "line_errors": dict(c.line_errors),
            "checkpoint_failures": self._checkpointer.failures,
            "checkpoint_recoveries": dict(self._checkpointer.store.recoveries),
            "join": None if join is None else {
                "gateway_entries": self._gateway_parser.entries, "gateway_skipped": self._gateway_parser.skipped,
                "joined": join.stats.joined, "expired": join.stats.expired,
                "overflow": join.stats.overflow, "contexts_dropped": join.stats.contexts_dropped,
                "waiting": join.waiting},
        }
