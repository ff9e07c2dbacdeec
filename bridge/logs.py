"""The agent's own logs: structlog, JSON when stderr is not a terminal, readable when it is.

A logger is built and passed down (no `structlog.configure`, no global state), and nothing
logs per line on the hot path.
"""

from __future__ import annotations

import sys
from typing import TextIO

import structlog


def make_logger(stream: TextIO | None = None, json: bool | None = None) -> structlog.typing.FilteringBoundLogger:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    return structlog.wrap_logger(
        structlog.PrintLogger(stream),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(20),
    )
