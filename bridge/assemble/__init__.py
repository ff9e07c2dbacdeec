"""assemble: typed events of one source → finished request and engine timelines."""

from bridge.assemble.diagnosis import Thresholds
from bridge.assemble.requests import AssembleConfig, Assembler, AssembleStats
from bridge.assemble.timeline import (
    INFERRED,
    OBSERVED,
    REPORTED,
    EngineTimeline,
    Phase,
    RequestTimeline,
    SpanEvent,
    Timeline,
)

__all__ = [
    "AssembleConfig", "Assembler", "AssembleStats", "Thresholds", "EngineTimeline", "Phase",
    "RequestTimeline", "SpanEvent", "Timeline", "REPORTED", "OBSERVED", "INFERRED",
]
