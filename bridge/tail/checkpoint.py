"""Durable checkpoints: where to resume each file, and what was already delivered past there.

One JSON document in the state directory, replaced atomically (write to a temporary file,
fsync, rename, fsync the directory), so a crash leaves either the old or the new one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_str  # json.dumps's own C string encoder

_VERSION = 1
#: A checkpoint is a few hundred bytes per file and per delivered request; one past this is
#: damaged (or not ours), and reading it whole would cost the agent its memory limit.
MAX_CHECKPOINT_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Delivered:
    """A request (or engine incident) already acknowledged whose lines reach past the offset:
    on resume, its lines up to `last_offset` are skipped so it is not rebuilt a second time."""

    key: str          # request id, or "engine@<offset>"
    last_offset: int


@dataclass(slots=True)
class FileCheckpoint:
    path: str
    source_key: str
    generation: int    # order of this file among its source's files (rotations); see tail.follow
    inode: int
    fingerprint: str   # hex digest of the first `fingerprint_len` bytes
    fingerprint_len: int
    offset: int        # every byte before this is delivered or belongs to no request
    # The content just before where the file was read to (`tail_end`, ≥ offset): hex digest of
    # its last bytes, up to 256. A file rewritten in place with the same first bytes (and
    # size) is not resumed in the middle of someone else's lines. "": not known (an older
    # checkpoint, a gzip file, nothing read yet).
    tail_fingerprint: str = ""
    tail_end: int = 0


@dataclass(slots=True)
class SourceCheckpoint:
    key: str
    next_generation: int
    delivered: list[Delivered] = field(default_factory=list)  # positions are source-wide


@dataclass(slots=True)
class Loaded:
    """What `load` found: the checkpoint to resume from (None: none usable), and why not the
    current file when it was damaged (`damaged`: one reason per file tried)."""

    files: list[FileCheckpoint] | None
    sources: list[SourceCheckpoint]
    used: str                      # "current" | "previous" | "none"
    damaged: list[str] = field(default_factory=list)
    written_at: float | None = None
    facts: dict[str, dict] = field(default_factory=dict)  # source key → engine facts in force at its position
    # path → (complete, [(length, fingerprint)]): the heads of the files known at each followed
    # path (tail.follow's `known_heads`); empty from a checkpoint written before they were kept
    heads: dict[str, tuple[bool, list[tuple[int, str]]]] = field(default_factory=dict)
    # directory → the names it held at the follower's last look before the save (tail.follow's
    # `listings`): a name not among them came while the agent was down; empty from older ones
    listings: dict[str, list[str]] = field(default_factory=dict)


def _file_doc(f: FileCheckpoint) -> dict:
    """`dataclasses.asdict`, written out: a save runs every second, and asdict's deep copy
    of every delivered entry dominated the agent's own CPU when many were listed."""
    return {"path": f.path, "source_key": f.source_key, "generation": f.generation, "inode": f.inode,
            "fingerprint": f.fingerprint, "fingerprint_len": f.fingerprint_len, "offset": f.offset,
            "tail_fingerprint": f.tail_fingerprint, "tail_end": f.tail_end}


def _delivered_json(entries) -> bytes:
    """The entries as `json.dumps` writes them (separators `,` and `:`), without a dict each."""
    enc = _json_str
    return ",".join([f'{{"key":{enc(d.key)},"last_offset":{int(d.last_offset)}}}' for d in entries]).encode()


