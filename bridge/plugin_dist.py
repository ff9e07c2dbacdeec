"""The vLLM plugin as an artifact of its own, for any vLLM image: a pure-Python wheel
(`vllm-trace-bridge plugin wheel DIR`) and the same files laid into a directory that vLLM finds
through `PYTHONPATH` (`plugin install --target DIR`, what `inject`'s init container runs).

Why not the package's own wheel: `pip wheel .` builds the agent (its C fast paths make it
`cp311-cp311-linux_x86_64`, refused by a vLLM image on another Python) and pulls the agent's
dependencies. The plugin needs neither: it is `bridge/vllm_plugin/`, which imports nothing of
the bridge, shipped under a top-level name of its own (`vllm_trace_bridge_plugin`: `bridge` is
too generic a name to put on a vLLM image's path) with one entry point,
`[vllm.general_plugins] vllm_trace_bridge`. The files are read from the package at build time
(whatever it holds then, checked: Python 3.10 syntax, no absolute `bridge` import, no compiled
code), and the wheel is written with the standard library: no build backend, no network, the
same bytes for the same source.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass

DIST_NAME = "vllm-trace-bridge-plugin"
MODULE = "vllm_trace_bridge_plugin"
ENTRY_GROUP = "vllm.general_plugins"
ENTRY_NAME = "vllm_trace_bridge"  # vLLM's VLLM_PLUGINS names it so; docs/plugin.md
OLDEST_PYTHON = (3, 10)
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_plugin")
#: Files that can only be compiled code or its leftovers: a py3-none-any wheel must hold none.
_COMPILED = (".so", ".pyd", ".dylib", ".c", ".h")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest stamp: the same source gives the same bytes


class PluginBuildError(Exception):
    """The plugin's source can't make a pure-Python artifact, or the target can't take it; the
    message names the file and the fix."""


@dataclass(frozen=True)
class PluginFiles:
    """The plugin's distribution: (path inside the wheel / under the target, content), the
    package first, its .dist-info after, RECORD last (as the wheel format asks)."""

    version: str
    files: tuple[tuple[str, bytes], ...]

    @property
    def dist_info(self) -> str:
        return f"{MODULE}-{self.version}.dist-info"

    @property
    def wheel_name(self) -> str:
        return f"{MODULE}-{self.version}-py3-none-any.whl"


def _version(init_text: str, path: str) -> str:
    for node in ast.parse(init_text, path).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__"
                                                for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    raise PluginBuildError(f"{path}: no `__version__ = \"…\"` string; the wheel's version is read from it")


def _check_module(text: str, path: str) -> None:
    """Python 3.10 syntax (the oldest Python a vLLM image may have), and no absolute import of
    the bridge: under its own name the plugin has no `bridge` to import from."""
    try:
        tree = ast.parse(text, path, feature_version=OLDEST_PYTHON)
    except SyntaxError as exc:
        raise PluginBuildError(f"{path}:{exc.lineno}: not valid Python {OLDEST_PYTHON[0]}.{OLDEST_PYTHON[1]} "
                               f"syntax ({exc.msg}); the plugin must run on every vLLM image's Python") from None
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            if name == "bridge" or name.startswith("bridge."):
                raise PluginBuildError(f"{path}:{node.lineno}: imports `{name}`; inside the plugin use a relative "
                                       "import (`from . import …`): the plugin ships as "
                                       f"`{MODULE}`, with no `bridge` beside it")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def plugin_files(source: str = SOURCE) -> PluginFiles:
    """Read the plugin package as it is now and make its distribution's files."""
    package: list[tuple[str, bytes]] = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if name.endswith((".pyc", ".pyo")):
                continue
            if name.endswith(_COMPILED):
                raise PluginBuildError(f"{path}: compiled code has no place in the plugin, which must be pure "
                                       "Python to load in any vLLM image; move it out of the package")
            with open(path, "rb") as f:
                data = f.read()
            if name.endswith(".py"):
                _check_module(data.decode("utf-8"), path)
            rel = os.path.relpath(path, source).replace(os.sep, "/")
            package.append((f"{MODULE}/{rel}", data))
    init = os.path.join(source, "__init__.py")
    if not os.path.isfile(init):
        raise PluginBuildError(f"{source}: no __init__.py; give the plugin package's directory")
    with open(init, encoding="utf-8") as f:
        version = _version(f.read(), init)
    info = f"{MODULE}-{version}.dist-info"
    meta = [
        (f"{info}/METADATA", (
            "Metadata-Version: 2.1\n"
            f"Name: {DIST_NAME}\n"
            f"Version: {version}\n"
            "Summary: vLLM plugin of vllm-trace-bridge: writes each request's lifecycle to vLLM's log\n"
            "License: Apache-2.0\n"
            f"Requires-Python: >={OLDEST_PYTHON[0]}.{OLDEST_PYTHON[1]}\n"
            "Classifier: Programming Language :: Python :: 3\n"
            "\n"
            "Loaded by vLLM through its vllm.general_plugins entry point; needs nothing but the vLLM\n"
            "already installed. See docs/plugin.md of vllm-trace-bridge.\n").encode()),
        (f"{info}/WHEEL", (
            "Wheel-Version: 1.0\n"
            f"Generator: vllm-trace-bridge {version}\n"
            "Root-Is-Purelib: true\n"
            "Tag: py3-none-any\n").encode()),
        (f"{info}/entry_points.txt", f"[{ENTRY_GROUP}]\n{ENTRY_NAME} = {MODULE}:register\n".encode()),
        (f"{info}/top_level.txt", f"{MODULE}\n".encode()),
    ]
    files = package + meta
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files) + f"{info}/RECORD,,\n"
    return PluginFiles(version, tuple(files) + ((f"{info}/RECORD", record.encode()),))


def write_wheel(out_dir: str, source: str = SOURCE) -> str:
    """Write the wheel into `out_dir` (made if missing); returns its path."""
    dist = plugin_files(source)
    try:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, dist.wheel_name)
        fd, tmp = tempfile.mkstemp(prefix=".plugin-wheel-", dir=out_dir)
    except OSError as exc:
        raise PluginBuildError(f"{out_dir}: cannot write there ({exc.strerror or exc}); give a writable "
                               "directory") from None
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in dist.files:
                info = zipfile.ZipInfo(name, _EPOCH)
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def install(target: str, source: str = SOURCE) -> PluginFiles:
    """Lay the plugin and its .dist-info into `target`, replacing an earlier copy of it (and
    nothing else there): run again, as a restarted init container does, it gives the same
    tree. Files 0644 and directories 0755 whatever the umask, so vLLM's user (often another
    uid than the installer's) can read them."""
    dist = plugin_files(source)
    try:
        os.makedirs(target, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".vllm-trace-bridge-plugin-", dir=target)
    except OSError as exc:
        raise PluginBuildError(f"{target}: cannot write there ({exc.strerror or exc}); give a writable "
                               "directory (in Kubernetes: an emptyDir mounted there)") from None
    try:
        for name, data in dist.files:
            path = os.path.join(staging, *name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, 0o644)
        for dirpath, dirnames, _ in os.walk(staging):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
        old = [n for n in os.listdir(target)
               if n == MODULE or (n.startswith(MODULE + "-") and n.endswith(".dist-info"))]
        for name in old:
            path = os.path.join(target, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        for name in (MODULE, dist.dist_info):
            os.replace(os.path.join(staging, name), os.path.join(target, name))
    except OSError as exc:
        raise PluginBuildError(f"{target}: installing the plugin failed ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dist
