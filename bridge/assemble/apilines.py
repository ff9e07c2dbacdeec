"""The lines vLLM's API server writes about a request: `Received request`, its details,
`Added request`, `Finished request`, `Generated response`, aborts and failures, V0's sampled
preemption warning. A mixin of `Assembler` (requests.py), whose index, `end` and `close` it uses.

They join under one key whatever spelling a line uses (`ids`); a request whose start was not
seen is opened by its first line, marked `vllm.start_unknown`. A client that reuses its
`X-Request-Id` while a request under it is still being received gets a twin (`index`).
"""

from __future__ import annotations

from bridge.assemble import ids
from bridge.assemble.ending import Close, End
from bridge.assemble.index import COARSE
from bridge.assemble.kvlines import kv_of
from bridge.assemble.state import SEEN_DETAILS, SEEN_RECEIVED, RequestState, given
from bridge.assemble.timeline import SpanEvent
from bridge.decode.record import Record
from bridge.parse.events import (EngineError, RequestAdded, RequestDetails, RequestFailed, RequestFinished,
                                 RequestReceived, RequestsAborted, RequestWaiting, ResponseGenerated, SequencePreempted)

_NS = 1_000_000_000


class ApiLines:
    """Handlers of the API server's lines about requests."""

    def _upstream(self, key: str, record: Record) -> RequestState:
        """Open (or continue) an upstream request under `key`, with what its id tells."""
        self.engine.end_startup()
        r = self._start(key, record)
        if r.extra is None:
            self._describe(r, key, record)
        return r

    @staticmethod
    def _describe(r: RequestState, key: str, record: Record) -> None:
        r.extra = {"gen_ai.response.id": ids.response_id(key)}
        op = ids.operation(key)
        if op is not None:
            r.extra["gen_ai.operation.name"] = op
        if record.process:
            r.extra["vllm.process"] = record.process

    def _resolve(self, rid: str, record: Record) -> RequestState | None:
        """The request a line names; one whose start was not seen (an excerpt, an agent started
        late) is opened here, marked `vllm.start_unknown`. None for a request already emitted."""
        key = ids.resolve(rid, self.index.open)
        if key is not None:
            if self.index.twins and key in self.index.twins:
                return self.index.touch(self.index.occurrence(key, rid, record.process), record)
            return self._touch(key, record)
        if ids.resolve(rid, self.index.gone) is not None:
            self.stats.orphan_lines += 1
            return None
        return self._orphan(rid, record)

    def _orphan(self, rid: str, record: Record) -> RequestState:
        r = self._upstream(ids.canonical(rid), record)
        r.set("vllm.start_unknown", True)
        if rid != r.request_id:
            r.set("vllm.request.internal_id", rid)
        self.stats.orphan_requests += 1
        return r

    def _concurrent(self, rid: str) -> bool:
        """A request under this id was received and is not yet added: vLLM adds a request right
        after it logs its arrival, so a second arrival now is another request at the same time.
        When the plugin logs every request's end, so is one received and not ended: still in
        flight (a client's retry before its first try ended, on this or another API server)."""
        ends_logged = self.ends_logged
        return any(o.terminal_ns is None and o.extra is not None and o.seen & SEEN_RECEIVED and (
            ends_logged or not o.engine_ids) for o in self.index.group(rid))

    def _open_twin(self, rid: str, record: Record) -> RequestState:
        r = self.index.open_twin(rid, record, (self._queue_offset, self._gpu_offset))
        self.stats.requests_opened += 1
        self._describe(r, rid, record)
        self.stats.reused_concurrent += 1
        return r

    def _retire(self, rid: str) -> None:
        """A new request under an id whose concurrent requests were all added: they are over."""
        for o in self.index.group(rid):
            if o.terminal_ns is None:
                self.close(o, Close.REUSED)
            if o in self.index.twins.get(rid, ()) or self.index.open.get(rid) is o:
                self.close(o, Close.DONE)

    def _again(self, key: str, bit: int) -> None:
        """A start line this request has shown already: the id was reused by a new request
        (occurrence order). The one open under it ends where its lines end."""
        r = self.index.open.get(key)
        if r is not None and r.terminal_ns is None and r.seen & bit:
            self.close(r, Close.REUSED)

    def _on_received(self, record: Record, ev: RequestReceived) -> None:
        rid = ev.request_id
        if rid in self.index.open and self._concurrent(rid):
            self.engine.end_startup()
            r = self._open_twin(rid, record)
        else:
            if self.index.twins and rid in self.index.twins:
                self._retire(rid)
            self._again(rid, SEEN_RECEIVED)
            r = self._upstream(rid, record)
        r.seen |= SEEN_RECEIVED
        for key, value in given(("gen_ai.request.max_tokens", ev.max_tokens),
                                ("gen_ai.request.temperature", ev.temperature), ("gen_ai.request.top_p", ev.top_p),
                                ("gen_ai.request.n", ev.n), ("vllm.lora.name", ev.lora), ("vllm.pd.role", ev.pd_role),
                                ("vllm.pd.remote_engine_id", ev.remote_engine_id),
                                ("vllm.pd.remote_request_id", ev.remote_request_id)).items():
            r.set(key, value)
        if ev.pd_role is not None:
            kv_of(r, ev.pd_role)  # a prefill lingers for its `KV blocks released` line (kvlines.py)

    def _on_details(self, record: Record, ev: RequestDetails) -> None:
        # DEBUG prints it just before `Received request`: it opens the request like that line.
        self._again(ev.request_id, SEEN_DETAILS)
        r = self._upstream(ev.request_id, record)
        r.seen |= SEEN_DETAILS
        r.set("gen_ai.usage.input_tokens", ev.prompt_tokens)

    def _on_added(self, record: Record, ev: RequestAdded) -> None:
        rid = ev.request_id
        if self.index.twins and self._add_twin(rid, record):
            return
        key = ids.resolve(rid, self.index.in_flight)
        if key is not None:
            r = self.index.open[key]
            # vLLM ≥ 0.14 gives every request its own `-<8 hex>` suffix, n>1 children `<i>_` of
            # it: an id added before, or another suffix, is another request under a reused id.
            added = r.engine_ids
            if added and (rid in added or ids.engine_base(rid) not in {ids.engine_base(a) for a in added}):
                self.close(r, Close.REUSED)
                key = None
        self._add(self._upstream(key if key is not None else ids.canonical(rid), record), rid)

    @staticmethod
    def _add(r: RequestState, rid: str) -> None:
        """vLLM added `r` to its engine under `rid` (its first such id is its internal one)."""
        answer = r.answered()
        if not answer.added and rid != r.request_id:
            r.set("vllm.request.internal_id", rid)
        answer.added.add(rid)

    def _add_twin(self, rid: str, record: Record) -> bool:
        """`Added request` under an id received several times at once: the API server that
        writes it is the one that received it (each logs its own `Received` and `Added`), and
        it adds them in the order they arrived, so of those it received the oldest not yet added
        is this one (an n>1 child joins the request its engine id was added as). Two API
        servers' `Added` lines come in any order."""
        key = ids.resolve(rid, self.index.open)
        if key is None or key not in self.index.twins:
            return False
        base = ids.engine_base(rid)
        group = self.index.group(key)
        waiting = [o for o in group if o.terminal_ns is None and not o.engine_ids]
        process = record.process
        r = next((o for o in group if base in {ids.engine_base(a) for a in o.engine_ids}), None) \
            or next((o for o in waiting if o.extra is not None and o.extra.get("vllm.process") == process), None) \
            or next(iter(waiting), None)
        if r is None:
            return False
        self._add(self.index.touch(r, record), rid)
        return True

    @staticmethod
    def _when(record: Record, r: RequestState) -> int:
        """When a line about `r` happened. A header stamp says only its second, and the line was
        written after the request's lines before it: no earlier than the latest of them (a
        plugin line's exact `t=`, say) when that lies within the second. (Only the request's
        own lines: a resume reads all of them again, so the agent and a replay agree.)"""
        ts = record.ts_ns
        if record.clock in COARSE and ts < r.last_ns < ts + _NS:
            return r.last_ns
        return ts

    def _on_finished(self, record: Record, ev: RequestFinished) -> None:
        r = self._resolve(ev.request_id, record)
        if r is not None and r.terminal_ns is None:
            self.end(r, self._when(record, r), End.FINISHED)
            self.engine.alive(record.ts_ns)

    def _on_generated(self, record: Record, ev: ResponseGenerated) -> None:
        r = self._resolve(ev.request_id, record)
        if r is None:
            return
        if ev.output_tokens is not None and r.summary is None:
            # One line per choice of a whole response (serving.py logs each choice's token ids):
            # their counts add up, as the response's `usage.completion_tokens` does over n. But
            # serving.py logs a choice only `if output_text:`: a choice with no text has no line,
            # and fewer than n lines are a lower bound, not the output, so nothing is set until
            # all n are in. (A plugin summary counted them already, from vLLM's own stats.)
            tokens = r.answered().tokens
            tokens.append(ev.output_tokens)
            if len(tokens) >= ((r.extra or {}).get("gen_ai.request.n") or 1):
                r.set("gen_ai.usage.output_tokens", sum(tokens))
        if ev.finish_reason is None and ev.streaming != "complete":
            return
        if ev.streaming == "complete":
            r.answered().closed += 1
        # One line per choice (n>1 logs each choice's reason): one reason per choice, as the
        # GenAI convention has it, and the last choice's line ends the request.
        extra = r.extra or {}
        n = extra.get("gen_ai.request.n") or 1
        reasons = extra.get("gen_ai.response.finish_reasons", [])
        if ev.finish_reason is not None and len(reasons) < n:
            reasons = [*reasons, ev.finish_reason]
            r.set("gen_ai.response.finish_reasons", reasons)
        if r.terminal_ns is None:
            ts = self._when(record, r)
            if ev.finish_reason != "abort" and len(reasons) < n and r.streams_closed < n:
                pass  # one choice of n>1 is done (a stream's last delta); the others go on
            elif ev.finish_reason == "abort" and self.engine.stop_ns is not None:
                self.end(r, ts, End.STOPPED)  # aborted by the stop (vLLM's abort mode)
            elif ev.finish_reason == "abort":
                # aborted by the engine with no line of its own (`POST /pause`, core.py): the
                # client got a cut answer whose reason says so
                self.end(r, ts, End.ABORTED, message=f"Request {ev.request_id} aborted (finish_reason: abort)")
            else:
                self.end(r, ts, End.FINISHED)
                self.engine.alive(record.ts_ns)
        elif r.outcome == "finished" and r.error_type is None and record.ts_ns > r.terminal_ns and r.summary is None:
            # (a summary's end is vLLM's own e2e end, and its arrival counts back from it)
            r.terminal_ns = record.ts_ns
        elif r.summary is not None and ev.streaming != "delta" and r.held <= 0 and self.index.open.get(r.request_id) is r \
                and (r.streams_closed >= (extra.get("gen_ai.request.n") or 1) if ev.streaming == "complete"
                     else not self._awaits_api(r)):
            # the plugin's summary, then a reason for every choice, or a stream's closing lines,
            # one per choice (serving_chat.py logs one for each): nothing more to come
            self.close(r, Close.DONE)
        elif r in self._signal_ends and ev.streaming != "complete" and ev.finish_reason not in (None, "abort"):
            # a choice's own reason, not `(streaming complete)`: vLLM logs that after an abort too
            self._served(r, record.ts_ns)

    def _served(self, r: RequestState, ts: int) -> None:
        """A request the engine's death or the stop had ended shows its answer finished after
        all: the engine had made it, and a loaded API server wrote it out after the death's
        lines (a choice's reason other than `abort` is logged only for a whole answer).
        It was served: finished here, its failure taken back; it stays linked to the incident."""
        end = self._signal_ends.pop(r)
        self.end(r, ts, End.FINISHED)  # its failure taken back with it (`end`)
        if r.events:
            r.events = [e for e in r.events if e is not end]
        if r.extra is not None:
            r.extra.pop("vllm.end_inferred", None)
        inc = self.engine.incident
        if inc is not None and r in inc.failed:
            inc.failed.remove(r)

    def _on_aborted(self, record: Record, ev: RequestsAborted) -> None:
        for rid in ev.request_ids:
            r = self._resolve(rid, record)
            if r is not None and r.terminal_ns is None:
                if self.engine.stop_ns is not None:  # aborted by the stop (vLLM's abort mode, or cancelled)
                    self.end(r, self._when(record, r), End.STOPPED)
                else:
                    self.end(r, self._when(record, r), End.ABORTED, message=f"Request {rid} aborted")

    def _on_waiting(self, record: Record, ev: RequestWaiting) -> None:
        """The scheduler holds the request (a decode waiting for remote KV): it is in this engine,
        opened here if its start was not seen, no phase boundary."""
        self._resolve(ev.request_id, record)

    def _on_failed(self, record: Record, ev: RequestFailed) -> None:
        # V0's "Failing the request" may be its only line: `_resolve` opens it then.
        r = self._resolve(ev.request_id, record)
        if r is None or r.terminal_ns is not None:
            return
        ts = self._when(record, r)
        if ev.error_type == "engine_dead" and self.engine.death is None and self.engine.stop_ns is None:
            # vLLM fails a request `(engine dead)` only once its engine is dead (async_llm: the
            # output handler's EngineDeadError): the death itself, where no line of it came first
            # (a log begun late, an excerpt). Its incident opens here; error lines of it that follow
            # join it and may name the cause. It ends this request and all in flight.
            self.engine.on_engine_error(record, EngineError(
                "engine_dead", "EngineDeadError", f"Request {ev.request_id} failed ({ev.reason})", True, ""))
            if r.terminal_ns is not None:
                return
        if ev.error_type == "engine_dead" and self.engine.death is None and self.engine.stop_ns is not None:
            self.end(r, ts, End.STOPPED)  # vLLM fails what is in flight with EngineDeadError on a stop
        elif ev.error_type == "engine_dead" and self.engine.death is not None:
            self.end(r, ts, End.ENGINE_DIED, self.engine.death, exception="RequestFailed")
        else:
            self.end(r, ts, End.FAILED, ev.error_type, self._request_text(ev.reason))

    def _on_sequence_preempted(self, record: Record, ev: SequencePreempted) -> None:
        r = self._resolve(ev.request_id, record)
        if r is None:
            return
        r.sampled_preemptions += 1
        r.add_event(SpanEvent("vllm.preempted", record.ts_ns, {
            "vllm.preemption.mode": ev.mode, "vllm.preemption.cumulative": ev.cumulative}), True)
