"""Which occurrence of a request each id names: the requests of one source not yet emitted.

Four maps, kept consistent by the methods below and no other code:
- `open`: every request not yet emitted, under its id (or, for a twin, `twin_key`);
- `in_flight`: the subset not yet over;
- `twins`: requests received under an id while another under it was not yet added (clients
  that reuse `X-Request-Id` concurrently), each besides the one under the id itself;
- `gone`: ids of emitted upstream requests → their last line, so a late line makes no orphan.

A request is opened (`open_new`, `open_twin`), seen again (`touch`), over (`over`) and released
(`release`) here; what those mean for its timeline is the assembler's.
"""

from __future__ import annotations

from bridge.assemble import ids
from bridge.assemble.state import RequestState
from bridge.decode.record import CLOCK_ANCHORED, CLOCK_HEADER, Record
from bridge.core.position import GEN_SHIFT

_GONE_KEPT = 4096  # ids of emitted upstream requests remembered
#: Clocks that only say the second a line was written in (vLLM's header; a line with no stamp
#: of its own): the line happened at or after that second's start, within it.
COARSE = frozenset({CLOCK_HEADER, CLOCK_ANCHORED})
_IN_FILE = (1 << GEN_SHIFT) - 1


def where(record: Record) -> str:
    """An occurrence: where a request's (or incident's) first line is, the same for every
    reader of the stream: its time and its byte offset in its own file. Not the file's
    generation: the agent numbers the files it followed from where it started, `replay` the
    files it is given, and kubelet deletes the oldest; ids hashed from it would differ."""
    return f"{record.ts_ns}:{record.offset & _IN_FILE}"


API_SERVERS = "ApiServer_"  # the process prefix of each of vLLM's API servers with --api-server-count > 1


def twin_key(r: RequestState) -> str:
    return f"{r.request_id}\x00{r.occurrence}"


class Occurrences:
    __slots__ = ("open", "in_flight", "twins", "gone")

    def __init__(self) -> None:
        self.open: dict[str, RequestState] = {}
        self.in_flight: dict[str, RequestState] = {}
        self.twins: dict[str, list[RequestState]] = {}
        self.gone: dict[str, int] = {}

    @staticmethod
    def touch(r: RequestState, record: Record) -> RequestState:
        """A line of `r`'s: the latest evidence of it (time and position)."""
        if record.ts_ns > r.last_ns:
            r.last_ns = record.ts_ns
        r.last_offset = record.offset
        return r

    @staticmethod
    def _new(rid: str, record: Record, deps: tuple) -> RequestState:
        # The occurrence is where its first line is (`where`): the same in every run that reads
        # that line, whatever was read before it, so a request rebuilt after a restart or
        # rotation keeps its ids and a reused id never shares them.
        r = RequestState(rid, where(record), record.ts_ns, record.offset)
        r.coarse_start = record.clock in COARSE
        for dep in deps:  # lines it depends on (the gauges it snapshots): a resume reads them again
            if dep is not None and dep < r.first_offset:
                r.first_offset = dep
        return r

    def open_new(self, rid: str, record: Record, deps: tuple) -> RequestState:
        """A new occurrence under `rid` (none is open under it)."""
        r = self._new(rid, record, deps)
        self.open[rid] = r
        self.in_flight[rid] = r
        return r

    def open_twin(self, rid: str, record: Record, deps: tuple) -> RequestState:
        """A new occurrence under `rid` besides the one open under it."""
        r = self._new(rid, record, deps)
        key = twin_key(r)
        self.open[key] = self.in_flight[key] = r
        self.twins.setdefault(rid, []).append(r)
        return r

    def key(self, r: RequestState) -> str:
        """Where `r` is held in `open`: under its id, or as a twin."""
        return r.request_id if self.open.get(r.request_id) is r else twin_key(r)

    def over(self, r: RequestState) -> None:
        """`r` is over: no longer in flight (it stays open until released)."""
        self.in_flight.pop(self.key(r), None)

    def release(self, r: RequestState) -> None:
        """`r` is emitted: no longer open. With twins, the next one open takes the id's place."""
        rid = r.request_id
        if not (self.twins and rid in self.twins):
            del self.open[rid]
            self.in_flight.pop(rid, None)
        else:
            twins = self.twins[rid]
            if self.open.get(rid) is r:
                del self.open[rid]
                self.in_flight.pop(rid, None)
                heir = twins.pop(0)
                key = twin_key(heir)
                del self.open[key]
                self.open[rid] = heir
                if self.in_flight.pop(key, None) is not None:
                    self.in_flight[rid] = heir
            else:
                key = twin_key(r)
                del self.open[key]
                self.in_flight.pop(key, None)
                twins.remove(r)
            if not twins:
                del self.twins[rid]
        if r.extra is not None:  # an upstream request: its late lines are no orphans
            self.gone[rid] = r.last_ns

    def forget(self, deadline: int) -> None:
        """Forget emitted ids whose last line is at or before `deadline` (the TTL), and all
        but the latest `_GONE_KEPT`."""
        if len(self.gone) > _GONE_KEPT or (self.gone and next(iter(self.gone.values())) <= deadline):
            gone = sorted(self.gone.items(), key=lambda kv: kv[1])[-_GONE_KEPT:]
            self.gone = {k: v for k, v in gone if v > deadline}

    def group(self, key: str) -> list[RequestState]:
        """Every open request under this id, oldest first."""
        r = self.open.get(key)
        twins = self.twins.get(key, ())
        return sorted([r, *twins] if r is not None else list(twins), key=lambda o: o.first_offset)

    def occurrence(self, key: str, rid: str, process: str = "") -> RequestState:
        """Which of the requests open under `key` a line naming `rid` belongs to: the one vLLM
        added under that engine id, else the oldest still in flight that the line's API server
        received (each of several API servers logs its own requests), else the oldest in flight."""
        group = self.group(key)
        if rid != key:
            base = ids.engine_base(rid)
            for o in group:
                added = o.engine_ids
                if added and (rid in added or base in {ids.engine_base(a) for a in added}):
                    return o
        if process.startswith(API_SERVERS):
            for o in group:
                if o.terminal_ns is None and o.extra is not None and o.extra.get("vllm.process") == process:
                    return o
        for o in group:
            if o.terminal_ns is None:
                return o
        return group[0]
