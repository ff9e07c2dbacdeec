"""The plugin's hook points against vLLM releases' own source, read without importing vLLM (or
torch): every minor from 0.10 on, a few files of each wheel read over HTTP Range requests and
cached (tests/plugin_versions_table.py); 0.32 also from the test venv when it is there. A hook
point renamed or given other parameters in a release fails here by name, and docs/plugin.md's
table is what those releases' source says today.

The tests that read the releases carry the `versions` marker: they run when selected
(`-m versions`, which fetches about 1 MB per release from PyPI the first time), in CI, or when the
files are already cached; otherwise they skip."""

from __future__ import annotations

import http.server
import io
import json
import os
import random
import re
import threading
import zipfile
from pathlib import Path

import pytest

import plugin_versions_table as pvt
from bridge.vllm_plugin import TESTED_VERSIONS, hooks

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "plugin.md"
VENV = Path.home() / ".cache" / "vllm-trace-bridge" / "vllm-venv"


def _selected(config) -> bool:
    if os.environ.get("CI", "") not in ("", "0", "false"):
        return True
    expr = config.getoption("markexpr", "") or ""
    return "versions" in expr and "not versions" not in expr


@pytest.fixture
def release(request):
    """`open(version)` → a reader of that release's files; offline (a skip when they are not
    cached) unless the `versions` tests were selected."""
    offline = not _selected(request.config)

    def open_(version: str):
        src = pvt.ReleaseSource(version, offline=offline)

        def read(path: str) -> str | None:
            try:
                return src.read(path)
            except pvt.NotCached:
                pytest.skip(f"vLLM {version}'s files are not cached in {pvt.CACHE}: pytest -m versions fetches them")

        return src, read

    return open_


def _doc_rows() -> dict[str, str]:
    lines = pvt.table_in(DOC.read_text(encoding="utf-8")).splitlines()
    return {line.split("|")[1].strip(): line for line in lines[2:]}


# -- every release (marker `versions`) ------------------------------------------------------------

