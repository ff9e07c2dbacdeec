"""A vLLM plugin that writes the seed dialect's lifecycle lines from inside unmodified vLLM.

Loaded by vLLM through the `vllm.general_plugins` entry point. It ships on its own as the
pure-Python distribution `vllm-trace-bridge-plugin` (top-level module `vllm_trace_bridge_plugin`,
laid out from this package by `vllm-trace-bridge plugin wheel` / `plugin install --target`,
bridge/plugin_dist.py), so its imports inside the package are relative. It wraps methods of vLLM's V1 scheduler (in
the engine core) and of its output processor (in the API server), and writes, through vLLM's
own logger, the lines the bridge already reads:

    Scheduling request <id>: priority=<p>, num_scheduled_blocks=<n>, remaining_blocks=<n>, queued=<x>ms, t=<T>
    Preempting request <id>: reason=<r>, preempted_blocks=<n>, t=<T>
    Request <id>: prompt_tokens=<n>, generated_tokens=<n>, ttft=<x>ms, itl=<x>ms, total_latency=<x>s, t=<T>
    Running queue: <n> requests, waiting queue: <n> requests, free blocks: <f>/<t>
    Freed <n> blocks for request <id>, reason=<r>, t=<T>        (one per finished request)
    Allocated block <b> for request <id>, size=<n>B, t=<T>       (only with ..._BLOCKS=1)
    Freed block <b> for request <id>, reason=<r>, t=<T>          (only with ..._BLOCKS=1, instead)

`t=<T>` is the event's own time, unix seconds with six decimals, taken where vLLM records it
(its request events' monotonic stamps, turned into wall-clock time with one offset per
process; the API server's own wall-clock stamps for the summary): a log header has one-second
resolution, and a runtime stamp says when the line was read, not when the event happened.

The summary is written by the API server from vLLM's own request stats, so its time to first
token and end-to-end are the ones vLLM's metrics and `llm_request` spans report.

Nothing leaves vLLM's process but those log lines: no exporter, no socket, no thread. Every
hook is wrapped: a failure in the plugin is logged once and the plugin switches itself off;
vLLM's own method always runs, with its own arguments, and its result or exception is
passed through untouched.

Switches: vLLM's `VLLM_PLUGINS` (the plugin's name is `vllm_trace_bridge`), and
`VLLM_TRACE_BRIDGE_PLUGIN=0`. `VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS=1` adds the per-block lines;
`VLLM_TRACE_BRIDGE_PLUGIN_QUEUE_INTERVAL_S` (default 1) paces the queue-state line.

This module imports nothing from vLLM at import time, and nothing from the rest of the bridge.
"""

from __future__ import annotations

import os

#: vLLM releases (major, minor) the plugin was tested against. Not a gate: on any other
#: version it installs when every hook point it needs is there (`hooks.HOOK_POINTS`, checked
#: by name and signature), and otherwise says which one is missing and leaves vLLM untouched.
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
