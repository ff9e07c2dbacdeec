#!/usr/bin/env bash
# Install Arize Phoenix (a tracing backend with an OTLP receiver and a query API, no Docker)
# into its own virtualenv, once, outside the repository. tests/test_phoenix.py (marker
# `phoenix`) starts it on 127.0.0.1 and stops it. .ci/run calls this script; a second run
# only checks the install (a second or two).
#   PHOENIX_VENV   where the venv goes (default ~/.cache/vllm-trace-bridge/phoenix-venv)
#   PHOENIX_VERSION  the arize-phoenix release (default 20.26.1, the one the test was written
#                    against); PHOENIX_SPEC overrides the whole pip requirement
set -euo pipefail
VENV="${PHOENIX_VENV:-$HOME/.cache/vllm-trace-bridge/phoenix-venv}"
PHOENIX_VERSION="${PHOENIX_VERSION:-20.26.1}"
SPEC="${PHOENIX_SPEC:-arize-phoenix${PHOENIX_VERSION:+==$PHOENIX_VERSION}}"
# Installed, at the wanted version: metadata only (importing phoenix takes ~20 s).
have=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))' 2>/dev/null || true)
if [ -x "$VENV/bin/phoenix" ] && [ -n "$have" ] && { [ -n "${PHOENIX_SPEC:-}" ] || [ "$have" = "$PHOENIX_VERSION" ]; }; then
    echo "phoenix $have already installed in $VENV"
else
    start=$(date +%s)
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "$SPEC"
    echo "installed $SPEC in $VENV in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
fi
"$VENV/bin/python" -c 'import importlib.metadata as m; print("arize-phoenix", m.version("arize-phoenix"))'
