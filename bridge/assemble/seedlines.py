"""The lines of one request the engine core and the vLLM plugin write: its scheduling, its
preemptions, its KV blocks allocated and freed, its summary or how it ended, its timeout, a
failed allocation. A mixin of `Assembler` (requests.py), whose index, `end` and `close` it uses.

Ids repeat (the seed's ids are object addresses, reused once freed): a line that starts a
request (scheduling, preemption, allocation, summary) for an id whose request is already over
begins a new occurrence, and the old one is emitted first. An n>1 request's children
(`<i>_<id>`) are one request: the client's.
"""

from __future__ import annotations

from dataclasses import replace

from bridge.assemble import ids
from bridge.assemble.ending import Close, End
from bridge.assemble.engine import dp_engine
from bridge.assemble.kvlines import awaits_release
from bridge.assemble.state import RequestState
from bridge.assemble.timeline import SpanEvent
from bridge.decode.record import CLOCK_EXACT, Record
from bridge.parse.events import (
    AllocationFailed,
    BlockAllocated,
    BlockFreed,
    Preempted,
    RequestEnded,
    RequestSummary,
    RequestTimedOut,
    Scheduled,
)

_NS = 1_000_000_000
#: Free reasons that mean the request is over (not a preemption): blocks released at its end.
_RELEASE_REASONS = frozenset({"completed", "finished", "aborted"})


def _exact(record: Record, ev) -> Record:
    """The record, timed by the event's own exact time when its line states one (the vLLM
    plugin's `t=`): better than any header or runtime stamp, which only say when the line was
    written or read. The assembler's clock (`_now`, sweeps) stays on the records' stamps."""
    at = ev.at_ns
    return record if at is None else replace(record, ts_ns=at, clock=CLOCK_EXACT)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else (a if b is None else min(a, b))


def _combined(rid: str, seqs: dict) -> tuple[RequestSummary, int]:
    """One summary for an n>1 request from its children's (each `(end ns, summary)`), as the
    client's response counts them: the prompt once, the generated tokens of all n (its
    `usage.completion_tokens`); arrival the children's (vLLM copies the parent's to each), first
    token the first of any child's, end the last child's. ITL: the mean gap over all of them."""
    done = [v for v in seqs.values() if v is not None and v[1] is not None]  # (an ended child has no summary)
    arrival = min(end - round(s.e2e_s * _NS) for end, s in done)
    first = min(end - round(s.e2e_s * _NS) + round(s.ttft_s * _NS) for end, s in done)
    end = max(e for e, _ in done)
    gaps = sum(max(0, s.generated_tokens - 1) for _, s in done)
    itl = sum(s.itl_s * max(0, s.generated_tokens - 1) for _, s in done) / gaps if gaps else 0.0
    summary = RequestSummary(rid, max(s.prompt_tokens for _, s in done), sum(s.generated_tokens for _, s in done),
                             (first - arrival) / _NS, itl, (end - arrival) / _NS, end)
    return summary, end


def _rank(process: str) -> int | None:
    """The data-parallel engine a process prefix names (`engine.dp_engine`, the one rule an
    incident's rank comes from too), as a rank, else None."""
    engine = dp_engine(process)
    return int(engine) if engine else None


def _dp_rank(r: RequestState, process: str) -> None:
    """`vllm.dp.rank` from the engine core that scheduled the request (`EngineCore_DP<n> pid=…`):
    with data parallel only the engine core's own lines say which engine served it (the API
    server's output processor keeps no engine index). The first schedule's engine wins."""
    if r.extra is not None and "vllm.dp.rank" in r.extra:
        return
    rank = _rank(process)
    if rank is not None:
        r.set("vllm.dp.rank", rank)


