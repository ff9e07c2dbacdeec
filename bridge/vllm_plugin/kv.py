"""The KV-transfer lines of a disaggregated (prefill/decode) vLLM: two moments no vLLM line
shows per request at INFO.

- On the decode: the scheduler moves a request out of `WAITING_FOR_REMOTE_KVS` (its KV cache
  has arrived from the prefill, or failed to): `Scheduler._update_waiting_for_remote_kv(request)`,
  which every release from 0.10 on calls at that moment (before 0.24 it is also called on every
  step while the KV is still missing, and then returns False: no line).

      KV received for request <id>: engine_request_id=<eid>, remote_request_id=<prefill's eid>,
          remote_engine_id=<engine>, blocks=<n>, status=ok|failed
          [, waiting_since=<T>] [, arrived_at=<T>], t=<T>

  `waiting_since`: when the scheduler allocated the blocks for an asynchronous load (the
  connector's `update_state_after_alloc` with external tokens, which puts the request into
  `WAITING_FOR_REMOTE_KVS`); `arrived_at`: when the worker's output reported the transfer done
  (`finished_recving`, in `_update_from_kv_xfer_finished`); `t`: when the scheduler moved it on.

- On the prefill: the blocks it held for the decode are freed (the decode read them, or the
  connector's lease expired): `Scheduler._update_from_kv_xfer_finished(output)`'s
  `finished_sending`, read before vLLM frees them.

      KV blocks released for request <id>: engine_request_id=<eid>, blocks=<n>
          [, engine_id=<engine>] [, held_since=<T>], t=<T>

  `engine_id`: this engine's `kv_transfer_config.engine_id` (with the `_dp<n>` vLLM adds under
  data parallelism), what the decode gets as `remote_engine_id`: with request id randomization
  off it is part of the key that joins the two halves. `held_since`: when the connector's
  `request_finished` said to keep the blocks (the request's end on the prefill). Whether the decode read them or the lease expired the scheduler cannot
  tell: the NIXL worker's own WARNING `Releasing expired KV blocks for request <eid> …` says it,
  with the same engine request id.

`<id>` is the id the API server logged (as the plugin's other lines), `<eid>` vLLM's engine
request id (`<id>-<8 hex>`), the one the prefill's `kv_transfer_params.remote_request_id`
carries to the decode. `<T>`: unix seconds, six decimals.

Cost: nothing on a scheduler without a KV connector (no wrapper is bound); with one, a call per
transfer and per finished request, never per token. Written at any log level (the plugin's
`LineWriter`). The wrappers are bound on the scheduler instance and its connector, so another
scheduler in the same process is untouched. A failure switches this scheduler's KV lines off,
said once; vLLM's method always runs with its own arguments and result.
"""

from __future__ import annotations

import time
import typing

SCHEDULER_PY = "vllm/v1/core/sched/scheduler.py"


class KvHookPoint(typing.NamedTuple):
    file: str
    cls: str
    name: str
    params: tuple[str, ...]


#: The scheduler's methods the KV lines hook (both in every release 0.10 → 0.34, same leading
#: parameter; tests/test_vllm_plugin_kv.py reads them in each release's source). The connector's
#: `update_state_after_alloc` / `request_finished` are the KV connector API (KVConnectorBase_V1),
#: looked up on the instance: a connector without them costs only `waiting_since` / `held_since`.
KV_HOOK_POINTS = (
    KvHookPoint(SCHEDULER_PY, "Scheduler", "_update_waiting_for_remote_kv", ("request",)),
    KvHookPoint(SCHEDULER_PY, "Scheduler", "_update_from_kv_xfer_finished", ("kv_connector_output",)),
)

_RECEIVED = "KV received for request %s: engine_request_id=%s, remote_request_id=%s, remote_engine_id=%s, " \
            "blocks=%d, status=%s%s, t=%.6f"
