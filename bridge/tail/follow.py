"""Follow live log files: discovery, fair reading, rotation, truncation, deletion.

Identity is content plus inode, never the name: a file is known by the fingerprint of its
first bytes and its inode, so a renamed file keeps its history and a new file at an old name
is new. Every file belongs to a *source* (one container's stream, from the kubelet path) and
gets a *generation* number within it; a line's position is `generation << 40 | offset`, so
positions stay ordered across rotations and across restarts (generations are checkpointed).

Rotation kinds handled:
- rename + create (kubelet: `0.log` → `0.log.<stamp>`, later gzipped): the open descriptor is
  read to its end; the new file at the name is a new generation.
- copytruncate: the file shrinks under us; the copy is found by fingerprint and read from
  where we were; the truncated file continues as a new generation.
- truncation without a copy: a new generation from offset 0 (counted).
- deletion: the open descriptor is read to its end, then closed.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import io
import gzip
import os
import stat
import time
import zlib
from dataclasses import dataclass, field
from hashlib import blake2b
from itertools import accumulate

from bridge.tail.source import Source, live_order, live_path, source_for
from bridge.tail.checkpoint import FileCheckpoint
from bridge.core.position import GEN_SHIFT
from bridge.tail.files import MAX_LINE_BYTES, rotation_key

FINGERPRINT_BYTES = 256
TAIL_BYTES = 256           # the bytes before the read position a rewrite check compares
# A file unchanged by size and mtime is still checked for an in-place rewrite (its first bytes
# and the bytes before where it was read to): each file at most once per REWRITE_CHECK_S, at
# most REWRITE_CHECKS per round (two 256-byte preads each; a parked file an open and a close).
# A rewrite that keeps the size and the mtime is rare; finding it within seconds is enough.
REWRITE_CHECK_S = 10.0
REWRITE_CHECKS = 16
_CHUNK_MAX = 64 << 20         # a bigger read (a rotated file's rest, all at once) goes line by line
LONG_LINE_BYTES = 64 << 10  # lines longer than this are counted: a sign of a stuck writer or a dump
RETIRE_AFTER_S = 5.0       # a detached file quiet this long at its end is closed
_RACY_NS = 2_000_000_000  # a directory changed this recently is listed again at the next look
_KNOWN_PER_PATH = 1024     # heads kept per path (kubelet keeps 5 files, logrotate `rotate N`)
_LISTED_NAMES_KEPT = 20_000  # names of listed directories a checkpoint keeps (more: none kept)


def _generation(tf: TrackedFile) -> int:
    return tf.generation


def fingerprint(head: bytes) -> str:
    return blake2b(head, digest_size=12).hexdigest()


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_head(path: str, n: int = FINGERPRINT_BYTES) -> bytes:
    """The first `n` bytes (of the uncompressed stream for `.gz`). A damaged or half-written
    gzip file raises OSError like an unreadable one (gzip raises EOFError and zlib.error too)."""
    try:
        with _open(path) as f:
            return f.read(n)
    except (EOFError, zlib.error) as exc:
        raise OSError(f"{path}: {exc}") from None


def siblings(path: str) -> list[str]:
    """The files rotated from `path`: `<path>.*` (kubelet's `0.log.<stamp>`, logrotate's
    `.1`, `.2.gz`) and `<path>-*` (logrotate's `dateext`), sorted; never a temporary file
    (kubelet writes `<file>.gz.tmp` before renaming it to `.gz`), never anything but a regular file."""
    esc = glob.escape(os.path.realpath(path))  # a kubelet symlink's rotated files sit by its target
    # Regular files only: opening a FIFO named like one blocks until a writer comes (for ever).
    return sorted(p for p in glob.glob(esc + ".*") + glob.glob(esc + "-*")
                  if not p.endswith(".tmp") and os.path.isfile(p))


#: Names rotation gives `0.log` (kubelet's stamp and its gzip, logrotate's number and dateext).
_ROTATED_EXAMPLES = ("0.log.20260215-100000", "0.log.20260215-100000.gz", "0.log.1", "0.log-20260215")


def matches_rotated_files(glob_: str) -> bool:
    """Whether an include glob also matches rotated files (`*/*/*`, `*.log*`): each would be
    followed as a file of its own as well as read with the file it was rotated from."""
    return any(fnmatch.fnmatch(name, os.path.basename(glob_)) for name in _ROTATED_EXAMPLES)


def rotation_order(path: str, sibling: str, mtime: float) -> tuple:
    """Oldest first, by the name the rotation gave (`files.rotation_key`: the one rule replay uses too)."""
    return rotation_key(sibling[len(os.path.realpath(path)):], mtime, sibling)


def _gzip_size(path: str) -> int | None:
    """The uncompressed size a gzip file's trailer states (ISIZE: modulo 4 GiB, enough for a
    rotated log), None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            return int.from_bytes(f.read(4), "little")
    except OSError:
        return None


def _rotated_unread(live: str, tracked: list, at_path: os.stat_result | None) -> int:
    """Bytes in the files rotated from `live` after the oldest of `tracked` (found among them
    by inode, by name, or a `.gz` by its first bytes), and in the file at `live` now, that no
    file of `tracked` is: written since and not reached yet."""
    inodes = {tf.inode for tf in tracked if not tf.path.endswith(".gz")}
    paths = {tf.path for tf in tracked}
    heads = {(tf.fp_len, tf.fp) for tf in tracked if tf.fp_len}
    entries = []
    for sibling in siblings(live):
        try:
            st = os.stat(sibling)
        except OSError:
            continue
        entries.append((rotation_order(live, sibling, st.st_mtime), sibling, st))
    entries.sort(key=lambda e: e[0])
    if at_path is not None:
        entries.append(((), live, at_path))

    def ours(sibling: str, st: os.stat_result) -> bool:
        if sibling == live:  # the file at the path now: followed if its inode is (a renamed one kept the name)
            return st.st_ino in inodes
        if sibling in paths or (st.st_ino in inodes and not sibling.endswith(".gz")):
            return True
        if sibling.endswith(".gz") and heads:  # a file being read, gzipped since (its plain one deleted)
            try:
                head = read_head(sibling)
            except OSError:
                return False
            return any(fingerprint(head[:n]) == fp for n, fp in heads if len(head) >= n)
        return False

    total, reached = 0, False
    for _, sibling, st in entries:
        if ours(sibling, st):
            reached = True
        elif reached:
            size = _gzip_size(sibling) if sibling.endswith(".gz") else st.st_size
            total += size or 0
    return total


