"""The agent's own logs: structlog, JSON when stderr is not a terminal, readable when it is.

A logger is built and passed down (no `structlog.configure`, no global state), and nothing
logs per line on the hot path.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from bridge.export.trouble import export_fix


def make_logger(stream: TextIO | None = None, json: bool | None = None, secrets: tuple[str, ...] = ()) -> Logger:
    """The bridge's logger: structlog, built at its first use. `replay` usually logs nothing,
    and importing structlog (it imports asyncio) is a fifth of its start-up. Every line is
    scrubbed of URL credentials and of `secrets` (bridge.export.secrets) before it is written."""
    return Logger(lambda: _structlog_logger(stream, json, secrets))


class Logger:
    """Stands for the structlog logger `build()` makes, and makes it when first used."""

    __slots__ = ("_build", "_logger")

    def __init__(self, build: Callable[[], object]) -> None:
        self._build = build
        self._logger = None

    def __getattr__(self, name: str):
        if name in Logger.__slots__:  # unset (a copy made by `copy`): not the logger's to answer
            raise AttributeError(name)
        if self._logger is None:
            self._logger = self._build()
        return getattr(self._logger, name)


def _structlog_logger(stream: TextIO | None, json: bool | None, secrets: tuple[str, ...] = ()):
    import structlog

    from bridge.export.secrets import Redactor

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
            Redactor(secrets),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(20),
    )


_LIBRARIES = ("opentelemetry", "grpc")
_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error",
           logging.CRITICAL: "critical"}


class StructlogHandler(logging.Handler):
    """A stdlib logging handler that hands each record to a structlog logger, so the
    OpenTelemetry SDK's and gRPC's own lines come out in the agent's format (JSON in
    production) instead of plain text between its JSON lines.

    `on_export_trouble(message)`: called for an exporter's warning or error (a refused or
    failed export attempt); when given, those records are left to it instead of logged."""

    def __init__(self, log, on_export_trouble: Callable[[str], None] | None = None) -> None:
        super().__init__(logging.WARNING)
        self._log = log
        self._on_trouble = on_export_trouble

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if self._on_trouble is not None and record.name.startswith("opentelemetry.exporter"):
                self._on_trouble(message)
                return
            method = getattr(self._log, _LEVELS.get(record.levelno, "warning"))
            fix = export_fix(message) if record.name.startswith("opentelemetry.exporter") else None
            if fix is not None:  # a TLS failure: a receiver answered, and the agent's own line can't say why
                method(record.name.split(".", 1)[0] + "_log", logger=record.name, message=message, fix=fix)
            else:
                method(record.name.split(".", 1)[0] + "_log", logger=record.name, message=message)
        except Exception:  # a logging problem never stops the agent
            self.handleError(record)


@contextmanager
def route_library_logs(log, on_export_trouble: Callable[[str], None] | None = None) -> Iterator[StructlogHandler]:
    """While inside: the `opentelemetry` and `grpc` loggers write through `log` (warnings
    and up), not to stderr as plain text. Restored on exit (the stdlib loggers are global)."""
    handler = StructlogHandler(log, on_export_trouble)
    saved = []
    for name in _LIBRARIES:
        lib = logging.getLogger(name)
        saved.append((lib, lib.propagate, lib.level))
        lib.addHandler(handler)
        lib.propagate = False
        if lib.level == logging.NOTSET or lib.level > logging.WARNING:
            lib.setLevel(logging.WARNING)
    try:
        yield handler
    finally:
        for lib, propagate, level in saved:
            lib.removeHandler(handler)
            lib.propagate = propagate
            lib.setLevel(level)


class ExportProgress:
    """The agent's periodic `export_progress` line: at most every `interval` seconds, and only
    when a counter moved, so an operator sees delivery going (or not) without scraping
    /metrics, and an idle agent stays quiet."""

    KEYS = ("spans_sent", "spans_retried", "spans_dropped", "queued_spans", "requests_finished", "requests_open",
            "files_followed")

    def __init__(self, log, interval: float, clock: Callable[[], float]) -> None:
        self._log = log
        self._interval = interval
        self._clock = clock
        self._next = clock() + interval
        self._last: dict[str, int] = {}

    def __call__(self, counts: Callable[[], dict[str, int]]) -> None:
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        current = counts()
        if current != self._last:
            since = {f"{k}_since_last": current[k] - self._last.get(k, 0)
                     for k in ("spans_sent", "spans_retried", "spans_dropped") if k in current}
            level = "warning" if since.get("spans_dropped_since_last") or since.get("spans_retried_since_last") \
                else "info"
            getattr(self._log, level)("export_progress", **current, **since)
            self._last = current
