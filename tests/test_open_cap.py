"""Replay's open requests are capped as the agent's are (issue 37, point 2): a log of requests that
start and never end no longer holds them all until its end. The truth is the generated log's:
which requests it started (each once) and that none of them ends."""

from __future__ import annotations

import io
import re
from collections import Counter

from bridge.assemble.timeline import RequestTimeline
from bridge.config import AgentConfig
from bridge.pipeline import ReplayConfig, replay
from waits import deadline


def _never_ending(path, n: int) -> list[str]:
    """`n` requests scheduled, 1,000 a second of log time, none with another line."""
    ids = [f"0x7f{i:010x}" for i in range(n)]
    with open(path, "w") as f:
        for i, rid in enumerate(ids):
            s = 1_000 + i // 1_000
            f.write(f"INFO 02-15 {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d} scheduler.py:234] Scheduling request "
                    f"{rid}: priority=0, num_scheduled_blocks=4, remaining_blocks=2\n")
    return ids


def test_replay_keeps_at_most_the_limit_open_and_counts_what_it_closed(tmp_path, monkeypatch):
    import bridge.pipeline as pipeline

    path = tmp_path / "open.log"
    ids = _never_ending(path, 20_000)
    keep = 500
    most = [0]
    real = pipeline.Assembler

    class Watched(real):  # how many are open after each line (the Python feed: the C one is bypassed)
        def feed(self, record, event):
            super().feed(record, event)
            most[0] = max(most[0], self.open_requests)

    monkeypatch.setattr(pipeline, "Assembler", Watched)
    out: list = []
    stats = replay([str(path)], [out.append], ReplayConfig(max_open_requests=keep))
    roots = [t for t in out if isinstance(t, RequestTimeline)]
    # every request the log started, once, none ended by a line
    assert Counter(t.request_id for t in roots) == Counter(ids)
    assert {t.outcome for t in roots} == {"incomplete"}
    # the limit: what it closed is counted, and no more than a look's worth over it was ever open
    assert stats.assemble.requests_capped == len(ids) - keep
    assert stats.assemble.requests_evicted == len(ids) - keep  # unended: evicted too, as in the agent
    assert keep < most[0] <= keep + pipeline._CAP_EVERY


def test_under_the_limit_nothing_is_closed_early(tmp_path):
    path = tmp_path / "open.log"
    ids = _never_ending(path, 3_000)
    out: list = []
    stats = replay([str(path)], [out.append], ReplayConfig(max_open_requests=3_000))
    assert stats.assemble.requests_capped == 0
    assert len([t for t in out if isinstance(t, RequestTimeline)]) == len(ids)


def test_replay_says_what_the_limit_closed(tmp_path):
    from bridge.cli import main

    path = tmp_path / "open.log"
    ids = _never_ending(path, 5_000)
    buf = io.StringIO()
    assert main(["replay", str(path), "--waterfalls", "0", "--max-open-requests", "1000"], env={}, out=buf) == 0
    text = buf.getvalue()
    assert re.search(rf"^open limit\s+{len(ids) - 1000} requests closed early: more than 1000 were open at once",
                     text, re.M), text
    assert re.search(rf"^requests\s+{len(ids)} \(incomplete {len(ids)}\)", text, re.M), text


def test_replay_refuses_a_limit_below_one(tmp_path):
    from bridge.cli import main

    path = tmp_path / "open.log"
    _never_ending(path, 10)
    buf = io.StringIO()
    assert main(["replay", str(path), "--max-open-requests", "0"], env={}, out=buf) == 2


def test_replay_has_the_agents_limit_by_default():
    assert ReplayConfig().max_open_requests == AgentConfig().max_open_requests


def test_the_agent_counts_what_its_limit_closed_and_replay_counts_the_same(tmp_path):
    """The agent's /metrics and replay's summary count the same requests for the same log."""
    from agentkit import AgentProc, pod_log, wait_for
    from receivers import GrpcReceiver

    log = pod_log(tmp_path)
    ids = _never_ending(log, 3_000)
    stats = replay([log], [lambda t: None], ReplayConfig(max_open_requests=200))
    with GrpcReceiver() as rx:
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), str(tmp_path / "state"), rx.endpoint,
                          "--max-open-requests", "200").start()
        try:
            assert wait_for(lambda: agent.metric("lines_read") == len(ids), deadline(60))
            # (read together: a scrape during a read sees its lines counted before they are handled)
            assert wait_for(lambda: (agent.metric("requests_open"), agent.metric("requests_capped"))
                            == (200, len(ids) - 200), deadline(30)), (agent.metric("requests_open"), agent.metric("requests_capped"))
        finally:
            assert agent.term()[0] == 0
    assert stats.assemble.requests_capped == len(ids) - 200