class SeedLines:
    """Handlers of the engine core's and the plugin's per-request lines."""

    def _seed_id(self, rid: str) -> str:
        """A seed line's id, or the upstream request in flight it names (`<id>-<8 hex>` is V1's
        engine-side spelling of `<id>`): the vLLM plugin's lines join vLLM's own. An n>1 child
        (`<i>_<id>`) is its parent's: one client request, one root, whatever else is open."""
        if rid in self.index.open or not ids.respelled(rid):
            return rid
        key = ids.resolve(rid, self.index.open) if self.index.open else None
        if key is None and ids.child_index(rid) is not None:
            return ids.engine_base(rid)
        return key or rid

    def _named(self, rid: str, internal: str | None) -> RequestState | None:
        """The request open under `rid` whose engine id a plugin line states (`internal_id=`):
        the one vLLM added under it (`Added request <engine id>`), else, the id being none of
        theirs, the one twin not added yet (an engine core's line can come before its API
        server's `Added`, written after the hand-off). None when the line states none, or that
        does not settle it (ids kept as given are alike)."""
        if internal is None:
            return None
        base = ids.engine_base(internal)
        group = self.index.group(rid)
        named = [o for o in group if o.engine_ids and (
            internal in o.engine_ids or base in {ids.engine_base(a) for a in o.engine_ids})]
        if not named:
            named = [o for o in group if not o.engine_ids and o.terminal_ns is None]
        return named[0] if len(named) == 1 else None

    def _twin(self, rid: str, record: Record, stage: int = 0, internal: str | None = None) -> RequestState:
        """Which of the requests in flight at once under `rid` a plugin line is about: the one
        added under the engine id the line states (`internal`, the plugin's `internal_id=`).
        A line that states none (an older plugin; ids kept as given) is placed by a rule:
        an engine core's first `Scheduling` (`stage` 1): the
        oldest not yet scheduled (the engines take them in the order added); its `Freed` (2):
        the oldest that engine core scheduled and did not free yet; the API server's end (3): the
        one twin the line's API server received, else of those it received the first freed (the
        engine frees a finished request's blocks before the API server logs its end). Else the one this line's API
        server received, or the oldest (`index.occurrence`)."""
        pick = self._named(rid, internal)
        if pick is not None:
            return self.index.touch(pick, record)
        group = [o for o in self.index.group(rid) if o.terminal_ns is None]
        if stage == 1:
            pick = next((o for o in group if o.schedules is None), None)
        elif stage == 2:
            rank = _rank(record.process)
            free = [o for o in group if o.schedules is not None and o.last_free_ns is None]
            pick = next((o for o in free if o.extra is not None and o.extra.get("vllm.dp.rank") == rank), None) \
                or next(iter(free), None)
        elif stage == 3:
            mine = [o for o in group if o.extra is not None and o.extra.get("vllm.process") == record.process]
            if len(mine) == 1:  # each API server logs its own requests' ends: no guess needed
                pick = mine[0]
            else:
                done = [o for o in (mine or group) if o.last_free_ns is not None]
                pick = min(done, key=lambda o: o.last_free_ns, default=None)
        if pick is None:
            pick = self.index.occurrence(rid, rid, record.process)
        return self.index.touch(pick, record)

    def _start_seq(self, rid: str, record: Record, stage: int = 0,
                   internal: str | None = None) -> tuple[RequestState, int | None]:
        """`_start` for a plugin line, and which n>1 child of its request it names (or None).
        A child the request had not shown yet, after its siblings' summaries ended it (how many
        there are was never logged), continues it: siblings are not a reused id. `internal`:
        the engine id the line states, which tells twins apart (`_twin`)."""
        if self.index.twins and rid in self.index.twins:
            return self._twin(rid, record, stage, internal), None
        r = self.index.open.get(rid)
        if r is not None and r.terminal_ns is None:  # the commonest line: one of an open request's
            if record.ts_ns > r.last_ns:  # index.touch, inlined on the hot path
                r.last_ns = record.ts_ns
            r.last_offset = record.offset
            return r, None
        key = self._seed_id(rid)
        k = ids.child_index(rid) if key != rid else None
        if k is not None:
            r = self.index.open.get(key)
            if r is not None and r.terminal_ns is not None and r.outcome == "finished" and r.seqs is not None \
                    and k not in r.seqs and self.index.open.get(r.request_id) is r:
                r.terminal_ns, r.outcome, r.summary = None, "incomplete", None
                self.index.in_flight[key] = r
        r = self._start(key, record)
        if k is not None:
            if r.seqs is None:
                r.seqs = {}
            r.seqs.setdefault(k, None)
        return r, k

    def _on_scheduled(self, record: Record, ev: Scheduled) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r, k = self._start_seq(ev.request_id, record, 1, ev.internal_id)
        ts = record.ts_ns
        if r.schedules is None:
            r.schedules = []
            r.queue_at_schedule = self._queue
            r.gpu_at_schedule = self._gpu
        r.schedules.append((ts, ev))
        process = record.process
        if process.startswith("EngineCore_DP"):
            _dp_rank(r, process)
        p = self._open_preemption(r, ev.request_id)
        if p is not None:
            p[1] = ts  # rescheduled: the preemption is over

    @staticmethod
    def _open_preemption(r: RequestState, rid: str) -> list | None:
        """The preemption not yet over of the sequence `rid` names: the request's last one, or,
        with n>1 children (each preempted and rescheduled on its own), that child's."""
        if not r.preemptions:
            return None
        if r.seqs is None:
            last = r.preemptions[-1]
            return last if last[1] is None else None
        for p in reversed(r.preemptions):
            if p[1] is None and p[2].request_id == rid:
                return p
        return None

    def _on_preempted(self, record: Record, ev: Preempted) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r, k = self._start_seq(ev.request_id, record, 0, ev.internal_id)
        if r.preemptions is None:
            r.preemptions = []
        if self._open_preemption(r, ev.request_id) is not None:
            return  # preempted again before being rescheduled: still the same preemption
        r.preemptions.append([record.ts_ns, None, ev])

    def _on_allocated(self, record: Record, ev: BlockAllocated) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r = self.index.open.get(ev.request_id)
        if r is None or r.terminal_ns is not None:
            r = self._start_seq(ev.request_id, record)[0]
        else:  # a third of all lines: `_start_seq`'s first case, inlined (index.touch)
            if record.ts_ns > r.last_ns:
                r.last_ns = record.ts_ns
            r.last_offset = record.offset
        r.allocated += 1
        r.held += 1
        r.add_block_event(SpanEvent("vllm.kv_block.allocated", record.ts_ns, {
            "vllm.kv_block.id": ev.block, "vllm.kv_block.size_bytes": ev.size_bytes}))

    def _on_freed(self, record: Record, ev: BlockFreed) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        rid, ts, n, reason = ev.request_id, record.ts_ns, ev.count, ev.reason  # (read once: a third of all lines)
        r = self.index.open.get(rid)
        if self.index.twins and rid in self.index.twins:
            r = self._twin(rid, record, 2, ev.internal_id)
        elif r is None:
            r = self._touch(self._seed_id(rid), record)
            if r is None:
                return
        else:
            if ts > r.last_ns:  # index.touch, inlined on the hot path
                r.last_ns = ts
            r.last_offset = record.offset
        r.freed += n
        r.held -= n
        attrs = {"vllm.kv_block.id": ev.block} if ev.block else {"vllm.kv_block.count": n}
        if reason:
            attrs["vllm.kv_block.reason"] = reason
        r.add_block_event(SpanEvent("vllm.kv_block.freed", ts, attrs))
        if r.terminal_ns is not None:
            r.last_free_ns = ts
            if r.held <= 0 and r.outcome != "timeout" and not self._awaits_api(r):  # a timeout may still get its API line
                self.close(r, Close.DONE)
        elif reason in _RELEASE_REASONS:
            if r.seqs is not None and self._seqs_left(r, ids.child_index(rid)):
                return  # one child of n>1 released; the request goes on with the others
            # Released before the line that ends the request: V1's engine frees a finished
            # request's blocks at once, and the API server logs its end after the hand-off.
            if r.release_ns is None:
                r.release_ns = ts
            r.last_free_ns = ts

    def _on_summary(self, record: Record, ev: RequestSummary) -> None:
        if ev.at_ns is not None:
            record = _exact(record, ev)
        r, k = self._start_seq(ev.request_id, record, 3, ev.times.internal_id if ev.times is not None else None)
        self.ends_logged = True
        end = record.ts_ns
        if ev.times is not None:
            self._plugin_times(r, ev.request_id, ev.times)
        if k is not None:
            r.seqs[k] = (end, ev)
            if self._seqs_left(r):
                return  # its siblings are still running: the client's request is not over
            r.summary, end = _combined(r.request_id, r.seqs)
        else:
            r.summary = ev
        self.end(r, end, End.FINISHED)
        self.engine.alive(record.ts_ns)
        if r.held <= 0 and not self._awaits_api(r):
            self.close(r, Close.DONE)

    @staticmethod
    def _awaits_api(r: RequestState) -> bool:
        """The plugin's summary ended a chat vLLM's API server logs (`Received request`): it is
        written as the output processor finishes the request (`_update_stats_from_finished`),
        before the serving code logs the response (`Generated response … finish_reason: …`,
        chat and Responses API only: completions log no output). It lingers for those lines
        (`linger_s`), which name its finish reasons, until it has one per choice."""
        if r.kv is not None and awaits_release(r):
            return True  # a disaggregated prefill: its blocks are held for the decode (kvlines.py)
        extra = r.extra
        if r.summary is None or extra is None or extra.get("gen_ai.operation.name") != "chat":
            return False
        return len(extra.get("gen_ai.response.finish_reasons", ())) < (extra.get("gen_ai.request.n") or 1)

    @staticmethod
    def _seqs_left(r: RequestState, ending: int | None = None) -> bool:
        """Whether children of an n>1 request other than `ending` have not finished: vLLM's
        `ParentRequest` answers the client once every one of its n children has. n is the
        logged `SamplingParams(n=…)`, else the children `Added request` or the plugin named."""
        n = (r.extra or {}).get("gen_ai.request.n") or (r.times.n if r.times is not None else None) or 0
        if not n:
            n = sum(1 for a in r.engine_ids if ids.child_index(a) is not None)
        seqs = r.seqs
        done = sum(1 for i, v in seqs.items() if v is not None or i == ending)
        return done < max(n, len(seqs))

    def _on_ended(self, record: Record, ev: RequestEnded) -> None:
        """The plugin's line for a request that did not complete: aborted (the client went, or
        vLLM aborted it) or failed, with the phases vLLM stamped before."""
        record = _exact(record, ev)
        rid = self._seed_id(ev.request_id)
        internal = ev.times.internal_id if ev.times is not None else None
        r = self._named(rid, internal) if self.index.twins and rid in self.index.twins else None
        if r is None:
            r = self.index.open.get(rid)
        k = ids.child_index(ev.request_id) if rid != ev.request_id else None
        if r is not None and r.terminal_ns is not None:  # vLLM's own line (or a sibling's) ended it first
            # Still a line of the request: its last offset is what a resumed agent skips up to
            # once the request is delivered (else a sibling's line read again opens a new root).
            self.index.touch(r, record)
            if ev.times is not None and r.times is None:
                self._plugin_times(r, ev.request_id, ev.times)
            if k is None:  # its counts, unless a line gave them (a KV load failure ends it first)
                for key, value in (("gen_ai.usage.input_tokens", ev.prompt_tokens),
                                   ("gen_ai.usage.output_tokens", ev.generated_tokens), ("vllm.e2e_s", ev.e2e_s)):
                    if r.extra is None or key not in r.extra:
                        r.set(key, value)
            if k is not None and r.seqs is not None:  # n>1: this child is over too
                r.seqs[k] = (record.ts_ns, None)
                if r.held <= 0 and not self._seqs_left(r) and self.index.open.get(r.request_id) is r:
                    self.close(r, Close.DONE)
            return
        r, k = self._start_seq(ev.request_id, record, 0, internal)  # a child of n>1 ends its parent: vLLM aborts all
        if k is not None:
            r.seqs[k] = (record.ts_ns, None)
        if ev.times is not None:
            self._plugin_times(r, ev.request_id, ev.times)
        r.set("gen_ai.usage.input_tokens", ev.prompt_tokens)
        r.set("gen_ai.usage.output_tokens", ev.generated_tokens)
        r.set("vllm.e2e_s", ev.e2e_s)
        if ev.finish == "abort":
            self.end(r, record.ts_ns, End.ABORTED, message=f"Request {ev.request_id} aborted")
        else:
            self.end(r, record.ts_ns, End.FAILED, ev.finish, f"Request {ev.request_id} ended: {ev.finish}")
        if r.held <= 0 and not (k is not None and self._seqs_left(r)):  # n>1: its siblings' lines come too
            self.close(r, Close.DONE)

    @staticmethod
    def _plugin_times(r: RequestState, rid: str, times) -> None:
        """vLLM's own stamps from the plugin's end line: the first scheduling and the
        preemptions, unless the engine core's lines gave them already (same stamps, with block
        counts); the first and last token go to the build."""
        if r.times is not None:  # another child of an n>1 request: one phase set for the client's request
            old = r.times
            times = replace(times, arrival_ns=_least(old.arrival_ns, times.arrival_ns),
                            queued_ns=_least(old.queued_ns, times.queued_ns),
                            scheduled_ns=_least(old.scheduled_ns, times.scheduled_ns),
                            first_token_ns=_least(old.first_token_ns, times.first_token_ns),
                            last_token_ns=max((t for t in (old.last_token_ns, times.last_token_ns) if t is not None),
                                              default=None),
                            preempted=old.preempted + times.preempted,
                            caller=old.caller or times.caller, tracestate=old.tracestate or times.tracestate)
        r.times = times
        if times.scheduled_ns is not None and not r.schedules:
            queued = (times.scheduled_ns - times.queued_ns) / 1e9 if times.queued_ns is not None else None
            r.schedules = [(times.scheduled_ns, Scheduled(rid, 0, None, None, queued, times.scheduled_ns))]
        if times.preempted and not r.preemptions:
            r.preemptions = [[start, end, Preempted(rid, "", None, start)] for start, end in times.preempted]

    def _on_timeout(self, record: Record, ev: RequestTimedOut) -> None:
        r = self.index.open.get(ev.request_id)
        if r is not None and r.outcome == "timeout":  # the second of the two timeout lines
            self._touch(ev.request_id, record)
            if ev.after_s is not None:
                r.timeout_after_s = ev.after_s
            return
        r = self._start(ev.request_id, record)
        r.timeout_after_s = ev.after_s
        self.end(r, record.ts_ns, End.TIMEOUT, message=self._text(ev.message))

    def _on_alloc_failed(self, record: Record, ev: AllocationFailed) -> None:
        r = self._start(ev.request_id, record)
        message = ev.message
        oom = self.engine.last_oom
        if oom is not None and record.ts_ns - oom[0] <= self._config.oom_window_s * _NS:
            message = f"{message}: {oom[1].message}"
        self.end(r, record.ts_ns, End.FAILED, "oom", self._text(message), "OutOfMemoryError")
