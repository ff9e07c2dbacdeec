"""A file rewritten in place to the same size and the same mtime is noticed and read again
(issue 37, point 1): by its content (its first bytes and the bytes before where it was read
to), not by its size and mtime, in the follower, for a parked file and in the checkpoint's
identity across a restart. Truth: the bytes the test wrote.
"""

from __future__ import annotations

import os

import pytest

from bridge.resume import file_checkpoint
from bridge.tail.follow import REWRITE_CHECK_S, Filters, Follower


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _lines(tag: str, n: int = 20, head: str = "INFO 02-15 10:23:00 api_server.py:1] vLLM API server started\n") -> list[bytes]:
    """A vLLM-like start, then `n` lines marked `tag` (all tags the same length)."""
    return [head.encode()] + [f"INFO 02-15 10:23:{i % 60:02d} x.py:1] Added request {tag}-{i:04d}.\n".encode()
                              for i in range(n)]


def _rewrite_keeping_size_and_mtime(path: str, data: bytes) -> None:
    st = os.stat(path)
    assert len(data) == st.st_size
    with open(path, "r+b") as f:  # in place: same inode
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


def _drain(follower: Follower, clock: Clock, rounds: int = 5) -> list[bytes]:
    got = []
    for _ in range(rounds):
        clock.t += REWRITE_CHECK_S
        got += [raw for _, lines in follower.poll() for _, raw in lines]
    return got


@pytest.mark.parametrize("what", ["all", "head_kept", "only_the_last_line"])
def test_a_rewrite_to_the_same_size_and_mtime_is_read_again(tmp_path, what):
    path = str(tmp_path / "vllm.log")
    old = _lines("aaaa")
    if what == "all":
        new = _lines("bbbb", head="INFO 02-15 10:24:00 api_server.py:1] vLLM API server started\n")
    elif what == "head_kept":  # the first bytes as they were: only the later lines differ
        new = old[:5] + _lines("bbbb")[5:]
    else:
        new = old[:-1] + [old[-1].replace(b"aaaa", b"bbbb")]
    with open(path, "wb") as f:
        f.writelines(old)
    clock = Clock()
    follower = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    follower.discover(first_round=True)
    assert _drain(follower, clock) == old
    _rewrite_keeping_size_and_mtime(path, b"".join(new))
    assert _drain(follower, clock) == new  # the new content, whole, from its start
    assert follower.stats.rotations == {"rewrite": 1}
    assert _drain(follower, clock) == []  # once


def test_an_unchanged_file_is_never_taken_for_a_rewrite_and_appends_still_read(tmp_path):
    path = str(tmp_path / "vllm.log")
    old = _lines("aaaa")
    with open(path, "wb") as f:
        f.writelines(old)
    clock = Clock()
    follower = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    follower.discover(first_round=True)
    assert _drain(follower, clock, 20) == old
    more = _lines("cccc")[1:]
    with open(path, "ab") as f:
        f.writelines(more)
    assert _drain(follower, clock, 20) == more
    assert follower.stats.rotations == {}


def test_a_rewrite_that_changes_the_size_keeping_the_head_is_not_read_from_the_old_place(tmp_path):
    """Rewritten longer with the same first bytes: without the bytes before our place, the
    follower read on from its old offset, in the middle of other content."""
    path = str(tmp_path / "vllm.log")
    old = _lines("aaaa")
    with open(path, "wb") as f:
        f.writelines(old)
    clock = Clock()
    follower = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    follower.discover(first_round=True)
    assert _drain(follower, clock) == old
    new = old[:6] + _lines("dddd", 40)[6:]  # past the first 256 bytes
    with open(path, "r+b") as f:
        f.write(b"".join(new))
    got = _drain(follower, clock)
    assert got == new
    assert follower.stats.rotations == {"rewrite": 1}


