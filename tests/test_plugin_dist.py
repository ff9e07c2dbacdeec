"""The plugin as an artifact of its own (bridge/plugin_dist.py, issue 32): the wheel is what the
wheel format and pip say a pure-Python wheel is, built from whatever bridge/vllm_plugin holds,
and `plugin install --target` lays a tree that the real vLLM venv's Python finds through
PYTHONPATH alone, loads, and registers. Checked against independent truth: pip's own wheel
installer, hashlib over the archive, importlib.metadata in vLLM's interpreter, vLLM's classes."""

from __future__ import annotations

import base64
import configparser
import email.parser
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import bridge
from bridge import plugin_dist
from waits import deadline

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache/vllm-trace-bridge/vllm-venv")) / "bin" / "python"


def _bridge(*argv: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=deadline(120))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = _bridge("plugin", "wheel", str(out))
    assert proc.returncode == 0, proc.stderr
    (path,) = out.iterdir()
    assert proc.stdout.strip() == str(path)
    return path


def test_the_wheel_is_pure_python_for_every_python3_and_names_the_entry_point(wheel):
    assert wheel.name == f"vllm_trace_bridge_plugin-{bridge.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"vllm_trace_bridge_plugin-{bridge.__version__}.dist-info"
        meta = email.parser.Parser().parsestr(zf.read(f"{info}/METADATA").decode())
        wheel_meta = email.parser.Parser().parsestr(zf.read(f"{info}/WHEEL").decode())
        entry = configparser.ConfigParser()
        entry.read_string(zf.read(f"{info}/entry_points.txt").decode())
    assert meta["Name"] == "vllm-trace-bridge-plugin" and meta["Version"] == bridge.__version__
    assert meta["Requires-Python"] == ">=3.10" and meta.get_all("Requires-Dist") is None  # no dependency
    assert wheel_meta["Tag"] == "py3-none-any" and wheel_meta["Root-Is-Purelib"] == "true"
    assert dict(entry["vllm.general_plugins"]) == {"vllm_trace_bridge": "vllm_trace_bridge_plugin:register"}
    assert names[-1] == f"{info}/RECORD"  # last, as the wheel format asks
    assert not [n for n in names if not n.startswith(("vllm_trace_bridge_plugin/", info + "/"))]


def test_record_holds_every_file_with_its_sha256_and_size(wheel):
    with zipfile.ZipFile(wheel) as zf:
        record_name = next(n for n in zf.namelist() if n.endswith("/RECORD"))
        rows = [line.split(",") for line in zf.read(record_name).decode().splitlines()]
        listed = {path: (h, size) for path, h, size in rows}
        assert set(listed) == set(zf.namelist())
        for name in zf.namelist():
            if name == record_name:
                assert listed[name] == ("", "")
                continue
            data = zf.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert listed[name] == (f"sha256={digest}", str(len(data))), name


def test_the_wheel_holds_the_plugin_package_as_it_is(wheel):
    with zipfile.ZipFile(wheel) as zf:
        for path in sorted((ROOT / "bridge" / "vllm_plugin").glob("*.py")):
            assert zf.read(f"vllm_trace_bridge_plugin/{path.name}") == path.read_bytes()


