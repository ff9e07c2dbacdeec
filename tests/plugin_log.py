"""A logger that keeps what the plugin writes, for the plugin's unit tests (the hooks write
through a `logging.Logger`, as they do inside vLLM)."""

from __future__ import annotations

import logging

import pytest


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def log():
    logger = logging.getLogger(f"test.vllm_plugin.{id(object())}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    h = Lines()
    logger.addHandler(h)
    logger.lines = h.lines
    return logger
