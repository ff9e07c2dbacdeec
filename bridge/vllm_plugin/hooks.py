"""The hooks. `install` wraps six methods of vLLM's V1 `Scheduler` (the engine core) and one of
its `OutputProcessor` (the API server):

- `Scheduler.add_request`: notes when the request entered the engine's queue (monotonic, as
  vLLM's own QUEUED event), for the `queued=` field of its first `Scheduling request` line.
- `Scheduler.schedule`: after vLLM's own call, the new and resumed requests of the step get
  their `Scheduling request` line (and, with blocks on, `Allocated block` lines for the blocks
  the step gave out); at most once per interval, the `Running queue` line.
- `Scheduler._preempt_request`: the `Preempting request` line, written just before vLLM's call
  (which frees the blocks it counts).
- `Scheduler._free_request_blocks`: a finished request's `Freed <n> blocks` line (with blocks
  on, one `Freed block` line per block, preemptions included).
- `OutputProcessor._update_stats_from_finished`: the finished-request summary, from the very
  stats vLLM's own metrics and `llm_request` spans are made of (time to first token and
  end-to-end as the API server saw them), so the bridge's durations are vLLM's.
- Only when vLLM keeps no stats (`--disable-log-stats`, where the API server has none to
  give): `Scheduler.update_from_output` notes the first token and `Scheduler._free_request`
  writes the summary from the engine's clock instead, after vLLM's free (so, as from the API
  server, the release lines come before the end's line).

Every line ends in `t=<unix seconds>.<µs>`, the event's own time: vLLM's QUEUED / SCHEDULED /
PREEMPTED request events where it records them (monotonic, turned into wall-clock time with an
offset taken once per scheduler), the API server's wall-clock iteration stamp for the summary.

Which vLLM: any whose classes have the hook points in `HOOK_POINTS`, by name and by the
parameters the wrappers rely on (checked before anything is wrapped); tested on 0.32 and 0.33.

Each wrapper calls vLLM's method first (or, where the plugin must look before vLLM changes
state, reads and then calls it) and never lets its own error reach vLLM: the first error is
logged once with its traceback and that object's tracer switches off.
"""

from __future__ import annotations

import functools
import os
import re
import time

from . import _LOGGER_NAME, TESTED_VERSIONS, version_tested

_SCHEDULER_PY = "vllm/v1/core/sched/scheduler.py"
_OUTPUT_PY = "vllm/v1/engine/output_processor.py"
#: (module file, class, method, the leading parameters after `self` the wrapper relies on).
HOOK_POINTS = (
    (_SCHEDULER_PY, "Scheduler", "add_request", ("request",)),
    (_SCHEDULER_PY, "Scheduler", "schedule", ()),
    (_SCHEDULER_PY, "Scheduler", "update_from_output", ()),
    (_SCHEDULER_PY, "Scheduler", "_preempt_request", ("request", "timestamp")),
    (_SCHEDULER_PY, "Scheduler", "_free_request", ("request",)),
    (_SCHEDULER_PY, "Scheduler", "_free_request_blocks", ("request",)),
    (_OUTPUT_PY, "OutputProcessor", "_update_stats_from_finished", ("req_state", "finish_reason", "iteration_stats")),
)
HOOKED = tuple(m for _f, c, m, _p in HOOK_POINTS if c == "Scheduler")
FRONTEND_HOOKED = tuple(m for _f, c, m, _p in HOOK_POINTS if c == "OutputProcessor")
#: What the hooks read at run time (a miss there switches the plugin off, vLLM runs on): the
#: names that must appear in vLLM's source, for the check against a release's wheel.
READ_AT_RUN_TIME = (
    ("vllm/v1/core/sched/output.py", ("scheduled_new_reqs", "scheduled_cached_reqs", "resumed_req_ids",
                                      "new_block_ids", "req_id", "block_ids")),
    ("vllm/v1/request.py", ("events", "num_output_tokens", "num_prompt_tokens", "arrival_time", "priority")),
    ("vllm/v1/engine/__init__.py", ("QUEUED", "SCHEDULED", "PREEMPTED")),
    ("vllm/v1/metrics/stats.py", ("iteration_timestamp", "first_token_latency", "num_generation_tokens",
                                  "first_token_ts", "last_token_ts")),
    (_SCHEDULER_PY, ("kv_cache_manager", "requests", "running", "waiting", "log_stats")),
    ("vllm/v1/core/block_pool.py", ("get_num_free_blocks", "num_gpu_blocks")),
)