def test_pip_installs_the_wheel_offline(wheel, tmp_path):
    """pip's own installer checks the name, the tags and RECORD; nothing is fetched."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                           "--disable-pip-version-check", "--target", str(tmp_path / "site"), str(wheel)],
                          capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "vllm_trace_bridge_plugin" / "hooks.py").exists()


def test_the_same_source_gives_the_same_bytes(wheel, tmp_path):
    again = plugin_dist.write_wheel(str(tmp_path))
    assert Path(again).read_bytes() == wheel.read_bytes()


def test_the_plugin_and_the_bridge_carry_one_version():
    assert plugin_dist.plugin_files().version == bridge.__version__


def _copy_of_the_plugin(tmp_path: Path) -> Path:
    src = tmp_path / "vllm_plugin"
    shutil.copytree(ROOT / "bridge" / "vllm_plugin", src, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_a_module_added_to_the_package_is_in_the_artifact(tmp_path):
    """Built from what the package holds at build time, not from a list of files."""
    src = _copy_of_the_plugin(tmp_path)
    (src / "extra.py").write_text("X = 1\n")
    names = [n for n, _ in plugin_dist.plugin_files(str(src)).files]
    assert "vllm_trace_bridge_plugin/extra.py" in names


@pytest.mark.parametrize("name, text, says", [
    ("bad.py", "from bridge.parse import seed\n", "bad.py:1: imports `bridge.parse`"),
    ("bad.py", "import bridge.vllm_plugin.hooks\n", "bad.py:1: imports `bridge.vllm_plugin.hooks`"),
    ("bad.py", "try:\n    pass\nexcept* ValueError:\n    pass\n", "not valid Python 3.10 syntax"),
    ("_fast.so", "", "compiled code has no place in the plugin"),
])
def test_a_package_that_cannot_ship_alone_is_refused_naming_the_file(tmp_path, name, text, says):
    src = _copy_of_the_plugin(tmp_path)
    (src / name).write_text(text)
    with pytest.raises(plugin_dist.PluginBuildError) as err:
        plugin_dist.plugin_files(str(src))
    assert says in str(err.value) and name in str(err.value)


def test_install_replaces_an_older_copy_and_leaves_the_rest(tmp_path):
    target = tmp_path / "t"
    (target / "vllm_trace_bridge_plugin-0.0.1.dist-info").mkdir(parents=True)
    (target / "vllm_trace_bridge_plugin").mkdir()
    (target / "vllm_trace_bridge_plugin" / "stale.py").write_text("")
    (target / "someone_else.py").write_text("kept")
    old = os.umask(0o077)  # a tight umask must not make the files unreadable to vLLM's user
    try:
        proc = _bridge("plugin", "install", "--target", str(target))
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    first = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    assert first == sorted(["someone_else.py", "vllm_trace_bridge_plugin",
                            f"vllm_trace_bridge_plugin-{bridge.__version__}.dist-info"]
                           + [f"vllm_trace_bridge_plugin/{n}" for n in ("__init__.py", "hooks.py")]
                           + [f"vllm_trace_bridge_plugin-{bridge.__version__}.dist-info/{n}"
                              for n in ("METADATA", "RECORD", "WHEEL", "entry_points.txt", "top_level.txt")])
    assert (target / "someone_else.py").read_text() == "kept"
    for p in target.rglob("*"):
        if p.name != "someone_else.py":
            assert p.stat().st_mode & 0o777 == (0o755 if p.is_dir() else 0o644), p
    assert _bridge("plugin", "install", "--target", str(target)).returncode == 0  # a restarted init container
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == first


def test_install_into_a_place_it_cannot_write_says_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = _bridge("plugin", "install", "--target", str(blocker / "sub"))
    assert proc.returncode == 2 and "cannot write there" in proc.stderr and proc.stdout == ""


def installed_plugin_in_vllm(target: Path) -> dict:
    """In the real vLLM venv's Python, with PYTHONPATH=target only: the entry point vLLM reads,
    where it comes from, and what `register` does to vLLM's output processor."""
    probe = r"""
import importlib.metadata as m, inspect, json, os, sys
target = sys.argv[1]
eps = [e for e in m.entry_points(group="vllm.general_plugins") if e.name == "vllm_trace_bridge"]
ours = [e for e in eps if os.path.abspath(e.dist._path).startswith(target + os.sep)]
fn = ours[0].load()
fn()
from vllm.v1.engine.output_processor import OutputProcessor
wrapped = OutputProcessor._update_stats_from_finished  # the API server's hook, always installed
print(json.dumps({"value": ours[0].value, "dist": ours[0].dist.name, "module": inspect.getsourcefile(fn),
                  "wrapped": bool(getattr(wrapped, "__vllm_trace_bridge_wrapped__", False)),
                  "wrapper_file": inspect.getsourcefile(wrapped)}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(target), VLLM_TRACE_BRIDGE_PLUGIN="1")
    proc = subprocess.run([str(VLLM_PYTHON), "-c", probe, str(target)], capture_output=True, text=True, env=env,
                          cwd=target.parent, timeout=deadline(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM venv at {VLLM_PYTHON.parent.parent}")
def test_installed_plugin_is_found_loaded_and_registered_by_vllms_python(tmp_path):
    target = tmp_path / "plugin"
    proc = _bridge("plugin", "install", "--target", str(target))
    assert proc.returncode == 0, proc.stderr
    seen = installed_plugin_in_vllm(target)
    assert seen["value"] == "vllm_trace_bridge_plugin:register" and seen["dist"] == "vllm-trace-bridge-plugin"
    assert seen["module"].startswith(str(target)) and seen["wrapper_file"].startswith(str(target))
    assert seen["wrapped"]
