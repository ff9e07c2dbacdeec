"""The hooks. By default the plugin lives in the API server only, and vLLM's engine core — the
one Python thread that feeds the GPU — runs untouched (its `Scheduler.__init__` is wrapped, and
that is all, unless engine lines are wanted: see below).

The API server already receives, for every request, the engine core's QUEUED / SCHEDULED /
PREEMPTED event times (`EngineCoreOutput.events`, kept in `RequestStateStats` when vLLM keeps
stats, its default) and the engine core's stamp of every token batch. So one line per request,
written where vLLM finishes the request's stats, carries every phase, at vLLM's own times:

- `OutputProcessor._update_stats_from_finished`: the request's summary line (below), every
  finish reason (a completed request's line is the seed summary; any other end,
  `Request <id> ended: finish=<reason>, …`).
- `IterationStats.update_from_events` (called only for an output that carries events): the
  times of a preempted request's PREEMPTED events and of the SCHEDULED events that end them.
- `OutputProcessor.abort_requests`: a request the API server aborts (client gone) never
  reaches the finished stats: its `ended` line, with what is known, from here.
- `AsyncLLM.add_request`: the caller's W3C `traceparent` / `tracestate` (vLLM drops them
  unless its own tracing is on), validated and kept until the request's line is written.

The summary line (`t=` and the `*_at` times are unix seconds, six decimals):

    Request <id>: prompt_tokens=<n>, generated_tokens=<n>, ttft=<x>ms, itl=<x>ms, total_latency=<x>s,
        t=<end>, arrival=<A>, queued_at=<Q>, scheduled_at=<S>, first_token_at=<F>, last_token_at=<L>
        [, preempted=<p>~<r>/<p>~<r>…] [, traceparent=<W3C>] [, tracestate=<W3C>]

ttft, itl, total_latency and `t` are vLLM's own numbers (`first_token_latency`, its mean
inter-token latency, its e2e latency ending at the iteration's wall-clock stamp). The `*_at`
times are vLLM's engine-core stamps (`queued_ts`, `scheduled_ts`, `first_token_ts`,
`last_token_ts`, each PREEMPTED and the SCHEDULED after it): CLOCK_MONOTONIC of the engine core,
which on Linux is one clock for every process of the host, turned into wall-clock time with one
offset (`time.time() - time.monotonic()`) taken once per API-server process. So the bridge's
queued / prefill / decode spans are vLLM's `time_in_queue`, `time_in_model_prefill` and
`time_in_model_decode`, to the microsecond. A time vLLM never stamped (a request aborted while
queued) is left out. Old bridges read the summary's first fields and ignore the rest.

The engine core writes lines only where the API server cannot know: with
`VLLM_TRACE_BRIDGE_PLUGIN_ENGINE=1` (block counts on `Scheduling request` / `Preempting request`
lines, the `Running queue` line, `Freed <n> blocks`), with `VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS=1`
(that and one line per block), and when vLLM keeps no stats (`--disable-log-stats`: the API
server then has no event times, so the engine core writes every line, the summary included,
from its own clock — the previous plugin's lines). Then `Scheduler.__init__` binds wrappers of
six methods on that scheduler instance:

- `add_request`: notes when the request entered the engine's queue.
- `schedule`: the new and resumed requests' `Scheduling request` lines (blocks on: `Allocated
  block` lines); at most once per interval, the `Running queue` line.
- `_preempt_request`: the `Preempting request` line, before vLLM frees the blocks it counts.
- `_free_request_blocks`: a finished request's `Freed <n> blocks` line (blocks on: one per block).
- `update_from_output` / `_free_request`: stats off only, the first token and the summary.

A scheduler with a KV connector (disaggregated prefill/decode) also binds kv.py's two hooks,
whatever the above: the decode's `KV received` and the prefill's `KV blocks released` lines (a
call per transfer, never per token; `VLLM_TRACE_BRIDGE_PLUGIN_KV=0` leaves them out).

Every line is written in vLLM's format straight to vLLM's stream (`LineWriter`, not through
`logging`), so `VLLM_LOGGING_LEVEL=WARNING` or a logging config of the user's own does not drop
it; the plugin's warnings go through its own logger (`vllm_trace_bridge`, not propagating).

Which vLLM: the gate is per side (`HOOK_POINTS`, each by name — or an older name of the same
meaning — and by the parameters its wrapper relies on, checked before anything is wrapped). The
API server's hook points decide whether the plugin installs; the engine core's only whether it
writes its lines (a missing one: no engine line, said once where they are wanted). Names some
releases lack are read with a fallback (`ADAPTED`). Every phase on 0.10 → 0.34 by their source
(tests/plugin_versions_table.py); tested on 0.32 and 0.33.

Each wrapper calls vLLM's method first (or, where the plugin must look before vLLM changes
state, reads and then calls it) and never lets its own error reach vLLM: the first error is
logged once with its traceback and that object's hooks switch off.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import sys
import time
import types
import typing

from . import TESTED_VERSIONS, version_tested

#: The plugin's own logger (not under `vllm.`: vLLM's logging config does not reach it).
LOGGER_NAME = "vllm_trace_bridge"

_SCHEDULER_PY = "vllm/v1/core/sched/scheduler.py"
_OUTPUT_PY = "vllm/v1/engine/output_processor.py"
_STATS_PY = "vllm/v1/metrics/stats.py"
_ASYNC_PY = "vllm/v1/engine/async_llm.py"

#: The sides of the plugin a hook point belongs to. `API`: the default mode, in the API server —
#: without every one of these the plugin does nothing. `EXTRA`: an API-server hook whose absence
#: costs one thing (the preempted spans, the caller's context), said once. `ENGINE`: the engine
#: core's lines, needed only when they are asked for or vLLM keeps no stats; without one the
#: engine core writes nothing, said once when they are wanted.
API, EXTRA, ENGINE = "api", "extra", "engine"


class HookPoint(typing.NamedTuple):
    """A method the plugin wraps: its file in vLLM, class, name, the leading parameters after
    `self` the wrapper relies on, its side, and older names with the same meaning (the release's
    source read: same arguments, same moment, same effect on the request)."""

    file: str
    cls: str
    name: str
    params: tuple[str, ...]
    side: str
    alt: tuple[str, ...] = ()


HOOK_POINTS = (
    HookPoint(_SCHEDULER_PY, "Scheduler", "__init__", (), ENGINE),
    HookPoint(_SCHEDULER_PY, "Scheduler", "add_request", ("request",), ENGINE),
    HookPoint(_SCHEDULER_PY, "Scheduler", "schedule", (), ENGINE),
    HookPoint(_SCHEDULER_PY, "Scheduler", "update_from_output", (), ENGINE),
    HookPoint(_SCHEDULER_PY, "Scheduler", "_preempt_request", ("request", "timestamp"), ENGINE),
    HookPoint(_SCHEDULER_PY, "Scheduler", "_free_request", ("request",), ENGINE),
    # 0.12-0.23: `_free_blocks(request)` frees a finished request's blocks (`kv_cache_manager.free`),
    # as `_free_request_blocks` does from 0.24 on (then also for a preemption, which before 0.24
    # frees inside `_preempt_request`: the plugin writes those blocks' lines there).
    HookPoint(_SCHEDULER_PY, "Scheduler", "_free_request_blocks", ("request",), ENGINE, ("_free_blocks",)),
    HookPoint(_OUTPUT_PY, "OutputProcessor", "_update_stats_from_finished",
              ("req_state", "finish_reason", "iteration_stats"), API),
    # `internal` (0.14 on) is read when the method takes it; before, the ids are vLLM's own.
    HookPoint(_OUTPUT_PY, "OutputProcessor", "abort_requests", ("request_ids",), API),
    HookPoint(_STATS_PY, "IterationStats", "update_from_events", ("req_id", "events", "is_prefilling", "req_stats"),
              EXTRA),
    HookPoint(_ASYNC_PY, "AsyncLLM", "add_request", ("request_id",), EXTRA),
)
#: The engine core's methods, wrapped per scheduler instance when engine lines are wanted.
HOOKED = tuple(hp.name for hp in HOOK_POINTS if hp.cls == "Scheduler" and hp.name != "__init__")
FRONTEND_HOOKED = tuple(hp.name for hp in HOOK_POINTS if hp.cls == "OutputProcessor")
#: What each missing EXTRA hook point costs (its degradation, said once).
EXTRA_COST = {"IterationStats.update_from_events": "no preempted spans",
              "AsyncLLM.add_request": "no caller trace context"}
#: What the hooks read at run time (file, side, names): the names that must appear in vLLM's
#: source, for the check against a release's wheel. A miss there switches that side off at its
#: first use (vLLM runs on), unless the name is in ADAPTED.
READ_AT_RUN_TIME = (
    ("vllm/v1/core/sched/output.py", ENGINE, ("scheduled_new_reqs", "scheduled_cached_reqs", "resumed_req_ids",
                                              "new_block_ids", "req_id", "block_ids")),
    ("vllm/v1/request.py", ENGINE, ("events", "num_output_tokens", "num_prompt_tokens", "arrival_time",
                                    "priority", "status")),
    ("vllm/v1/core/kv_cache_manager.py", ENGINE, ("get_block_ids", "block_pool")),
    ("vllm/v1/engine/__init__.py", API, ("QUEUED", "SCHEDULED", "PREEMPTED")),
    (_STATS_PY, API, ("iteration_timestamp", "first_token_latency", "num_generation_tokens", "num_preemptions",
                      "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts", "arrival_time")),
    (_OUTPUT_PY, API, ("request_states", "external_req_ids", "parent_requests", "child_requests",
                       "external_req_id", "prompt_len", "stats")),
    (_SCHEDULER_PY, ENGINE, ("kv_cache_manager", "requests", "running", "waiting", "log_stats")),
    ("vllm/v1/core/block_pool.py", ENGINE, ("get_num_free_blocks", "num_gpu_blocks")),
)
#: Names the hooks read with a fallback, read in the releases without them, and what they do
#: there instead (exact: the same stamps or ids, found another way).
ADAPTED = {
    "resumed_req_ids": "0.34: a resumed request comes in `scheduled_new_reqs`",
    "num_preemptions": "PREEMPTED found in the events",
    "external_req_ids": "before 0.14: the request's own id",
    "external_req_id": "before 0.14: the request's own id",
}


def _signature_gap(fn, params: tuple[str, ...]) -> str | None:
    """None when `fn(self, *params)` is how it takes its leading arguments; else what differs."""
    names = _param_names(fn)
    if names is None:
        return None  # no signature to read (a C method): trust the name
    if tuple(names[:len(params)]) != params:
        return f"({', '.join(params)}), it takes ({', '.join(names)})"
    return None


def _param_names(fn) -> list[str] | None:
    """The positional parameters after `self`, or None when there is no signature to read."""
    import inspect

    try:
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    except (TypeError, ValueError):
        return None


def _unwrapped(fn):
    return getattr(fn, "__wrapped__", fn) if getattr(fn, _WRAPPED, False) else fn


def resolve(classes: dict[str, type]) -> tuple[dict[HookPoint, str], dict[HookPoint, str]]:
    """({hook point: the name it has in these classes (its own or an older one)}, {hook point:
    why it is not there}) for the hook points of the classes given."""
    found, gaps = {}, {}
    for hp in HOOK_POINTS:
        if hp.cls not in classes:
            continue
        why = None
        for name in (hp.name, *hp.alt):
            fn = getattr(classes[hp.cls], name, None)
            if not callable(fn):
                continue
            gap = _signature_gap(_unwrapped(fn), hp.params)
            if gap is None:
                found[hp] = name
                break
            why = why or f"{hp.cls}.{name}{gap}"
        if hp not in found:
            gaps[hp] = why or f"{hp.cls}.{hp.name}"
    return found, gaps


def missing_hook_points(classes: dict[str, type], sides=(API, EXTRA, ENGINE)) -> list[str]:
    """`Class.method` (and why) for each hook point of those sides the given classes lack
    (under any of its names): [] means that side installs."""
    return [why for hp, why in resolve(classes)[1].items() if hp.side in sides]


@dataclasses.dataclass(frozen=True)
class SourceReport:
    """One release's source against the hook points: a cell per `HOOK_POINTS` entry ('' there,
    'as `<older name>`', 'missing', '(…), it takes (…)', 'no file') and the (file, name) pairs
    the hooks read at run time that it lacks."""

    points: tuple[str, ...]
    names: tuple[tuple[str, str], ...]

    def lacking(self, side: str) -> list[str]:
        """What that side lacks that nothing adapts to (hook points, then run-time names)."""
        out = [f"{hp.cls}.{hp.name}" + (cell if cell.startswith("(") else "")
               for hp, cell in zip(HOOK_POINTS, self.points)
               if hp.side == side and cell and not cell.startswith("as ")]
        sides = {path: s for path, s, _w in READ_AT_RUN_TIME}
        return out + [f"{path}: {w}" for path, w in self.names if sides[path] == side and w not in ADAPTED]

    def adapted(self, side: str) -> list[str]:
        """Where that side runs on an older name or a fallback (exact, per the release's source)."""
        out = [f"`{hp.name}` {cell}" for hp, cell in zip(HOOK_POINTS, self.points)
               if hp.side == side and cell.startswith("as ")]
        sides = {path: s for path, s, _w in READ_AT_RUN_TIME}
        return out + [ADAPTED[w] for path, w in self.names if sides[path] == side and w in ADAPTED]


def source_report(read) -> SourceReport:
    """The hook points and run-time names in a vLLM release's source, without importing it (nor
    torch): `read(path)` gives a file of the release (`vllm/...py`) or None."""
    import ast
    import re as _re

    trees: dict[str, object] = {}
    cells = []
    for hp in HOOK_POINTS:
        if hp.file not in trees:
            text = read(hp.file)
            trees[hp.file] = ast.parse(text) if text is not None else None
        tree = trees[hp.file]
        if tree is None:
            cells.append("no file")
            continue
        cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == hp.cls), None)
        cell = "missing"
        for i, name in enumerate((hp.name, *hp.alt)):
            fn = None if cls is None else next(
                (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None)
            if fn is None:
                continue
            names = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]
            if tuple(names[:len(hp.params)]) == hp.params:
                cell = f"as `{name}`" if i else ""
                break
            if cell == "missing":
                cell = f"({', '.join(hp.params)}), it takes ({', '.join(names)})"
        cells.append(cell)
    absent = []
    for path, _side, words in READ_AT_RUN_TIME:
        text = read(path)
        if text is None:
            absent.append((path, "(no such file)"))
            continue
        absent += [(path, w) for w in words if not _re.search(r"\b" + w + r"\b", text)]
    return SourceReport(tuple(cells), tuple(absent))