@dataclass(slots=True)
class Filters:
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ("*",)
    pods: tuple[str, ...] = ("*",)
    containers: tuple[str, ...] = ("*",)
    gateway: tuple[str, ...] = ()  # access logs: followed whatever pod or container wrote them

    def __post_init__(self) -> None:
        # Include globs are expanded from the working directory and the paths found are made
        # absolute: so are the globs, or a restart could not tell a checkpointed file at its
        # path from a rotated one, and sent it again (a review). Exclude and gateway globs are
        # only matched (`*` spans `/`: `*istio-proxy*` matches anywhere) and stay as given.
        self.include = tuple(os.path.abspath(p) for p in self.include)

    def accepts(self, path: str, source: Source) -> bool:
        return self.refusal(path, source) is None

    def refusal(self, path: str, source: Source) -> str | None:
        """Why the filters turn this file away (a sentence naming the setting), or None."""
        for p in self.exclude:
            if fnmatch.fnmatch(path, p):
                return f"matches exclude {p!r}"
        if any(fnmatch.fnmatch(path, p) for p in self.gateway):
            return None
        r = source.resource
        for key, setting, patterns in (("k8s.namespace.name", "namespaces", self.namespaces),
                                       ("k8s.pod.name", "pods", self.pods),
                                       ("k8s.container.name", "containers", self.containers)):
            if key in r and not any(fnmatch.fnmatch(str(r[key]), p) for p in patterns):
                return f"{key.split('.')[1]} {r[key]!r} matches none of {setting} {list(patterns)}"
        return None


@dataclass(frozen=True, slots=True)
class Discovery:
    """A change in what the follower follows, for the agent's log: `followed` (with whether the
    path gave a Kubernetes identity), `skipped` (with why: filter, exclude, unreadable, not a
    regular file) or `released` (gone from its path: read to its end, then closed)."""

    action: str          # followed | skipped | released
    path: str
    reason: str = ""     # skipped: why; followed: a note (e.g. not a kubelet path)
    kind: str = ""       # skipped: filter | unreadable | not_a_file | duplicate | not_vllm (the files_skipped label)
    source: str = ""


_NOT_KUBELET = ("not a kubelet path (/var/log/pods/<ns>_<pod>_<uid>/<container>/N.log): no k8s.* attributes, "
                "namespace/pod/container filters do not apply")


@dataclass(slots=True)
class TailStats:
    files_opened: int = 0
    files_retired: int = 0
    rotations: dict[str, int] = field(default_factory=dict)  # rename | copytruncate | truncate | deleted
    errors: dict[str, int] = field(default_factory=dict)     # permission | vanished | lost | io
    files_parked: int = 0     # descriptors closed to stay within the budget (place kept)
    files_reopened: int = 0   # parked files opened again by identity when they changed
    lines_oversized: int = 0
    bytes_cut: int = 0        # the rest of an oversized line past its first MAX_LINE_BYTES: dropped
    lines_long: int = 0       # over LONG_LINE_BYTES, still read whole
    bytes_read: int = 0
    history_skipped: int = 0  # bytes a first start left unread: older than the history window

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


class TrackedFile:
    """One open file being read. `offset` is where the next unread line starts."""

    __slots__ = ("path", "source", "generation", "base", "fh", "inode", "fp", "fp_len", "offset",
                 "partial", "detached", "quiet_since", "done", "seen", "at_eof", "cut", "active_at",
                 "tail_fp", "tail_end", "checked_at")

    def __init__(self, path: str, source: Source, generation: int, fh, inode: int, offset: int) -> None:
        self.path = path
        self.source = source
        self.generation = generation
        self.base = generation << GEN_SHIFT
        self.fh = fh
        self.inode = inode
        self.fp = ""
        self.fp_len = 0
        self.offset = offset
        self.partial = b""
        self.detached = False   # no longer at its path (renamed, deleted, or a rotated copy)
        self.quiet_since: float | None = None
        self.done = False
        self.seen: tuple[int, int] | None = None  # (size, mtime_ns) when last read to the end
        self.at_eof = False
        self.active_at = 0.0  # the follower's clock when lines last came from it (who is parked first)
        # The fingerprint of the TAIL_BYTES before `tail_end`, where it was last read to its end:
        # a rewrite in place that keeps the size (and the mtime, and the first bytes) changes it.
        self.tail_fp, self.tail_end = "", 0
        self.checked_at = float("-inf")  # the follower's clock at the last rewrite check
        # Inside a line cut at MAX_LINE_BYTES: its rest, to the next newline, is dropped, never
        # read as a line of its own (a client whose prompt vLLM logs could forge lines). A resume
        # at an offset that follows no newline is inside such a line.
        self.cut = offset > 0 and not path.endswith(".gz") and _mid_line(fh, offset)

    def refresh_fingerprint(self) -> None:
        if self.fp_len >= FINGERPRINT_BYTES or self.fh is None:
            return
        try:
            head = os.pread(self.fh.fileno(), FINGERPRINT_BYTES, 0) if not self.path.endswith(".gz") \
                else read_head(self.path)
        except OSError:
            return
        if len(head) > self.fp_len:
            self.fp, self.fp_len = fingerprint(head), len(head)

    def note_tail(self) -> None:
        """Remember the bytes before where the file is read to (plain files, read to the end)."""
        end = self.offset + len(self.partial)
        n = min(TAIL_BYTES, end)
        try:
            data = os.pread(self.fh.fileno(), n, end - n)
        except (OSError, ValueError, AttributeError):
            return
        if len(data) == n:
            self.tail_fp, self.tail_end = fingerprint(data), end

    def same_content(self, fd: int) -> bool:
        """Whether the file open as `fd` still starts with our first bytes and holds, before
        where we read to, the bytes we read there. False: rewritten (or truncated) in place."""
        try:
            if self.fp_len and fingerprint(os.pread(fd, self.fp_len, 0)) != self.fp:
                return False
            if self.tail_fp:
                n = min(TAIL_BYTES, self.tail_end)
                data = os.pread(fd, n, self.tail_end - n)
                return len(data) == n and fingerprint(data) == self.tail_fp
        except OSError:
            return True  # cannot tell: the read that follows reports the error
        return True

    def signature(self) -> tuple[int, int] | None:
        """(size, mtime) of the open file; None where it cannot tell (gzip, closed)."""
        if self.path.endswith(".gz") or self.fh is None:
            return None
        try:
            st = os.fstat(self.fh.fileno())
        except (OSError, ValueError):
            return None
        return st.st_size, st.st_mtime_ns

    def size(self) -> int | None:
        if self.fh is None:  # parked: read to its end when it was closed, as far as we know
            return self.seen[0] if self.seen else None
        if self.path.endswith(".gz"):
            return None
        try:
            return os.fstat(self.fh.fileno()).st_size
        except (OSError, ValueError):
            return None

    def read(self, max_bytes: int, stats: TailStats) -> list[tuple[int, bytes]]:
        """Complete lines (position, bytes) from `offset`, at most about `max_bytes` of them.
        The common round reads one chunk and splits it in C; a line held from the last round,
        the rest of a cut line, a long line or a gzip file take the line-by-line path."""
        if self.cut or self.path.endswith(".gz") or max_bytes > _CHUNK_MAX:
            return self.read_lines(max_bytes, stats)
        out: list[tuple[int, bytes]] = []
        if self.partial:  # finish the held line first, alone
            out = self.read_lines(1, stats)
            if self.partial or self.cut or self.at_eof:
                return out
            max_bytes -= len(out[0][1]) if out else 0
            if max_bytes <= 0:
                return out
        start = self.fh.tell()
        chunk = self.fh.read(max_bytes)
        self.at_eof = len(chunk) < max_bytes
        end = chunk.rfind(b"\n") + 1
        if not chunk or len(chunk) - end >= MAX_LINE_BYTES - 1:  # nothing, or a line to cut
            self.fh.seek(start)
            return out + (self.read_lines(max_bytes, stats) if chunk else [])
        lines = io.BytesIO(chunk[:end]).readlines()  # split on b"\n" only, as readline does
        if lines and max(map(len, lines)) > LONG_LINE_BYTES:
            self.fh.seek(start)
            return out + self.read_lines(max_bytes, stats)
        stats.bytes_read += len(chunk)
        at = self.base + self.offset
        out += zip(accumulate(map(len, lines), initial=at), lines)  # zip stops at the lines' end
        self.offset += end
        self.partial = chunk[end:]
        return out

    def read_lines(self, max_bytes: int, stats: TailStats) -> list[tuple[int, bytes]]:
        """`read`, line by line: the reference, and the path for every case but the common one."""
        out: list[tuple[int, bytes]] = []
        readline = self.fh.readline
        pos = self.offset + len(self.partial)
        budget = max_bytes
        self.at_eof = False
        while budget > 0:
            raw = readline(MAX_LINE_BYTES - len(self.partial))  # a line is cut at MAX_LINE_BYTES, held part included
            if not raw:
                self.at_eof = True
                break
            n = len(raw)
            budget -= n
            stats.bytes_read += n
            pos += n
            if self.cut:  # the rest of an oversized line
                self.cut = raw[-1] != 10
                stats.bytes_cut += n
                self.offset = pos
                continue
            if raw[-1] != 10:  # no b"\n": the writer is mid-line, or the line is oversized
                if n + len(self.partial) < MAX_LINE_BYTES:
                    self.partial += raw
                    continue
                stats.lines_oversized += 1
                self.cut = True
            if self.partial:
                raw = self.partial + raw
                self.partial = b""
            if len(raw) > LONG_LINE_BYTES:
                stats.lines_long += 1
            out.append((self.base + self.offset, raw))
            self.offset = pos
        return out

    def flush_partial(self) -> list[tuple[int, bytes]]:
        if not self.partial:
            return []
        raw, self.partial = self.partial, b""
        pos = self.offset
        self.offset += len(raw)
        return [(self.base + pos, raw)]

    def park(self) -> None:
        """Close the descriptor, keep the place: reopened by identity (inode and fingerprint)
        when the file changes (`Follower._unpark`). Files are a budget, not one fd each."""
        try:
            self.fh.close()
        except OSError:
            pass
        self.fh = None

    def close(self) -> None:
        if self.fh is not None:
            try:
                self.fh.close()
            except OSError:
                pass
        self.done = True


