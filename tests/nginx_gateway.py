"""A real nginx (Debian's package) in front of a test vLLM server, with the README's config."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from waits import deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "docs", "gateway", "nginx.conf")


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)


class Nginx:
    def __init__(self, prefix: str, port: int, upstream: str) -> None:
        self.prefix, self.port = prefix, port
        os.makedirs(prefix, exist_ok=True)
        text = open(CONFIG).read()
        text = text.replace("@PREFIX@", prefix).replace("@LISTEN@", f"127.0.0.1:{port}").replace("@VLLM@", upstream)
        self.conf = os.path.join(prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(text)
        self.access_log = os.path.join(prefix, "access.json")
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Nginx:
        exe = nginx_binary()
        assert exe, "nginx is not installed (.ci/run installs Debian's nginx)"
        self.proc = subprocess.Popen([exe, "-p", self.prefix, "-c", self.conf, "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        until = time.monotonic() + deadline(15)
        while time.monotonic() < until:
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited {self.proc.returncode}: {self.proc.stderr.read().decode()}")
            try:
                urllib.request.urlopen(self.base + "/ctx/health", timeout=deadline(2)).close()
                return self
            except urllib.error.HTTPError:
                return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError("nginx did not answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(deadline(10))
