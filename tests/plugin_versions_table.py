"""Which of the plugin's hook points each vLLM release has, read from that release's own wheel.

    python tests/plugin_versions_table.py                 # the markdown table (docs/plugin.md)
    python tests/plugin_versions_table.py --write docs/plugin.md   # replace the table there
    python tests/plugin_versions_table.py --latest        # the newest patch of each minor on PyPI now

A vLLM wheel is 300-500 MB; the check needs a handful of its files. A wheel is a zip and the
file host answers HTTP Range requests, so this reads the zip's central directory from the end
of the file and then only the members asked for (zipfile over a seekable remote file; each
member's CRC is checked by zipfile). The files are cached under
~/.cache/vllm-trace-bridge/wheels-src/<version>/ with the wheel's member list, so a second run
needs no network. Standard library only.

Generic over the plugin's design: the columns are whatever `hooks.HOOK_POINTS` names when this
runs, the cells and the names whatever `hooks.source_report` finds (an older name the plugin
also wraps shows as `as <name>`), and the two verdicts follow the sides install() gates on:
the default mode (the API server's hook points) and the engine lines (the engine core's).
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: The releases in docs/plugin.md: the newest patch of each minor from 0.10 on, as PyPI had them
#: on 2026-12-03 (`--latest` lists today's). Pinned so the table and its cache do not move.
RELEASES = ("0.10.2", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1", "0.18.1",
            "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1",
            "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")

INDEX = os.environ.get("VLLM_TRACE_BRIDGE_PYPI", "https://pypi.org").rstrip("/")
CACHE = Path(os.environ.get("VLLM_TRACE_BRIDGE_WHEELS_SRC",
                            Path.home() / ".cache" / "vllm-trace-bridge" / "wheels-src"))
_MANIFEST = ".wheel.json"
_FINAL = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?")
_TABLE_START = "<!-- versions-table: python tests/plugin_versions_table.py --write docs/plugin.md -->"
_TABLE_END = "<!-- /versions-table -->"


class NotCached(LookupError):
    """Offline, and the file is not in the cache."""


class RangeUnsupported(RuntimeError):
    """The host answered a Range request with something else (not an OSError: zipfile would
    turn that into "not a zip file")."""


# -- PyPI ---------------------------------------------------------------------------------------

def _get(url: str, headers: dict | None = None, timeout: float = 60,
         expect: int | None = None) -> tuple[int, dict, bytes]:
    """One GET, retried twice on a transport error (the host closes every connection). With
    `expect`, another status is RangeUnsupported, raised before the body is read."""
    for attempt in range(3):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
                if expect is not None and r.status != expect:
                    raise RangeUnsupported(f"{url}: the host ignored the Range request (HTTP {r.status})")
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == 2:
                raise
            time.sleep(1 + attempt)
        except OSError:
            if attempt == 2:
                raise
            time.sleep(1 + attempt)
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=4)
def _project(package: str, index: str) -> tuple[str, dict]:
    """(its URL, PyPI's JSON for the project): every release's files (one request per run)."""
    api = f"{index}/pypi/{package}/json"
    return api, json.loads(_get(api)[2])


def latest_per_minor(first_minor: int = 10, package: str = "vllm", index: str = INDEX) -> list[str]:
    """The newest final release of each 0.<minor> from `first_minor` on that has a wheel."""
    best: dict[tuple[int, int], tuple[tuple[int, ...], str]] = {}
    for version, files in _project(package, index)[1]["releases"].items():
        m = _FINAL.fullmatch(version)
        if not m or not any(f["filename"].endswith(".whl") and not f.get("yanked") for f in files):
            continue
        key = tuple(int(g or 0) for g in m.groups())
        if key[0] == 0 and key[1] < first_minor:
            continue
        if key[:2] not in best or best[key[:2]][0] < key:
            best[key[:2]] = (key, version)
    return [v for _, (_, v) in sorted(best.items())]


def wheel_url(version: str, package: str = "vllm", index: str = INDEX) -> tuple[str, str, int]:
    """(url, filename, size) of one wheel of that release (an x86_64 one when there is; the
    Python source is the same in every platform's wheel)."""
    api, project = _project(package, index)
    wheels = [f for f in project["releases"].get(version, ())
              if f["filename"].endswith(".whl") and not f.get("yanked")]
    if not wheels:
        raise LookupError(f"{package} {version} has no wheel on {index}")
    wheels.sort(key=lambda f: ("x86_64" not in f["filename"], f["filename"]))
    f = wheels[0]
    return urllib.parse.urljoin(api, f["url"]), f["filename"], int(f["size"])


class RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a file behind HTTP Range requests, fetched in aligned
    blocks and kept in memory (zipfile reads the end record, then the central directory, then
    each member's header and data: a few requests per member)."""

    BLOCK = 256 * 1024

    def __init__(self, url: str, size: int) -> None:
        super().__init__()
        self.url, self.size, self.pos = url, size, 0
        self.blocks: dict[int, bytes] = {}
        self.requests = 0
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        first, last = self.pos // self.BLOCK, (self.pos + n - 1) // self.BLOCK
        missing = [b for b in range(first, last + 1) if b not in self.blocks]
        if missing:
            self._fetch(missing[0], missing[-1])
        data = b"".join(self.blocks[b] for b in range(first, last + 1))
        start = self.pos - first * self.BLOCK
        buf[:n] = data[start:start + n]
        self.pos += n
        return n

    def _fetch(self, first: int, last: int) -> None:
        lo, hi = first * self.BLOCK, min(self.size, (last + 1) * self.BLOCK) - 1
        _, headers, body = _get(self.url, {"Range": f"bytes={lo}-{hi}"}, expect=206)
        if not headers.get("content-range", "").startswith(f"bytes {lo}-") or len(body) != hi - lo + 1:
            raise RangeUnsupported(f"{self.url}: asked for bytes {lo}-{hi}, got {headers.get('content-range')} "
                                   f"and {len(body)} bytes")
        self.requests += 1
        self.fetched += len(body)
        for b in range(first, last + 1):
            off = b * self.BLOCK - lo
            self.blocks[b] = body[off:off + self.BLOCK]


# -- one release's source, cached ---------------------------------------------------------------

class ReleaseSource:
    """`read(path)`: a file of vLLM `version` as text, or None when the wheel has no such file.
    From the cache when it is there; else from the wheel over the network (unless `offline`,
    which raises NotCached)."""

    def __init__(self, version: str, cache: Path = CACHE, offline: bool = False, package: str = "vllm",
                 index: str = INDEX) -> None:
        self.version, self.package, self.offline, self.index = version, package, offline, index
        self.dir = cache / version
        self._zip: zipfile.ZipFile | None = None
        self._remote: RemoteFile | None = None
        self._members: set[str] | None = None
        self.wheel = ""
        manifest = self.dir / _MANIFEST
        if manifest.is_file():
            m = json.loads(manifest.read_text(encoding="utf-8"))
            self._members, self.wheel = set(m["members"]), m["wheel"]

    def _open(self) -> zipfile.ZipFile:
        if self._zip is None:
            if self.offline:
                raise NotCached(f"vLLM {self.version} is not cached in {self.dir}")
            url, self.wheel, size = wheel_url(self.version, self.package, self.index)
            self._remote = RemoteFile(url, size)
            self._zip = zipfile.ZipFile(self._remote)
            names = sorted(self._zip.namelist())
            self._members = set(names)
            self._write(self.dir / _MANIFEST, json.dumps({"wheel": self.wheel, "url": url, "members": names}))
        return self._zip

    def members(self) -> set[str]:
        if self._members is None:
            self._open()
        return self._members

    def read(self, path: str) -> str | None:
        if path.startswith("/") or ".." in path.split("/"):
            raise ValueError(path)
        local = self.dir / path
        if local.is_file() and self._members is not None:
            return local.read_text(encoding="utf-8")
        if path not in self.members():
            return None
        data = self._open().read(path)  # zipfile checks the member's CRC
        self._write(local, data)
        return data.decode("utf-8")

    @property
    def requests(self) -> int:
        return self._remote.requests if self._remote else 0

    @property
    def fetched(self) -> int:
        return self._remote.fetched if self._remote else 0

    def metadata_version(self) -> str | None:
        """The version the wheel's own METADATA states."""
        name = next((n for n in self.members() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        text = self.read(name) if name else None
        m = re.search(r"^Version:\s*(\S+)", text or "", re.M)
        return m[1] if m else None

    @staticmethod
    def _write(path: Path, data) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)


# -- the verdicts ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One release: a cell per hook point ('' there, 'as `<older name>`', 'missing', 'takes
    `(…)`', 'no file'), the run-time names it lacks, and what each side of the plugin gives
    there: `default` (the API server's line, the default mode) and `engine` (the engine core's
    lines, when asked for or when vLLM keeps no stats)."""

    version: str
    cells: tuple[str, ...]
    run_time: tuple[str, ...]
    default: str
    engine: str

    @property
    def installs(self) -> bool:
        return not self.default.startswith("nothing")

    @property
    def full(self) -> bool:
        return self.default == "every phase" and self.engine.startswith("all")


def hook_columns(hooks) -> list[str]:
    """A header per hook point: the method's name, `Class.method` where two classes share it."""
    names = [hp[2] for hp in hooks.HOOK_POINTS]
    return [hp[2] if names.count(hp[2]) == 1 else f"{hp[1]}.{hp[2]}" for hp in hooks.HOOK_POINTS]


def _cell(cell: str) -> str:
    if cell.startswith("("):
        takes = re.search(r"it takes (\(.*\))$", cell)
        return f"takes `{takes[1]}`" if takes else "other signature"
    return cell


def row(version: str, read, hooks) -> Row:
    """What `hooks.source_report(read)` says of that release, side by side, as hooks.install
    acts on it."""
    rep = hooks.source_report(read)
    run_time = []
    for path, name in rep.names:
        where = path.rsplit("/", 1)[-1]
        if name.startswith("("):
            run_time.append(f"{path} (no file)")
        else:
            run_time.append(f"`{name}` ({where})" + (": adapted" if name in hooks.ADAPTED else ""))
    return Row(version, tuple(map(_cell, rep.points)), tuple(run_time), _default(rep, hooks), _engine(rep, hooks))


def _names(items) -> str:
    return ", ".join(f"`{i}`" for i in items)


def _default(rep, hooks) -> str:
    """What the default mode's line has on that release (hooks.install, Frontend)."""
    gone = rep.lacking(hooks.API)
    points = [g for g in gone if ":" not in g]
    if points:
        return f"nothing: the plugin does nothing (one warning: no {_names(points)})"
    if gone:
        return f"partial: the API server's side switches off at the first use of {_names(gone)}"
    costs = [hooks.EXTRA_COST[g.split("(")[0]] for g in rep.lacking(hooks.EXTRA)]
    return "every phase" + "".join(f", {c}" for c in costs)


def _engine(rep, hooks) -> str:
    """What the engine core writes there when its lines are wanted (hooks._wrap)."""
    gone = rep.lacking(hooks.ENGINE)
    points = [g for g in gone if ":" not in g]
    if points:
        return f"none: no {_names(points)} (said once when they are wanted)"
    if gone:
        return f"partial: the engine core's side switches off at the first use of {_names(gone)}"
    how = rep.adapted(hooks.ENGINE)
    return "all" + (f" ({'; '.join(how)})" if how else "")


def traces(r: Row) -> str:
    """Both sides in one sentence (for a reader of one row)."""
    return f"default: {r.default}; engine lines: {r.engine}"


def table(rows: list[Row], hooks) -> str:
    cols = hook_columns(hooks)
    head = ["vLLM", *(f"`{c}`" for c in cols), "names read at run time", "traces (default: the API server's line)",
            "engine lines (`…_ENGINE=1`, or stats off)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [c or "✓" for c in r.cells]
        missing = "; ".join(r.run_time) or "✓"
        lines.append("| " + " | ".join([r.version, *cells, missing, r.default, r.engine]) + " |")
    return "\n".join(lines) + "\n"


def replace_table(doc: str, text: str) -> str:
    start, end = doc.index(_TABLE_START), doc.index(_TABLE_END)
    return doc[:start] + _TABLE_START + "\n" + text + doc[end:]


def table_in(doc: str) -> str:
    start, end = doc.index(_TABLE_START), doc.index(_TABLE_END)
    return doc[start + len(_TABLE_START):end].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bridge.vllm_plugin import hooks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("versions", nargs="*", help="releases (default: the pinned list)")
    p.add_argument("--latest", action="store_true", help="the newest patch of each minor on PyPI now")
    p.add_argument("--offline", action="store_true", help="the cache only")
    p.add_argument("--write", metavar="DOC", help="replace the table between the markers in DOC")
    args = p.parse_args(argv)
    versions = args.versions or (latest_per_minor() if args.latest else list(RELEASES))
    rows = []
    for v in versions:
        src = ReleaseSource(v, offline=args.offline)
        if src.metadata_version() != v:  # the wheel's own METADATA says which release it is
            raise SystemExit(f"the wheel for vLLM {v} says it is {src.metadata_version()}")
        rows.append(row(v, src.read, hooks))
        if src.requests:
            print(f"vLLM {v}: {src.requests} range requests, {src.fetched / 1e6:.1f} MB of {src.wheel}",
                  file=sys.stderr)
    text = table(rows, hooks)
    if args.write:
        doc = Path(args.write)
        doc.write_text(replace_table(doc.read_text(encoding="utf-8"), text), encoding="utf-8")
        print(f"wrote the table into {doc}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
