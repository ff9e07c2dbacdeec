"""The lines about a disaggregated request's KV cache moving between a prefill and a decode
engine (issue #34, docs/distributed.md): the plugin's `KV received` (decode) and `KV blocks
released` (prefill), NIXL's lease expiry, invalid blocks and transfer failures, and the
connector's aggregate `KV Transfer metrics`. A mixin of `Assembler` (requests.py).

What they leave on a request is its `KvState`; `kv_phases` turns that into the `kv_transfer`
(decode) and `kv_hold` (prefill) spans after the timeline is built, the same after the C build
and the pure one (neither knows of them). A prefill whose summary came from the plugin lingers
(OVER) for its release line, bounded by `AssembleConfig.kv_hold_s`: its connector keeps the
blocks until the decode has read them or the lease ran out.
"""

from __future__ import annotations

from bridge.assemble import ids
from bridge.assemble.ending import Close, End
from bridge.assemble.state import RequestState, fan_out, given
from bridge.assemble.timeline import INFERRED, OBSERVED, Phase, RequestTimeline, SpanEvent
from bridge.decode.record import Record
from bridge.parse.events import (KvBlocksInvalid, KvLeaseExpired, KvLoadFailed, KvReceived, KvReleased,
                                 KvTransferFailed, KvTransferMetrics)

_NS = 1_000_000_000
PREFILL, DECODE = "prefill", "decode"


class KvState:
    """What the KV lines said of one request (`RequestState.kv`; None for most requests)."""

    __slots__ = ("role", "waiting_since_ns", "arrived_ns", "received_ns", "ok", "blocks", "remote_request_id",
                 "remote_engine_id", "held_since_ns", "released_ns", "released_blocks", "expired", "invalid",
                 "failure")

    def __init__(self, role: str | None) -> None:
        self.role = role
        self.waiting_since_ns = self.arrived_ns = self.received_ns = None  # decode: `KV received`
        self.ok: bool | None = None
        self.blocks: int | None = None
        self.remote_request_id: str | None = None
        self.remote_engine_id: str | None = None
        self.held_since_ns = self.released_ns = None  # prefill: `KV blocks released`
        self.released_blocks: int | None = None
        self.expired = False       # NIXL reaped the blocks at the lease's end
        self.invalid = False       # ... and a decode read them after (`Potentially invalid KV blocks`)
        self.failure: str | None = None  # NIXL's failure type word, on the decode

    def awaits_release(self, r: RequestState) -> bool:
        """A prefill the plugin's summary ended (so the plugin, whose `KV blocks released` line
        ends `kv_hold`, is there) whose release line has not come yet; or whose lease ran out
        with no reader, released, and whose decode may still read the freed blocks: NIXL says
        so (`Potentially invalid KV blocks …`, when the decode's read notification arrives) only
        after the release, and only this way is that line an event of the request's own root."""
        if self.role != PREFILL or r.times is None:
            return False
        return self.released_ns is None or (self.expired and not self.invalid)

    def linger_from(self, r: RequestState) -> int:
        """Where `AssembleConfig.kv_hold_s` counts from: the request's end, or for an expired
        lease the release (the decode can come any time after: the recording's came 8 and 28 s
        after)."""
        if self.expired and self.released_ns is not None:
            return self.released_ns
        return r.terminal_ns


def kv_of(r: RequestState, role: str | None = None) -> KvState:
    kv = r.kv
    if kv is None:
        kv = r.kv = KvState(role)
    elif kv.role is None:
        kv.role = role
    return kv


def awaits_remote_kv(r: RequestState) -> bool:
    """A decode whose KV has not arrived (no `KV received` yet): vLLM's stats lines do not show
    it (the recording's `Running: 0 reqs, Waiting: 0 reqs` while pd-002 waited 6 s in
    WAITING_FOR_REMOTE_KVS), so no stats line may close it as idle."""
    kv = r.kv
    return kv is not None and kv.role == DECODE and kv.waiting_since_ns is None and kv.failure is None


def awaits_release(r: RequestState) -> bool:
    kv = r.kv
    return kv is not None and kv.awaits_release(r)


def kv_due(r: RequestState, kv_deadline: int) -> bool:
    """A request over and past `linger_s` may go: nothing awaited, or awaited past `kv_hold_s`."""
    kv = r.kv
    return kv is None or not kv.awaits_release(r) or kv.linger_from(r) <= kv_deadline


