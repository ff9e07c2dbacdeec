"""Timestamps: RFC 3339 runtime stamps, and vLLM's year-less, one-second header stamps."""

from __future__ import annotations

import calendar
import re
from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo

_NS = 1_000_000_000
# The times a record may carry: OTLP's fixed64 nanoseconds run from 1970 to 2554; the end is
# kept to 2500 so that a reported duration (at most a month, parse.numbers) added to a time
# still fits. A stamp outside is replaced by its stream's last good time (Decoder, counted).
MAX_NS = 16_725_225_600 * _NS  # 2500-01-01T00:00:00Z
_RFC3339_TAIL = re.compile(r"(?:\.(\d{1,9})\d*)?(Z|z|[+-]\d\d:?\d\d)?$")


def zone(name: str) -> tzinfo:
    """`UTC` or an IANA name; raises ValueError naming the zone when it is unknown."""
    if name.upper() in ("UTC", "Z"):
        return timezone.utc
    try:
        return ZoneInfo(name)
    except Exception as exc:  # ZoneInfoNotFoundError, ValueError on odd keys
        raise ValueError(f"unknown timezone {name!r}: use UTC or an IANA name such as Europe/Berlin") from exc


class Rfc3339:
    """`2024-02-15T10:23:45.123456789Z` → epoch ns; the date-time part is cached per second."""

    __slots__ = ("_base", "_base_ns")

    def __init__(self) -> None:
        self._base = ""
        self._base_ns = 0

    def __call__(self, stamp: str) -> int | None:
        base = stamp[:19]
        if len(base) < 19:  # (else "" would match the empty cache and read as the epoch)
            return None
        if base != self._base:
            try:
                self._base_ns = calendar.timegm(datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").timetuple()) * _NS
            except ValueError:
                return None
            self._base = base
        m = _RFC3339_TAIL.match(stamp, 19)
        if m is None:
            return None
        frac, tz = m.groups()
        ns = self._base_ns + (int(frac.ljust(9, "0")) if frac else 0)
        if tz and tz not in "Zz":
            sign = 1 if tz[0] == "+" else -1
            hh, mm = int(tz[1:3]), int(tz[-2:])
            ns -= sign * (hh * 3600 + mm * 60) * _NS
        return ns


class HeaderClock:
    """vLLM's `MM-DD HH:MM:SS` → epoch ns.

    The year comes from `year`, else from `reference` (the file's mtime: a line is never
    newer than its file), and rolls forward when the month falls back (Dec → Jan). That roll
    is undone when the month jumps ahead again (Jan → Dec): a stray January line among
    December ones, or a December line written late after the new year, moves only the lines it
    stamps. A gap of months with no roll before it (a quiet server) moves nothing.
    """

    __slots__ = ("_tz", "_year", "_reference", "_last_month", "_rolled", "_cache_key", "_cache_ns")

    def __init__(self, tz: tzinfo = timezone.utc, year: int | None = None, reference: float | None = None):
        self._tz = tz
        self._year = year
        self._reference = reference
        self._last_month = 0
        self._rolled = False  # the year was last moved by a roll forward, not set
        self._cache_key = ""
        self._cache_ns = 0

    def __call__(self, stamp: str) -> int | None:
        """`stamp` is exactly `MM-DD HH:MM:SS`, or `MM-DD HH:MM` (a `datefmt` without seconds: the
        minute's start); None when it is not a real date."""
        if stamp == self._cache_key:
            return self._cache_ns
        try:
            month, day = int(stamp[0:2]), int(stamp[3:5])
            hour, minute, second = int(stamp[6:8]), int(stamp[9:11]), int(stamp[12:14]) if len(stamp) > 11 else 0
        except ValueError:
            return None
        if self._year is None:
            self._year = self._infer_year(month, day)
        elif month < self._last_month - 6:
            self._year += 1
            self._rolled = True
        elif month > self._last_month + 6 and self._rolled:
            self._year -= 1
            self._rolled = False
        self._last_month = month
        try:
            if self._tz is timezone.utc:
                secs = calendar.timegm((self._year, month, day, hour, minute, second, 0, 0, 0))
                datetime(self._year, month, day, hour, minute, second)  # validates the date
            else:
                secs = datetime(self._year, month, day, hour, minute, second, tzinfo=self._tz).timestamp()
        except ValueError:
            return None
        ns = int(secs) * _NS
        if 0 <= ns <= MAX_NS:  # an out-of-range second is not cached: the C fast path reads the cache
            self._cache_key, self._cache_ns = stamp, ns
        return ns

    def _infer_year(self, month: int, day: int) -> int:
        ref = datetime.fromtimestamp(self._reference, self._tz) if self._reference else datetime.now(self._tz)
        return ref.year - 1 if (month, day) > (ref.month, ref.day) else ref.year
