"""Checkpoint saves against the standard library, over random histories (Hypothesis).

After every save of a random history of what the agent does to its sources' `delivered` lists
between saves (entries appended or extended, a prune into a new list, the last entry replaced,
lists cleared or shrunk, sources appearing, disappearing, reordered, renumbered, two keys on
one list, file entries changing, a save failing at the temporary file's fsync or after the
rename at the directory's), with every code point in the strings:

- the file is byte for byte `json.dumps` of the `asdict` document (separators `,` and `:`),
  with the file's own `written_at`: the save writes its text by hand and keeps it between saves;
- `load()` gives the records back;
- a save after a successful one with the same content writes nothing (an idle agent), and a
  save after a failed one writes again.

Written by a reviewer of 8ddc2b9; `VLLM_TRACE_BRIDGE_FUZZ_EXAMPLES` sets the size (default 150).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import types
from dataclasses import asdict

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from bridge.tail import checkpoint as ck
from bridge.tail.checkpoint import CheckpointStore, Delivered, FileCheckpoint, SourceCheckpoint

EXAMPLES = int(os.environ.get("VLLM_TRACE_BRIDGE_FUZZ_EXAMPLES", "150"))
OPS = 40

# Every code point, lone surrogates included, and the usual suspects.
TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=()), max_size=6),
    st.sampled_from(['"', "\\", "\x00", "\x1f", "\x7f", "\ud800", "\udfff", "\u2028", "\u0085", "é",
                     "\U0001f600", "</", "\\u0041", "a\"b\\c"]),
)
OFFSET = st.one_of(st.integers(0, 1 << 62), st.integers(-3, 3), st.just(1 << 80))


class FlakyOS:
    """`os` for the checkpoint module: fsync is a no-op (no disk load), or raises once."""

    def __init__(self) -> None:
        self.fail: str | None = None  # "file": the tmp file's fsync; "dir": the directory's

    def __getattr__(self, name):
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        if self.fail == ("dir" if is_dir else "file"):
            self.fail = None
            raise OSError(28, "No space left on device (injected)")


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def time(self) -> float:
        self.t += 0.001953125 * 3  # exact binary fractions, distinct every call
        return self.t


def _expected(files, sources, written_at) -> bytes:
    doc = {"version": 1, "written_at": written_at, "files": [asdict(f) for f in files],
           "sources": [asdict(s) for s in sources]}
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def _body(files, sources) -> str:
    return json.dumps({"files": [asdict(f) for f in files], "sources": [asdict(s) for s in sources]},
                      separators=(",", ":"))


def _run(data) -> None:
    flaky, clock = FlakyOS(), Clock()
    saved_os, saved_time = ck.os, ck.time
    ck.os, ck.time = flaky, types.SimpleNamespace(time=clock.time)
    try:
        with tempfile.TemporaryDirectory(prefix="ckfuzz-") as d:
            _session(data, d, flaky)
    finally:
        ck.os, ck.time = saved_os, saved_time


def _session(data, d: str, flaky: FlakyOS) -> None:
    store = CheckpointStore(d)
    lists: dict[str, list] = {}
    order: list[list] = []          # [key, next_generation]
    files: list[FileCheckpoint] = []
    on_disk: bytes | None = None    # the file's bytes
    disk_body: str | None = None    # its content without written_at

    def new_entry() -> Delivered:
        e = Delivered(data.draw(TEXT), data.draw(OFFSET))
        return e

    def a_key() -> str:
        return data.draw(st.sampled_from(sorted(lists))) if lists and data.draw(st.booleans()) else data.draw(TEXT)

    def a_list() -> list | None:
        return lists[data.draw(st.sampled_from(sorted(lists)))] if lists else None

    contract = ["append", "append", "append", "append", "extend", "extend", "replace_last", "del_at", "clear", "shrink", "prune_new_list",
                "same_content_new_list", "add_source", "drop_source", "reorder", "renumber", "share_list",
                "files", "save", "save", "save", "save_fail_file", "save_fail_dir"]
    names = contract
    for step in range(data.draw(st.integers(1, OPS))):
        op = data.draw(st.sampled_from(names))
        entries = a_list()
        if op == "append" and entries is not None:
            entries.append(new_entry())
        elif op == "extend" and entries is not None:
            entries.extend(new_entry() for _ in range(data.draw(st.integers(0, 4))))
        elif op == "replace_last" and entries:
            entries[-1] = new_entry()
        elif op == "del_at" and entries:
            del entries[data.draw(st.integers(0, len(entries) - 1))]
        elif op == "clear" and entries is not None:
            entries.clear()
        elif op == "shrink" and entries:
            del entries[data.draw(st.integers(0, len(entries) - 1)):]
        elif op in ("prune_new_list", "same_content_new_list") and lists:
            key = data.draw(st.sampled_from(sorted(lists)))
            old = lists[key]
            keep = old if op == "same_content_new_list" else [e for e in old if data.draw(st.booleans())]
            # the agent rebinds the name; other holders (a shared key) keep the old list
            lists[key] = list(keep)
        elif op == "add_source":
            key = data.draw(TEXT)
            if key not in lists:
                lists[key] = []
            if all(k != key for k, _ in order):
                order.insert(data.draw(st.integers(0, len(order))), [key, data.draw(st.integers(0, 1 << 40))])
        elif op == "drop_source" and order:
            order.pop(data.draw(st.integers(0, len(order) - 1)))
        elif op == "reorder" and order:
            order[:] = data.draw(st.permutations(order))
        elif op == "renumber" and order:
            order[data.draw(st.integers(0, len(order) - 1))][1] = data.draw(st.integers(0, 1 << 40))
        elif op == "share_list" and len(lists) >= 2:
            a, b = data.draw(st.lists(st.sampled_from(sorted(lists)), min_size=2, max_size=2, unique=True))
            lists[a] = lists[b]
        elif op == "files":
            files = [FileCheckpoint(data.draw(TEXT), a_key(), data.draw(st.integers(0, 9)),
                                    data.draw(st.integers(0, 1 << 40)), data.draw(TEXT),
                                    data.draw(st.integers(0, 64)), data.draw(st.integers(0, 1 << 50)))
                     for _ in range(data.draw(st.integers(0, 2)))]
        elif op.startswith("save"):
            sources = [SourceCheckpoint(k, g, lists[k]) for k, g in order]
            body = _body(files, sources)
            fail = {"save_fail_file": "file", "save_fail_dir": "dir"}.get(op)
            flaky.fail = fail
            note(f"step {step}: {op} {body[:300]!r}")
            before = on_disk
            try:
                store.save(files, sources)
            except OSError:
                assert fail is not None
                try:
                    with open(store.path, "rb") as f:
                        on_disk = f.read()
                except FileNotFoundError:
                    on_disk = None
                if fail == "file":  # before the rename: the file is the one before
                    assert on_disk == before
                else:               # after the rename: the new file is in place
                    assert on_disk == _expected(files, sources, json.loads(on_disk)["written_at"])
                disk_body = None  # not known to be complete: the next save must write
                continue
            finally:
                flaky.fail = None
            with open(store.path, "rb") as f:
                on_disk = f.read()
            written_at = json.loads(on_disk)["written_at"]
            assert on_disk == _expected(files, sources, written_at), "the file is not json.dumps's"
            if body == disk_body:
                assert on_disk == before, "unchanged state rewritten (an idle agent should not write)"
            disk_body = body
            loaded = CheckpointStore(d).load()
            assert loaded.used == "current" and not loaded.damaged
            assert loaded.files == files
            assert loaded.sources == [SourceCheckpoint(k, g, list(lists[k])) for k, g in order]
            assert loaded.written_at == written_at


_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                     database=None)


@_SETTINGS
@given(st.data())
def test_every_save_writes_what_json_dumps_writes_and_reads_back(data):
    _run(data)


def test_a_save_that_failed_after_its_rename_does_not_skip_the_next(tmp_path, monkeypatch):
    """The directory's fsync fails after the rename: the new file is in place, unconfirmed. Saving
    the state before it again must write it (it was skipped as 'what the file already says')."""
    flaky = FlakyOS()
    monkeypatch.setattr(ck, "os", flaky)
    store = CheckpointStore(str(tmp_path))
    before = [SourceCheckpoint("s", 0, [])]
    store.save([], before)
    flaky.fail = "dir"
    try:
        store.save([], [SourceCheckpoint("s", 0, [Delivered("a", 1)])])
        raise AssertionError("the injected fsync failure did not reach the caller")
    except OSError:
        pass
    store.save([], before)
    with open(store.path) as f:
        assert json.load(f)["sources"] == [asdict(s) for s in before]