def _tail_matches(path: str, tail_fp: str, end: int) -> bool:
    """Whether the TAIL_BYTES before `end` in the file at `path` have this fingerprint (True
    when none is known). OSError when it cannot be read."""
    if not tail_fp:
        return True
    n = min(TAIL_BYTES, end)
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, n, end - n)
    finally:
        os.close(fd)
    return len(data) == n and fingerprint(data) == tail_fp


def _mid_line(fh, offset: int) -> bool:
    """Whether the byte before `offset` is not a newline."""
    try:
        return os.pread(fh.fileno(), 1, offset - 1) not in (b"\n", b"")
    except (OSError, ValueError, AttributeError):
        return False


RETRY_FIRST_S = 1.0    # an entry that could not be read is tried again after this long,
RETRY_MAX_S = 300.0    # doubling after each failure up to this


def file_error(exc: OSError) -> tuple[str, str, str]:
    """(files_skipped kind, file_errors reason, a sentence) for an entry that could not be read."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "unreadable", "permission", "not readable by this user (permission denied)"
    if exc.errno == errno.ELOOP:
        return "loop", "loop", "a symbolic link loop (too many levels of symbolic links)"
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return "unreadable", "fd_limit", "no file descriptor left (open files limit)"
    return "unreadable", "io", f"cannot be read: {exc.strerror or exc}"


def open_files_budget() -> int:
    """How many log files may be open at once: three quarters of the soft RLIMIT_NOFILE (the
    rest is for sockets, the checkpoint, the telemetry server), at least 16."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 768
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1 << 16
    return max(16, soft * 3 // 4)


def expand(pattern: str, errors: TailStats, listings: dict[str, tuple[int, list[str]]] | None = None,
           denied: list | None = None, due=None,
           previous: dict[str, list[str]] | None = None) -> list[tuple[str, bool]]:
    """`glob`, but a directory we may not list (no permission, a link that loops, an I/O
    error) is handed to the caller in `denied` as (directory, error) instead of silently
    skipped or raised, and a directory whose mtime has not changed is not listed again
    (`listings` caches them). `due(directory)`: False for a directory that failed before and
    is not to be tried again yet (the caller's backoff).

    Each match comes with `changed`: False when its directory was unchanged since the last
    call (no file there was created, renamed or removed), so the caller may skip it.
    `previous`, if given, gets the names a directory listed again held at its last listing.
    """
    parts = [p for p in pattern.split(os.sep) if p]
    roots = [(os.sep if pattern.startswith(os.sep) else os.curdir, False)]
    for part in parts:
        nxt: list[tuple[str, bool]] = []
        for d, _ in roots:
            if glob.has_magic(part):
                if due is not None and not due(d):
                    continue
                try:
                    mtime = os.stat(d).st_mtime_ns
                    cached = listings.get(d) if listings is not None else None
                    changed = cached is None or cached[0] != mtime
                    if changed:
                        with os.scandir(d) as it:
                            names = [e.name for e in it]
                        if previous is not None and cached is not None:
                            previous[d] = cached[1]
                        if listings is not None:
                            if len(listings) > 50_000:
                                listings.clear()
                            # File times are coarse (a kernel tick, coarser on some filesystems):
                            # a change in the tick of this listing (kubelet's rename, then the
                            # runtime's new file, ms apart) leaves the mtime as read here. A
                            # listing that recent is not trusted next time (git's racy rule), or
                            # the new live file would wait for the directory's next change.
                            racy = time.time_ns() - mtime < _RACY_NS
                            listings[d] = (-1 if racy else mtime, names)
                    else:
                        names = cached[1]
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except OSError as exc:  # EACCES, ELOOP (a directory link that loops), EIO, ...
                    if denied is not None:
                        denied.append((d, exc))
                    else:
                        errors.count(errors.errors, file_error(exc)[1])
                    continue
                nxt.extend((os.path.join(d, n), changed) for n in names
                           if fnmatch.fnmatchcase(n, part) and not n.startswith("."))
            else:
                p = os.path.join(d, part)
                if os.path.lexists(p):
                    nxt.append((p, True))
        roots = nxt
    return roots  # may include a directory that matched: the caller's stat tells


class Follower:
    """Knows every file worth reading and hands out their new lines, round-robin."""

    def __init__(self, filters: Filters, *, start_at_end: bool = False, read_chunk: int = 1 << 20,
                 clock=time.monotonic, max_open: int | None = None, admit=None,
                 history: tuple[int, float] | None = None) -> None:
        self.filters = filters
        # A first start from the beginning reads back a bounded window of each file found at
        # the first look: (bytes, seconds), 0 for no bound (see `_history_start`).
        self._history = history
        # Descriptors are a budget: past it, the files idle longest are parked (closed, place
        # kept) and reopened by identity when they change; 10,000 files under a 1,024 limit.
        self.max_open = max_open or open_files_budget()
        self.open_count = 0
        self._poll_started: float | None = None  # set while a poll runs
        # A check above this stage (bridge/detect.py: does the file read like vLLM?) of a file the
        # filters accept and no file of its container is followed yet: `admit(path, source)` is
        # None to follow it, else (kind, why) to hold it back, asked again at the next look.
        self._admit = admit
        self.stats = TailStats()
        self.files: list[TrackedFile] = []
        self._by_path: dict[str, TrackedFile] = {}
        self._next_gen: dict[str, int] = {}
        self._start_at_end = start_at_end
        self._read_chunk = read_chunk
        self._clock = clock
        self._resume: dict[str, FileCheckpoint] = {}
        # Paths whose checkpointed file was rotated away while we were down → the checkpoint's
        # time: the files rotated after it, from that path, are read before the one there now.
        self._rotated_while_down: dict[str, float] = {}
        # Entries (files, directories) that could not be read → (failures, when to try again):
        # each is reported once, then tried again with backoff; the healthy ones beside it are served.
        self._retry: dict[str, tuple[int, float]] = {}
        # Per followed path, the heads (length, fingerprint) of the files known to have been
        # at it: every file opened, and the rotated siblings there when it was first seen (not
        # read, deliberately). A sibling with a head not known is one that took the name and was
        # rotated away between two looks. Checkpointed, so a restart tells the files it read
        # from the ones rotated while it was down, gzipped or not, whatever the clocks did.
        self._known: dict[str, dict[tuple[int, str], None]] = {}
        self._exact: set[str] = set()  # paths whose known heads are complete (see _catch_missed)
        self._restored_at: float | None = None  # the checkpoint's time, when resumed from one
        self._overflowed: set[str] = set()  # paths that had more files than heads kept: never complete
        self._pruned_at = 0.0  # when the known heads of gone directories were last dropped
        self._listings: dict[str, tuple[int, list[str]]] = {}  # directory → (mtime, names)
        self._checks_left = REWRITE_CHECKS  # rewrite checks left in this round
        self._previous: dict[str, list[str]] = {}  # directory listed again this look → its names at the last
        self._last_look: float | None = None  # wall time of the last discovery
        self._judged: dict[str, tuple[Source, bool]] = {}     # path → (source, passes the filters)
        self.skipped: dict[str, tuple[str, str]] = {}  # path → (kind, why) of candidates not followed
        self.changes: list[Discovery] = []  # since the caller last took them (take_changes)
        self.just_retired: list[TrackedFile] = []  # closed during the last poll
        # Generations that ended in a copytruncate during the last poll: their lines now live
        # in the copy, where a resume finds them (by fingerprint) while a request needs them.
        self.just_truncated: list[FileCheckpoint] = []

    # -- restore -------------------------------------------------------------------------

    def restore(self, files: list[FileCheckpoint], next_generation: dict[str, int],
                saved_at: float | None = None,
                heads: dict[str, tuple[bool, list[tuple[int, str]]]] | None = None,
                listings: dict[str, list[str]] | None = None) -> None:
        """Resume from checkpoints. A file no longer at its path is looked for among its
        rotated siblings (`<path>.*`, `<path>-*`, gzipped too) by fingerprint; the siblings
        rotated after it are read next, oldest first, before the file at the path now: two
        rotations while the agent was down lose nothing. `heads`: the known heads per path
        (`known_heads`), which tell those siblings exactly; a checkpoint from before they were
        kept falls back to the plain siblings written since `saved_at`, its time. `listings`:
        the directories' names at the last look before the save (`listings`): the first look
        after the restore compares with them as with a look of this run, so a file whose name
        was not there then (a container that started, rotated and was gzipped while the agent
        was down) is new, every file rotated from it read, gzipped or not."""
        self._next_gen.update(next_generation)
        self._restored_at = saved_at
        for d, names in (listings or {}).items():
            self._listings[d] = (-2, names)  # no mtime matches: listed again, `_previous` gets these
        for path, (complete, known) in (heads or {}).items():
            self._known[path] = dict.fromkeys(known)
            if complete:
                self._exact.add(path)
        for ck in files:
            if self._matches(ck.path, ck):
                if any(fnmatch.fnmatch(ck.path, p) for p in self.filters.include):
                    self._resume[ck.path] = ck  # opened when discovery finds it there
                else:  # a rotated file, read from where it was (discovery never lists it)
                    self._open(ck.path, source_for(ck.path), ck.generation, ck.offset, detached=True)
                continue
            self._find_rotated(ck)
            if saved_at is not None and any(fnmatch.fnmatch(ck.path, p) for p in self.filters.include):
                self._rotated_while_down[ck.path] = min(saved_at, self._rotated_while_down.get(ck.path, saved_at))

    def _find_rotated(self, ck: FileCheckpoint) -> None:
        """Open the file a checkpoint names among its rotated siblings (by fingerprint): first
        `<path>.*`, then any file of its directory, as a rotation that numbers its files shifts
        a rotated one on (`0.log.1` is `0.log.2` after the next rotation)."""
        first = siblings(ck.path)
        taken = {t.path for t in self.files}
        rest = sorted(p for p in glob.glob(os.path.join(glob.escape(os.path.dirname(ck.path)), "*"))
                      if p != ck.path and p not in first and p not in taken and os.path.isfile(p)
                      and not any(fnmatch.fnmatch(p, inc) for inc in self.filters.include))  # a live file
        for sibling in first + rest:
            if self._matches(sibling, ck):
                self._open(sibling, source_for(ck.path), ck.generation, ck.offset, detached=True)
                return
        self.stats.count(self.stats.errors, "lost")  # rotated away and gone while we were down

    @staticmethod
    def _matches(path: str, ck: FileCheckpoint) -> bool:
        try:
            head = read_head(path, ck.fingerprint_len)
        except OSError:
            return False
        if len(head) != ck.fingerprint_len or fingerprint(head) != ck.fingerprint:
            return False
        # And the bytes before where it was read to are still ours (not a rewrite in place
        # that kept the first bytes); a `.gz` is not decompressed that far for it.
        try:
            return path.endswith(".gz") or _tail_matches(path, ck.tail_fingerprint, ck.tail_end)
        except OSError:
            return False

    # -- discovery -----------------------------------------------------------------------

    def discover(self, first_round: bool = False) -> None:
        looked_at = time.time()
        self._previous = {}
        found: set[str] = set()
        denied: list[tuple[str, OSError]] = []
        accepted: list[tuple[str, Source]] = []
        now = self._clock()
        tried: set[str] = set()  # directories in backoff tried again this look

        def due(d: str) -> bool:
            if d not in self._retry:
                return True
            if now < self._retry[d][1]:
                return False
            tried.add(d)
            return True

        for pattern in self.filters.include:
            for path, changed in expand(pattern, self.stats, self._listings, denied, due, self._previous):
                path = os.path.abspath(path)
                if path in found:
                    continue
                if path in self._retry and path not in self._by_path and now < self._retry[path][1]:
                    continue  # failed before: its next try is not due yet
                if not changed and path in self._by_path:
                    found.add(path)  # its directory is as it was: same file, nothing to look at
                    continue
                known = self._judged.get(path)
                if known is None:
                    if len(self._judged) > 100_000:
                        self._judged.clear()
                    source = source_for(path)
                    known = self._judged[path] = (source, self.filters.accepts(path, source))
                source, ok = known
                if ok and self._admit is not None and self._held(path, source):
                    continue
                if ok:
                    found.add(path)
                    accepted.append((path, source))
                else:
                    self._skip(path, "filter", self.filters.refusal(path, source) or "filtered", source)
        # A file reached by two names (kubelet's /var/log/containers symlink and its real path
        # under /var/log/pods) is followed once, by the real one when both are new. A stream's
        # files in the order they were written (`0.log` before `1.log`), whatever order the
        # directory lists them in: new ones are numbered (generations) as they are seen.
        for path, source in sorted(accepted, key=lambda a: (os.path.islink(a[0]), live_order(a[0]))):
            try:
                self._see(path, source, first_round)
            except OSError as exc:  # nothing one entry does stops the agent: skipped, tried again later
                self._failed(path, exc, source)
        failed_dirs = set()
        for d, exc in denied:
            failed_dirs.add(d)
            self._failed(os.path.abspath(d), exc, directory=True)
        for d in tried - failed_dirs:
            self._recovered(os.path.abspath(d))
        for path, tf in list(self._by_path.items()):
            if path not in found:  # deleted or renamed away: read what is left, then retire
                tf.detached = True
                del self._by_path[path]
                gone = not os.path.exists(path)
                self.stats.count(self.stats.rotations, "deleted" if gone else "excluded")
                self.changes.append(Discovery("released", path, "deleted or renamed away: read to its end, then "
                                              "closed" if gone else "no longer matches the filters",
                                              source=tf.source.key))
        self._last_look = looked_at
        gone = [p for p in self._rotated_while_down if p not in found]  # its pod went while we were down
        for p in gone:
            del self._rotated_while_down[p]
        self._forget(gone)
        if looked_at - self._pruned_at >= 60:  # a pod whose file went first and directory later
            self._pruned_at = looked_at
            self._forget([p for p in self._known if p not in found])

    def _held(self, path: str, source: Source) -> bool:
        """Whether `admit` holds back a file the filters accept. Never asked of a file followed
        or to be resumed, nor of a container with a file followed: it was admitted once."""
        if path in self._by_path or path in self._resume or path in self._rotated_while_down \
                or any(tf.source.key == source.key for tf in self.files):
            return False
        if path not in self._exact and path not in self._known:
            self._know_history(path)
        verdict = self._admit(path, source)
        if verdict is None:
            return False
        self._skip(path, verdict[0], verdict[1], source)
        return True

    def _know_history(self, path: str) -> None:
        """A held path at first sight: its rotated files are known (history), but for those a
        file followed at once would catch up (`_catch_missed`: plain ones written since the last
        look; every one, gzipped or not, when the directory listed at our last look did not hold
        the path: `_new_since_last_look`, as `_see` asks). Its heads are then complete: once
        admitted, `_see` reads every rotated file not known, those rotated while it was held
        included, gzipped or not."""
        since = self._restored_at if self._last_look is None else self._last_look
        history = self._new_since_last_look(path) if since is not None else None
        found = siblings(path)
        for sibling in found:
            try:
                if history is not None:
                    if os.path.basename(sibling) not in history:
                        continue  # rotated from a path that came after our last look: new
                elif since is not None and not sibling.endswith(".gz") and os.stat(sibling).st_mtime >= since:
                    continue
                head = read_head(sibling)
            except OSError:
                continue
            if head:
                self._know(path, (len(head), fingerprint(head)))
        if len(found) < _KNOWN_PER_PATH and path not in self._overflowed:
            self._exact.add(path)

    def _skip(self, path: str, kind: str, why: str, source: Source | None = None) -> None:
        """Remember (and report once) a candidate not followed, and why."""
        if self.skipped.get(path) == (kind, why):
            return
        if len(self.skipped) > 100_000:
            self.skipped.clear()
        self.skipped[path] = (kind, why)
        self.changes.append(Discovery("skipped", path, why, kind, source.key if source else ""))

    def _failed(self, path: str, exc: OSError, source: Source | None = None, directory: bool = False) -> None:
        """An entry that could not be read: reported once (a `skipped` change and one count in
        `errors` by reason), then tried again after RETRY_FIRST_S, doubling up to RETRY_MAX_S."""
        kind, reason, why = file_error(exc)
        n, _ = self._retry.get(path, (0, 0.0))
        if n == 0:
            self.stats.count(self.stats.errors, reason)
        self._retry[path] = (n + 1, self._clock() + min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(n, 20)))
        if len(self._retry) > 100_000:
            self._retry.clear()
        self._skip(path, kind, ("directory " if directory else "") + why + "; tried again later, with backoff",
                   source)

    def _recovered(self, path: str) -> None:
        if self._retry.pop(path, None) is not None:
            self.skipped.pop(path, None)

    def take_changes(self) -> list[Discovery]:
        """What was followed, skipped or released since the last call (the agent logs it)."""
        out, self.changes = self.changes, []
        return out

    def skipped_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {"filter": 0, "unreadable": 0, "loop": 0, "not_a_file": 0, "duplicate": 0}
        for kind, _ in self.skipped.values():
            out[kind] = out.get(kind, 0) + 1
        return out

    def _see(self, path: str, source: Source, first_round: bool) -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.stats.count(self.stats.errors, "vanished")
            return
        if not stat.S_ISREG(st.st_mode):
            self._skip(path, "not_a_file", "not a regular file (a directory matched the include glob?)", source)
            return
        tf = self._by_path.get(path)
        renamed_since = None  # renamed away: what came and went since its last write
        if tf is not None:
            if tf.inode == st.st_ino:
                return
            tf.detached = True  # renamed away; a new file took the name
            self.stats.count(self.stats.rotations, "rename")
            del self._by_path[path]
            try:
                renamed_since = os.fstat(tf.fh.fileno()).st_mtime
            except (OSError, ValueError, AttributeError):  # AttributeError: parked, no descriptor
                pass
        if tf is None:
            twin = self._same_file(path, st)
            if twin is not None:
                self._skip(path, "duplicate", f"the same file as {twin} (another name for it): followed once, "
                                              "by that name", source)
                return
        ck = self._resume.pop(path, None)
        if ck is not None:
            if ck.inode == st.st_ino and st.st_size >= ck.offset and self._matches(path, ck):
                tf = self._by_path_open(path, source, ck.generation, ck.offset)
                if tf is None:
                    self._resume[path] = ck  # not opened now (permission, no descriptor): kept for the next try
                    return
                if ck.tail_end >= ck.offset:  # what it was read to: a rewrite before the next read shows
                    tf.tail_fp, tf.tail_end = ck.tail_fingerprint, ck.tail_end
                self._know_siblings(path)  # not rotated while we were down: nothing there is new
                return
            # Rotated (renamed or copied and truncated) between the restore and this look:
            # the checkpointed file is a sibling now; what is at the path is a new generation.
            self._find_rotated(ck)
        # One catch-up of the files that came and went at this name, from the earliest time
        # anything can have been missed: rotated while we were down (the checkpoint's time);
        # renamed away under us (its last write); a name with complete heads (any time: the
        # heads tell); a name never seen (our last look, or on a restart the checkpoint's
        # time: a pod that started and rotated while we were down).
        since = self._rotated_while_down.pop(path, None)
        if since is None:
            since = renamed_since
        if since is None and ck is None:
            since = 0.0 if path in self._exact else (self._restored_at if self._last_look is None
                                                     else self._last_look)
        history = self._new_since_last_look(path) if since is not None and path not in self._exact else None
        if history is not None:  # it and all rotated from it came since: every one is new
            self._catch_missed(path, source, 0.0, history)
        elif since is not None:
            self._catch_missed(path, source, since)
        self._know_siblings(path)
        offset, note = 0, ""
        if first_round and ck is None:
            if self._start_at_end:
                offset = st.st_size
            elif self._history is not None:
                offset, note = self._history_start(path, st)
        self._by_path_open(path, source, self._new_generation(source), offset, note)

    def _history_start(self, path: str, st: os.stat_result) -> tuple[int, str]:
        """Where a first start begins a file that was there before it, and the note to log.
        A file last written longer than the age bound ago is started at its end; a longer one
        than the bytes bound at the first line that starts within its last `bytes` (a line is
        never read from its middle). Cost: one stat and at most MAX_LINE_BYTES read per file.
        A `.gz` file is bounded by age only (its size is not what it holds)."""
        max_bytes, max_age = self._history
        if max_age and time.time() - st.st_mtime > max_age:
            if st.st_size:
                self.stats.history_skipped += st.st_size
                return st.st_size, f"first start: last written {time.time() - st.st_mtime:.0f} s ago, before " \
                                   f"history_age ({max_age:g} s): started at its end, {st.st_size} bytes not read"
            return 0, ""
        if not max_bytes or st.st_size <= max_bytes or path.endswith(".gz"):
            return 0, ""
        start = st.st_size - max_bytes
        with open(path, "rb") as fh:
            at = start
            while at < st.st_size and at - start < MAX_LINE_BYTES:
                block = os.pread(fh.fileno(), min(1 << 16, st.st_size - at + 1), at - 1)
                nl = block.find(b"\n")
                if nl >= 0:
                    at += nl
                    break
                if not block:
                    break
                at += len(block)
            else:
                at = st.st_size  # no line starts in the window (one line longer than it): nothing old
        self.stats.history_skipped += at
        return at, f"first start: the last {st.st_size - at} of {st.st_size} bytes read (history_bytes " \
                   f"{max_bytes}); {at} older bytes not read"

    def _same_file(self, path: str, st: os.stat_result) -> str | None:
        """The name a followed file is read by, if `path` is another name for it."""
        for other, tf in self._by_path.items():
            if tf.inode == st.st_ino and other != path:
                try:
                    if tf.fh is None or os.path.samestat(os.fstat(tf.fh.fileno()), st):
                        return other
                except (OSError, ValueError):
                    continue
        return None

    def _new_since_last_look(self, path: str) -> set[str] | None:
        """The names in `path`'s directory at our last look, when `path` was not one of them (a
        container's restart, `1.log`, that kubelet rotated and gzipped before we looked), or
        none when the directory itself (or one above it) was not there then (a new pod's): so
        the file there and every file rotated from it since came after that look. None when
        that is not known (nothing above it listed before, or the name there already)."""
        if os.path.islink(path):  # a symlink's rotated files are elsewhere
            return None
        d, name = os.path.split(path)
        names: set[str] | None = None  # the path's own directory's names at the last look
        while True:
            before = self._previous.get(d)
            if before is not None:
                if name in before:
                    return None
                return set(before) if names is None else names
            if names is None:
                names = set()  # not listed before: a new directory, if one above says so
            parent, name = os.path.split(d)
            if parent == d or not name:
                return None
            d = parent

    def _catch_missed(self, path: str, source: Source, since: float, history: set[str] | None = None) -> None:
        """Files that took the name and were rotated away again between two looks (or while
        the agent was down): rotated siblings never read, oldest first (`rotation_order`).
        Where the path's known heads are complete (`_exact`: it was seen here from its start,
        or the checkpoint kept them), that is every sibling whose head is not known, `.gz` or
        not. Otherwise (a name first seen now, a checkpoint from before the heads were kept)
        only plain siblings written since `since` (our last look, or the checkpoint's time):
        kubelet gzips the file it rotated before at its next rotation, which makes a file read
        long ago look new when nothing says it was read. `history`: the names the directory held
        at our last look, when the path was not one of them; every other sibling is new."""
        exact = path in self._exact or history is not None
        open_inodes = {t.inode for t in self.files if not t.path.endswith(".gz")}
        candidates = []
        for sibling in siblings(path):
            if (sibling.endswith(".gz") and not exact) or (history and os.path.basename(sibling) in history):
                continue
            try:
                st = os.stat(sibling)
                if (not exact and st.st_mtime < since) or st.st_ino in open_inodes:
                    continue
                head = read_head(sibling)
            except OSError:
                continue
            if head and not self._is_known(head):
                candidates.append((rotation_order(path, sibling, st.st_mtime), sibling, head))
        # One file under two names: `0.log.1` and the `0.log.1.gz` gzip is writing (or has just
        # written, before it removes the plain one). The plain one is whole; read it once.
        plain_heads = {head for _, sibling, head in candidates if not sibling.endswith(".gz")}
        candidates = [c for c in candidates if not (c[1].endswith(".gz") and c[2] in plain_heads)]
        for _, sibling, _ in sorted(candidates):
            self.stats.count(self.stats.rotations, "caught_up")
            self._open(sibling, source, self._new_generation(source), 0, detached=True)

    def _is_known(self, head: bytes) -> bool:
        """Known at any path: a sibling resumed by its rotated name, or a file renamed from
        one followed path to another, is known where it was opened."""
        key = (len(head), fingerprint(head))
        if any(key in known for known in self._known.values()):
            return True
        lengths = {n for known in self._known.values() for n, _ in known if n < len(head)}
        for n in lengths:  # known while it was shorter: it has grown since
            key = (n, fingerprint(head[:n]))
            if any(key in known for known in self._known.values()):
                return True
        return False

    def _know(self, path: str, head: tuple[int, str]) -> None:
        known = self._known.setdefault(path, {})
        known.pop(head, None)
        known[head] = None
        if len(known) > _KNOWN_PER_PATH:
            del known[next(iter(known))]
            # No longer complete, and never again: the head let go may be a file still there,
            # which would then look unread. The path keeps the rule of a name without heads.
            self._exact.discard(path)
            self._overflowed.add(path)

    def _know_siblings(self, path: str) -> None:
        """Every rotated sibling at `path` now is one we read or chose not to read: known, so
        that from here on a sibling not known is one that came and went between two looks."""
        found = siblings(path)
        for sibling in found:
            try:
                head = read_head(sibling)
            except OSError:
                continue
            if head:
                self._know(path, (len(head), fingerprint(head)))
        if len(found) < _KNOWN_PER_PATH and path not in self._overflowed:  # room for them and the file at the path
            self._exact.add(path)

    def listings(self) -> dict[str, list[str]]:
        """The names each listed directory held at the last look (the checkpoint keeps them, for
        `restore`); none past _LISTED_NAMES_KEPT names, a node's worth, to keep the file small."""
        out, total = {}, 0
        for d, (_, names) in self._listings.items():
            total += len(names)
            if total > _LISTED_NAMES_KEPT:
                return {}
            out[d] = names
        return out

    def known_heads(self) -> dict[str, tuple[bool, list[tuple[int, str]]]]:
        """Per path, whether its known heads are complete, and the heads (the checkpoint keeps them)."""
        return {p: (p in self._exact, list(known)) for p, known in self._known.items() if known}

    def _forget(self, paths) -> None:
        """Drop the known heads of paths no longer followed, read or awaited, in a directory
        that is gone (a deleted pod's)."""
        live = set(self._by_path) | set(self._resume) | set(self._rotated_while_down)
        live.update(tf.source.path for tf in self.files)
        for p in paths:
            # A name between two files (renamed away, the next not there yet) keeps what is
            # known of it: its directory is still there.
            if p not in live and not os.path.isdir(os.path.dirname(p)):
                self._known.pop(p, None)
                self._exact.discard(p)
                self._overflowed.discard(p)

    def _new_generation(self, source: Source) -> int:
        gen = self._next_gen.get(source.key, 0)
        self._next_gen[source.key] = gen + 1
        return gen

    def _by_path_open(self, path: str, source: Source, generation: int, offset: int,
                      history: str = "") -> TrackedFile | None:
        tf = self._open(path, source, generation, offset, detached=False)
        if tf is not None:
            self._by_path[path] = tf
            note = "" if "k8s.pod.name" in source.resource or any(
                fnmatch.fnmatch(path, p) for p in self.filters.gateway) else _NOT_KUBELET
            note = "; ".join(n for n in (note, history) if n)
            self.changes.append(Discovery("followed", path, note, source=source.key))
        return tf

    def _open(self, path: str, source: Source, generation: int, offset: int, detached: bool) -> TrackedFile | None:
        self._make_room()
        fh = None
        try:
            fh = _open(path)
            inode = os.fstat(fh.fileno()).st_ino
            if offset:
                fh.seek(offset)
        except (OSError, EOFError, zlib.error) as exc:
            if fh is not None:
                fh.close()
            if not isinstance(exc, OSError):
                exc = OSError(errno.EIO, str(exc))
            return self._open_failed(path, exc, source)
        self._retry.pop(path, None)
        self.skipped.pop(path, None)
        self._next_gen[source.key] = max(self._next_gen.get(source.key, 0), generation + 1)
        tf = TrackedFile(path, source, generation, fh, inode, offset)
        tf.detached = detached
        tf.active_at = self._clock()
        tf.refresh_fingerprint()
        self._remember(tf)
        self.files.append(tf)
        self.open_count += 1
        self.stats.files_opened += 1
        return tf

    # -- the descriptor budget -----------------------------------------------------------

    def _make_room(self) -> None:
        """Below the budget, park the files idle longest: first those read to their end and
        unchanged since, then any followed plain file (a gzip file or a detached one, being
        read to its end, keeps its descriptor). A batch at a time, so an open is not a sort."""
        if self.open_count < self.max_open:
            return
        want = self.open_count - self.max_open + 1 + max(1, self.max_open // 16)
        # Never, during a poll, one read in it: the caller has yet to take its lines (and mtime).
        now = self._poll_started
        open_ = [t for t in self.files if t.fh is not None and not t.done and not t.detached
                 and not t.path.endswith(".gz") and not (now is not None and t.active_at >= now)]
        open_.sort(key=lambda t: (t.seen is None, t.active_at))
        for tf in open_[:want]:
            tf.park()
            self.open_count -= 1
            self.stats.files_parked += 1

    def _unpark(self, tf: TrackedFile) -> bool:
        """Reopen a parked file by identity: at its path if the inode and the first bytes are
        still its own, else among its rotated siblings (renamed while parked). False when it
        has not changed since it was parked (no descriptor taken) or cannot be opened now."""
        candidates = [] if tf.detached else [tf.path]
        try:
            st = os.stat(tf.path) if not tf.detached else None
        except OSError:
            st = None
        if st is not None and st.st_ino == tf.inode:
            if tf.seen is not None and (st.st_size, st.st_mtime_ns) == tf.seen:
                # As it was by size and mtime: keep it closed, unless its content says otherwise.
                if not (self._rewrite_check_due(tf, self._clock()) and self._parked_rewritten(tf)):
                    return False
        else:
            candidates = siblings(tf.path)
        for path in candidates:
            try:
                if os.stat(path).st_ino != tf.inode:
                    continue
                self._make_room()
                if self.open_count >= self.max_open:
                    return False  # every descriptor is on a file read in this round: next round
                fh = open(path, "rb")
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self.stats.count(self.stats.errors, "fd_limit")
                    return False
                continue
            try:
                # At its path the inode is enough (a copytruncate while parked is found by the
                # truncation check after); a sibling must also start with its first bytes.
                same = os.fstat(fh.fileno()).st_ino == tf.inode and (
                    path == tf.path or not tf.fp_len or fingerprint(os.pread(fh.fileno(), tf.fp_len, 0)) == tf.fp)
                if same:
                    fh.seek(tf.offset + len(tf.partial))
            except OSError:
                same = False
            if not same:
                fh.close()
                continue
            tf.fh = fh
            self.open_count += 1
            self.stats.files_reopened += 1
            if path != tf.path:  # rotated away while parked: its rest is read, the path's new file is discovered
                tf.detached = True
                if self._by_path.get(tf.path) is tf:
                    del self._by_path[tf.path]
                self.stats.count(self.stats.rotations, "rename")
            return True
        # Gone while parked (deleted, or rotated out of reach): what it held past our place is lost.
        self.stats.count(self.stats.errors, "lost")
        if self._by_path.get(tf.path) is tf:
            del self._by_path[tf.path]
        tf.done = True
        return False

    def _parked_rewritten(self, tf: TrackedFile) -> bool:
        """`_rewritten` for a parked file: a descriptor for the check only, closed at once."""
        try:
            fd = os.open(tf.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_ino != tf.inode or tf.same_content(fd):
                return False
        finally:
            os.close(fd)
        self.stats.count(self.stats.rotations, "rewrite")
        self._restart(tf)
        return True

    def _open_failed(self, path: str, exc: OSError, source: Source) -> None:
        if isinstance(exc, FileNotFoundError):
            self.stats.count(self.stats.errors, "vanished")
        else:  # permission, a loop, no descriptor left, I/O: reported once, tried again with backoff
            self._failed(path, exc, source)

    def _remember(self, tf: TrackedFile) -> None:
        if tf.fp_len:
            self._know(tf.source.path, (tf.fp_len, tf.fp))

    # -- reading -------------------------------------------------------------------------

    def _check_truncation(self, tf: TrackedFile) -> list[tuple[int, bytes]]:
        """Lines still to read from the copy if the file was copied and truncated, else []."""
        size = tf.size()
        if size is None:
            return []
        grown = size >= tf.offset + len(tf.partial)
        if grown:
            # Not smaller, but it may have been truncated and refilled, or rewritten in place,
            # since we last looked: the first bytes and the bytes before our place tell.
            if not tf.fp_len or tf.offset == 0:
                return []
            if tf.same_content(tf.fh.fileno()):
                return []
        # Shrunk under us (or rewritten). A copy with our content holds what we had not read yet.
        copy = None
        for sibling in siblings(tf.path):
            try:
                # (a `.gz` copy, compressed at once, is smaller than what it holds)
                if (sibling.endswith(".gz") or os.path.getsize(sibling) >= tf.offset) \
                        and fingerprint(read_head(sibling, tf.fp_len)) == tf.fp \
                        and (sibling.endswith(".gz") or _tail_matches(sibling, tf.tail_fp, tf.tail_end)):
                    copy = sibling
                    break
            except OSError:
                continue
        lines: list[tuple[int, bytes]] = []
        if copy is not None:
            # Read the copy's tail as the same stream (same generation, same decoder), so
            # lines keep their order: the copy's tail comes before the refilled file.
            live = tf.fh
            try:
                with _open(copy) as fh:
                    fh.seek(tf.offset + len(tf.partial))
                    tf.fh = fh
                    lines = tf.read(1 << 62, self.stats) + tf.flush_partial()
            except (OSError, EOFError, zlib.error):
                self.stats.count(self.stats.errors, "io")
            finally:
                tf.fh = live
            self.stats.count(self.stats.rotations, "copytruncate")
            self.just_truncated.append(FileCheckpoint(tf.path, tf.source.key, tf.generation, 0, tf.fp, tf.fp_len,
                                                      tf.offset, tf.tail_fp, tf.tail_end))
        else:  # not smaller: other content (refilled after a truncation, or rewritten in place)
            self.stats.count(self.stats.rotations, "rewrite" if grown else "truncate")
        self._restart(tf)
        return lines

    def _restart(self, tf: TrackedFile) -> None:
        """The file at our descriptor holds other content now: a new generation, from its start."""
        tf.generation = self._new_generation(tf.source)
        tf.base = tf.generation << GEN_SHIFT
        tf.offset, tf.partial, tf.fp, tf.fp_len = 0, b"", "", 0
        tf.tail_fp, tf.tail_end, tf.seen, tf.cut = "", 0, None, False
        if tf.fh is not None:
            tf.fh.seek(0)

    def _rewrite_check_due(self, tf: TrackedFile, now: float) -> bool:
        """Whether an unchanged (size, mtime) file gets its content checked this round."""
        if self._checks_left <= 0 or now - tf.checked_at < REWRITE_CHECK_S or not (tf.fp_len or tf.tail_fp):
            return False
        self._checks_left -= 1
        tf.checked_at = now
        return True

    def _rewritten(self, tf: TrackedFile) -> bool:
        """An in-place rewrite that kept the size and the mtime: counted, and the file read
        again from its start as a new generation (what it held before was read already)."""
        if tf.same_content(tf.fh.fileno()):
            return False
        self.stats.count(self.stats.rotations, "rewrite")
        self._restart(tf)
        return True

    def poll(self) -> list[tuple[TrackedFile, list[tuple[int, bytes]]]]:
        """One fair round: up to `read_chunk` bytes from each file. A source's files are read
        in generation order, a newer one only once the older ones (rotated, or a restart's
        `0.log` before its `1.log`) are read to their end: its lines reach assemble in the
        order they were written, as `replay` reads them."""
        out = []
        now = self._poll_started = self._clock()
        self._checks_left = REWRITE_CHECKS
        self.just_truncated = []
        behind: set[str] = set()  # sources with an older generation still being read
        for tf in self.files if len(self.files) < 2 else sorted(self.files, key=_generation):
            if tf.source.key in behind:
                continue
            if tf.fh is None and not tf.done and not self._unpark(tf):
                continue  # parked and unchanged (or not reopened now): nothing to read
            sig = tf.signature()
            if sig is not None and sig == tf.seen and not (
                    not tf.detached and self._rewrite_check_due(tf, now) and self._rewritten(tf)):
                lines = []  # unchanged since we read it to the end: one fstat (now and then two preads)
            else:
                early = self._check_truncation(tf) if not tf.detached else []
                try:
                    lines = early + tf.read(self._read_chunk, self.stats)
                except OSError:
                    self.stats.count(self.stats.errors, "io")
                    lines = []
                except (EOFError, zlib.error):  # a damaged or cut gzip file: what it held up to there
                    self.stats.count(self.stats.errors, "damaged_gzip")
                    lines = early + tf.flush_partial()
                    tf.close()
                tf.seen = sig if tf.at_eof else None
                if tf.seen is not None and tf.fh is not None:
                    tf.note_tail()
            if tf.fp_len < FINGERPRINT_BYTES and lines:
                tf.refresh_fingerprint()
                if tf.fp_len >= FINGERPRINT_BYTES:
                    self._remember(tf)
            if not tf.at_eof and not tf.done:  # a rotated file, or a restart's (0.log before 1.log)
                behind.add(tf.source.key)
            if lines:
                tf.quiet_since = None
                tf.active_at = now
            elif tf.detached:
                if tf.quiet_since is None:
                    tf.quiet_since = now
                elif now - tf.quiet_since >= RETIRE_AFTER_S or tf.path.endswith(".gz"):
                    lines = tf.flush_partial()
                    tf.close()
            if lines:
                out.append((tf, lines))
        self.just_retired = [tf for tf in self.files if tf.done]
        if self.just_retired:
            self.files = [tf for tf in self.files if not tf.done]
            self.open_count = sum(1 for tf in self.files if tf.fh is not None)
            self.stats.files_retired += len(self.just_retired)
            self._forget({tf.source.path for tf in self.just_retired})
        self._poll_started = None
        return out

    def behind(self) -> dict[str, int]:
        """Bytes written but not read yet, per file path."""
        out = {}
        for tf in self.files:
            size = tf.size()
            if size is not None:
                out[tf.path] = max(0, size - tf.offset)
        return out

    def unread(self) -> dict[str, int]:
        """Bytes of each followed log not read yet, by its live path: what is left of the files
        being read (`behind`) and of every file rotated from the path after the oldest of them,
        `.gz` ones by the size their gzip trailer states, and the file at the path now if it is
        not followed yet. While the agent is held back (a collector outage: the export queue
        full, reading paused, no look for files) those are the rotations it has not reached,
        which `behind` cannot see. Read from another thread (the scrape): works on snapshots.
        Cost: a stat per followed path; a listing of its rotated files (and 256 bytes of each
        `.gz` one) only where a file being read was rotated away."""
        by_live: dict[str, list[TrackedFile]] = {}
        for tf in list(self.files):
            by_live.setdefault(live_path(tf.source.path), []).append(tf)
        out = {}
        for live, tracked in by_live.items():
            total = 0
            for tf in tracked:
                size = tf.size() if not tf.path.endswith(".gz") else _gzip_size(tf.path)
                if size is not None:
                    total += max(0, size - tf.offset)
            try:
                at_path = os.stat(live)
            except OSError:
                at_path = None
            following = at_path is not None and any(
                not tf.detached and tf.inode == at_path.st_ino for tf in tracked)
            if not following:  # a file being read was rotated away: the ones after it are unread
                total += _rotated_unread(live, tracked, at_path)
            out[live] = total
        return out

    def awaiting_resume(self) -> list[FileCheckpoint]:
        """Checkpoints of files not found at their path again yet (kept as they were)."""
        return list(self._resume.values())

    def next_generations(self) -> dict[str, int]:
        return dict(self._next_gen)

    def close(self) -> None:
        for tf in self.files:
            tf.close()
        self.open_count = 0