_RELEASED = "KV blocks released for request %s: engine_request_id=%s, blocks=%d%s%s, t=%.6f"
_CAP = 65536  # entries of requests that never reached the moment that drops them


class KvLines:
    """One scheduler's KV state: monotonic stamps by engine request id, bounded."""

    def __init__(self, log, api_id, engine_id: str | None = None) -> None:
        self.log = log
        self.api_id = api_id  # engine id → the id the API server logged
        # this engine's KV engine id, as the decode's `remote_engine_id` names it
        self.engine = "" if not engine_id else f", engine_id={_field(engine_id)}"
        self.on = True
        self.wall = time.time() - time.monotonic()
        self.waiting_since: dict[str, float] = {}
        self.arrived: dict[str, float] = {}
        self.held_since: dict[str, float] = {}

    @staticmethod
    def _put(d: dict, key, value) -> None:
        if len(d) >= _CAP:
            d.clear()
        d[key] = value

    def fail(self, where: str) -> None:
        self.on = False
        self.log.warning("vllm-trace-bridge plugin: KV lines switched off after an error in %s; vLLM is "
                         "unaffected", where, exc_info=True)

    # -- the connector's side -----------------------------------------------------------------

    def allocated(self, request, num_external_tokens) -> None:
        if num_external_tokens:
            self._put(self.waiting_since, request.request_id, time.monotonic())

    def finished(self, request, result) -> None:
        delay = result[0] if isinstance(result, tuple) and result else False
        if delay:
            self._put(self.held_since, request.request_id, time.monotonic())

    # -- the scheduler's side -----------------------------------------------------------------

    def xfer_finished(self, sched, output) -> list:
        """Before vLLM's call: note arrivals, and read what `finished_sending` will free."""
        now = time.monotonic()
        for eid in getattr(output, "finished_recving", None) or ():
            self._put(self.arrived, eid, now)
        out = []
        requests = sched.requests
        for eid in getattr(output, "finished_sending", None) or ():
            req = requests.get(eid)
            if req is None:
                continue
            held = sched.kv_cache_manager.get_block_ids(eid)
            out.append((eid, sum(len(g) for g in held) if held else 0))
        return out

    def released(self, freed: list) -> None:
        now = time.time()
        for eid, blocks in freed:
            since = self.held_since.pop(eid, None)
            self.log.info(_RELEASED, self.api_id(eid), eid, blocks, self.engine,
                          "" if since is None else f", held_since={since + self.wall:.6f}", now)

    def before_received(self, sched, request) -> tuple:
        eid = request.request_id
        held = sched.kv_cache_manager.get_block_ids(eid)
        failed = eid in (getattr(sched, "failed_recving_kv_req_ids", None) or ())
        return sum(len(g) for g in held) if held else 0, failed

    def received(self, request, blocks: int, failed: bool) -> None:
        eid = request.request_id
        params = getattr(request, "kv_transfer_params", None) or {}
        extra = ""
        since = self.waiting_since.pop(eid, None)
        if since is not None:
            extra += f", waiting_since={since + self.wall:.6f}"
        arrived = self.arrived.pop(eid, None)
        if arrived is not None:
            extra += f", arrived_at={arrived + self.wall:.6f}"
        self.log.info(_RECEIVED, self.api_id(eid), eid, _field(params.get("remote_request_id")),
                      _field(params.get("remote_engine_id")), blocks, "failed" if failed else "ok", extra,
                      time.time())


def _field(value) -> str:
    """An id as one field of the line: no separator of the line inside it."""
    if value is None:
        return "-"
    text = str(value)
    return "".join(ch if ch.isprintable() and ch not in " ,:" else "_" for ch in text)[:200] or "-"