def _signature_gap(fn, params: tuple[str, ...]) -> str | None:
    """None when `fn(self, *params)` is how it takes its leading arguments; else what differs."""
    import inspect

    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    except (TypeError, ValueError):
        return None  # no signature to read (a C method): trust the name
    if tuple(names[:len(params)]) != params:
        return f"({', '.join(params)}), it takes ({', '.join(names)})"
    return None


def missing_hook_points(classes: dict[str, type]) -> list[str]:
    """`Class.method` (and why) for each hook point the given classes lack: [] means install."""
    out = []
    for _file, cls_name, name, params in HOOK_POINTS:
        fn = getattr(classes[cls_name], name, None)
        if not callable(fn):
            out.append(f"{cls_name}.{name}")
            continue
        fn = getattr(fn, "__wrapped__", fn) if getattr(fn, _WRAPPED, False) else fn
        gap = _signature_gap(fn, params)
        if gap is not None:
            out.append(f"{cls_name}.{name}{gap}")
    return out


def missing_in_source(read) -> list[str]:
    """The same check on a vLLM release's source, without importing it (nor torch): `read(path)`
    gives a file of the release (`vllm/...py`) or None. Also the names read at run time."""
    import ast
    import re as _re

    out = []
    trees: dict[str, object] = {}
    for path, cls_name, name, params in HOOK_POINTS:
        if path not in trees:
            text = read(path)
            trees[path] = ast.parse(text) if text is not None else None
        tree = trees[path]
        if tree is None:
            out.append(f"{path} (no such file)")
            continue
        cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
        fn = None if cls is None else next(
            (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)
        if fn is None:
            out.append(f"{cls_name}.{name}")
            continue
        names = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]
        if tuple(names[:len(params)]) != params:
            out.append(f"{cls_name}.{name}({', '.join(params)}), it takes ({', '.join(names)})")
    for path, words in READ_AT_RUN_TIME:
        text = read(path)
        if text is None:
            out.append(f"{path} (no such file)")
            continue
        out += [f"{path}: {w}" for w in words if not _re.search(r"\b" + w + r"\b", text)]
    return out
_ATTR = "_vllm_trace_bridge_tracer"
_WRAPPED = "__vllm_trace_bridge_wrapped__"
_SUFFIX = re.compile(r"-[0-9a-f]{8}$")

_installed: dict[type, bool] = {}

