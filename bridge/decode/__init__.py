"""decode: physical lines of one file → `Record`s (framing removed, timestamp resolved).

One `Decoder` per file: it keeps that file's framing, partial-line buffer and clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo

from bridge.decode.clock import MAX_NS, HeaderClock, Rfc3339
from bridge.decode.flattened import ANSI as _ANSI
from bridge.decode.flattened import line_text, may_hold_records, raw_starts, record_starts
from bridge.decode.framing import CLOUD, CRI, DOCKER, PLAIN, CloudUnwrapper, CriUnwrapper, DockerUnwrapper, detect
from bridge.decode.jsonline import JsonLine, parse_json_line, parse_json_text
from bridge.decode.prefix import FULL_LEVEL, HEADER, split_prefix
from bridge.decode.record import CLOCK_ANCHORED, CLOCK_HEADER, CLOCK_JSON, CLOCK_RUNTIME, CLOCK_SHIPPER, Record

__all__ = ["Carry", "Decoder", "DecodeStats", "Record"]

_MAX_PARTIAL_CHARS = 4 * 1024 * 1024  # a runaway partial line is cut, not held forever
# A JSON record's own `asctime` (ms) wins over the runtime's stamp when it lies this far before
# the read at most: further off, the record's zone is not the one configured.
_JSON_LAG_NS, _MS_NS = 10_000_000_000, 1_000_000
_S_NS = 1_000_000_000


def _header_near(stamp: str, runtime_ts: int, tz: tzinfo) -> int | None:
    """The header's `MM-DD HH:MM:SS` (local time in `tz`) in the year of the runtime's stamp
    of the same line (not the HeaderClock's year, which a CRI file never needs): epoch ns,
    None when it is no date that year."""
    try:
        year = datetime.fromtimestamp(runtime_ts // _S_NS, tz).year
        return int(datetime(year, int(stamp[0:2]), int(stamp[3:5]), int(stamp[6:8]), int(stamp[9:11]),
                            int(stamp[12:14]), tzinfo=tz).timestamp()) * _S_NS
    except (ValueError, OverflowError, OSError):
        return None


@dataclass(frozen=True, slots=True)
class Held:
    """One stream's partial line: its parts so far, where it began and ended, its stamp, and
    whether it is being cut (its rest is dropped)."""

    stream: str
    parts: tuple[str, ...]
    chars: int
    offset: int
    end: int
    ts: int
    cut: bool


@dataclass(frozen=True, slots=True)
class Carry:
    """The partial lines a file ended in, handed to the file its writer went on in (a kubelet
    rotation can fall between a `P` part and its `F` end: `Decoder.carry`, `Decoder.adopt`)."""

    framing: str
    held: tuple[Held, ...]

    @property
    def position(self) -> int:
        """Where the earliest of them began: a resume must re-read from there."""
        return min(h.offset for h in self.held)


@dataclass(slots=True)
class DecodeStats:
    lines: int = 0            # physical lines in
    records: int = 0          # records out
    invalid_utf8: int = 0
    framing_errors: int = 0   # a line that did not fit its file's framing
    partials_joined: int = 0
    no_header: int = 0        # records with no vLLM header (timed from the last one)
    prefixed: int = 0         # records with a process prefix, shipper stamp or literal prefix
    truncated: int = 0
    times_out_of_range: int = 0  # before 1970 or after 2500: the stream's last good time instead


class Decoder:
    __slots__ = ("stats", "_framing", "_unwrap", "_clock", "_last_ts", "_parts", "_part_offset",
                 "_part_chars", "_part_end", "_part_ts", "_header", "_shipper", "_tz", "_cut", "_part_stream",
                 "_others", "_column", "_more")

    def __init__(self, *, tz: tzinfo = timezone.utc, year: int | None = None, mtime: float | None = None):
        self.stats = DecodeStats()
        self._framing: str | None = None
        self._unwrap = None
        self._clock = HeaderClock(tz, year, mtime)
        self._last_ts = int(mtime * 1e9) if mtime and 0 < mtime * 1e9 <= MAX_NS else 0
        self._parts: list[str] = []
        self._part_offset = 0
        self._part_chars = 0
        self._part_end = 0
        self._part_ts = 0
        self._header = HEADER.match
        self._shipper = Rfc3339()
        self._tz = tz
        self._cut = False  # dropping the rest of a partial line cut at _MAX_PARTIAL_CHARS
        # The `_part*` slots and `_cut` are the state of one stream's partial line (`_part_stream`,
        # "stdout" or "stderr"); another stream's, while it holds one, waits in `_others`. The
        # kubelet writes the streams' parts independently: a `P` on stderr inside a stdout line
        # must not be joined into it.
        self._part_stream = ""
        self._others: dict[str, tuple] = {}
        # the columns a viewer put before the last header (prefix.Split.column): taken off the
        # header-less lines that start with them too (a traceback under `kserve-container `)
        self._column = ""
        self._more: list[Record] | None = None  # a flattened line's records after its first (`more`)

    @property
    def framing(self) -> str | None:
        return self._framing

    @property
    def held_position(self) -> int | None:
        """Where a partial line this decoder still holds began (a resume must re-read it), or
        the line it is cutting: a resume from inside it would read its rest as a line."""
        held = [o[2] for o in self._others.values()]
        if self._parts or self._cut:
            held.append(self._part_offset)
        return min(held, default=None)

    def __call__(self, raw: bytes, offset: int) -> Record | None:
        """One physical line (with its newline) starting at `offset` → a Record, or None while a
        partial line is being joined or the line is empty."""
        stats = self.stats
        stats.lines += 1
        end = offset + len(raw)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            stats.invalid_utf8 += 1
            line = raw.decode("utf-8", "replace")
        line = line.rstrip("\n")
        if self._framing is None:
            if not line.rstrip("\r"):
                return None
            self._framing = detect(line)
            unwrappers = {CRI: CriUnwrapper, DOCKER: DockerUnwrapper, CLOUD: CloudUnwrapper}
            self._unwrap = unwrappers.get(self._framing, lambda: None)()

        runtime_ts = None
        if self._unwrap is not None:
            framed = self._unwrap(line)
            if framed is None:
                stats.framing_errors += 1
            else:
                runtime_ts, partial, line = framed
                stream = getattr(self._unwrap, "stream", "")
                if stream != self._part_stream and (self._others or self._parts or self._cut):
                    self._switch(stream)
                else:
                    self._part_stream = stream
                if self._cut:  # the rest of a line cut below: never a line of its own (forged lines)
                    self._cut = partial
                    return None
                if partial or self._parts:
                    if not self._parts:
                        self._part_offset = offset
                        self._part_ts = runtime_ts  # a joined line is as old as its first part
                        self._part_chars = 0
                    self._parts.append(line)
                    self._part_chars += len(line)
                    self._part_end = end
                    if partial and self._part_chars < _MAX_PARTIAL_CHARS:
                        return None
                    if partial:
                        stats.truncated += 1
                        self._cut = True
                    line, offset = self._take_parts()
                    runtime_ts = self._part_ts
        if not line:
            return None
        record = self._record(line, runtime_ts, offset, end)
        if record is not None and self._unwrap is None and may_hold_records(record.message) \
                and not self._leads_with_header(line):
            return self._unflatten(record, raw, end)
        return record

    def _leads_with_header(self, line: str) -> bool:
        """The line starts with vLLM's header, or with a process prefix and the header: a line of
        one record (its message may quote another's header), and the only lines the C fast path
        takes, so that path and this one read every line alike."""
        if self._header(line) is not None:
            return True
        close = line.find(") ") if line[:1] == "(" else -1
        return close > 0 and self._header(line, close + 2) is not None

    def more(self) -> list[Record] | None:
        """The records after the first of the line just decoded, when it held several (and None
        for every other line): a caller that reads them all takes these after the one returned."""
        more, self._more = self._more, None
        return more

    def _unflatten(self, record: Record, raw: bytes, end: int) -> Record:
        """A line that holds several vLLM records (`flattened.record_starts`, its own header too):
        each is a record of its own, its header read, at the byte where it begins in the line (a
        resume from there reads it again whole); the text before the first stays the record it
        was. Any other line is returned as it came."""
        message = record.message
        if not line_text(raw).endswith(message):
            return record  # its text is no part of the line: a JSON record's message (one record)
        starts = record_starts(message, bool(record.level))
        if starts is None:
            return record
        bounds = [record.offset + at for at in raw_starts(message, starts, raw)]
        low = record.offset
        for i, at in enumerate(bounds):  # (kept inside the line, each after the one before)
            bounds[i] = low = min(max(low + 1, at), end - 1)
        more = []
        for i, s in enumerate(starts):
            text = message[s:starts[i + 1] - 1] if i + 1 < len(starts) else message[s:]
            part = self._record(text, None, bounds[i], bounds[i + 1] if i + 1 < len(bounds) else end)
            if part is not None:
                more.append(part)
        head = message[:starts[0] - 1].rstrip()
        if not head:  # nothing before the first header: it is the line's first record
            first, more = more[0], more[1:]
            self.stats.records -= 1  # the header-less record it replaces
        else:  # the line's first record, cut where the next begins
            first = Record(record.ts_ns, record.clock, record.level, record.origin, head, record.offset, bounds[0],
                           record.process, False)
        self._more = more or None
        return first

    def _record(self, line: str, runtime_ts: int | None, offset: int, end: int) -> Record | None:
        stats = self.stats
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        continued = line.endswith("\r")
        if continued:
            line = line.rstrip("\r")
            if not line:
                return None
        process = ""
        own = None
        if line[:1] == "{":  # vLLM's JSON format: one record per line, year and milliseconds
            js = parse_json_line(line, self._tz)
            if js is not None:
                stats.records += 1
                return self._json(js, runtime_ts, offset, end)
        m = self._header(line)
        if m is None:  # the slow path: prefixes, shipper stamps, lines with no header
            split = split_prefix(line)
            if split.column:
                self._column = split.column
            elif split.header is None and self._column and line.startswith(self._column):
                split = split_prefix(line[len(self._column):])
            m, process, line = split.header, split.process, split.line or line
            if split.shipper_stamp and runtime_ts is None:
                runtime_ts = self._shipper(split.shipper_stamp)
                shipper = runtime_ts is not None
            else:
                shipper = False
            if m is not None or process or split.message_start:
                stats.prefixed += 1
            if m is None:
                line = line[split.message_start:]
                if not line:
                    return None
                if split.own_stamp:
                    own = split
        else:
            shipper = False
        if m is not None:
            level, stamp, origin = m.groups()
            if level in FULL_LEVEL:  # a header whose level lost its first letter (prefix.CLIPPED_HEADER)
                level = FULL_LEVEL[level]
            message = line[m.end():]
            if runtime_ts is not None:
                ts, clock = runtime_ts, (CLOCK_SHIPPER if shipper else CLOCK_RUNTIME)
                if not shipper and int(stamp[12:14]) != runtime_ts // _S_NS % 60 and \
                        (own_s := _header_near(stamp, runtime_ts, self._tz)) is not None and \
                        own_s + _S_NS <= runtime_ts <= own_s + _JSON_LAG_NS:
                    # vLLM wrote the line within its header's second; the runtime stamped it
                    # when it read the pipe, after that second had passed (a loaded machine:
                    # over a second late). The line's time is no later than the second's end.
                    # (The C fast path takes only lines whose stamp is in the header's second.)
                    ts = own_s + _S_NS - 1
            else:
                ts, clock = self._clock(stamp), CLOCK_HEADER
                if ts is None:  # 02-30 is not a date: keep the line, time it from the last one
                    ts, clock = self._last_ts, CLOCK_ANCHORED
        else:
            level = origin = ""
            message = line
            stats.no_header += 1
            if runtime_ts is not None:
                ts, clock = runtime_ts, (CLOCK_SHIPPER if shipper else CLOCK_RUNTIME)
            elif own is not None and (ts := self._clock(own.own_stamp)) is not None:
                # torch C++ / journald: the line's own local time, after a zone-exact stamp
                ts, clock = ts + own.own_frac_ns, CLOCK_HEADER
            else:
                ts, clock = self._last_ts, CLOCK_ANCHORED
        if not 0 <= ts <= MAX_NS:  # what OTLP cannot carry (1900, 9999)
            stats.times_out_of_range += 1
            ts, clock = self._last_ts, CLOCK_ANCHORED
        self._last_ts = ts
        stats.records += 1
        return Record(ts, clock, level, origin, message, offset, end, process, continued)

    def _json(self, js: JsonLine, runtime_ts: int | None, offset: int, end: int,
              runtime_clock: str = CLOCK_RUNTIME) -> Record:
        if runtime_ts is not None and js.ts_ns is not None and \
                runtime_ts - _JSON_LAG_NS <= js.ts_ns and js.ts_ns + _MS_NS <= runtime_ts:
            # vLLM stamped the record as the event happened; the runtime, when it read
            # the line (a pipe's buffering can hold several lines and stamp them alike).
            # The record's millisecond is the better time when it lies before the read.
            ts, clock = js.ts_ns, CLOCK_JSON
        elif runtime_ts is not None:
            ts, clock = runtime_ts, runtime_clock
        elif js.ts_ns is not None:
            ts, clock = js.ts_ns, CLOCK_JSON
        else:
            ts, clock = self._last_ts, CLOCK_ANCHORED
        if not 0 <= ts <= MAX_NS:
            self.stats.times_out_of_range += 1
            ts, clock = self._last_ts, CLOCK_ANCHORED
        self._last_ts = ts
        return Record(ts, clock, js.level, js.origin, js.message, offset, end, js.process)

    def json_record(self, text: str, first: Record, end: int) -> Record | None:
        """A JSON record pretty-printed over the lines from `first` to `end` (decode's joiner
        gathered them, `text` joined by newlines), timed as a one-line record is (its own
        millisecond, or the stamp the runtime or a shipper gave its first line); None when it
        is no JSON log record. The lines were counted as records already."""
        js = parse_json_text(text, self._tz)
        if js is None:
            return None
        runtime = first.ts_ns if first.clock in (CLOCK_RUNTIME, CLOCK_SHIPPER) else None
        return self._json(js, runtime, first.offset, end, first.clock)

    def _switch(self, stream: str) -> None:
        """Make `stream`'s partial-line state the current one; the current one, if it holds
        anything, waits in `_others` for its stream's next line."""
        mine = self._others.pop(stream, None)
        if self._parts or self._cut:
            self._others[self._part_stream] = (self._parts, self._part_chars, self._part_offset, self._part_end,
                                               self._part_ts, self._cut)
        if mine is None:
            mine = ([], 0, 0, 0, 0, False)
        (self._parts, self._part_chars, self._part_offset, self._part_end, self._part_ts, self._cut) = mine
        self._part_stream = stream

    def carry(self) -> Carry | None:
        """The partial lines held (each stream's), taken out: the writer goes on with them in
        another file. None when none is held."""
        if self._framing is None:
            return None
        held = []
        if self._parts or self._cut:
            held.append(Held(self._part_stream, tuple(self._parts), self._part_chars, self._part_offset,
                             self._part_end, self._part_ts, self._cut))
        for stream, (parts, chars, offset, end, ts, cut) in self._others.items():
            if parts or cut:
                held.append(Held(stream, tuple(parts), chars, offset, end, ts, cut))
        self._parts, self._cut, self._others = [], False, {}
        return Carry(self._framing, tuple(sorted(held, key=lambda h: h.offset))) if held else None

    def adopt(self, carry: Carry) -> None:
        """Go on with the partial lines another file ended in (`carry`), before this file's
        first line: its writer is the same (a rotation's next file), so is its framing. Their
        records keep their first part's position, in the older file."""
        if self._framing is not None or self._parts or self._others or self._cut:
            raise ValueError("adopt() before the first line only")
        self._framing = carry.framing
        unwrappers = {CRI: CriUnwrapper, DOCKER: DockerUnwrapper, CLOUD: CloudUnwrapper}
        self._unwrap = unwrappers.get(carry.framing, lambda: None)()
        for h in carry.held:
            self._others[h.stream] = (list(h.parts), h.chars, h.offset, h.end, h.ts, h.cut)
        first = carry.held[0].stream  # the earliest is the current one, the others wait
        (self._parts, self._part_chars, self._part_offset, self._part_end, self._part_ts,
         self._cut) = self._others.pop(first)
        self._part_stream = first

    def flush(self) -> Record | None:
        """At end of input: a partial line never completed is still a line. One stream's at a
        time, the earliest first: call until None."""
        while True:
            if not self._parts:
                waiting = [k for k, o in self._others.items() if o[0]]
                if not waiting:
                    return None
                self._switch(min(waiting, key=lambda k: self._others[k][2]))
                continue
            end, ts = self._part_end, self._part_ts
            line, offset = self._take_parts()
            record = self._record(line, ts, offset, end) if line else None
            if record is not None:
                return record

    def _take_parts(self) -> tuple[str, int]:
        self.stats.partials_joined += len(self._parts) - 1
        line = "".join(self._parts)
        self._parts = []
        return line, self._part_offset