def missing_in_source(read) -> list[str]:
    """`source_report` as messages: each hook point absent under every name it may have, each
    run-time name absent (adapted or not)."""
    rep = source_report(read)
    out = []
    for hp, cell in zip(HOOK_POINTS, rep.points):
        if cell == "no file":
            out.append(f"{hp.file} (no such file)")
        elif cell == "missing":
            out.append(f"{hp.cls}.{hp.name}")
        elif cell.startswith("("):
            out.append(f"{hp.cls}.{hp.name}{cell}")
    out += [f"{path} {w}" if w.startswith("(") else f"{path}: {w}" for path, w in rep.names]
    return out


_ATTR = "_vllm_trace_bridge_tracer"
_WRAPPED = "__vllm_trace_bridge_wrapped__"
_HEX8 = re.compile(r"[0-9a-f]{8}")

_installed: dict[type, bool] = {}

#: Ends that are a finished request in the seed's sense: their line is the seed's summary. Any
#: other end (abort, error, an ignored prompt) gets the `ended` line, which names its reason
#: (written by the API server; the engine core's fallback writes none, as before).
_COMPLETED = frozenset({"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_REPETITION"})
_COMPLETED_REASONS = frozenset({"STOP", "LENGTH", "REPETITION"})  # the API server's FinishReason
_SUMMARY = ("Request %s: prompt_tokens=%d, generated_tokens=%d, ttft=%.3fms, itl=%.3fms, total_latency=%.6fs, "
            "t=%.6f%s")
