"""How a request is over, and why it goes out: the two values every ending names.

A request is *over* once a line, the engine's death or the server's stop ends it: `End` says
which, and so its outcome, `error.type` and exception. It *goes out* (its timeline is emitted,
its id released) when nothing more is to come — at once, after lingering for its last block
frees or its API server's lines, or with no line having ended it at all: `Close` says why.
Both go through one method each of the assembler (`_end`, `_close`); no other code sets an
outcome or emits a request.
"""

from __future__ import annotations

from enum import Enum


class End(Enum):
    """Why a request is over: (outcome, `error.type` unless the line says, exception type unless
    the line says, whether a signal — the engine's death, the server's stop — ended it rather
    than a line of its own; such a request may still show its answer after all)."""

    FINISHED = ("finished", None, None, False)       # a summary, `Finished request`, a finish reason
    ABORTED = ("aborted", "aborted", "RequestAborted", False)  # the client went, or vLLM aborted it
    FAILED = ("failed", None, "RequestFailed", False)  # vLLM failed it: the line says why
    TIMEOUT = ("timeout", "timeout", "RequestTimeout", False)
    STOPPED = ("aborted", "shutdown", "ServerShutdown", True)  # a deliberate stop (SIGTERM, a rollout)
    ENGINE_DIED = ("failed", None, "EngineDeadError", True)    # the engine's incident ended it

    def __init__(self, outcome: str, error_type: str | None, exception: str | None, by_signal: bool) -> None:
        self.outcome = outcome
        self.error_type = error_type
        self.exception = exception
        self.by_signal = by_signal


STOPPED_MESSAGE = "the server was stopped while the request was in flight"


def engine_failed(error_type: str | None) -> str:
    """A request's own failure when the engine died: the incident's type, not its text (that is
    on the linked `vllm.engine` span)."""
    return f"engine failed ({error_type}); see the linked vllm.engine span"


class Close(Enum):
    """Why a request's timeline goes out now."""

    DONE = "done"          # over, and nothing more is to come (its frees, its API server's lines)
    IDLE = "idle"          # no line ended it; the engine showed itself idle without it: over, end inferred
    UNENDED = "unended"    # no line ended it, none will: `incomplete`, unless the engine's state says more
    REUSED = "reused"      # no line ended it, and a new request took its id: as UNENDED, or idle if upstream
    EXPIRED = "expired"    # its TTL passed, or the open requests are too many: DONE if over, else evicted
    FLUSHED = "flushed"    # the end of input: DONE if over, else UNENDED
