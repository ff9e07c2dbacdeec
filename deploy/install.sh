#!/bin/sh
# Install the agent with only its runtime dependencies into a fresh virtualenv.
#
#   deploy/install.sh VENV SRC
#
# deploy/Dockerfile runs exactly this, and tests/test_deploy.py runs it too (then starts the
# agent from VENV), so the image's install step is tested without a container engine.
# PYTHON picks the interpreter (default python3).
set -eu
venv=$1
src=$2
"${PYTHON:-python3}" -m venv "$venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    "$venv/bin/pip" install --quiet --constraint "$src/deploy/constraints.txt" "$src"
# The running agent never installs anything: leave pip out of the runtime environment.
"$venv/bin/pip" uninstall --quiet --yes pip
"$venv/bin/vllm-trace-bridge" --help >/dev/null
# The vLLM plugin as a pure-Python wheel beside the agent (docs/plugin.md): `inject`'s init
# container lays it out with `plugin install --target`; the wheel is there to copy out.
"$venv/bin/vllm-trace-bridge" plugin wheel "$venv/plugin" >/dev/null