def test_a_parked_file_rewritten_in_place_is_read_again(tmp_path):
    """Past the descriptor budget a file idle at its end is closed; its rewrite is still seen
    (checked with a descriptor opened for the check and closed at once)."""
    paths = [str(tmp_path / f"vllm-{i}.log") for i in range(6)]
    for i, p in enumerate(paths):
        with open(p, "wb") as f:
            f.writelines(_lines(f"a{i:03d}"))
    clock = Clock()
    follower = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock, max_open=3)
    follower.discover(first_round=True)
    assert len(_drain(follower, clock, 10)) == 6 * 21
    parked = [tf for tf in follower.files if tf.fh is None]
    assert parked, "nothing parked: the case is not reached"
    victim = parked[0].path
    new = _lines("bbbb")  # the same length as a000…a005
    _rewrite_keeping_size_and_mtime(victim, b"".join(new))
    got = _drain(follower, clock, 10)
    assert got == new
    assert follower.stats.rotations == {"rewrite": 1}
    assert follower.open_count <= 3


@pytest.mark.parametrize("same_size", [True, False])
def test_a_restart_does_not_resume_a_file_rewritten_while_it_was_down(tmp_path, same_size):
    """The checkpoint keeps the fingerprint of the bytes before where the file was read to:
    the same inode and first bytes are not enough to resume in the middle of new content."""
    path = str(tmp_path / "vllm.log")
    old = _lines("aaaa")
    with open(path, "wb") as f:
        f.writelines(old)
    clock = Clock()
    first = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    first.discover(first_round=True)
    assert _drain(first, clock) == old
    tf = first.files[0]
    ck = file_checkpoint(tf, tf.offset)
    assert ck.tail_fingerprint and ck.tail_end == os.path.getsize(path)
    first.close()
    new = old[:4] + _lines("bbbb" if same_size else "bbbbbb", 25)[4:]  # the first bytes kept
    with open(path, "r+b") as f:
        f.write(b"".join(new))
    second = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    second.restore([ck], {ck.source_key: ck.generation + 1})
    second.discover()
    assert _drain(second, clock) == new
    # As it was: resumed where it was, nothing read twice.
    third = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    tf = second.files[0]
    third.restore([file_checkpoint(tf, tf.offset)], {ck.source_key: tf.generation + 1})
    third.discover()
    assert _drain(third, clock) == []


def test_a_checkpoint_from_before_tail_fingerprints_still_resumes(tmp_path):
    """An older agent's checkpoint has no tail fingerprint: resumed by inode and first bytes."""
    import dataclasses
    path = str(tmp_path / "vllm.log")
    old = _lines("aaaa")
    with open(path, "wb") as f:
        f.writelines(old)
    clock = Clock()
    first = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    first.discover(first_round=True)
    _drain(first, clock)
    ck = dataclasses.replace(file_checkpoint(first.files[0], first.files[0].offset), tail_fingerprint="", tail_end=0)
    first.close()
    with open(path, "ab") as f:
        f.write(_lines("eeee")[1])
    second = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    second.restore([ck], {ck.source_key: ck.generation + 1})
    second.discover()
    assert _drain(second, clock) == [_lines("eeee")[1]]


def test_a_rewrite_right_after_a_restart_is_seen(tmp_path):
    """Resumed from its checkpoint, a file rewritten (same size, mtime, first bytes) before the
    agent read it again: the checkpoint's fingerprint of the bytes before its place tells."""
    path = str(tmp_path / "vllm.log")
    old = _lines("aaaa")
    with open(path, "wb") as f:
        f.writelines(old)
    clock = Clock()
    first = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    first.discover(first_round=True)
    _drain(first, clock)
    ck = file_checkpoint(first.files[0], first.files[0].offset)
    first.close()
    second = Follower(Filters((str(tmp_path / "*.log"),)), clock=clock)
    second.restore([ck], {ck.source_key: ck.generation + 1})
    second.discover()  # resumed at its place: the same file
    assert second.files[0].offset == ck.offset
    new = old[:-1] + [old[-1].replace(b"aaaa", b"bbbb")]
    _rewrite_keeping_size_and_mtime(path, b"".join(new))
    assert _drain(second, clock) == new
    assert second.stats.rotations == {"rewrite": 1}
