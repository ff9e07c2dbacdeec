"""Deployment artefacts: image, Helm chart, plain manifests, collector configs, compose demo.

All offline: Helm runs as a library (helm-python-sdk), Kubernetes schemas ship with
kubernetes-validate, hadolint and yamllint are PyPI packages. No container engine is needed:
the image's install step runs as a script in a fresh virtualenv.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "vllm-trace-bridge"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    """A console script installed by the test extra, next to this interpreter (or on PATH)."""
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or pytest.fail(f"{name} is not installed"))


# --- image --------------------------------------------------------------------------------

def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_clean_under_hadolint():
    proc = subprocess.run([_tool("hadolint"), "--no-color", "--failure-threshold", "info",
                           str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_has_labels_healthcheck_non_root_user_and_the_contract_command():
    steps = _dockerfile()
    kinds = [k for k, _ in steps]
    assert "HEALTHCHECK" in kinds
    labels = " ".join(a for k, a in steps if k == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels
    user = [a for k, a in steps if k == "USER"][-1]
    assert not user.startswith(("0", "root"))
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["vllm-trace-bridge"]
    assert json.loads([a for k, a in steps if k == "CMD"][-1]) == \
        ["run", "--config", "/etc/vllm-trace-bridge/config.yaml"]
    # Every file the image copies is let through by .dockerignore.
    allowed = [ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.startswith("!")]
    for k, a in steps:
        if k == "COPY" and "--from=" not in a:
            for src in a.split()[:-1]:
                assert (ROOT / src).exists(), src
                assert src.rstrip("/") in allowed, f"{src} is excluded by .dockerignore"


def _build_stage_copy_and_run(tmp_path: Path) -> tuple[Path, Path]:
    """Carry out the build stage's COPY and RUN steps with host paths: returns (src, venv)."""
    steps = _dockerfile()
    build = steps[: [i for i, (k, _) in enumerate(steps) if k == "FROM"][1]]
    workdir = Path(next(a for k, a in build if k == "WORKDIR"))
    src = tmp_path / "src"
    venv = tmp_path / "venv"
    run = None
    for k, a in build:
        if k == "COPY":
            *sources, dest = a.split()
            target = src / (Path(dest) if not dest.startswith("/") else Path(dest).relative_to(workdir))
            for s in sources:
                origin = ROOT / s
                if origin.is_dir():
                    shutil.copytree(origin, target if not dest.endswith("/") or len(sources) == 1
                                    and s.rstrip("/") == dest.rstrip("/").split("/")[-1]
                                    else target / origin.name,
                                    ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
                else:
                    dst = target / origin.name if dest.endswith("/") or len(sources) > 1 else target
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, dst)
        elif k == "RUN":
            run = json.loads(a) if a.startswith("[") else shlex.split(a)
    assert run is not None and "deploy/install.sh" in run, "the build stage must RUN deploy/install.sh"
    image_venv = run[run.index("deploy/install.sh") + 1]
    argv = [str(venv) if x == image_venv else str(src) if x == str(workdir) else x for x in run]
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(argv, cwd=src, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return src, venv


def test_image_install_steps_give_a_working_agent(tmp_path):
    """The build stage's COPY + RUN in a fresh virtualenv, then the agent starts from it."""
    _, venv = _build_stage_copy_and_run(tmp_path)
    exe = venv / "bin" / "vllm-trace-bridge"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not (venv / "bin" / "pip").exists(), "the runtime environment should carry no pip"
    # Test dependencies stay out of the image.
    freeze = subprocess.run([str(venv / "bin" / "python"), "-c",
                             "import importlib.metadata as m; print('\\n'.join(sorted(d.metadata['Name'].lower() "
                             "for d in m.distributions())))"], capture_output=True, text=True, env=env)
    installed = set(freeze.stdout.split())
    assert "vllm-trace-bridge" in installed
    assert not installed & {"pytest", "hypothesis", "yamllint", "helm-python-sdk", "kubernetes-validate"}

    # `run` is being written in main; once it exists its --print-config must work from the image.
    has_run = subprocess.run([str(exe), "run", "--help"], capture_output=True, env=env, timeout=60)
    if has_run.returncode == 0:
        state = tmp_path / "state"
        state.mkdir()
        config = tmp_path / "config.yaml"
        config.write_text("containers: ['*vllm*']\nlisten: 0.0.0.0:9464\n")
        proc = subprocess.run([str(exe), "run", "--config", str(config), "--print-config",
                               "--state-dir", str(state)], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        printed = yaml.safe_load(proc.stdout)
        assert printed["containers"] == ["*vllm*"] and printed["listen"] == "0.0.0.0:9464"


def test_healthcheck_script_probes_healthz(tmp_path):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = str(DEPLOY / "healthcheck.py")
        ok = subprocess.run([sys.executable, script], capture_output=True, timeout=30,
                            env=dict(os.environ, VLLM_TRACE_BRIDGE_LISTEN=f"0.0.0.0:{server.server_port}"))
        assert ok.returncode == 0
    finally:
        server.shutdown()
    down = subprocess.run([sys.executable, script], capture_output=True, timeout=30,
                          env=dict(os.environ, VLLM_TRACE_BRIDGE_LISTEN=f"127.0.0.1:{server.server_port}"))
    assert down.returncode == 1


# --- YAML ---------------------------------------------------------------------------------------

def test_yamllint_passes_on_all_yaml():
    proc = subprocess.run([_tool("yamllint"), "--strict", "--format", "parsable", "."],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