class _DeliveredText:
    """Each source's `delivered` list as JSON bytes, extended in place rather than rewritten.

    An unfinished request keeps every request acknowledged after it listed, up to the TTL
    (60,000 entries, 4 MB, at 100 requests/s), and the agent saves after every ack. Between two
    prunes the agent only appends to the list (a prune makes a new one), so the text of the
    entries already written is kept; it is trusted only while the list is the same object and
    the entry at the end of the written part is still the one written. The entries are frozen;
    an entry replaced in the middle of the list would not be seen (the agent never does it)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[str, tuple[list, int, object, bytearray]] = {}  # key → (list, n, its n-th, text)

    def __call__(self, sources: list[SourceCheckpoint]) -> list[tuple[bytes, bytearray]]:
        """Per source, the JSON object's head and its delivered entries, to be written as
        `head + entries + b"]}"`. The same bytearray comes back, longer, while the list only grew."""
        kept, self._kept = self._kept, {}
        out = []
        for s in sources:
            entries, n = s.delivered, len(s.delivered)
            old = kept.get(s.key)
            if old is not None and old[0] is entries and old[1] <= n and (old[1] == 0 or entries[old[1] - 1] is old[2]):
                text, done = old[3], old[1]
            else:
                text, done = bytearray(), 0
            if n > done:
                if text:
                    text += b","
                text += _delivered_json(entries[done:])
            self._kept[s.key] = (entries, n, entries[n - 1] if n else None, text)
            head = f'{{"key":{_json_str(s.key)},"next_generation":{int(s.next_generation)},"delivered":['.encode()
            out.append((head, text))
        return out


def _parse(doc) -> tuple[list[FileCheckpoint], list[SourceCheckpoint], float | None]:
    """The document as typed records, or ValueError saying what is wrong with it."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("version") != _VERSION:
        raise ValueError(f"version {doc.get('version')!r}, this agent reads version {_VERSION}")
    files_raw, sources_raw = doc.get("files"), doc.get("sources")
    if not isinstance(files_raw, list) or not isinstance(sources_raw, list):
        raise ValueError("'files' and 'sources' must be lists")
    try:
        files = [FileCheckpoint(**e) for e in files_raw]
        sources = []
        for e in sources_raw:
            e = dict(e)
            delivered = [Delivered(**d) for d in e.pop("delivered", [])]
            sources.append(SourceCheckpoint(**e, delivered=delivered))
    except TypeError as exc:
        raise ValueError(f"unexpected shape ({exc})") from None
    for f in files:
        if not (isinstance(f.path, str) and isinstance(f.source_key, str) and isinstance(f.fingerprint, str)
                and isinstance(f.tail_fingerprint, str)
                and all(isinstance(v, int) and v >= 0
                        for v in (f.generation, f.inode, f.fingerprint_len, f.offset, f.tail_end))):
            raise ValueError(f"a file entry has fields of the wrong type: {f.path!r}")
    for src in sources:
        if not (isinstance(src.key, str) and isinstance(src.next_generation, int)
                and all(isinstance(d.key, str) and isinstance(d.last_offset, int) for d in src.delivered)):
            raise ValueError(f"a source entry has fields of the wrong type: {src.key!r}")
    written = doc.get("written_at")
    return files, sources, written if isinstance(written, (int, float)) else None


def _heads(raw) -> dict[str, tuple[bool, list[tuple[int, str]]]]:
    """`known_heads` as saved; an entry of another shape is left out (its path then falls
    back to what a checkpoint without heads gets), never a reason to distrust the rest."""
    out: dict[str, tuple[bool, list[tuple[int, str]]]] = {}
    if not isinstance(raw, dict):
        return out
    for path, entry in raw.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("heads"), list)):
            continue
        heads = entry["heads"]
        if all(isinstance(h, list) and len(h) == 2 and type(h[0]) is int and isinstance(h[1], str) for h in heads):
            out[path] = (entry.get("complete") is True, [(h[0], h[1]) for h in heads])
    return out


def _listings(raw) -> dict[str, list[str]]:
    """`listings` as saved; a directory of another shape is left out (names there then get the
    rule of a checkpoint without listings)."""
    if not isinstance(raw, dict):
        return {}
    return {d: names for d, names in raw.items()
            if isinstance(d, str) and isinstance(names, list) and all(isinstance(n, str) for n in names)}


