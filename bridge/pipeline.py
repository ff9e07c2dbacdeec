"""Wires the stages for one pass over finished files: tail → decode → parse → assemble → sinks.

Every stage is built here and only here, so a stage never imports another stage's internals;
sinks (OTLP, waterfall, summary) are plain callables taking a timeline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import timezone, tzinfo

from bridge.assemble import AssembleConfig, Assembler, AssembleStats, Timeline
from bridge.decode import Decoder, DecodeStats, source_for
from bridge.decode.joiner import JoinStats
from bridge.decode.stream import RecordStream
from bridge.parse import Parser, ParseStats
from bridge.tail import read_lines

Sink = Callable[[Timeline], None]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    tz: tzinfo = timezone.utc
    year: int | None = None
    assemble: AssembleConfig = AssembleConfig()


@dataclass(slots=True)
class ReplayStats:
    files: int = 0
    decode: DecodeStats = field(default_factory=DecodeStats)
    join: JoinStats = field(default_factory=JoinStats)
    parse: ParseStats = field(default_factory=ParseStats)
    assemble: AssembleStats = field(default_factory=AssembleStats)


def _add_into(total, part) -> None:
    for f in fields(part):
        v = getattr(part, f.name)
        if isinstance(v, int):
            setattr(total, f.name, getattr(total, f.name) + v)


def replay(paths: Iterable[str], sinks: list[Sink], config: ReplayConfig = ReplayConfig()) -> ReplayStats:
    """Run every file through the pipeline, in order, each with its own decoder and assembler."""
    stats = ReplayStats()
    parser = Parser()
    if len(sinks) == 1:
        emit = sinks[0]
    else:
        def emit(t: Timeline) -> None:
            for sink in sinks:
                sink(t)

    for path in paths:
        stats.files += 1
        stream = RecordStream(Decoder(tz=config.tz, year=config.year, mtime=os.stat(path).st_mtime))
        assembler = Assembler(source_for(path), emit, config.assemble)
        feed, parse = assembler.feed, parser.parse  # the per-line calls, C fast paths when built
        for record in stream.over(read_lines(path)):
            event = parse(record.message, record.level, record.origin)
            if event is not None:
                feed(record, event)
        assembler.flush()
        _add_into(stats.decode, stream.decoder.stats)
        _add_into(stats.join, stream.joiner.stats)
        _add_into(stats.assemble, assembler.stats)
    stats.parse = parser.snapshot()
    return stats