class KvLines:
    """Handlers of the KV lines (table.py's `Kv*` rows)."""

    def _kv_request(self, rid: str | None, engine_rid: str | None, record: Record,
                    count: bool = True) -> RequestState | None:
        """The open request a KV line names: by its API id (the plugin's lines) or its engine
        request id (NIXL's), the one `Added request` named when it was added. None: not open
        (counted as an orphan line: the request went out already, or its start was not read)."""
        index = self.index
        r = None
        for name in (rid, engine_rid):
            if name is None:
                continue
            key = name if name in index.open else ids.resolve(name, index.open)
            if key is None:
                continue
            cand = index.open[key]
            if engine_rid is None or not cand.engine_ids or engine_rid in cand.engine_ids:
                r = cand
                break
        if r is None:
            if count:
                self.stats.orphan_lines += 1
            return None
        return index.touch(r, record)

    def _on_kv_received(self, record: Record, ev: KvReceived) -> None:
        r = self._kv_request(ev.request_id, ev.engine_request_id, record)
        if r is None:
            return
        kv = kv_of(r, DECODE)
        kv.waiting_since_ns, kv.arrived_ns, kv.received_ns = ev.waiting_since_ns, ev.arrived_ns, ev.at_ns
        kv.ok, kv.blocks = ev.ok, ev.blocks
        kv.remote_request_id, kv.remote_engine_id = ev.remote_request_id, ev.remote_engine_id
        # the decode's own line names its prefill even when `Received request` was not read
        for key, value in given(("vllm.pd.role", DECODE), ("vllm.pd.remote_engine_id", ev.remote_engine_id),
                                ("vllm.pd.remote_request_id", ev.remote_request_id)).items():
            if r.extra is None or key not in r.extra:
                r.set(key, value)
        if not ev.ok:
            at = ev.at_ns if ev.at_ns is not None else record.ts_ns
            r.add_event(SpanEvent("exception", at, {"exception.type": "KvTransferFailed",
                                                    "exception.message": "the KV cache did not arrive from "
                                                    "the prefill (status=failed)"}), False)
            kv.failure = kv.failure or "load_failed"

    def _on_kv_released(self, record: Record, ev: KvReleased) -> None:
        r = self._kv_request(ev.request_id, ev.engine_request_id, record)
        if r is None:
            return
        kv = kv_of(r, PREFILL)
        kv.held_since_ns = ev.held_since_ns
        kv.released_ns = ev.at_ns if ev.at_ns is not None else record.ts_ns
        kv.released_blocks = ev.blocks
        if r.extra is None or "vllm.pd.role" not in r.extra:
            r.set("vllm.pd.role", PREFILL)
        if ev.engine_request_id != r.request_id and (r.extra is None or "vllm.request.internal_id" not in r.extra):
            r.set("vllm.request.internal_id", ev.engine_request_id)  # the P/D key, when `Added` was not read
        if ev.engine_id is not None:  # part of the P/D key when ids are not randomised (export.mapping)
            r.set("vllm.pd.engine_id", ev.engine_id)
        if r.terminal_ns is not None and r.held <= 0 and not self._awaits_api(r):
            self.close(r, Close.DONE)  # not after an expiry: it lingers for `Potentially invalid`

    def _on_kv_lease_expired(self, record: Record, ev: KvLeaseExpired) -> None:
        """NIXL reaped a prefill's blocks no decode read within the lease. A lease is only
        given to a prefill that finished (its connector's `request_finished`), so a request
        this log showed no line of before (stock vLLM names none; an excerpt; an agent started
        after it) is opened here, finished at a time no line states; one emitted already
        (`index.gone`) is not opened twice."""
        r = self._kv_request(None, ev.engine_request_id, record, count=False)
        if r is None:
            if ids.resolve(ev.engine_request_id, self.index.gone) is not None:
                self.stats.orphan_lines += 1
                return
            r = self._orphan(ev.engine_request_id, record)
            r.set("vllm.pd.role", PREFILL)
            self.end(r, record.ts_ns, End.FINISHED, observed=False)
        kv_of(r, PREFILL).expired = True
        r.add_event(SpanEvent("vllm.kv.lease_expired", record.ts_ns, {"vllm.kv.readers": ev.readers}), False)

    def _on_kv_blocks_invalid(self, record: Record, ev: KvBlocksInvalid) -> None:
        """A decode read the blocks of this prefill after NIXL reaped them (vLLM's ERROR: its
        output may rest on reused blocks). On the prefill's root while it lingers for this
        (`KvState.awaits_release`), then it goes; past that, the prefill is emitted: a
        `kv_transfer` incident in the prefill's own trace (export/mapping.py: its ids derive
        from the engine request id the line names, as the root's did), not an orphan."""
        r = self._kv_request(None, ev.engine_request_id, record, count=False)
        if r is None:
            self.engine.late_kv_incident(record, ev.engine_request_id,
                                         "a decode read KV blocks this prefill had released at its lease's end "
                                         "(Potentially invalid KV blocks)")
            return
        kv_of(r, PREFILL).invalid = True  # lingers no more: the next tick sends it (not at once: with
        # several decode workers reading, each one's notification makes a line of its own)
        r.add_event(SpanEvent("vllm.kv.blocks_invalid", record.ts_ns, {}), False)

    def _on_kv_transfer_failed(self, record: Record, ev: KvTransferFailed) -> None:
        """A connector's failure, on the request it names (the decode's engine id), never an
        engine incident; one naming no request (a failed handshake) is followed by a line for
        each request it fails."""
        if ev.engine_request_id is None:
            self.stats.no_action += 1
            return
        r = self._kv_request(None, ev.engine_request_id, record)
        if r is None:
            return
        kv = kv_of(r, DECODE)
        kv.failure = ev.failure
        attrs = {"exception.type": "KvTransferFailed", "exception.message": f"NIXL transfer failure: {ev.failure}"}
        if ev.cause is not None:  # the class of the exception its traceback ends in
            attrs["vllm.kv_transfer.cause"] = ev.cause
        r.add_event(SpanEvent("exception", record.ts_ns, attrs), False)

    def _on_kv_load_failed(self, record: Record, ev: KvLoadFailed) -> None:
        """vLLM's scheduler fails these requests (their KV load failed; `failure_policy=fail`):
        each ends FAILED here, `distributed`, saying so; the engine goes on (no incident). The
        plugin's `ended: finish=error` and the API server's `failed with an internal error`
        that follow find it over."""
        message = "KV load failure: the KV cache did not arrive from the prefill"
        if ev.tokens is not None:
            message += f" ({ev.tokens} tokens affected)"
        for eid in ev.engine_request_ids:
            r = self._kv_request(None, eid, record)
            if r is None:
                continue
            kv = kv_of(r, DECODE)
            kv.failure = kv.failure or "load_failed"
            if r.terminal_ns is None:
                self.end(r, record.ts_ns, End.FAILED, "distributed", message, exception="KvLoadFailed")

    def _on_kv_metrics(self, record: Record, ev: KvTransferMetrics) -> None:
        """The connector's aggregate over a stats interval: no request's own figure, so an event
        on every request in flight (as the engine's stats lines)."""
        attrs = given(("vllm.kv_transfer.count", ev.transfers), ("vllm.kv_transfer.avg_s", ev.avg_xfer_s),
                      ("vllm.kv_transfer.p90_s", ev.p90_xfer_s), ("vllm.kv_transfer.avg_post_s", ev.avg_post_s),
                      ("vllm.kv_transfer.p90_post_s", ev.p90_post_s), ("vllm.kv_transfer.avg_bytes", ev.avg_bytes),
                      ("vllm.kv_transfer.throughput_bytes_per_s", ev.throughput_bps),
                      ("vllm.kv_transfer.avg_descriptors", ev.avg_descriptors),
                      ("vllm.kv_transfer.failed", ev.failed), ("vllm.kv_transfer.failed_recvs", ev.failed_recvs),
                      ("vllm.kv_transfer.expired", ev.expired),
                      ("vllm.kv_transfer.notifs_after_expiry", ev.notifs_after_expiry))
        fan_out(self.index.in_flight.values(), SpanEvent("vllm.kv_transfer.metrics", record.ts_ns, attrs))


