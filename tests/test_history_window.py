"""A first start reads back a bounded window of history, not the node's whole past (issue 37,
point 5): `history_bytes` (the last bytes of each file, from the first whole line there) and
`history_age` (a file last written before it is started at its end). The truth is what the test
wrote: which lines start inside the window, counted from the lines themselves.
"""

from __future__ import annotations

import os
import time

import pytest

from agentkit import AgentProc, Receiver, free_port, pod_log, wait_for
from receivers import attrs

from bridge.config import ConfigError, load
from bridge.tail.follow import Filters, Follower
from waits import deadline


def _summary(i: int) -> str:
    # Lines of different lengths, so a bound falls inside a line as often as not.
    return (f"2025-02-15T10:23:02.{i:09d}Z stdout F INFO 02-15 10:23:02 scheduler.py:789] "
            f"Request 0x{i:x}: prompt_tokens={i * 7 % 1000}, generated_tokens=2, ttft=1.0ms, itl=1.0ms, "
            f"total_latency=0.5s\n")


def _lines_from(lines: list[str], start: int) -> list[str]:
    """The lines that begin at or after byte `start` of their concatenation."""
    out, at = [], 0
    for line in lines:
        if at >= start:
            out.append(line)
        at += len(line.encode())
    return out


def _read_all(follower: Follower) -> list[bytes]:
    got = []
    for _ in range(50):
        batch = follower.poll()
        if not batch:
            break
        got += [raw for _, lines in batch for _, raw in lines]
    return got


@pytest.mark.parametrize("bound", [1, 57, 1000, 4096, 10_000])
def test_a_first_start_reads_the_lines_that_start_within_the_last_history_bytes(tmp_path, bound):
    lines = [_summary(i) for i in range(200)]
    log = pod_log(tmp_path)
    with open(log, "w") as f:
        f.writelines(lines)
    size = os.path.getsize(log)
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)), history=(bound, 0.0))
    follower.discover(first_round=True)
    got = _read_all(follower)
    want = _lines_from(lines, size - bound)
    assert [g.decode() for g in got] == want
    assert follower.stats.history_skipped == size - sum(len(x.encode()) for x in want)
    assert follower.stats.bytes_cut == 0 and follower.stats.lines_oversized == 0  # not read as a cut line
    # What is written after is read whole: the bound is on the past only.
    with open(log, "a") as f:
        f.write(_summary(999))
    assert _read_all(follower) == [_summary(999).encode()]


def test_files_found_later_and_whole_files_within_the_bound_are_read_from_their_start(tmp_path):
    lines = [_summary(i) for i in range(20)]
    small = pod_log(tmp_path, "vllm-small")
    with open(small, "w") as f:
        f.writelines(lines)
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)), history=(1 << 20, 0.0))
    follower.discover(first_round=True)
    assert [g.decode() for g in _read_all(follower)] == lines
    later = pod_log(tmp_path, "vllm-later")  # a pod that starts after the agent: not history
    with open(later, "w") as f:
        f.writelines(lines * 100)
    follower.discover()
    assert len(_read_all(follower)) == 2000
    assert follower.stats.history_skipped == 0


def test_a_file_last_written_before_history_age_starts_at_its_end(tmp_path):
    old, fresh = pod_log(tmp_path, "vllm-old"), pod_log(tmp_path, "vllm-fresh")
    for path in (old, fresh):
        with open(path, "w") as f:
            f.writelines(_summary(i) for i in range(10))
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    follower = Follower(Filters((str(tmp_path / "pods/*/*/*.log"),)), history=(0, 3600.0))
    follower.discover(first_round=True)
    got = _read_all(follower)
    assert len(got) == 10  # the fresh file, whole (history_bytes 0: no bytes bound)
    assert follower.stats.history_skipped == os.path.getsize(old)
    notes = [c.reason for c in follower.take_changes() if c.path == old]
    assert notes and "history_age" in notes[0]
    with open(old, "a") as f:  # the old pod speaks again: that is read
        f.write(_summary(77))
    assert _read_all(follower) == [_summary(77).encode()]


def _ids(rx: Receiver) -> set[str]:
    return {attrs(s.attributes)["vllm.request.id"] for s in rx.spans() if s.name == "vllm.request"}


def test_the_agent_bounds_its_first_start_only_and_says_so(tmp_path):
    """A first start sends the requests whose lines are in the window; a restart resumes from
    its checkpoint (what was written while it was down is read whole, not bounded again)."""
    lines = [_summary(i) for i in range(300)]
    log = pod_log(tmp_path)
    with open(log, "w") as f:
        f.writelines(lines)
    bound = sum(len(x.encode()) for x in lines[-100:]) + 10  # ten bytes into line 199: it is not read
    want = {f"0x{i:x}" for i in range(200, 300)}
    rx = Receiver(free_port(), str(tmp_path / "rx.bin")).start()
    state = str(tmp_path / "state")
    try:
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), state, rx.endpoint, "--poll-interval", "0.2",
                          "--history-bytes", str(bound)).start()
        assert wait_for(lambda: _ids(rx) >= want, deadline(30)), len(_ids(rx))
        time.sleep(1.0)  # anything older would have come with them
        assert _ids(rx) == want
        following = [e for e in agent.log_events() if e.get("event") == "following"]
        assert following[0]["history_skipped_bytes"] == sum(len(x.encode()) for x in lines[:200])
        followed = [e for e in agent.log_events() if e.get("event") == "file_followed"]
        assert "history_bytes" in followed[0]["note"]
        assert agent.term()[0] == 0
        more = [_summary(i) for i in range(300, 700)]  # written while it is down: more than the bound
        with open(log, "a") as f:
            f.writelines(more)
        agent = AgentProc(str(tmp_path / "pods/*/*/*.log"), state, rx.endpoint, "--poll-interval", "0.2",
                          "--history-bytes", str(bound)).start()
        want |= {f"0x{i:x}" for i in range(300, 700)}
        assert wait_for(lambda: _ids(rx) >= want, deadline(30)), len(want - _ids(rx))
        assert _ids(rx) == want
        assert agent.term()[0] == 0
    finally:
        rx.stop()


@pytest.mark.parametrize("name, value", [("history_bytes", "-1"), ("history_age", "-5"), ("history_age", "nan"),
                                         ("history_age", "inf")])
def test_a_bad_history_bound_fails_at_start_naming_the_field_and_the_fix(name, value):
    with pytest.raises(ConfigError) as e:
        load(None, {"VLLM_TRACE_BRIDGE_" + name.upper(): value}, {})
    text = str(e.value)
    assert text.startswith(f"{name} (from VLLM_TRACE_BRIDGE_{name.upper()})") and "give 0 (no bound) or more" in text
    with pytest.raises(ConfigError) as e:
        load({name: "a lot"}, {}, {})
    assert name in str(e.value) and "expected a number" in str(e.value)


def test_the_default_bounds_a_first_start_by_bytes():
    cfg, _ = load(None, {}, {})
    assert cfg.start_at == "beginning" and cfg.history_bytes == 64 << 20 and cfg.history_age == 0
