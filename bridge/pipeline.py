"""Wires the stages for one pass over finished files: tail → decode → parse → assemble → sinks.

Every stage is built here and only here, so a stage never imports another stage's internals;
sinks (OTLP, waterfall, summary) are plain callables taking a timeline.
"""

from __future__ import annotations

import os
from itertools import chain, islice
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from datetime import timezone, tzinfo

from bridge.assemble import AssembleConfig, Assembler, AssembleStats, Timeline
from bridge.decode import Decoder, DecodeStats
from bridge.decode.joiner import JoinStats
from bridge.decode.record import Record
from bridge.decode.stream import RecordStream
from bridge.export.transforms import fan_out
from bridge.parse import Parser, ParseStats
from bridge.parse.rules import Rules
from bridge.tail import read_lines
from bridge.tail.source import source_for, streams
from bridge.core.position import GEN_SHIFT

Sink = Callable[[Timeline], None]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    tz: tzinfo = timezone.utc
    year: int | None = None
    assemble: AssembleConfig = AssembleConfig()
    rules: Rules | None = None  # user line rules (--rules), run where the built-in grammar found nothing
    # Open requests kept per stream; beyond this the oldest are closed (counted in
    # `assemble.requests_capped`): the agent's `max_open_requests`, with its default.
    max_open_requests: int = 100_000  # (tests/test_open_cap.py: the agent's default)


@dataclass(slots=True)
class ReplayStats:
    files: int = 0
    decode: DecodeStats = field(default_factory=DecodeStats)
    join: JoinStats = field(default_factory=JoinStats)
    parse: ParseStats = field(default_factory=ParseStats)
    assemble: AssembleStats = field(default_factory=AssembleStats)
    line_errors: dict[str, int] = field(default_factory=dict)  # stage → lines a stage raised on (skipped)
    cut: dict[str, int] = field(default_factory=dict)  # lines_oversized, bytes_cut (tail.files.read_lines)


class LineErrors:
    """One line a stage raises on is skipped, counted by stage and logged once per file and
    error kind, with its byte offset and never its content (it may hold what a user typed)."""

    def __init__(self, counts: dict[str, int], log=None) -> None:
        self.counts = counts
        self._log = log
        self._seen: set[tuple[str, str, str]] = set()

    def __call__(self, stage: str, path: str, offset: int | None, exc: BaseException) -> None:
        self.counts[stage] = self.counts.get(stage, 0) + 1
        kind = type(exc).__name__
        if self._log is not None and (path, stage, kind) not in self._seen:
            if len(self._seen) > 10_000:
                self._seen.clear()
            self._seen.add((path, stage, kind))
            self._log.warning("line_error", stage=stage, file=path, offset=offset, error=kind,
                              note="line skipped; further errors of this kind in this file are only counted")


def _add_into(total, part) -> None:
    for f in fields(part):
        v = getattr(part, f.name)
        if isinstance(v, int):
            setattr(total, f.name, getattr(total, f.name) + v)


class Stages:
    """How the agent reaches its stages, injected at its construction: each hook returns what
    it is given. The fault-injection tests wrap them from outside (`bridge.faults`), so the
    agent's own code has no test hooks of its own."""

    def lines(self, lines: list[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
        """A batch's (position, raw line) pairs, as an iterator `operator.length_hint` reads."""
        return iter(lines)

    def parse(self, parse: Callable) -> Callable:
        return parse

    def feed(self, feed: Callable) -> Callable:
        return feed


def drive(records: Callable[[], Iterable[Record]], parse: Callable, feed: Callable, errors: Callable,
          path: str, where: Callable[[], int | None], keep: Callable | None = None) -> Record | None:
    """Records → parse → assemble, for replay and the live agent alike: a line a stage raises
    on is skipped and counted (`errors(stage, path, offset, exc)`), never fatal. `records()` is
    called again after the decoder raised, going on from the line after `where()` (the
    offset of the line it raised on). `keep(record, event)`, when given, filters each event
    before it is fed (the event, another, or None: not fed; counted as assemble's if it
    raises): the agent's skip of requests delivered before a restart. Returns the last record
    read, or None."""
    record = None
    failed_at = None
    while True:
        try:
            for record in records():
                try:
                    event = parse(record.message, record.level, record.origin)
                except Exception as exc:
                    errors("parse", path, record.offset, exc)
                    continue
                if event is not None:
                    try:
                        if keep is not None:
                            event = keep(record, event)
                            if event is None:
                                continue
                        feed(record, event)
                    except Exception as exc:
                        errors("assemble", path, record.offset, exc)
            return record
        except Exception as exc:
            pos = where()
            errors("decode", path, pos, exc)
            if pos == failed_at:  # no line read since the last one: it is the end that fails
                return record
            failed_at = pos


#: Lines between two looks at the open-request limit: the agent looks once per read (a chunk of
#: the file), so both overshoot it by at most a few thousand requests and memory stays bounded.
_CAP_EVERY = 4096


def bounded(lines: Iterable, assembler: Assembler, keep: int, errors: Callable, path: str) -> Iterable:
    """`lines`, passed on as they are; after each `_CAP_EVERY` of them the assembler's oldest open
    requests are closed until `keep` remain (`Assembler.evict_oldest`), as the agent does after
    each read: a log of requests that start and never end no longer holds them all until its end."""
    def chunks():  # the cap looked at between chunks; lines pass through chain (C), not this frame
        it = iter(lines)
        while chunk := list(islice(it, _CAP_EVERY)):
            yield chunk
            if assembler.open_requests > keep:
                try:
                    assembler.evict_oldest(keep)
                except Exception as exc:
                    errors("assemble", path, None, exc)
    return chain.from_iterable(chunks())


def replay(paths: Iterable[str], sinks: list[Sink], config: ReplayConfig = ReplayConfig(),
           log=None) -> ReplayStats:
    """Run the files through the pipeline. The files of one container's stream (its rotated
    files, its live file, its restarts: `tail.source.streams`) are one log, read in the order
    written into one assembler, as the live agent reads them: a request across a rotation is
    one request, and its ids are the agent's. Each file has its own decoder (framing, clock).
    A line that makes a stage raise is skipped and counted (`stats.line_errors`), never fatal."""
    stats = ReplayStats()
    errors = LineErrors(stats.line_errors, log)
    parser = Parser(rules=config.rules)
    emit = fan_out(sinks)

    for files in streams(paths):
        assembler = None
        for gen, path in enumerate(files):  # a stream's files are its generations
            stats.files += 1
            source = source_for(path)
            if assembler is None:
                assembler = Assembler(source, emit, config.assemble)
            assembler.add_file(gen, source)
            stream = RecordStream(Decoder(tz=config.tz, year=config.year, mtime=os.stat(path).st_mtime))
            at = [-1]
            lines = bounded(read_lines(path, gen << GEN_SHIFT, at, stats.cut), assembler, config.max_open_requests, errors, path)
            drive(lambda: stream.over(lines), parser.parse, assembler.feed, errors, path,
                  lambda: max(at[0], 0))
            _add_into(stats.decode, stream.decoder.stats)
            _add_into(stats.join, stream.joiner.stats)
        try:
            assembler.flush()
        except Exception as exc:
            errors("assemble", files[-1], None, exc)
        _add_into(stats.assemble, assembler.stats)
    stats.parse = parser.snapshot()
    return stats