#: Ends that are a finished request in the seed's sense. Aborts, errors and ignored (too long)
#: prompts get no summary line: vLLM's API server logs those itself, and a summary would make
#: the bridge call them finished.
_COMPLETED = frozenset({"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_REPETITION"})
_COMPLETED_REASONS = frozenset({"STOP", "LENGTH", "REPETITION"})  # the API server's FinishReason
_SUMMARY = ("Request %s: prompt_tokens=%d, generated_tokens=%d, ttft=%.3fms, itl=%.3fms, total_latency=%.6fs, "
            "t=%.6f")


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
        return _SUFFIX.sub("", engine_id) if self.strip else engine_id

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
                     "queued=%.3fms, t=%.6f", rid, getattr(req, "priority", 0) or 0, len(ids), free,
                     max(0.0, s_ts - q_ts) * 1e3, s_ts + self.wall)
            else:
                info("Scheduling request %s: priority=%d, num_scheduled_blocks=%d, remaining_blocks=%d, t=%.6f",
                     rid, getattr(req, "priority", 0) or 0, len(ids), free, s_ts + self.wall)
            if self.summary and req is not None and engine_id not in self.first_token \
                    and not req.num_output_tokens:
                self.pending_first[engine_id] = req
            if self.blocks and ids:
                self._allocated(sched, rid, ids)
        cached = out.scheduled_cached_reqs
        resumed = cached.resumed_req_ids
        if resumed or self.blocks:
            for engine_id, new_ids in zip(cached.req_ids, cached.new_block_ids):
                ids = new_ids[0] if new_ids else ()
                if engine_id in resumed:
                    req = requests.get(engine_id)
                    s_ts = _event_times(req)[1]
                    info("Scheduling request %s: priority=%d, num_scheduled_blocks=%d, remaining_blocks=%d, t=%.6f",
                         self.rid(engine_id), getattr(req, "priority", 0) or 0, len(ids), free,
                         (s_ts if s_ts is not None else started) + self.wall)
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

    def preempting(self, sched, request) -> tuple[str, int]:
        """Read before vLLM frees the blocks: (id, blocks held)."""
        held = sched.kv_cache_manager.get_block_ids(request.request_id)
        return self.rid(request.request_id), len(held[0]) if held else 0

    def preempted(self, rid: str, blocks: int, forced: bool, timestamp=None) -> None:
        """`timestamp`: vLLM's own (monotonic) time of the preemption, its PREEMPTED event's."""
        at = timestamp + self.wall if isinstance(timestamp, (int, float)) and timestamp > 0 else time.time()
        self.log.info("Preempting request %s: reason=%s, preempted_blocks=%d, t=%.6f",
                      rid, "forced" if forced else "kv_cache_full", blocks, at)

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
            return rid, request.num_prompt_tokens, generated, ttft * 1e3, itl * 1e3, e2e, now
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
            info("Freed %d blocks for request %s, reason=%s, t=%.6f", len(held[0]), rid, reason, now)
            return
        for b in held[0]:
            info("Freed block %d for request %s, reason=%s, t=%.6f", b, rid, reason, now)


class Frontend(_Hooks):
    """The API server's side: one summary line per completed request, written where vLLM itself
    stamps the first token and the end (its `IterationStats`), from the same numbers."""

    def finished(self, req_state, finish_reason, iteration_stats) -> None:
        stats = req_state.stats
        if iteration_stats is None or stats is None:
            return  # no stats kept: the engine core writes the summary from its own clock
        if getattr(finish_reason, "name", str(finish_reason)) not in _COMPLETED_REASONS:
            return
        rid = self.api_id(req_state.request_id)  # the id the engine core's lines carry
        generated = stats.num_generation_tokens
        end = iteration_stats.iteration_timestamp  # wall clock: e2e's end, as vLLM's own span
        e2e = max(0.0, end - stats.arrival_time)
        ttft = stats.first_token_latency if generated else e2e
        itl = (stats.last_token_ts - stats.first_token_ts) / (generated - 1) if generated > 1 else 0.0
        self.log.info(_SUMMARY, rid, req_state.prompt_len or 0, generated, ttft * 1e3, max(0.0, itl) * 1e3, e2e,
                      end)


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


def _tracer(sched, logger) -> Tracer:
    t = sched.__dict__.get(_ATTR)
    if t is None:
        # vLLM keeps stats in the API server when the scheduler does (`log_stats`, the same flag)
        t = Tracer(logger, summary=not getattr(sched, "log_stats", False))
        sched.__dict__[_ATTR] = t
    return t


def _frontend(processor, logger) -> Frontend:
    f = processor.__dict__.get(_ATTR)
    if f is None:
        f = processor.__dict__[_ATTR] = Frontend(logger)
    return f


