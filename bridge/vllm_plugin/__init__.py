"""A vLLM plugin that writes the seed dialect's lifecycle lines from inside unmodified vLLM.

Loaded by vLLM through the `vllm.general_plugins` entry point. It ships on its own as the
pure-Python distribution `vllm-trace-bridge-plugin` (top-level module `vllm_trace_bridge_plugin`,
laid out from this package by `vllm-trace-bridge plugin wheel` / `plugin install --target`,
bridge/plugin_dist.py), so its imports inside the package are relative. By default it lives in the API
server: one line per request, where vLLM finishes the request's stats, with vLLM's own numbers
and event times (its engine core's QUEUED / SCHEDULED / PREEMPTED / token stamps, which the API
server receives anyway) and the caller's W3C `traceparent`:

    Request <id>: prompt_tokens=<n>, generated_tokens=<n>, ttft=<x>ms, itl=<x>ms, total_latency=<x>s,
        t=<T>, arrival=<T>, queued_at=<T>, scheduled_at=<T>, first_token_at=<T>, last_token_at=<T>
        [, n=<n>] [, preempted=<T>~<T>/…] [, traceparent=…] [, tracestate=…]
    Request <id> ended: finish=<reason>, prompt_tokens=<n>, generated_tokens=<n>, total_latency=<x>s, t=<T>, …

The engine core runs untouched unless its lines are asked for (`…_PLUGIN_ENGINE=1`, `…_BLOCKS=1`)
or vLLM keeps no stats (`--disable-log-stats`); then it writes `Scheduling request`,
`Preempting request`, `Running queue`, `Freed <n> blocks` (and per-block) lines, and without
stats the summary. `hooks.py` says which vLLM methods are wrapped and why.

`<T>` is unix seconds with six decimals, vLLM's own stamp of the event (monotonic stamps turned
into wall-clock time with one offset per process). Lines are written in vLLM's format straight
to vLLM's stream, not through `logging`, so vLLM's log level does not drop them.

Nothing leaves vLLM's process but those log lines: no exporter, no socket, no thread. Every
hook is wrapped: a failure in the plugin is logged once and the plugin switches itself off;
vLLM's own method always runs, with its own arguments, and its result or exception is
passed through untouched.

Switches: vLLM's `VLLM_PLUGINS` (the plugin's name is `vllm_trace_bridge`),
`VLLM_TRACE_BRIDGE_PLUGIN=0`, `VLLM_TRACE_BRIDGE_PLUGIN_ENGINE=1`, `…_BLOCKS=1`,
`…_QUEUE_INTERVAL_S` (default 1), `…_TRACE_CONTEXT=0` (never write the caller's context),
`…_KV=0` (no KV-transfer lines on a disaggregated engine: kv.py).

This module imports nothing from vLLM at import time, and nothing from the rest of the bridge.
"""

from __future__ import annotations

import os

#: vLLM releases (major, minor) the plugin was tested against. Not a gate: on any other
#: version it installs when the API server's hook points are there (`hooks.HOOK_POINTS`, checked
#: by name and signature; the engine core's only for its lines), and otherwise says which one is
#: missing and leaves vLLM untouched.
TESTED_VERSIONS = ((0, 32), (0, 33))

#: The bridge release this plugin belongs to (the wheel's version; tests check it is the bridge's).
__version__ = "0.1.0"

PLUGIN_NAME = "vllm_trace_bridge"
_LOGGER_NAME = "vllm.trace_bridge"


def enabled(environ=os.environ) -> bool:
    return environ.get("VLLM_TRACE_BRIDGE_PLUGIN", "1").strip().lower() not in ("0", "false", "no", "off", "")


def version_tested(version: str) -> bool:
    """`0.32.0`, `0.32.1+cpu`, `0.33.0rc1` → tested; anything else → not (which may still work)."""
    parts = version.split("+", 1)[0].split(".")
    try:
        major, minor = int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (ValueError, IndexError):
        return False
    return (major, minor) in TESTED_VERSIONS


def register() -> None:
    """vLLM's entry point. Runs in every vLLM process (API server, engine core, workers), maybe
    more than once; it must never raise."""
    try:
        if not enabled():
            return
        from . import hooks

        if hooks.install():
            import logging

            # One line per vLLM process saying which copy runs: an image can hold more than one.
            logging.getLogger(_LOGGER_NAME).info("vllm-trace-bridge plugin %s loaded from %s", __version__,
                                                 os.path.dirname(os.path.abspath(__file__)))
    except Exception:  # noqa: BLE001 — a plugin must never take vLLM down
        try:
            import logging

            logging.getLogger(_LOGGER_NAME).warning(
                "vllm-trace-bridge plugin disabled: it failed to install", exc_info=True)
        except Exception:  # noqa: BLE001
            pass
