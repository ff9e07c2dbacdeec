"""A minimal launcher for real vLLM (the venv tests/vllm_env/install.sh makes), for the
plugin's tests and benchmark. vLLM's stdout and stderr (API server, engine core and worker
all write there) are captured the way a container runtime would: each line CRI-framed with
the nanosecond time it was read, so the bridge gets sub-second stamps as it does in k8s.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the shared vLLM harness
from vllm_server import CPU_DTYPE, plugin_path  # noqa: E402
from waits import deadline  # noqa: E402

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache/vllm-trace-bridge/vllm-venv"))
MODEL_DIR = Path(os.environ.get("VLLM_PLUGIN_MODEL", Path.home() / ".cache/vllm-trace-bridge/tiny-llama-plugin"))


def venv_ready() -> str | None:
    """None when real vLLM can run here, else why not."""
    if not (VENV / "bin" / "vllm").exists():
        return f"no vLLM venv at {VENV}; run tests/vllm_env/install.sh"
    return None


def build_model() -> Path:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    subprocess.run([str(VENV / "bin" / "python"), str(HERE / "tiny_model.py"), str(MODEL_DIR)],
                   check=True, env=env, capture_output=True)
    return MODEL_DIR


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cri_stamp(ns: int) -> str:
    secs, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


class Vllm:
    """`with Vllm(log_path, plugin=True, blocks=64) as v: v.complete(...)`."""

    def __init__(self, log_path: Path, *, plugin: bool = True, plugin_blocks: bool = False,
                 gpu_blocks: int = 64, otlp_endpoint: str | None = None, extra_env: dict | None = None,
                 max_num_seqs: int = 32, plain: bool = False, extra_args: tuple[str, ...] = (),
                 eager: bool = True) -> None:
        self.log_path = Path(log_path)
        self.plain = plain  # the log as a plain file: vLLM's lines only, no runtime stamp to help
        self.port = free_port()
        self.model = str(build_model())
        env = dict(os.environ)
        for k in list(env):
            if k.startswith(("VLLM_TRACE_BRIDGE_", "OTEL_")):
                del env[k]
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                   PYTHONUNBUFFERED="1", VLLM_TRACE_BRIDGE_PLUGIN="1" if plugin else "0")
        if plugin_blocks:
            env["VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS"] = "1"
        if otlp_endpoint:
            env["OTEL_EXPORTER_OTLP_TRACES_INSECURE"] = "true"
        env.update(extra_env or {})
        # The plugin as a vLLM pod gets it from `inject`: installed with `plugin install --target`
        # from this checkout, found through PYTHONPATH; never a copy in the venv.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), plugin_path() if plugin else None) if p)
        self.cmd = [str(VENV / "bin" / "vllm"), "serve", self.model, "--port", str(self.port),
                    "--host", "127.0.0.1", *(("--enforce-eager",) if eager else ()), "--enable-log-requests",
                    "--kv-cache-memory-bytes", "100000000", "--num-gpu-blocks-override", str(gpu_blocks),
                    "--max-model-len", "1024", "--max-num-seqs", str(max_num_seqs), "--seed", "0", *CPU_DTYPE]
        if otlp_endpoint:
            self.cmd += ["--otlp-traces-endpoint", otlp_endpoint]
        self.cmd += list(extra_args)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._pump: threading.Thread | None = None

    def __enter__(self) -> "Vllm":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=str(self.log_path.parent), start_new_session=True)

        def pump() -> None:
            for raw in self.proc.stdout:
                ns = time.time_ns()
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                out.write(f"{line}\n" if self.plain else f"{_cri_stamp(ns)} stdout F {line}\n")
                out.flush()
            out.close()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        until = time.monotonic() + deadline(240)
        while time.monotonic() < until:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=deadline(2)) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        self.__exit__()
        raise RuntimeError(f"vLLM did not become healthy in {deadline(240):.0f} s (scaled cap); see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM to vLLM's own process: it shuts its children down
            try:
                self.proc.wait(deadline(60))
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(deadline(10))
        if self._pump is not None:
            self._pump.join(deadline(10))

    def post(self, path: str, body: dict, request_id: str | None = None, timeout: float | None = None,
             headers: dict | None = None) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
        if request_id:
            req.add_header("X-Request-Id", request_id)
        with urllib.request.urlopen(req, timeout=deadline(600) if timeout is None else timeout) as r:
            return json.loads(r.read())

    def complete(self, request_id: str, prompt: str, max_tokens: int) -> dict:
        return self.post("/v1/completions", {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                                             "ignore_eos": True, "temperature": 0}, request_id)

    def chat(self, request_id: str, text: str, max_tokens: int) -> dict:
        return self.post("/v1/chat/completions", {"model": self.model, "max_tokens": max_tokens, "ignore_eos": True,
                                                  "temperature": 0,
                                                  "messages": [{"role": "user", "content": text}]}, request_id)

    def load(self, n: int, max_tokens: int, prompt_words: int = 40, chat_every: int = 3) -> list[str]:
        """n concurrent requests (every `chat_every`-th a chat); returns the X-Request-Ids sent."""
        words = "the quick brown fox jumps over the lazy dog one two three four five six seven".split()
        prompt = " ".join(words[i % len(words)] for i in range(prompt_words))
        ids = [f"plugintest-{i:03d}" for i in range(n)]

        def one(i: int) -> None:
            if chat_every and i % chat_every == 0:
                self.chat(ids[i], prompt, max_tokens)
            else:
                self.complete(ids[i], prompt, max_tokens)

        with ThreadPoolExecutor(n) as pool:
            list(pool.map(one, range(n)))
        return ids

    def metrics(self) -> dict[str, float]:
        """Prometheus text → {name: sum over label sets}."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=deadline(10)) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
        return out


if __name__ == "__main__":  # manual: python tests/plugin/vllm_proc.py OUT.log
    with Vllm(Path(sys.argv[1])) as v:
        v.load(4, 16)
        print(v.metrics().get("vllm:request_success_total"))