def missing(cls, signature_gap) -> list[str]:
    """The KV hook points `cls` lacks (or takes other leading parameters for): [] → it has them.
    `signature_gap(fn, params)`: hooks.py's check (passed in: kv.py imports nothing of hooks)."""
    out = []
    for hp in KV_HOOK_POINTS:
        fn = getattr(cls, hp.name, None)
        if not callable(fn):
            out.append(f"{hp.cls}.{hp.name}")
        elif (gap := signature_gap(fn, hp.params)) is not None:
            out.append(f"{hp.cls}.{hp.name}{gap}")
    return out


def attach(sched, log, api_id, signature_gap=lambda fn, params: None) -> bool:
    """Bind the KV wrappers on this scheduler (and its connector) when it has a KV connector and
    every KV hook point (`signature_gap`: hooks.py's check of a method's leading parameters).
    True when bound."""
    connector = getattr(sched, "connector", None)
    if connector is None:
        return False
    lacking = missing(type(sched), signature_gap)
    if lacking:
        log.warning("vllm-trace-bridge plugin: no KV transfer lines: this vLLM has no %s", ", ".join(lacking))
        return False
    kv_config = getattr(getattr(sched, "vllm_config", None), "kv_transfer_config", None)
    kv = KvLines(log, api_id, getattr(kv_config, "engine_id", None))
    cls = type(sched)
    orig_wait = getattr(cls, "_update_waiting_for_remote_kv")
    orig_xfer = getattr(cls, "_update_from_kv_xfer_finished")

    def _update_waiting_for_remote_kv(self, request, *args, **kwargs):
        seen = None
        if kv.on:
            try:
                seen = kv.before_received(self, request)
            except Exception:  # noqa: BLE001
                kv.fail("_update_waiting_for_remote_kv")
        out = orig_wait(self, request, *args, **kwargs)
        # before 0.24 it is called every step while the KV is missing and returns False then
        if seen is not None and out is not False and kv.on:
            try:
                kv.received(request, *seen)
            except Exception:  # noqa: BLE001
                kv.fail("_update_waiting_for_remote_kv")
        return out

    def _update_from_kv_xfer_finished(self, kv_connector_output, *args, **kwargs):
        freed = None
        if kv.on:
            try:
                freed = kv.xfer_finished(self, kv_connector_output)
            except Exception:  # noqa: BLE001
                kv.fail("_update_from_kv_xfer_finished")
        out = orig_xfer(self, kv_connector_output, *args, **kwargs)
        if freed and kv.on:
            try:
                kv.released(freed)
            except Exception:  # noqa: BLE001
                kv.fail("_update_from_kv_xfer_finished")
        return out

    import types

    sched.__dict__["_update_waiting_for_remote_kv"] = types.MethodType(_update_waiting_for_remote_kv, sched)
    sched.__dict__["_update_from_kv_xfer_finished"] = types.MethodType(_update_from_kv_xfer_finished, sched)
    _wrap_connector(connector, kv)
    return True


def _wrap_connector(connector, kv: KvLines) -> None:
    """The connector's `update_state_after_alloc(request, blocks, num_external_tokens)` and
    `request_finished[_all_groups](request, block_ids)`, on this instance, when it has them."""
    alloc = getattr(connector, "update_state_after_alloc", None)
    if callable(alloc):
        def update_state_after_alloc(request, blocks, num_external_tokens, *args, **kwargs):
            out = alloc(request, blocks, num_external_tokens, *args, **kwargs)
            if kv.on:
                try:
                    kv.allocated(request, num_external_tokens)
                except Exception:  # noqa: BLE001
                    kv.fail("update_state_after_alloc")
            return out

        setattr(connector, "update_state_after_alloc", update_state_after_alloc)
    for name in ("request_finished", "request_finished_all_groups"):
        fin = getattr(connector, name, None)
        if not callable(fin):
            continue

        def request_finished(request, *args, _fin=fin, _name=name, **kwargs):
            out = _fin(request, *args, **kwargs)
            if kv.on:
                try:
                    kv.finished(request, out)
                except Exception:  # noqa: BLE001
                    kv.fail(_name)
            return out

        setattr(connector, name, request_finished)