def kv_phases(t: RequestTimeline, r: RequestState) -> None:
    """`kv_transfer` (decode: waiting for the remote KV → arrived) and `kv_hold` (prefill: the
    blocks kept for the decode → freed) on a built timeline; a failed transfer is the request's
    error (`distributed`) when it failed with no more telling type (vLLM fails a request whose
    KV load failed with `FinishReason.ERROR`: the plugin says `finish=error`)."""
    kv = r.kv
    if kv.waiting_since_ns is not None:
        end = kv.arrived_ns if kv.arrived_ns is not None else kv.received_ns
        if end is not None and end >= kv.waiting_since_ns:
            attrs = {"vllm.kv_transfer.status": "ok" if kv.ok else "failed"}
            if kv.blocks is not None:
                attrs["vllm.kv_transfer.blocks"] = kv.blocks
            t.phases.append(Phase("kv_transfer", 0, kv.waiting_since_ns, end, OBSERVED,
                                  OBSERVED if kv.arrived_ns is not None else INFERRED, attrs))
            t.start_ns = min(t.start_ns, kv.waiting_since_ns)
            t.end_ns = max(t.end_ns, end)
    if kv.released_ns is not None:
        start, timing = (kv.held_since_ns, OBSERVED) if kv.held_since_ns is not None else (r.terminal_ns, OBSERVED)
        if start is None:
            start, timing = t.start_ns, INFERRED
        start = min(start, kv.released_ns)
        attrs = {"vllm.kv_hold.expired": kv.expired}
        if kv.released_blocks is not None:
            attrs["vllm.kv_hold.blocks"] = kv.released_blocks
        t.phases.append(Phase("kv_hold", 0, start, kv.released_ns, timing, OBSERVED, attrs))
        t.start_ns = min(t.start_ns, start)
        t.end_ns = max(t.end_ns, kv.released_ns)
    if kv.failure is not None and t.outcome == "failed" and t.error_type in (None, "other", "error"):
        t.error_type = t.attrs["error.type"] = "distributed"
        if not t.error_message:
            t.error_message = f"KV transfer failed ({kv.failure})"