class StateDirInUse(Exception):
    """Another process holds the state directory's lock (`lock_state_dir`)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder  # what the holder wrote into the lock file: its pid, or ""


def lock_state_dir(state_dir: str):
    """Hold `state_dir/lock` (an flock) for as long as the returned file stays open, or raise
    StateDirInUse. Two agents on one state directory would each export every line and write
    over each other's checkpoints; the kernel drops the lock when its holder exits, even by
    kill -9, so a restarted agent is never locked out by the one before it."""
    import fcntl

    f = open(os.path.join(state_dir, "lock"), "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read(32).strip()
        f.close()
        raise StateDirInUse(holder) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class CheckpointStore:
    """`checkpoints.json`, and `checkpoints.json.prev`: the one it replaced, kept so that a
    damaged current file (disk, hand edit, a tool) still leaves a good place to resume."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "checkpoints.json")
        self.prev_path = self.path + ".prev"
        self.written_at: float | None = None
        self.recoveries: dict[str, int] = {}  # what a damaged checkpoint was replaced with → times
        self._last_body: tuple | None = None
        self._sources_json = _DeliveredText()
        self._current_good = False  # the file at `path` is one we read whole or wrote: worth keeping
        self._prev_kept = False     # `.prev` is known to be there (see `save`)

    def exists(self) -> bool:
        return os.path.exists(self.path) or os.path.exists(self.prev_path)

    def load(self) -> Loaded:
        """The current checkpoint; if it is damaged (unreadable, not JSON, an unknown version
        or shape), the previous good one; else none (the caller says what it does then)."""
        damaged: list[str] = []
        for name, path in (("current", self.path), ("previous", self.prev_path)):
            try:
                with open(path, "rb") as f:  # a huge or runaway file is not read (nor read whole)
                    too_big = os.fstat(f.fileno()).st_size > MAX_CHECKPOINT_BYTES
                    raw = b"" if too_big else f.read(MAX_CHECKPOINT_BYTES + 1)
                if too_big or len(raw) > MAX_CHECKPOINT_BYTES:
                    raise ValueError(f"larger than {MAX_CHECKPOINT_BYTES >> 20} MiB, more than any checkpoint "
                                     "this agent writes: not read")
                doc = json.loads(raw)
                files, sources, written = _parse(doc)
            except FileNotFoundError:
                continue
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                damaged.append(f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}")
                continue
            self._current_good = name == "current"
            self.written_at = written
            facts = doc.get("engine_facts")
            facts = {k: v for k, v in facts.items() if isinstance(v, dict)
                     and all(isinstance(a, str) and isinstance(b, str) for a, b in v.items())} \
                if isinstance(facts, dict) else {}
            if damaged:
                self.recoveries[name] = self.recoveries.get(name, 0) + 1
            return Loaded(files, sources, name, damaged, written, facts, _heads(doc.get("known_heads")),
                          _listings(doc.get("listings")))
        if damaged:
            self.recoveries["none"] = self.recoveries.get("none", 0) + 1
        return Loaded(None, [], "none", damaged)

    def save(self, files: list[FileCheckpoint], sources: list[SourceCheckpoint],
             facts: dict[str, dict] | None = None,
             heads: dict[str, tuple[bool, list[tuple[int, str]]]] | None = None,
             listings: dict[str, list[str]] | None = None) -> None:
        """Write the checkpoint atomically (temporary file, fsync, rename, fsync the directory),
        the one it replaces kept as `.prev`; skipped when it says what the file already says
        (an idle agent then costs no writes and no fsyncs); either way it is current as of now.
        Raises OSError when it cannot be written (the caller retries).
        `facts`: per source, the engine facts (the banner's model and version) in force at its
        saved position, which a resume needs for the requests after it; written when there are.
        `heads`: the follower's known heads per path (`Loaded.heads`); written when there are.
        `listings`: the directories' names at the follower's last look (`Loaded.listings`)."""
        files_json = json.dumps([_file_doc(f) for f in files], separators=(",", ":")).encode()
        parts = self._sources_json(sources)
        extra_json = b',"engine_facts":%s' % json.dumps(facts, separators=(",", ":")).encode() if facts else b""
        if heads:
            doc = {p: {"complete": c, "heads": [[n, fp] for n, fp in h]} for p, (c, h) in heads.items()}
            extra_json += b',"known_heads":%s' % json.dumps(doc, separators=(",", ":")).encode()
        if listings:
            extra_json += b',"listings":%s' % json.dumps(listings, separators=(",", ":")).encode()
        # What the file would say: a kept text that is the same object and length has not changed.
        body = (files_json, extra_json, [(head, text, len(text)) for head, text in parts])
        now = time.time()
        if body == self._last_body:
            self.written_at = now
            return
        tmp = self.path + ".tmp"
        self._last_body = None  # until this save is complete: a failed one must not skip the next
        with open(tmp, "wb") as f:  # ASCII: every string went through json's ASCII encoder
            f.write(b'{"version":%d,"written_at":%s,"files":%s,"sources":[' % (_VERSION, repr(now).encode(), files_json))
            for i, (head, text) in enumerate(parts):
                f.write(b",%s" % head if i else head)
                f.write(text)
                f.write(b"]}")
            f.write(b"]%s}" % extra_json)
            f.flush()
            os.fsync(f.fileno())
        if self._current_good:
            try:  # a crash right after this leaves only `.prev`, which load then uses
                os.replace(self.path, self.prev_path)
            except FileNotFoundError:
                pass
        os.replace(tmp, self.path)
        if not self._prev_kept and not os.path.exists(self.prev_path):
            # The first checkpoint is `.prev` too: damaged before a second save, it would leave
            # nothing good, and the restart would be a first run (rotated files left unread).
            with open(self.path, "rb") as src, open(tmp, "wb") as f:
                f.write(src.read())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.prev_path)
        self._prev_kept = True
        dir_fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._current_good = True
        self.written_at = now
        self._last_body = body
