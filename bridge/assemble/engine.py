"""An engine's life as its log shows it: its start, its incidents, a deliberate stop, its death.

One `EngineLife` per source. It keeps what the engine-wide lines said — the startup being
gathered, the incident open, whether the engine died or is being stopped, how many requests
the last stats line said it held, the engine's facts (model, version) — and acts on the
requests in flight only through the assembler's `end` and `close` (`ending.End`, `Close`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from bridge.assemble.build import engine_timeline
from bridge.assemble.clock import ClockJump, jump_attrs
from bridge.assemble.ending import Close, End
from bridge.assemble.index import where
from bridge.assemble.kvlines import awaits_remote_kv
from bridge.assemble.startup import Startup
from bridge.assemble.state import RequestState, fan_out, given
from bridge.assemble.timeline import IncidentEvent, IncidentRef, SpanEvent, Timeline
from bridge.decode.record import Record
from bridge.parse.events import (
    CudaOom,
    EngineConfig,
    EngineError,
    EngineStats,
    ModelLoadFailed,
    NcclHint,
    NcclTimeout,
    SERVED_MODEL,
    ServerStop,
    StartupFact,
)

_NS = 1_000_000_000
# A stats line is printed from a snapshot taken a little before it: a request added just before
# an idle line may still log its end. It is closed only if nothing more comes for this long.
IDLE_GRACE_NS = 2 * _NS
# Error records this close together are one incident (a traceback per process, the API server's
# EngineDeadError, the per-request failures): one span, classified on all of them.
INCIDENT_WINDOW_NS = 5 * _NS
#: An incident's `error.type` is the most specific its lines show: a CUDA OOM wrapped in an
#: EngineDeadError stays `oom`, NCCL/watchdog evidence makes a "Worker died" `distributed`.
_SPECIFICITY = {t: i for i, t in enumerate(
    ("oom", "distributed", "timeout", "model_load", "engine_dead", "input", "overloaded", "aborted", "other"))}
#: Errors while the server is being stopped on purpose are part of the stop, not a death, unless
#: they show a failure of their own.
_REAL_FAILURES = frozenset({"oom", "distributed"})


def _incident_event(kind: str, error_type: str, ts_ns: int, occurrence: str) -> IncidentEvent:
    """An engine incident as the requests in flight see it: its type, time and a link to its
    span (the exporter resolves `IncidentRef`), never its text."""
    return IncidentEvent("vllm.engine.incident", ts_ns, {"error.type": error_type, "vllm.incident.kind": kind},
                         IncidentRef(kind, occurrence))


#: The engine a process belongs to: an engine core (`EngineCore_DP1 pid=7`) or one of its workers.
#: vLLM names a worker by its ranks (multiproc_executor.py `setup_proc_title_and_log_prefix`:
#: `Worker_DP1_PP0_TP1`), the DP rank whenever there is more than one engine: `Worker_DP1_TP0`
#: is engine 1's; `Worker_TP1`, `Worker_PP1`, `Worker` (before its groups exist) and older
#: releases' `VllmWorker TP0` / `VllmWorker rank=0` are the one engine's of their source.
_DP_ENGINE = re.compile(r"(?:EngineCore_(?:DP)?|Worker_DP)(\d+)(?!\d)")
_WORKER = re.compile(r"(?:Vllm|Ray)?Worker")


def dp_engine(process: str) -> str:
    """The data-parallel engine a process prefix names (`EngineCore_DP1 pid=7`,
    `Worker_DP1_TP0 pid=9` → "1"), or "" (the source's one engine, or not said)."""
    m = _DP_ENGINE.match(process) if process else None
    return m[1] if m else ""


#: An engine core process with no data-parallel index (`EngineCore pid=7`): the process is the
#: engine (core.py `run_engine_core`), so two of them at once are two engines (vllm-omni's stages,
#: two LLMs in one program), each with its own pid.
_BARE_CORE = re.compile(r"EngineCore pid=(\d+)(?!\d)")


def engine_key(process: str) -> str:
    """The engine a process prefix is of, for telling apart the engines that fail at one moment:
    its data-parallel index (`dp_engine`), else a bare engine core's pid (`core 7`), or ""
    (a worker, the API server, no prefix: the source's one engine, or not said)."""
    dp = dp_engine(process)
    if dp or not process:
        return dp
    m = _BARE_CORE.match(process)
    return f"core {m[1]}" if m else ""


def _engine_of(record: Record, ev: EngineError) -> str:
    """The engine an error record is of: its process prefix's (`engine_key`), else the engine
    core its line says died (the client's monitor, `Engine core proc EngineCore_DP1 died …`,
    written by the API server)."""
    return engine_key(record.process) or dp_engine(ev.core)


def _window(ev: EngineError) -> int:
    """The quiet after `ev` that ends its incident: `INCIDENT_WINDOW_NS`, longer by the interval
    its writer repeats it at while the condition lasts (a hang warned each minute is one hang)."""
    return INCIDENT_WINDOW_NS + int(ev.repeats_s * _NS)


def _worker(process: str) -> str:
    """The worker a process prefix names (`Worker_TP1 pid=9` → "Worker_TP1", `VllmWorker TP0 pid=5`
    → "VllmWorker TP0"), or ""."""
    return process.split(" pid=", 1)[0] if process and _WORKER.match(process) else ""


@dataclass(slots=True)
class _StartWait:
    """A broadcast wait absorbed into the start (`EngineLife._start_worked`): its latest
    warning's stamp, the quiet after which the wait is over (`_window`), whether a startup line
    came since that warning, and that warning itself once it was counted on the start (it becomes
    a hang's first line when no progress follows it)."""

    last_ns: int
    window_ns: int
    worked: bool
    last: tuple[Record, EngineError] | None


class _Incident:
    """Error records of one engine incident, gathered until none comes for its window (`_window`)."""

    __slots__ = ("first", "last_ns", "last_offset", "error_type", "lead", "fatal", "lines", "affected",
                 "failed", "event", "occurrence", "worker", "died", "engine", "window_ns", "core", "waits_only",
                 "start_offset", "lived")

    def __init__(self, record: Record, ev: EngineError) -> None:
        self.first = record
        self.worker = ""  # the first of the engine's workers that logged a line of it
        self.died = ""    # the worker a line says died (the executor's monitor)
        self.engine = ""  # the data-parallel engine whose process (core or worker) logged first
        self.core = ""    # the engine core process a line says died (the client's monitor)
        self.last_ns, self.last_offset = record.ts_ns, record.end_offset
        self.error_type, self.lead, self.fatal = ev.error_type, (record, ev), ev.fatal
        self.lines = 0
        # the first line of the start open when a line of it came: how it was typed (model_load,
        # oom) hangs on that start, and a resume from inside the start would read its later lines
        # as a start of their own, so a checkpoint holds it while the incident is open (`min_offset`)
        self.start_offset: int | None = None
        self.affected: dict[str, RequestState] = {}  # in flight while it lasted
        self.failed: list[RequestState] = []          # ended by it
        self.event: SpanEvent | None = None
        self.occurrence = ""  # set by the assembler when the incident begins: where its first line is
        #: the quiet that ends it: longer while its latest line is one its writer repeats while
        #: the condition lasts (a hang warned at each interval is one hang, not one per warning)
        self.window_ns = _window(ev)
        #: every line of it so far a wait its writer repeats (shm_broadcast's), nothing failed
        self.waits_only = True
        #: the engine served a request after it began (`EngineLife.alive`): what a worker's failed
        #: call (basis `rpc`) said was no batch the engine died of
        self.lived = False

    def add(self, record: Record, ev: EngineError) -> bool:
        """Take one more record; True when the incident's type became more specific."""
        self.lines += 1
        if not ev.repeats_s or ev.fatal:
            self.waits_only = False
        if not self.worker:
            self.worker = _worker(record.process)
        if not self.engine:
            self.engine = _engine_of(record, ev)
        if ev.core and not self.core:
            self.core = ev.core
        if ev.worker and not self.died:
            self.died = ev.worker
        if record.ts_ns >= self.last_ns:
            self.last_ns = record.ts_ns
            self.window_ns = _window(ev)
        self.last_offset = max(self.last_offset, record.end_offset)
        rank = _SPECIFICITY.get(ev.error_type, len(_SPECIFICITY))
        # a signal killed it: where a later traceback was raised tells no other cause
        frames_after_signal = self.lead[1].basis == "signal" and ev.basis == "frames"
        if rank < _SPECIFICITY.get(self.error_type, len(_SPECIFICITY)) and not frames_after_signal:
            self.error_type, self.lead = ev.error_type, (record, ev)
            return True
        if ev.fatal and not self.lead[1].fatal and ev.error_type == self.error_type:
            self.lead = (record, ev)  # the line that says the engine died, of the same kind
        return False


class EngineLife:
    """The engine-wide state of one source, and the lines that change it."""

    def __init__(self, requests, emit: Callable[[Timeline], None], source_at, text: Callable[[str], str],
                 stats, export_text: bool) -> None:
        self._requests = requests  # the assembler: its `end`, `close` and index
        self._in_flight: dict[str, RequestState] = requests.index.in_flight
        self._open: dict[str, RequestState] = requests.index.open
        self._emit = emit
        self._source_at = source_at
        self._text = text
        self.stats = stats
        self._export_text = export_text
        self.last_oom: tuple[int, CudaOom] | None = None
        self.pending_nccl: tuple[Record, NcclTimeout] | None = None
        self.startup: Startup | None = None
        self.facts: dict = {}  # what the banner said: gen_ai.request.model, vllm.version
        # Each change of those facts with the position of the line that made it, so a resume
        # from any position can start from the facts in force there (`facts_at`, `resume_facts`).
        self._facts_log: list[tuple[int, dict]] = []
        self._facts_start: dict = {}  # in force before the first of them
        self._stats_engines: set[str] = set()  # data-parallel engines seen in stats lines
        self._data_parallel = 1  # engines the banner says log their own stats lines
        self.incident: _Incident | None = None
        # the same moment's failures of other data-parallel engines: one incident each, closed
        # with the open one (their lines come after its first, so checkpoints need nothing more)
        self._siblings: dict[str, _Incident] = {}
        self.death: str | None = None    # error.type of this engine life's death, once it died
        self.stop_ns: int | None = None  # a deliberate stop began (and the engine had not died)
        self.stop_last_ns = 0            # the stop's latest line
        self._stop_mode = ""             # abort | drain, when vLLM said
        self._held: tuple[int, int] | None = None  # (ts, running + waiting) of the last stats line
        #: a broadcast wait the start's own lines showed to be its work (`_start_worked`)
        self._wait: _StartWait | None = None

    def tick(self, now_ns: int, ttl_deadline: int) -> None:
        """What is due at `now_ns`: a held NCCL timeout, an incident quiet for its window, a
        startup past the TTL."""
        if self.pending_nccl is not None and now_ns - self.pending_nccl[0].ts_ns >= _NS:
            self.flush_nccl(None)
        if self.incident is not None and (now_ns - self.incident.last_ns >= self.incident.window_ns
                                          or self.incident.first.ts_ns <= ttl_deadline):
            # quiet for its window; or older than the TTL (a hang warned for hours, an idle
            # server's repeated warning): held no longer than a request would be
            self.close_incident()
        if self.startup is not None and self.startup.end_ns <= ttl_deadline:
            self.end_startup()

    def flush(self) -> None:
        """End of input: everything held goes out."""
        if self.pending_nccl is not None:
            self.flush_nccl(None)
        if self.incident is not None:
            self.close_incident()
        self.end_startup()

    @property
    def min_offset(self) -> int | None:
        """The earliest position of a line still held here (for checkpoints)."""
        low = None
        for held in (self.pending_nccl[0].offset if self.pending_nccl is not None else None,
                     self.incident.first.offset if self.incident is not None else None,
                     self.incident.start_offset if self.incident is not None else None,
                     self.startup.first_offset if self.startup is not None else None):
            if held is not None and (low is None or held < low):
                low = held
        return low

    def on_stats(self, record: Record, ev: EngineStats) -> None:
        attrs = given(*((f"vllm.queue.{name}", getattr(ev, name))
                        for name in ("running", "waiting", "swapped", "deferred", "preemptions", "corrupted")),
                      *((key, getattr(ev, name)) for name, key in (
                          ("prompt_throughput", "vllm.throughput.prompt_tokens_per_s"),
                          ("generation_throughput", "vllm.throughput.generation_tokens_per_s"),
                          ("gpu_kv_usage", "vllm.kv_cache.gpu_usage"), ("cpu_kv_usage", "vllm.kv_cache.cpu_usage"),
                          ("prefix_cache_hit_rate", "vllm.prefix_cache.hit_rate"),
                          ("external_prefix_cache_hit_rate", "vllm.prefix_cache.external_hit_rate"),
                          ("mm_cache_hit_rate", "vllm.mm_cache.hit_rate"),
                          ("kv_fetch_waiting", "vllm.kv_fetch.waiting_to_start"),
                          ("kv_fetch_in_progress", "vllm.kv_fetch.in_progress"),
                          ("kv_fetch_completed", "vllm.kv_fetch.completed_waiting"))),
                      ("vllm.engine.index", ev.engine))
        event = SpanEvent("vllm.engine_stats", record.ts_ns, attrs)
        free = 1.0 - ev.gpu_kv_usage if ev.gpu_kv_usage is not None else None
        fan_out(self._in_flight.values(), event, free)
        if ev.engine is not None:
            self._stats_engines.add(ev.engine)
        if self.startup is not None:  # the engine's loop runs: it is up
            self.startup.ready = True
        # One engine's line speaks for the server only when it is the only engine: with
        # data parallelism (the banner's size, or more than one seen) only an aggregated line does.
        if (len(self._stats_engines) <= 1 and self._data_parallel <= 1) or "Aggregated" in (ev.engine or ""):
            held = ev.running + (ev.waiting or 0) + (ev.swapped or 0)
            self._held = (record.ts_ns, held)
            if held == 0:
                self._idle(record)

    def _settle(self) -> None:
        """Before a death or a stop ends what is in flight: the last stats line said how many
        requests the engine held. Unended requests beyond that many, older than the line by
        the grace and quiet since, had finished unlogged (V1 completions): the oldest of them,
        as requests mostly end in the order they came."""
        if self._held is None:
            return
        ts, held = self._held
        known = sorted((r for r in self._in_flight.values()
                        if r.extra is not None and r.first_ns <= ts - IDLE_GRACE_NS and not awaits_remote_kv(r)),
                       key=lambda r: (r.first_ns, r.first_offset))
        for r in known[:max(0, len(known) - held)]:
            if r.last_ns <= ts:
                self._requests.close(r, Close.IDLE, ts)

    def _idle(self, record: Record) -> None:
        """The engine says nothing runs or waits: requests with no end line are over, end
        unknown — once nothing more comes for them within the grace (see `tick`). A line of the
        request after an earlier idle line voids that one (the API server's stats can predate
        the engine's `Added request`): the next idle line is the one that counts."""
        for r in self._in_flight.values():
            if r.extra is not None and r.last_ns < record.ts_ns and (r.idle_at is None or r.idle_at < r.last_ns) \
                    and not awaits_remote_kv(r):
                r.idle_at = record.ts_ns

    def on_stop(self, record: Record, ev: ServerStop) -> None:
        """vLLM's shutdown sequence. After an engine death it is the server winding down (no
        stop: the death explains the requests); before one, a deliberate stop."""
        if self.death is not None:
            return
        ts = record.ts_ns
        if self.stop_ns is None:
            if ev.phase == "drained":
                return
            self._settle()
            self.stop_ns = ts
        self.stop_last_ns = max(self.stop_last_ns, ts)
        if ev.mode:
            self._stop_mode = ev.mode
        if ev.phase == "in_flight" and ev.in_flight is not None:
            # The engine core counts what it still holds (core.py:1645): of the requests no line
            # ended, the most recent ones; the others had finished unlogged (V1 completions).
            unended = sorted(self._in_flight.values(), key=lambda r: (r.first_ns, r.first_offset))
            cut = max(0, len(unended) - ev.in_flight)
            for r in unended[:cut]:
                if r.extra is not None:
                    self._requests.close(r, Close.IDLE, ts)
            if self._stop_mode == "abort":  # aborted right now (core.py:1648)
                for r in unended[cut:]:
                    self._requests.end(r, ts, End.STOPPED)
        elif ev.phase == "drained":
            # The engine holds nothing any more (core.py:1667): what it aborted was counted above
            # (no count line: it held nothing, core.py:1643); the rest had finished, or drained.
            for r in list(self._in_flight.values()):
                if r.extra is not None and r.first_ns <= ts:
                    self._requests.close(r, Close.IDLE, ts)

    def on_config(self, record: Record, ev: EngineConfig) -> None:
        if self.startup is None or self.startup.has_banner:  # a second banner: the engine restarted
            self.end_startup()
            self.startup = Startup(record)
        if self.incident is not None:
            self.close_incident()
        for r in list(self._in_flight.values()):  # the engine that held them is gone
            self._requests.close(r, Close.UNENDED)
        self.death = self.stop_ns = self._held = self._wait = None  # a new engine life
        self._data_parallel = max(1, ev.data_parallel)
        self._stop_mode = ""
        self.startup.has_banner = True
        facts = [("vllm.version", ev.version)]
        if ev.engine:
            facts.append(("vllm.engine.version", ev.engine))
        if ev.model:
            facts.append(("gen_ai.request.model", ev.model))
            self.facts["gen_ai.request.model"] = ev.model
        self.facts["vllm.version"] = ev.version
        self._facts_changed(record)
        self.startup.add(record, facts)

    def on_startup_fact(self, record: Record, ev: StartupFact) -> None:
        if self.startup is None:
            if ev.listening and self.facts:
                return  # the start was read and went out: another API server of it begins to listen
            self.startup = Startup(record)
        self.startup.add(record, tuple(ev.facts) + self._start_worked(record))
        if ev.listening:
            self.startup.ready = True
        for key, value in ev.facts:
            if key == SERVED_MODEL:  # the name clients send, over a model the logo named first
                key = "gen_ai.request.model"
            elif key not in ("vllm.version", "gen_ai.request.model") or key in self.facts:
                continue
            if self.facts.get(key) != value:
                self.facts[key] = value
                self._facts_changed(record)

    def _start_worked(self, record: Record) -> tuple:
        """A startup line while the engine waits on a shared-memory broadcast block: the wait is
        the start's work, no hang. vLLM's writer warns each interval its readers have not taken
        the last block (`No available shared memory broadcast block found in 60 seconds`), and
        while the engine starts they are busy in its RPC (compiling, profiling, warming up,
        capturing graphs) and log that progress; a hung reader logs nothing. So a wait incident
        of nothing but such warnings, no request in flight, ends unreported at the start's next
        line, and the warnings that go on at their interval with startup lines between them are
        absorbed too (`on_engine_error`); counted on the startup span (`vllm.startup.waits`)."""
        inc = self.incident
        if inc is not None and inc.waits_only and not inc.affected and not self._siblings and self.death is None \
                and inc.first.ts_ns <= record.ts_ns:
            # (a restart is no progress of the start it waited in: its banner closed the wait first)
            self.incident = None
            # the start was under way while it waited: its span, and the lines a checkpoint holds
            # for it (`min_offset`), begin no later than the first warning it absorbs
            start = self.startup
            if inc.first.offset < start.first_offset:
                start.first_offset = inc.first.offset
                start.start_ns = min(start.start_ns, inc.first.ts_ns)
            self._wait = _StartWait(inc.last_ns, inc.window_ns, True, None)
            return (("vllm.startup.waits", inc.lines),)
        if self._wait is not None:
            self._wait.worked = True
        return ()

    def end_startup(self, error_type: str = "", message: str = "") -> None:
        if self.startup is not None:
            self._emit(self.startup.timeline(self._source_at(self.startup.first_offset), error_type,
                                              self._text(message)))
            self.startup = None

    def on_engine_error(self, record: Record, ev: EngineError) -> None:
        if self.startup is not None and ev.error_type in ("model_load", "other") and self.startup.no_room:
            # a start that failed after the KV cache had no room left: the model did not fit
            ev = replace(ev, error_type="oom")
        elif ev.basis == "rpc" and self.startup is not None and not self.startup.ready and not self._in_flight:
            # a worker's call raised while the engine is being built (profiling, graph capture):
            # the start's call, so the start failed
            ev = replace(ev, error_type="model_load")
        open_start = self.startup.first_offset if self.startup is not None else None
        if self.startup is not None and (ev.fatal or ev.error_type in ("model_load", "oom")):
            self.startup.add(record, ())
            self.end_startup(ev.error_type, ev.message)
        ts = record.ts_ns
        if self._wait is not None and ev.repeats_s and not ev.fatal and self.incident is None:
            wait, self._wait = self._wait, None
            last_ns, window_ns, worked, last = wait.last_ns, wait.window_ns, wait.worked, wait.last
            if ts - last_ns <= window_ns and self.startup is not None and not self._in_flight:
                if worked:
                    # the same wait warned again, and the start logged progress since its last warning
                    self._wait = _StartWait(ts, _window(ev), False, (record, ev))
                    self.startup.add(record, (("vllm.startup.waits", 1),))
                    return
                if last is not None:
                    # nothing of the start since its last warning: the wait that one told of is a
                    # hang, from that warning (no longer counted as the start's)
                    waits = self.startup.attrs.pop("vllm.startup.waits", 1) - 1
                    if waits:
                        self.startup.attrs["vllm.startup.waits"] = waits
                    self.on_engine_error(*last)
        if self.stop_ns is not None and self.death is None and ev.error_type not in _REAL_FAILURES and not ev.exited:
            # vLLM raises EngineDeadError, cancels and kills its workers while it stops on purpose.
            self.stats.stop_errors += 1
            if ev.fatal:
                for r in list(self._in_flight.values()):
                    self._requests.end(r, ts, End.STOPPED)
            return
        inc = self.incident
        if inc is not None and self.death is None and ts - inc.last_ns > inc.window_ns:
            # quiet for its window (a tick closes it too: this is for a line less than 1 s after
            # one that ticked). Nothing later joins it, whatever it says of when its condition
            # began (torch's watchdog: `ran for …`): a tick, on log time or the agent's wall
            # clock, may have sent it already, and replay and the agent must group alike.
            self.close_incident()
            inc = None
        if inc is None:
            if self.death is not None:  # the engine is dead already and its incident went out
                self.stats.death_errors += 1
                if ev.fatal:  # V0's AsyncEngineDeadError for a request sent to the dead engine
                    for r in list(self._in_flight.values()):
                        self._requests.end(r, ts, End.ENGINE_DIED, self.death, exception=ev.exception_type)
                return
            inc = self.incident = _Incident(record, ev)
            inc.occurrence = where(record)  # reserved now: the link its event carries names its span
        if open_start is not None and (inc.start_offset is None or open_start < inc.start_offset):
            inc.start_offset = open_start  # (a restart reads the start again, so this line alike)
        engine, first_engine = _engine_of(record, ev), inc.engine or engine_key(inc.first.process)
        if engine and first_engine and engine != first_engine:
            # another engine (data-parallel, or another engine core) failing at the same time: its own incident
            sibling = self._siblings.get(engine)
            if sibling is None:
                sibling = self._siblings[engine] = _Incident(record, ev)
                sibling.occurrence = where(record)
            inc.last_ns = max(inc.last_ns, record.ts_ns)  # the window stays open while any reports
            inc = sibling
        if inc.lived and ev.basis == "rpc":  # the engine went on after such a failure: no death
            ev = replace(ev, error_type="other")
        # a later line telling more retypes the incident's event and what it ended, a sibling's too
        upgraded = inc.add(record, ev)
        if upgraded or inc.event is None:
            self._incident_event(inc)
        for key, r in self._in_flight.items():  # the event goes on at once: a request may be
            if inc.affected.setdefault(key, r) is r and (r.events is None or inc.event not in r.events):
                r.add_event(inc.event, False)  # emitted before the incident closes
        if ev.fatal and self.death is None:
            # The engine died: the best evidence of when the requests in flight ended.
            self._settle()
            self.death = inc.error_type
            lead_record, lead = inc.lead
            for r in list(self._in_flight.values()):
                self._requests.end(r, ts, End.ENGINE_DIED, inc.error_type, exception=lead.exception_type or ev.exception_type)
                inc.failed.append(r)
        elif upgraded and self.death is not None:
            self.death = inc.error_type
            for r in inc.failed:  # later lines told what killed it
                r.error_type = inc.error_type

    def _incident_event(self, inc: _Incident) -> None:
        """The incident's event on the requests it hit, replaced on those not emitted yet when
        a later line tells more (its type is only final once the incident closes)."""
        old = inc.event
        record, ev = inc.lead
        inc.event = _incident_event(inc.error_type, inc.error_type, inc.first.ts_ns, inc.occurrence)
        if old is None:
            return
        for key, r in inc.affected.items():
            if self._open.get(key) is r and r.events:
                r.events = [inc.event if e is old else e for e in r.events]

    def close_incident(self) -> None:
        """Emit the open incident as one `vllm.engine` span, and its event on the requests it hit;
        then each other data-parallel engine's of the same moment."""
        self._emit_incident(self.incident)
        self.incident = None
        siblings, self._siblings = self._siblings, {}
        for sibling in siblings.values():
            self._emit_incident(sibling)

    def _emit_incident(self, inc: _Incident) -> None:
        record, ev = inc.lead
        attrs = {"vllm.incident.fatal": inc.fatal or self.death is not None, "vllm.incident.lines": inc.lines}
        if ev.exception_type:
            attrs["exception.type"] = ev.exception_type
        if ev.stacktrace and self._export_text:
            attrs["exception.stacktrace"] = ev.stacktrace
        first = inc.first
        # the process that logged first: an error travels outward (worker → engine core → API
        # server), each wrapper logging after the one it wraps, so the first is nearest the cause;
        # but where the first is the engine's client (no engine core, no worker) and a line names
        # the engine core it saw die, the incident is of that core: it names it, and its reporter
        writer = first.process or record.process
        if inc.core and not (engine_key(writer) or _worker(writer)):
            attrs["vllm.process"] = inc.core
            if writer:
                attrs["vllm.reported_by"] = writer
        elif writer:
            attrs["vllm.process"] = writer
        # the engine it is of: a worker's lines are its engine's (`dp_engine`), so is its death
        if inc.engine.isdigit():  # (a bare engine core's pid is in its `vllm.process`)
            attrs["vllm.dp.rank"] = int(inc.engine)
        if inc.worker:
            attrs["vllm.worker"] = inc.worker
        if inc.died:
            attrs["vllm.worker.died"] = inc.died
        self._incident(first, inc.error_type, inc.error_type, first.ts_ns, ev.message, attrs,
                       affected=inc.affected, end_ns=inc.last_ns, end_offset=inc.last_offset,
                       occurrence=inc.occurrence)

    def on_cuda_oom(self, record: Record, ev: CudaOom) -> None:
        self.last_oom = (record.ts_ns, ev)
        if self.startup is not None:  # out of memory while starting: the start failed
            self.startup.add(record, ())
            self.end_startup("oom", ev.message)
        attrs = {}
        if ev.requested_bytes is not None:
            attrs["vllm.oom.requested_bytes"] = ev.requested_bytes
        self._incident(record, "cuda_oom", "oom", record.ts_ns, ev.message, attrs)

    def on_model_load(self, record: Record, ev: ModelLoadFailed) -> None:
        message = f"{ev.exception_type}: {ev.message}" if ev.exception_type else ev.message
        attrs = {"exception.type": ev.exception_type} if ev.exception_type else {}
        self._incident(record, "model_load", "model_load", record.ts_ns, message, attrs)

    def on_nccl(self, record: Record, ev: NcclTimeout) -> None:
        # Held for one line: the next one usually says what may have caused it.
        self.pending_nccl = (record, ev)

    def on_nccl_hint(self, record: Record, ev: NcclHint) -> None:
        if self.pending_nccl is None:
            self.stats.orphan_lines += 1
            return
        self.flush_nccl(ev)

    def flush_nccl(self, hint: NcclHint | None) -> None:
        record, ev = self.pending_nccl
        self.pending_nccl = None
        attrs = {"vllm.nccl.rank": ev.rank, "vllm.nccl.timeout_s": ev.after_s}
        if hint is not None:
            attrs["vllm.incident.causes"] = hint.causes
        start = max(0, record.ts_ns - int(ev.after_s * _NS))  # as build does: never before 1970
        self._incident(record, "nccl_timeout", "distributed", start, ev.message, attrs)

    def _incident(self, record: Record, kind: str, error_type: str, start_ns: int, message: str, attrs: dict,
                  affected: dict[str, RequestState] | None = None, end_ns: int | None = None,
                  end_offset: int | None = None, occurrence: str | None = None) -> None:
        """One `vllm.engine` span; its event goes on the requests in flight (`affected`: those in
        flight while a multi-line incident lasted, which have it already)."""
        occurrence = occurrence or where(record)  # where its first line is: the same after a restart
        hit = self._in_flight if affected is None else affected
        if affected is None:  # a multi-line incident's requests have its event already
            event = _incident_event(kind, error_type, record.ts_ns, occurrence)
            for r in hit.values():
                r.add_event(event, False)
        self.stats.engine_incidents += 1
        self._emit(engine_timeline(
            self._source_at(record.offset), kind, occurrence, start_ns, record.ts_ns if end_ns is None else end_ns,
            error_type, self._text(message), attrs, list(hit), record.offset,
            record.end_offset if end_offset is None else end_offset))

    def late_kv_incident(self, record: Record, engine_request_id: str, message: str) -> None:
        """A KV line about a disaggregated prefill already emitted (NIXL's `Potentially invalid
        KV blocks` past `kv_hold_s`): a `kv_transfer` incident naming it, which the export puts
        in that prefill's trace under its root (both ids derive from `engine_request_id`); no
        request in flight is hit by it."""
        attrs = {"vllm.pd.role": "prefill", "vllm.request.internal_id": engine_request_id}
        self._incident(record, "kv_transfer", "distributed", record.ts_ns, message, attrs, affected={})

    def on_clock_jump(self, record: Record, ev: ClockJump) -> None:
        """The stream's clock jumped between two lines (`clock.py`): counted, and an event on every
        request not yet emitted with both stamps. It ends no request (deadlines count from it: the
        assembler's clock follows it), but an incident's window or a held NCCL line closes at it."""
        self.stats.clock_jumps += 1
        if self.pending_nccl is not None:
            self.flush_nccl(None)
        if self.incident is not None:
            self.close_incident()
        event = SpanEvent("vllm.clock_jump", ev.after_ns, jump_attrs(ev.before_ns, ev.after_ns))
        for r in self._open.values():  # in flight, or waiting for its last block frees
            r.add_event(event, False)

    def alive(self, ts_ns: int) -> None:
        """A request finished normally: whatever died, the engine serves again (a line taken
        for a death that was none must not fail every later request). A worker's call that
        raised (basis `rpc`, typed the engine's death: a batch's call, the commonest) whose
        incident is still open was one the engine survived, a utility's (a LoRA, sleep): `other`."""
        if self.death is not None and self.incident is None:
            self.death = None
        inc = self.incident
        if inc is None or inc.lived or ts_ns < inc.first.ts_ns:
            return
        inc.lived = True
        if inc.error_type == "engine_dead" and inc.lead[1].basis == "rpc" and not inc.fatal and self.death is None:
            record, ev = inc.lead
            inc.error_type, inc.lead = "other", (record, replace(ev, error_type="other"))
            self._incident_event(inc)

    def resume_facts(self, facts: dict) -> None:
        """Start from the engine facts in force where a resume starts (a checkpoint's), as
        the lines before it, not read again, had set them."""
        self.facts = dict(facts)
        self._facts_start = dict(facts)

    def facts_at(self, position: int) -> dict:
        """The engine facts in force just before `position` (a checkpoint's safe position):
        what a resume from there must start from so the requests after it get them again.
        Changes before it are forgotten (the safe position never moves back)."""
        log = self._facts_log
        i = 0
        while i < len(log) and log[i][0] < position:
            i += 1
        if i:
            self._facts_start = log[i - 1][1]
            del log[:i]
        return self._facts_start

    def _facts_changed(self, record: Record) -> None:
        self._facts_log.append((record.offset, dict(self.facts)))