def _wrap(cls, logger) -> None:
    orig_add = cls.add_request
    orig_schedule = cls.schedule
    orig_update = cls.update_from_output
    orig_preempt = cls._preempt_request
    orig_free = cls._free_request
    orig_free_blocks = cls._free_request_blocks

    @functools.wraps(orig_add)
    def add_request(self, request, *args, **kwargs):
        out = orig_add(self, request, *args, **kwargs)
        try:
            t = _tracer(self, logger)
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
            t = _tracer(self, logger)
            if t.on:
                t.after_schedule(self, out, started)
        except Exception:  # noqa: BLE001
            _off(self, logger, "schedule")
        return out

    @functools.wraps(orig_update)
    def update_from_output(self, *args, **kwargs):
        out = orig_update(self, *args, **kwargs)
        try:
            t = _tracer(self, logger)
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
            t = _tracer(self, logger)
            if t.on:
                forced = bool(kwargs.get("drop_stale_output", args[1] if len(args) > 1 else False))
                t.preempted(*t.preempting(self, request), forced, kwargs.get("timestamp", args[0] if args else None))
        except Exception:  # noqa: BLE001
            _off(self, logger, "_preempt_request")
        return orig_preempt(self, request, *args, **kwargs)

    @functools.wraps(orig_free)
    def _free_request(self, request, *args, **kwargs):
        t = summary = None
        try:
            t = _tracer(self, logger)
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
            t = _tracer(self, logger)
            if t.on:
                t.freeing_blocks(self, request)
        except Exception:  # noqa: BLE001
            _off(self, logger, "_free_request_blocks")
        return orig_free_blocks(self, request, *args, **kwargs)

    for fn in (add_request, schedule, update_from_output, _preempt_request, _free_request, _free_request_blocks):
        setattr(fn, _WRAPPED, True)
        setattr(cls, fn.__name__, fn)


def _wrap_frontend(cls, logger) -> None:
    orig_finished = cls._update_stats_from_finished

    @functools.wraps(orig_finished)
    def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats, *args, **kwargs):
        out = orig_finished(self, req_state, finish_reason, iteration_stats, *args, **kwargs)
        try:
            f = _frontend(self, logger)
            if f.on:
                f.finished(req_state, finish_reason, iteration_stats)
        except Exception:  # noqa: BLE001
            _off(self, logger, "_update_stats_from_finished", _frontend)
        return out

    setattr(_update_stats_from_finished, _WRAPPED, True)
    cls._update_stats_from_finished = _update_stats_from_finished


def _off(obj, logger, where: str, state=_tracer) -> None:
    """A hook failed: switch that object's hooks off, saying so once."""
    try:
        h = state(obj, logger)
        if h.on:
            h.fail(where)
    except Exception:  # noqa: BLE001
        pass


def install(scheduler_cls=None, version: str | None = None, logger=None, output_cls=None) -> bool:
    """Wrap the scheduler's and the output processor's methods once per class. False (after one
    warning naming what is missing) when a hook point is not there or takes other arguments:
    then vLLM runs untouched. The version decides nothing; an untested one is said once."""
    if logger is None:
        from vllm.logger import init_logger

        logger = init_logger(_LOGGER_NAME)
    if version is None:
        from vllm.version import __version__ as version
    if scheduler_cls is None:
        from vllm.v1.core.sched.scheduler import Scheduler as scheduler_cls
    if output_cls is None:
        from vllm.v1.engine.output_processor import OutputProcessor as output_cls
    if _installed.get(scheduler_cls) and _installed.get(output_cls):
        return True
    missing = missing_hook_points({"Scheduler": scheduler_cls, "OutputProcessor": output_cls})
    if missing:
        logger.warning("vllm-trace-bridge plugin does nothing: vLLM %s has no %s", version, ", ".join(missing))
        return False
    if not version_tested(version):
        logger.info("vllm-trace-bridge plugin: vLLM %s is not a version it was tested on (%s); every hook "
                    "point it needs is there, so it runs", version, ", ".join(f"{a}.{b}" for a, b in TESTED_VERSIONS))
    if not any(getattr(getattr(scheduler_cls, name), _WRAPPED, False) for name in HOOKED):
        _wrap(scheduler_cls, logger)
    if not any(getattr(getattr(output_cls, name), _WRAPPED, False) for name in FRONTEND_HOOKED):
        _wrap_frontend(output_cls, logger)
    _installed[scheduler_cls] = _installed[output_cls] = True
    return True