@pytest.mark.versions
@pytest.mark.parametrize("version", pvt.RELEASES)
def test_the_docs_table_row_is_what_the_release_source_says(version, release):
    src, read = release(version)
    assert read("vllm/v1/core/sched/scheduler.py") is not None  # a vLLM V1 wheel, not a stand-in
    meta = next(n for n in src.members() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
    assert f"\nVersion: {version}\n" in read(meta)  # the wheel's own METADATA: it is that release
    got = pvt.table([pvt.row(version, read, hooks)], hooks).splitlines()[2]
    assert _doc_rows().get(version) == got, "re-run: python tests/plugin_versions_table.py --write docs/plugin.md"


@pytest.mark.versions
@pytest.mark.parametrize("minor", TESTED_VERSIONS, ids=lambda mm: "%d.%d" % mm)
def test_every_hook_point_is_in_each_tested_releases_source(minor, release):
    (version,) = [v for v in pvt.RELEASES if tuple(map(int, v.split(".")[:2])) == minor]
    _src, read = release(version)
    assert hooks.missing_in_source(read) == []


@pytest.mark.skipif(not VENV.is_dir(), reason="no vLLM venv (tests/vllm_env/install.sh)")
def test_every_hook_point_is_in_the_installed_vllm_0_32s_source():
    (site,) = VENV.glob("lib/python*/site-packages")

    def read(path: str) -> str | None:
        p = site / path
        return p.read_text(encoding="utf-8") if p.is_file() else None

    assert hooks.missing_in_source(read) == []


# -- the table's shape, without the network ---------------------------------------------------------

def test_the_docs_table_has_todays_hook_points_and_every_release():
    doc = pvt.table_in(DOC.read_text(encoding="utf-8")).splitlines()
    assert doc[0] == pvt.table([], hooks).splitlines()[0], \
        "HOOK_POINTS changed: python tests/plugin_versions_table.py --write docs/plugin.md"
    assert list(_doc_rows()) == list(pvt.RELEASES)


def _source_of(points, drop=(), rename_param=(), drop_words=()) -> dict[str, str]:
    """A release's files written from `points` (HOOK_POINTS' shape): every class and method with
    the parameters named there, every run-time name in a comment; then things broken."""
    files: dict[str, dict[str, list[str]]] = {}
    for hp in points:
        path, cls, name, params = hp[0], hp[1], hp[2], hp[3]
        if (cls, name) in drop:
            continue
        params = tuple("other" if (cls, name) == rename_param and i == 0 else p for i, p in enumerate(params))
        files.setdefault(path, {}).setdefault(cls, []).append(
            f"    def {name}(self{''.join(', ' + p for p in params)}, *rest):\n        pass\n")
    text = {path: "".join(f"class {c}:\n" + "".join(ms) for c, ms in classes.items())
            for path, classes in files.items()}
    for path, _side, words in hooks.READ_AT_RUN_TIME:
        text[path] = text.get(path, "") + "".join(f"# {w}\n" for w in words if w not in drop_words)
    return text


def _point(cls, name):
    return next(hp for hp in hooks.HOOK_POINTS if (hp.cls, hp.name) == (cls, name))


def _word(side, adapted: bool):
    """A run-time name of that side whose absence the source would show (not also a method or
    parameter there), adapted to or not."""
    return next((path, w) for path, s, words in hooks.READ_AT_RUN_TIME for w in words
                if s == side and (w in hooks.ADAPTED) == adapted
                and not re.search(r"\b%s\b" % w, _source_of(hooks.HOOK_POINTS, drop_words=[w])[path]))


def test_each_break_lands_in_its_own_cell_and_its_own_side():
    """The table puts what `source_report` finds under the hook point it is about (a method gone,
    a parameter renamed, an older name), and each side's verdict follows install()'s gate: the
    API server's hook points decide the default mode, the engine core's only its lines."""
    points = hooks.HOOK_POINTS
    whole = _source_of(points)
    full = pvt.row("x", whole.get, hooks)
    assert full == pvt.Row("x", ("",) * len(points), (), "every phase", "all") and full.full
    # the engine side: a method gone, another with other parameters, one under its older name
    gone, renamed = _point("Scheduler", "_preempt_request"), _point("Scheduler", "add_request")
    older = next(hp for hp in points if hp.alt)
    broken = _source_of(points, drop=[(gone.cls, gone.name)], rename_param=(renamed.cls, renamed.name))
    broken[older.file] = broken[older.file].replace(f"def {older.name}(", f"def {older.alt[0]}(")
    r = pvt.row("x", broken.get, hooks)
    assert r.cells[points.index(gone)] == "missing"
    assert r.cells[points.index(renamed)] == "takes `(%s)`" % ", ".join(("other", *renamed.params[1:]))
    assert r.cells[points.index(older)] == f"as `{older.alt[0]}`"
    assert [c for i, c in enumerate(r.cells) if points[i] not in (gone, renamed, older)] == [""] * (len(points) - 3)
    assert r.installs and r.default == "every phase" and not r.full
    assert r.engine.startswith("none: no `Scheduler.add_request(request), it takes (other)`, "
                               "`Scheduler._preempt_request`")
    only_older = dict(whole)
    only_older[older.file] = only_older[older.file].replace(f"def {older.name}(", f"def {older.alt[0]}(")
    assert pvt.row("x", only_older.get, hooks).engine == f"all (`{older.name}` as `{older.alt[0]}`)"
    # the API server's side: a hook point gone → nothing at all; an extra one → its part
    api = _point("OutputProcessor", "_update_stats_from_finished")
    r = pvt.row("x", _source_of(points, drop=[(api.cls, api.name)]).get, hooks)
    assert not r.installs and r.default.startswith("nothing") and api.name in r.default
    extra = _point("IterationStats", "update_from_events")
    r = pvt.row("x", _source_of(points, drop=[(extra.cls, extra.name)]).get, hooks)
    assert r.installs and r.default == "every phase, no preempted spans" and r.engine == "all"
    # run-time names: one adapted to changes nothing; another switches its side off at first use
    path, word = _word(hooks.API, adapted=True)
    r = pvt.row("x", _source_of(points, drop_words=[word]).get, hooks)
    assert r.run_time == (f"`{word}` ({path.rsplit('/', 1)[-1]}): adapted",) and r.default == "every phase"
    path, word = _word(hooks.ENGINE, adapted=False)
    r = pvt.row("x", _source_of(points, drop_words=[word]).get, hooks)
    assert r.run_time == (f"`{word}` ({path.rsplit('/', 1)[-1]})",) and r.default == "every phase"
    assert r.engine.startswith("partial") and word in r.engine
    path, word = _word(hooks.API, adapted=False)
    r = pvt.row("x", _source_of(points, drop_words=[word]).get, hooks)
    assert r.default.startswith("partial") and word in r.default and r.engine == "all"
    assert pvt.row("x", {}.get, hooks).cells == ("no file",) * len(points)


# -- the range reader, against a local host --------------------------------------------------------

class _Host(http.server.BaseHTTPRequestHandler):
    """Serves PyPI's project JSON and one wheel, honouring `Range: bytes=a-b` (unless `ranges`
    is off); counts the bytes of wheel it sent."""

    files: dict[str, bytes] = {}
    ranges = True
    sent = 0

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        body = type(self).files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        if rng and type(self).ranges and self.path.endswith(".whl"):
            lo, hi = (int(x) for x in rng.split("=", 1)[1].split("-"))
            part = body[lo:hi + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{lo + len(part) - 1}/{len(body)}")
        else:
            part = body
            self.send_response(200)
        if self.path.endswith(".whl"):
            type(self).sent += len(part)
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)


@pytest.fixture
def host():
    handler = type("Host", (_Host,), {"files": {}, "ranges": True, "sent": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _wheel(handler, version: str, files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    wheel = buf.getvalue()
    name = f"pkg-{version}-py3-none-any.whl"
    handler.files[f"/packages/{name}"] = wheel
    handler.files["/pypi/pkg/json"] = json.dumps({"releases": {version: [
        {"filename": f"pkg-{version}.tar.gz", "url": f"../../packages/pkg-{version}.tar.gz", "size": 1},
        {"filename": name, "url": f"../../packages/{name}", "size": len(wheel)}]}}).encode()
    return wheel


def test_the_range_reader_reads_members_without_the_whole_wheel_and_caches_them(host, tmp_path):
    handler, index = host
    ballast = random.Random(7).randbytes(4 * 1024 * 1024)  # incompressible: the bulk of a real wheel
    wanted = "".join(f"def f{i}(x):\n    return {i}\n" for i in range(3000))
    wheel = _wheel(handler, "1.2.3", {"pkg/_C.so": ballast, "pkg/a.py": wanted, "pkg/b.py": "B = 1\n",
                                      "pkg-1.2.3.dist-info/METADATA": "Name: pkg\nVersion: 1.2.3\n"})
    src = pvt.ReleaseSource("1.2.3", cache=tmp_path, package="pkg", index=index)
    assert src.read("pkg/a.py") == wanted
    assert src.read("pkg/nothing.py") is None
    assert src.metadata_version() == "1.2.3"
    assert 0 < handler.sent < len(wheel) // 4  # the ballast was never fetched
    assert src.requests <= 6
    sent = handler.sent
    again = pvt.ReleaseSource("1.2.3", cache=tmp_path, package="pkg", index=index, offline=True)
    assert again.read("pkg/a.py") == wanted and again.read("pkg/nothing.py") is None
    assert handler.sent == sent  # from the cache
    with pytest.raises(pvt.NotCached):
        again.read("pkg/b.py")  # in the wheel, never fetched, and offline


def test_a_host_that_ignores_ranges_is_an_error_not_a_whole_download(host, tmp_path):
    handler, index = host
    _wheel(handler, "1.0.0", {"pkg/a.py": "A = 1\n"})
    handler.ranges = False
    with pytest.raises(pvt.RangeUnsupported, match="ignored the Range request"):
        pvt.ReleaseSource("1.0.0", cache=tmp_path, package="pkg", index=index).read("pkg/a.py")


def test_the_newest_patch_of_each_minor(host):
    handler, index = host
    files = [{"filename": "x.whl", "url": "x.whl", "size": 1}]
    handler.files["/pypi/pkg/json"] = json.dumps({"releases": {
        "0.9.2": files, "0.10.0": files, "0.10.2": files, "0.10.10": files, "0.11.0rc1": files,
        "0.11.0": [{"filename": "x.tar.gz", "url": "x", "size": 1}], "0.12.0": files,
        "0.12.1": [{**files[0], "yanked": True}], "0.12.0.post1": files}}).encode()
    assert pvt.latest_per_minor(10, "pkg", index) == ["0.10.10", "0.12.0.post1"]