_PHASES = "Request %s: prompt_tokens=%d, generated_tokens=%d, ttft=%.3fms, itl=%.3fms, total_latency=%.6fs, t=%.6f%s"
_TIMES = ", arrival=%.6f, queued_at=%.6f, scheduled_at=%.6f, first_token_at=%.6f, last_token_at=%.6f"
_ENDED = "Request %s ended: finish=%s, prompt_tokens=%d, generated_tokens=%d, total_latency=%.6fs, t=%.6f%s"
#: W3C trace context, version 00 exactly, lower-case hex (a future version: its first four fields,
#: then `-` and more); all-zero ids and version ff are invalid (W3C Trace Context §3.2).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
#: tracestate: up to 32 `key=value` members, comma-separated (W3C §3.3); kept only whole and valid.
_TS_MEMBER = re.compile(r"(?:[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}|[a-z][_0-9a-z\-*/]{0,255})"
                        r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


def valid_traceparent(value) -> str | None:
    """The header as written when it is a valid W3C traceparent, else None (never echoed)."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    m = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if m is None:
        return None
    version, trace, span, _flags, rest = m.groups()
    if version == "ff" or trace == "0" * 32 or span == "0" * 16 or (version == "00" and rest is not None):
        return None
    return m.group(0)[:55]


def valid_tracestate(value) -> str | None:
    """The members of a valid W3C tracestate, joined by `,` (no spaces), else None."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    # a value with a space inside is valid W3C but would end the line's field: dropped whole
    if not members or len(members) > 32 or not all(_TS_MEMBER.fullmatch(m) and " " not in m for m in members):
        return None
    return ",".join(members)


def _flag(environ, name: str, default: str) -> str:
    return environ.get(name, default).strip().lower()


class _Hooks:
    """What every hooked object's state has: vLLM's logger, the off switch a plugin error
    throws, and the API server's spelling of an engine request id."""

    def __init__(self, logger, environ=os.environ) -> None:
        self.log = logger
        self.on = True
        self.strip = _flag(environ, "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "0") not in ("1", "true")

    def api_id(self, engine_id: str) -> str:
        """`<id>-<8 hex>` → `<id>`: the id the API server logged (unless vLLM keeps ids as given)."""
        if self.strip and len(engine_id) > 9 and engine_id[-9] == "-" and _HEX8.fullmatch(engine_id, len(engine_id) - 8):
            return engine_id[:-9]
        return engine_id

    @staticmethod
    def internal(engine_id: str, rid: str) -> str:
        """`, internal_id=<engine id>` when the engine's own id is not the one the line names:
        vLLM ≥ 0.14 makes each request's engine id unique (`-<8 hex>`), so two requests under
        one `X-Request-Id` at once are told apart by it (and by `Added request <engine id>`)."""
        return f", internal_id={engine_id}" if engine_id != rid and " " not in engine_id and "," not in engine_id \
            else ""

    def fail(self, where: str) -> None:
        self.on = False
        self.log.warning("vllm-trace-bridge plugin switched off after an error in %s; vLLM is unaffected",
                         where, exc_info=True)


class Tracer(_Hooks):
    """What one scheduler's hooks remember between calls. Everything is bounded by the number
    of requests the scheduler holds: entries go when a request is freed."""

    def __init__(self, logger, environ=os.environ, clock=time.time, summary: bool = True) -> None:
        super().__init__(logger, environ)
        self.summary = summary  # False: the API server writes it (vLLM keeps stats there)
        self.clock = clock
        # vLLM's request events carry time.monotonic(): one offset turns them into wall time.
        self.wall = time.time() - time.monotonic()
        self.blocks = _flag(environ, "VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "0") in ("1", "true", "yes", "on")
        try:
            self.interval = float(environ.get("VLLM_TRACE_BRIDGE_PLUGIN_QUEUE_INTERVAL_S", "1"))
        except ValueError:
            self.interval = 1.0
        self.next_queue = 0.0
        self.last_queue: tuple | None = None
        self.pending_first: dict[str, object] = {}   # engine id → Request, no first token yet
        self.first_token: dict[str, float] = {}      # engine id → wall time of its first token
        self.ids: dict[str, str] = {}                # engine id → the id the API server logged
        self.queued_at: dict[str, float] = {}        # engine id → monotonic time it was queued
        self.block_bytes: int | None = None
        #: before 0.24 `_preempt_request` frees the blocks itself (not through the hooked free):
        #: with block lines on, its hook writes them
        self.frees_in_preempt = False

    def rid(self, engine_id: str) -> str:
        rid = self.ids.get(engine_id)
        if rid is None:
            rid = self.ids[engine_id] = self.api_id(engine_id)
        return rid

    # -- hooks (called after/around vLLM's own method) ----------------------------------

    def added(self, request) -> None:
        self.queued_at.setdefault(request.request_id, time.monotonic())

    def after_schedule(self, sched, out, started: float) -> None:
        pool = sched.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        info = self.log.info
        requests = sched.requests
        for new in out.scheduled_new_reqs:
            engine_id = new.req_id
            req = requests.get(engine_id)
            ids = new.block_ids[0] if new.block_ids else ()
            rid = self.rid(engine_id)
            queued = self.queued_at.pop(engine_id, None)
            q_ts, s_ts = _event_times(req)  # vLLM's own QUEUED / SCHEDULED stamps (with log_stats)
            if s_ts is None:
                s_ts = started  # when schedule() began, as vLLM's SCHEDULED event
            if q_ts is None:
                q_ts = queued
            if q_ts is not None:
                info("Scheduling request %s: priority=%d, num_scheduled_blocks=%d, remaining_blocks=%d, "
                     "queued=%.3fms, t=%.6f%s", rid, getattr(req, "priority", 0) or 0, len(ids), free,
                     max(0.0, s_ts - q_ts) * 1e3, s_ts + self.wall, self.internal(engine_id, rid))
            else:
                info("Scheduling request %s: priority=%d, num_scheduled_blocks=%d, remaining_blocks=%d, t=%.6f%s",
                     rid, getattr(req, "priority", 0) or 0, len(ids), free, s_ts + self.wall,
                     self.internal(engine_id, rid))
            if self.summary and req is not None and engine_id not in self.first_token \
                    and not req.num_output_tokens:
                self.pending_first[engine_id] = req
            if self.blocks and ids:
                self._allocated(sched, rid, ids)
        cached = out.scheduled_cached_reqs
        # 0.34 on: no `resumed_req_ids`; a resumed request is sent in full in
        # `scheduled_new_reqs` (above: its line has no `queued=`, as here, its events no QUEUED)
        resumed = getattr(cached, "resumed_req_ids", None) or ()
        if resumed or self.blocks:
            for engine_id, new_ids in zip(cached.req_ids, cached.new_block_ids):
                ids = new_ids[0] if new_ids else ()
                if engine_id in resumed:
                    req = requests.get(engine_id)
                    s_ts = _event_times(req)[1]
                    rid = self.rid(engine_id)
                    info("Scheduling request %s: priority=%d, num_scheduled_blocks=%d, remaining_blocks=%d, t=%.6f%s",
                         rid, getattr(req, "priority", 0) or 0, len(ids), free,
                         (s_ts if s_ts is not None else started) + self.wall, self.internal(engine_id, rid))
                if self.blocks and ids:
                    self._allocated(sched, self.rid(engine_id), ids)
        now = time.monotonic()
        if now >= self.next_queue:
            running, waiting = len(sched.running), len(sched.waiting)
            state = (running, waiting, free)
            if state != self.last_queue or running or waiting:  # an idle engine says so once
                info("Running queue: %d requests, waiting queue: %d requests, free blocks: %d/%d",
                     running, waiting, free, pool.num_gpu_blocks)
                self.last_queue = state
            self.next_queue = now + self.interval

    def _allocated(self, sched, rid: str, ids) -> None:
        size = self.block_bytes
        if size is None:
            size = self.block_bytes = _block_bytes(sched)
        info = self.log.info
        now = time.time()
        for b in ids:
            info("Allocated block %d for request %s, size=%dB, t=%.6f", b, rid, size, now)

    def after_update(self) -> None:
        pending = self.pending_first
        if not pending:
            return
        now = self.clock()
        done = [engine_id for engine_id, req in pending.items() if req.num_output_tokens]
        for engine_id in done:
            del pending[engine_id]
            self.first_token[engine_id] = now

    def preempting(self, sched, request) -> tuple[str, int, str]:
        """Read before vLLM frees the blocks: (id, blocks held, engine id)."""
        held = sched.kv_cache_manager.get_block_ids(request.request_id)
        return self.rid(request.request_id), len(held[0]) if held else 0, request.request_id

    def preempted(self, rid: str, blocks: int, engine_id: str, forced: bool, timestamp=None) -> None:
        """`timestamp`: vLLM's own (monotonic) time of the preemption, its PREEMPTED event's."""
        at = timestamp + self.wall if isinstance(timestamp, (int, float)) and timestamp > 0 else time.time()
        self.log.info("Preempting request %s: reason=%s, preempted_blocks=%d, t=%.6f%s",
                      rid, "forced" if forced else "kv_cache_full", blocks, at, self.internal(engine_id, rid))

    def freeing(self, request) -> tuple | None:
        """A request is over: the arguments of its summary if it completed and the API server
        won't write it. Measured now; written after vLLM freed the blocks, so the release lines
        come before the end's line, in the same order as when the API server writes it."""
        engine_id = request.request_id
        first = self.first_token.pop(engine_id, None)
        self.pending_first.pop(engine_id, None)
        self.queued_at.pop(engine_id, None)
        if not self.summary:
            return None
        rid = self.rid(engine_id)
        now = self.clock()
        generated = request.num_output_tokens
        if first is None and generated:
            first = now  # first token came back in the step that finished it
        status = getattr(request.status, "name", str(request.status))
        if status in _COMPLETED:
            e2e = max(0.0, now - request.arrival_time)
            ttft = max(0.0, first - request.arrival_time) if first is not None else e2e
            itl = (now - first) / (generated - 1) if first is not None and generated > 1 else 0.0
            return rid, request.num_prompt_tokens, generated, ttft * 1e3, itl * 1e3, e2e, now, \
                self.internal(engine_id, rid)
        return None

    def freed(self, engine_id: str, summary: tuple | None) -> None:
        if summary is not None:
            self.log.info(_SUMMARY, *summary)
        self.ids.pop(engine_id, None)

    def freeing_blocks(self, sched, request) -> None:
        """Blocks on: a line per block, preemptions included. Off: one line per finished request
        (a preemption's count is on its `Preempting` line already), so every trace has `freed`."""
        status = getattr(request.status, "name", str(request.status))
        finished = status.startswith("FINISHED")
        if not (self.blocks or finished):
            return
        held = sched.kv_cache_manager.get_block_ids(request.request_id)
        if not held or not held[0]:
            return
        reason = ("aborted" if status == "FINISHED_ABORTED" else "completed") if finished else "preempted"
        rid = self.rid(request.request_id)
        info = self.log.info
        now = time.time()
        if not self.blocks:
            info("Freed %d blocks for request %s, reason=%s, t=%.6f%s", len(held[0]), rid, reason, now,
                 self.internal(request.request_id, rid))
            return
        for b in held[0]:
            info("Freed block %d for request %s, reason=%s, t=%.6f", b, rid, reason, now)


class Frontend(_Hooks):
    """The API server's side: one line per request, written where vLLM finishes the request's
    stats, from vLLM's own numbers and event times (see the module docstring)."""

    def __init__(self, logger, environ=os.environ) -> None:
        super().__init__(logger, environ)
        # vLLM's engine-core stamps are time.monotonic() (one clock for the whole host): one
        # offset, taken once per process, turns them into wall-clock time.
        self.wall = time.time() - time.monotonic()
        self.trust_context = _flag(environ, "VLLM_TRACE_BRIDGE_PLUGIN_TRACE_CONTEXT", "1") not in ("0", "false",
                                                                                                   "no", "off")
        self.preempted: dict[str, list] = {}   # engine id → [[PREEMPTED, SCHEDULED after it or 0], …]
        self.contexts: dict[str, str] = {}     # external id → ", traceparent=…[, tracestate=…]"
        #: what this release's lines lack (a missing EXTRA hook point's cost), said once, by the
        #: API server, at its first line (install runs in every vLLM process)
        self.lacking: str = ""
        self.in_abort = 0  # depth of vLLM's abort_requests (the outer call reports its children)

    def caller_context(self, request_id, headers) -> None:
        """`AsyncLLM.add_request`'s `trace_headers`: keep a valid traceparent (and tracestate)."""
        if not self.trust_context or not headers or not isinstance(request_id, str):
            return
        parent = valid_traceparent(headers.get("traceparent"))
        if parent is None:
            return
        state = valid_tracestate(headers.get("tracestate"))
        if len(self.contexts) >= 65536:  # requests that never reached the output processor
            self.contexts.clear()
        self.contexts[request_id] = f", traceparent={parent}" + (f", tracestate={state}" if state else "")

    def events(self, req_id: str, events) -> None:
        """A preempted request's PREEMPTED stamps, each closed by the SCHEDULED that follows."""
        spans = self.preempted.get(req_id)
        for ev in events:
            kind = ev.type.name
            if kind == "PREEMPTED":
                if spans is None:
                    if len(self.preempted) >= 65536:
                        self.preempted.clear()
                    spans = self.preempted[req_id] = []
                if not spans or spans[-1][1]:
                    spans.append([ev.timestamp, 0.0])
            elif kind == "SCHEDULED" and spans and not spans[-1][1]:
                spans[-1][1] = ev.timestamp

    def _tail(self, processor, req_state, stats) -> str:
        """`, arrival=…, queued_at=…, …, preempted=…, traceparent=…` for a request's line."""
        wall = self.wall
        q, s, f, last = stats.queued_ts, stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts
        if q and s and f and last and stats.arrival_time:  # the common case, in one format
            tail = _TIMES % (stats.arrival_time, q + wall, s + wall, f + wall, last + wall)
        else:
            parts = [f", arrival={stats.arrival_time:.6f}"] if stats.arrival_time else []
            for name, ts in (("queued_at", q), ("scheduled_at", s), ("first_token_at", f), ("last_token_at", last)):
                if ts:
                    parts.append(f", {name}={ts + wall:.6f}")
            tail = "".join(parts)
        parent = getattr(req_state, "parent_req", None)
        sampling = getattr(parent, "sampling_params", None)
        if isinstance(getattr(sampling, "n", None), int):  # a child of n>1: how many its request has
            tail += f", n={sampling.n}"
        if getattr(stats, "num_preemptions", self.preempted):  # before 0.30 no count: the spans seen
            spans = self.preempted.pop(req_state.request_id, None)
            if spans:
                tail += ", preempted=" + "/".join(
                    f"{p + wall:.6f}~{r + wall:.6f}" if r else f"{p + wall:.6f}~" for p, r in spans)
        if self.contexts:
            ext = getattr(req_state, "external_req_id", None)
            parent = None
            if ext is None:  # before 0.14: the id given to add_request is the request's or its parent's
                parent = getattr(req_state, "parent_req", None)
                ext = parent.request_id if parent is not None else req_state.request_id
            ctx = self.contexts.get(ext)
            if ctx is not None:
                tail += ctx
                if parent is not None:
                    last = not any(getattr(st, "parent_req", None) is parent
                                   for st in processor.request_states.values() if st is not req_state)
                else:
                    ids = getattr(processor, "external_req_ids", None)
                    last = ids is None or ext not in ids
                if last:  # the last of its requests (n > 1: children)
                    del self.contexts[ext]
        return tail

    def finished(self, processor, req_state, finish_reason, iteration_stats) -> None:
        stats = req_state.stats
        if iteration_stats is None or stats is None:
            return  # no stats kept: the engine core writes the lines from its own clock
        if self.lacking:
            lacking, self.lacking = self.lacking, ""
            self.log.warning("vllm-trace-bridge plugin: %s", lacking)
        rid = self.api_id(req_state.request_id)  # the id the engine core's lines carry
        generated = stats.num_generation_tokens
        end = iteration_stats.iteration_timestamp  # wall clock: e2e's end, as vLLM's own span
        e2e = max(0.0, end - stats.arrival_time)
        reason = getattr(finish_reason, "name", str(finish_reason))
        tail = self.internal(req_state.request_id, rid) + self._tail(processor, req_state, stats)
        if reason in _COMPLETED_REASONS:
            ttft = stats.first_token_latency if generated else e2e
            itl = (stats.last_token_ts - stats.first_token_ts) / (generated - 1) if generated > 1 else 0.0
            self.log.info(_PHASES, rid, req_state.prompt_len or 0, generated, ttft * 1e3, max(0.0, itl) * 1e3, e2e,
                          end, tail)
        else:
            self.log.info(_ENDED, rid, reason.lower(), req_state.prompt_len or 0, generated, e2e, end, tail)

    def aborting(self, processor, request_ids, internal) -> list:
        """Before vLLM's abort: the request states it may drop (children of a parent included)."""
        states, parents = processor.request_states, processor.parent_requests
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        out = []
        for rid in request_ids:
            ids = [rid] if internal else list(processor.external_req_ids.get(rid, ()))
            if internal and rid not in states and rid in parents:
                ids = list(parents[rid].child_requests)
            out += [st for st in map(states.get, ids) if st is not None]
        return out

    def aborted(self, processor, req_states) -> None:
        """After it: an `ended` line for each state vLLM dropped, with what is known."""
        now = time.time()
        states = processor.request_states
        for st in req_states:
            if states.get(st.request_id) is st or st.stats is None:
                continue
            e2e = max(0.0, now - st.stats.arrival_time)
            rid = self.api_id(st.request_id)
            self.log.info(_ENDED, rid, "abort", st.prompt_len or 0, st.stats.num_generation_tokens, e2e, now,
                          self.internal(st.request_id, rid) + self._tail(processor, st, st.stats))


def _event_times(req) -> tuple[float | None, float | None]:
    """(QUEUED, last SCHEDULED) monotonic stamps among the request's pending vLLM events: what
    vLLM's own time_in_queue is made of. Both None when vLLM keeps no stats (no events)."""
    queued = scheduled = None
    for ev in getattr(req, "events", None) or ():
        kind = getattr(ev.type, "name", None)
        if kind == "SCHEDULED":
            scheduled = ev.timestamp
        elif kind == "QUEUED":
            queued = ev.timestamp
    return queued, scheduled


def _block_bytes(sched) -> int:
    """Bytes one KV block takes across all layers (0 when the config does not say)."""
    try:
        cfg = sched.kv_cache_config
        return int(sum(t.size for t in cfg.kv_cache_tensors) // max(1, cfg.num_blocks))
    except Exception:  # noqa: BLE001
        return 0


def _tracer(sched, logger, frees_in_preempt: bool = False) -> Tracer:
    t = sched.__dict__.get(_ATTR)
    if t is None:
        # vLLM keeps stats in the API server when the scheduler does (`log_stats`, the same flag)
        t = Tracer(logger, summary=not getattr(sched, "log_stats", False))
        t.frees_in_preempt = frees_in_preempt
        sched.__dict__[_ATTR] = t
    return t


def engine_lines_wanted(sched, environ=os.environ) -> bool:
    """The engine core writes lines only when vLLM keeps no stats (the API server then knows no
    event time) or when asked to (block counts, block lines, the queue line)."""
    if not getattr(sched, "log_stats", False):
        return True
    return any(_flag(environ, name, "0") in ("1", "true", "yes", "on")
               for name in ("VLLM_TRACE_BRIDGE_PLUGIN_ENGINE", "VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS"))


def _wrap(cls, logger, names: dict[str, str], version: str = "?", lacking=()) -> None:
    """`cls.__init__` only; a scheduler that must write lines gets the six wrappers bound on
    itself (under the names this release has: `names`), so a scheduler that writes none runs
    vLLM's methods with no layer in between. `lacking`: the engine-side hook points this release
    does not have; then no wrapper, and when engine lines are wanted that is said once."""
    orig_init = cls.__init__
    methods = None if lacking else _engine_methods(cls, logger, names)
    said = []

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        # A disaggregated engine's KV lines (kv.py): only on a scheduler with a KV connector,
        # whatever the engine lines below.
        if getattr(self, "connector", None) is not None and \
                _flag(os.environ, "VLLM_TRACE_BRIDGE_PLUGIN_KV", "1") not in ("0", "false", "no", "off"):
            try:
                from . import kv

                kv.attach(self, logger, _Hooks(logger).api_id, _signature_gap)
            except Exception:  # noqa: BLE001
                logger.warning("vllm-trace-bridge plugin: no KV transfer lines: they failed to install",
                               exc_info=True)
        try:
            if engine_lines_wanted(self):
                if methods is None:
                    if not said:
                        said.append(True)
                        logger.warning(
                            "vllm-trace-bridge plugin: the engine core writes no line: vLLM %s has no %s%s", version,
                            ", ".join(lacking), "" if getattr(self, "log_stats", False) else
                            " (and vLLM keeps no stats, so the API server has no times to write either: "
                            "no plugin line at all; drop --disable-log-stats)")
                    return
                for name, fn in methods.items():
                    self.__dict__[name] = types.MethodType(fn, self)
        except Exception:  # noqa: BLE001
            _off(self, logger, "__init__")

    setattr(__init__, _WRAPPED, True)
    cls.__init__ = __init__


def _engine_methods(cls, logger, names: dict[str, str]) -> dict:
    """The engine-side wrappers, keyed by the name each has in `cls` (`names`: hook point's
    name → this release's)."""
    orig_add = cls.add_request
    orig_schedule = cls.schedule
    orig_update = cls.update_from_output
    orig_preempt = cls._preempt_request
    orig_free = cls._free_request
    free_blocks_name = names.get("_free_request_blocks", "_free_request_blocks")
    orig_free_blocks = getattr(cls, free_blocks_name)
    frees_in_preempt = free_blocks_name != "_free_request_blocks"

    @functools.wraps(orig_add)
    def add_request(self, request, *args, **kwargs):
        out = orig_add(self, request, *args, **kwargs)
        try:
            t = _tracer(self, logger, frees_in_preempt)
            if t.on:
                t.added(request)
        except Exception:  # noqa: BLE001
            _off(self, logger, "add_request")
        return out

    @functools.wraps(orig_schedule)
    def schedule(self, *args, **kwargs):
        started = time.monotonic()
        out = orig_schedule(self, *args, **kwargs)
        try:
            t = _tracer(self, logger, frees_in_preempt)
            if t.on:
                t.after_schedule(self, out, started)
        except Exception:  # noqa: BLE001
            _off(self, logger, "schedule")
        return out

    @functools.wraps(orig_update)
    def update_from_output(self, *args, **kwargs):
        out = orig_update(self, *args, **kwargs)
        try:
            t = _tracer(self, logger, frees_in_preempt)
            if t.on and t.summary:
                t.after_update()
        except Exception:  # noqa: BLE001
            _off(self, logger, "update_from_output")
        return out

    @functools.wraps(orig_preempt)
    def _preempt_request(self, request, *args, **kwargs):
        # Written before vLLM's call: the blocks are counted before vLLM frees them, and the
        # line comes before the `Freed block` lines of the same preemption.
        try:
            t = _tracer(self, logger, frees_in_preempt)
            if t.on:
                forced = bool(kwargs.get("drop_stale_output", args[1] if len(args) > 1 else False))
                t.preempted(*t.preempting(self, request), forced, kwargs.get("timestamp", args[0] if args else None))
                if t.blocks and t.frees_in_preempt:  # vLLM frees them next, not through the hooked free
                    t.freeing_blocks(self, request)
        except Exception:  # noqa: BLE001
            _off(self, logger, "_preempt_request")
        return orig_preempt(self, request, *args, **kwargs)

    @functools.wraps(orig_free)
    def _free_request(self, request, *args, **kwargs):
        t = summary = None
        try:
            t = _tracer(self, logger, frees_in_preempt)
            if t.on:
                summary = t.freeing(request)
            else:
                t = None
        except Exception:  # noqa: BLE001
            _off(self, logger, "_free_request")
            t = None
        out = orig_free(self, request, *args, **kwargs)
        if t is not None:
            try:
                t.freed(request.request_id, summary)
            except Exception:  # noqa: BLE001
                _off(self, logger, "_free_request")
        return out

    @functools.wraps(orig_free_blocks)
    def _free_request_blocks(self, request, *args, **kwargs):
        try:
            t = _tracer(self, logger, frees_in_preempt)
            if t.on:
                t.freeing_blocks(self, request)
        except Exception:  # noqa: BLE001
            _off(self, logger, "_free_request_blocks")
        return orig_free_blocks(self, request, *args, **kwargs)

    _free_request_blocks.__name__ = free_blocks_name
    out = {}
    for fn in (add_request, schedule, update_from_output, _preempt_request, _free_request, _free_request_blocks):
        setattr(fn, _WRAPPED, True)
        out[fn.__name__] = fn
    return out


def _wrap_frontend(front: Frontend, output_cls, stats_cls=None, async_cls=None) -> None:
    """The API server's hooks, all sharing `front` (one per process: vLLM's IterationStats has
    no link to its output processor). `stats_cls` / `async_cls` None: those hooks left out."""
    orig_finished = output_cls._update_stats_from_finished
    orig_abort = output_cls.abort_requests
    # `abort_requests(request_ids, internal)` from 0.14; before, `(request_ids)`: vLLM's own ids
    # (0.10-0.13 abort a parent's children by its id, as `internal=True` does now)
    params = _param_names(orig_abort)
    takes_internal = params is None or "internal" in params

    @functools.wraps(orig_finished)
    def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats, *args, **kwargs):
        out = orig_finished(self, req_state, finish_reason, iteration_stats, *args, **kwargs)
        if front.on:
            try:
                front.finished(self, req_state, finish_reason, iteration_stats)
            except Exception:  # noqa: BLE001
                front.fail("_update_stats_from_finished")
        return out

    @functools.wraps(orig_abort)
    def abort_requests(self, request_ids, *args, **kwargs):
        states = None
        if front.on and not front.in_abort:  # 0.10-0.13 abort a parent's children by calling itself
            try:
                internal = kwargs.get("internal", args[0] if args else False) if takes_internal else True
                states = front.aborting(self, request_ids, internal)
            except Exception:  # noqa: BLE001
                front.fail("abort_requests")
        front.in_abort += 1
        try:
            out = orig_abort(self, request_ids, *args, **kwargs)
        finally:
            front.in_abort -= 1
        if states:
            try:
                front.aborted(self, states)
            except Exception:  # noqa: BLE001
                front.fail("abort_requests")
        return out

    wrapped = [(output_cls, _update_stats_from_finished), (output_cls, abort_requests)]
    if stats_cls is not None:
        orig_events = stats_cls.update_from_events

        @functools.wraps(orig_events)
        def update_from_events(self, req_id, events, is_prefilling, req_stats, *args, **kwargs):
            out = orig_events(self, req_id, events, is_prefilling, req_stats, *args, **kwargs)
            # a request never preempted costs this test; before 0.30 (no count) the events are read
            if getattr(req_stats, "num_preemptions", 1) and front.on:
                try:
                    front.events(req_id, events)
                except Exception:  # noqa: BLE001
                    front.fail("update_from_events")
            return out

        wrapped.append((stats_cls, update_from_events))
    if async_cls is not None:
        orig_add = async_cls.add_request

        @functools.wraps(orig_add)
        async def add_request(self, request_id, *args, **kwargs):
            headers = kwargs.get("trace_headers")
            if headers and front.on:  # before vLLM drops them (its own tracing off)
                try:
                    front.caller_context(request_id, headers)
                except Exception:  # noqa: BLE001
                    front.fail("add_request")
            return await orig_add(self, request_id, *args, **kwargs)

        wrapped.append((async_cls, add_request))
    for cls, fn in wrapped:
        setattr(fn, _WRAPPED, True)
        setattr(cls, fn.__name__, fn)


def _off(obj, logger, where: str, state=_tracer) -> None:
    """A hook failed: switch that object's hooks off, saying so once."""
    try:
        h = state(obj, logger)
        if h.on:
            h.fail(where)
    except Exception:  # noqa: BLE001
        pass


class _Format(logging.Formatter):
    """vLLM's line format (vllm/logger.py), fields vLLM's record factory adds defaulted."""

    def format(self, record):
        if not hasattr(record, "vllm_process_name"):
            record.vllm_process_name = record.processName
        if not hasattr(record, "fileinfo"):
            record.fileinfo = record.filename
        return super().format(record)


def _stream(environ=os.environ):
    return sys.stderr if environ.get("VLLM_LOGGING_STREAM", "") == "ext://sys.stderr" else sys.stdout


def plugin_logger(environ=os.environ) -> logging.Logger:
    """The plugin's own logger, for its warnings: its own handler on vLLM's stream in vLLM's
    format, not propagating (so nothing is printed twice, and vLLM's level does not apply)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_vllm_trace_bridge", False) for h in logger.handlers):
        handler = logging.StreamHandler(_stream(environ))
        handler._vllm_trace_bridge = True
        fmt, datefmt = "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s " \
                       "[%(fileinfo)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S"
        try:
            from vllm.logger import _DATE_FORMAT, _FORMAT

            fmt, datefmt = _FORMAT, _DATE_FORMAT
        except Exception:  # noqa: BLE001 — another vLLM: the format above is 0.32's
            pass
        handler.setFormatter(_Format(fmt, datefmt))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class LineWriter:
    """The plugin's INFO lines, in vLLM's line format, written straight to vLLM's stream (and
    flushed, as vLLM's handler does): `VLLM_LOGGING_LEVEL` and vLLM's logging config govern
    vLLM's loggers, not these lines, so they reach the container's output whatever those say.
    Not through `logging`: a record, its handler and its formatter cost 15-20 µs a line; here
    the header is made once a second and a line costs one `%` and one write. Warnings go to
    `plugin_logger()`."""

    __slots__ = ("stream", "environ", "_sec", "_head", "_warn")

    def __init__(self, stream=None, environ=os.environ) -> None:
        self.stream = stream  # None: vLLM's stream (stdout, or stderr by VLLM_LOGGING_STREAM) at each write
        self.environ = environ
        self._sec = -1
        self._head = ""
        self._warn = None

    def _header(self, sec: int) -> str:
        """`(APIServer pid=1) INFO 12-03 16:22:02 [trace_bridge.py:1] `: vLLM's own format,
        its process name as vLLM set it for this process (vllm.logger), re-read each second."""
        pid = os.getpid()
        name = None
        try:
            from vllm import logger as vllm_logger

            info = getattr(vllm_logger, "_vllm_process_info", None)
            if info is not None and info[1] == pid:
                name = info[0]
        except Exception:  # noqa: BLE001
            pass
        if name is None:
            import multiprocessing

            name = multiprocessing.current_process().name
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(sec))
        return f"{self.environ.get('VLLM_LOGGING_PREFIX', '')}({name} pid={pid}) INFO {stamp} [trace_bridge.py:1] "

    def info(self, fmt: str, *args) -> None:
        sec = int(time.time())
        if sec != self._sec:
            self._head, self._sec = self._header(sec), sec
        stream = self.stream or _stream(self.environ)
        stream.write(f"{self._head}{fmt % args}\n")
        stream.flush()

    def warning(self, *args, **kwargs) -> None:
        if self._warn is None:
            self._warn = plugin_logger(self.environ)
        self._warn.warning(*args, **kwargs)


_DEFAULT = object()


def install(scheduler_cls=None, version: str | None = None, logger=None, output_cls=None,
            stats_cls=_DEFAULT, async_cls=_DEFAULT) -> bool:
    """Wrap the hook points once per class (vLLM's, or the given ones; `stats_cls` /
    `async_cls` None leaves those out), side by side:

    - the API server's (`API`): without one of them, one warning naming it and False: vLLM runs
      untouched;
    - `EXTRA` ones: a missing one costs its part of the line (`EXTRA_COST`), said once;
    - the engine core's (`ENGINE`, under an older name where the release's has the same
      meaning): a missing one leaves the engine core untouched, said once where its lines are
      wanted (`VLLM_TRACE_BRIDGE_PLUGIN_ENGINE` / `_BLOCKS`, or vLLM's stats off).

    The version decides nothing; an untested one is said once."""
    if logger is None:
        logger = LineWriter()
    if version is None:
        from vllm.version import __version__ as version
    if scheduler_cls is None:
        from vllm.v1.core.sched.scheduler import Scheduler as scheduler_cls
    if output_cls is None:
        from vllm.v1.engine.output_processor import OutputProcessor as output_cls
    if stats_cls is _DEFAULT:
        from vllm.v1.metrics.stats import IterationStats as stats_cls
    if async_cls is _DEFAULT:
        from vllm.v1.engine.async_llm import AsyncLLM as async_cls
    if _installed.get(scheduler_cls) and _installed.get(output_cls):
        return True
    classes = {"Scheduler": scheduler_cls, "OutputProcessor": output_cls}
    if stats_cls is not None:
        classes["IterationStats"] = stats_cls
    if async_cls is not None:
        classes["AsyncLLM"] = async_cls
    found, gaps = resolve(classes)
    missing = [why for hp, why in gaps.items() if hp.side == API]
    if missing:
        logger.warning("vllm-trace-bridge plugin does nothing: vLLM %s has no %s", version, ", ".join(missing))
        return False
    if not version_tested(version):
        logger.info("vllm-trace-bridge plugin: vLLM %s is not a version it was tested on (%s); every hook "
                    "point it needs is there, so it runs", version, ", ".join(f"{a}.{b}" for a, b in TESTED_VERSIONS))
    if not getattr(scheduler_cls.__init__, _WRAPPED, False):
        engine_gaps = [why for hp, why in gaps.items() if hp.side == ENGINE]
        _wrap(scheduler_cls, logger, {hp.name: name for hp, name in found.items() if hp.side == ENGINE},
              version, engine_gaps)
    if not any(getattr(getattr(output_cls, name), _WRAPPED, False) for name in FRONTEND_HOOKED):
        front = Frontend(logger)
        extra = {f"{hp.cls}.{hp.name}": why for hp, why in gaps.items() if hp.side == EXTRA}
        if extra:
            front.lacking = f"vLLM {version} has no " + "; no ".join(
                f"{why}: {EXTRA_COST[key]}" for key, why in extra.items())
        _wrap_frontend(front, output_cls, None if "IterationStats.update_from_events" in extra else stats_cls,
                       None if "AsyncLLM.add_request" in extra else async_cls)
    _installed[scheduler_cls] = _installed[output_cls] = True
    return True
