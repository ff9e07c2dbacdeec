"""`run`: the long-lived node agent. Follows files, assembles, exports, checkpoints.

The log file is the buffer (DESIGN.md §5). Each file's checkpoint only moves past lines whose
spans the receiver acknowledged, or that belong to no request. Requests that were delivered
while an older request held the checkpoint back are remembered in the checkpoint
(`Delivered`): on resume their lines are skipped, so each request is exported once, and a
span re-sent after a crash (acked, not yet checkpointed) carries the same deterministic ids.

One thread reads and assembles; a second sends (export.sender); a third serves telemetry:
what the agent shows of itself is `bridge.health`, read from its parts.
"""

from __future__ import annotations

import fnmatch
import operator
import os
import signal
import threading
import time

from bridge.assemble import AssembleConfig, Assembler, RequestTimeline, Thresholds, Timeline
from bridge.parse.context import TraceContext, make_rule
from bridge.assemble.join import ContextJoin, upstream_id
from bridge.assemble.clock import jumped as clock_jumped
from bridge.config import AgentConfig
from bridge.decode import Decoder
from bridge.delivery import Delivery
from bridge.detect import Detector
from bridge.decode.clock import zone
from bridge.decode.stream import RecordStream
from bridge.core.source import Source
from bridge.tail.source import file_of, same_writer
from bridge.export.transforms import with_k8s_identity
from bridge.export.resource import base_resource
from bridge.export.secrets import redact_url
from bridge.export.transport import Destination, make_transport
from bridge.health import AgentCounters, Health
from bridge.logs import ExportProgress
from bridge.parse import Parser
from bridge.parse.gateway import GatewayParser, gateway_format
from bridge.parse.rules import load_rules
from bridge.pipeline import LineErrors, Stages, drive
from bridge.resume import Checkpointer, file_checkpoint
from bridge.skip import key as delivery_key, sent_before, unsent
from bridge.sources import Pending, SourceState
from bridge.tail.checkpoint import Delivered
from bridge.core.position import IN_FILE as _MASK
from bridge.tail.follow import Filters, Follower, TrackedFile, matches_rotated_files
from bridge.tail.report import log_changes, warn_if_nothing

_NS = 1_000_000_000
_CHECKPOINT_EVERY_S = 1.0
_TICK_S = 0.25
_JOIN_IDLE_S = 0.25  # a held traceback or error line is released after this long with no new line


class Agent:
    def __init__(self, cfg: AgentConfig, dest: Destination, env, log, stages: Stages = Stages()) -> None:
        """`stages`: the hooks every batch reaches decode, parse and assemble through (the
        fault-injection tests wrap them: `bridge.faults`)."""
        self.cfg = cfg
        self.log = log
        self._dest = dest
        self._env = env
        self._stop = threading.Event()
        self._parser = Parser(rules=load_rules(cfg.rules) if cfg.rules else None)  # checked by config.load
        self._sources: dict[str, SourceState] = {}
        self._checkpointer = Checkpointer(cfg.state_dir, log)
        self.counters = AgentCounters()
        self._dirty = True
        self._memory_paused = False
        self._line_error = LineErrors(self.counters.line_errors, log)
        self._stages = stages
        self._assemble_cfg = AssembleConfig(thresholds=Thresholds(cfg.slow_ttft_ms / 1000, cfg.slow_itl_ms / 1000,
                                                                  cfg.low_free_blocks_pct / 100,
                                                                  cfg.high_gpu_memory_pct / 100),
                                            ttl_s=cfg.ttl, linger_s=cfg.linger, kv_hold_s=cfg.kv_hold,
                                            context_rule=make_rule(cfg.trace_context),
                                            client_context=cfg.client_trace_context,
                                            export_error_text=cfg.export_error_text)
        self._tz = zone(cfg.timezone)
        self._k8s_on_spans = cfg.k8s_attributes_on_spans
        self.telemetry_port: int | None = None
        self._followed_last = 0
        self._progress = ExportProgress(log, cfg.progress_interval, time.monotonic)
        self._join: ContextJoin | None = ContextJoin(cfg.join_window) if cfg.gateway_include else None
        self._gateway_parser = GatewayParser(gateway_format(
            cfg.gateway_format, cfg.gateway_request_id_field, cfg.gateway_traceparent_field))

    # -- lifecycle -----------------------------------------------------------------------

    def stop(self, *_args) -> None:
        self._stop.set()

    def run(self) -> int:
        from bridge.telemetry import TelemetryServer

        os.makedirs(self.cfg.state_dir, exist_ok=True)
        cfg = self.cfg
        loaded = self._checkpointer.load(cfg.start_at)
        first_run = loaded.files is None
        files, sources = loaded.files or [], loaded.sources
        self._detector = None if cfg.detect == "off" else Detector(
            cfg.detect_bytes, cfg.gateway_include, cfg.include, cfg.containers,
            load_rules(cfg.rules) if cfg.rules else None, self._tz)
        self._follower = Follower(
            Filters(cfg.include + cfg.gateway_include, cfg.exclude, cfg.namespaces, cfg.pods, cfg.containers,
                    cfg.gateway_include),
            start_at_end=cfg.start_at == "end" and first_run, read_chunk=cfg.read_chunk_bytes,
            admit=self._detector,
            history=(cfg.history_bytes, cfg.history_age) if first_run and cfg.start_at == "beginning" else None)
        for s in sources:
            st = self._state(s.key, None)
            st.skip = {d.key: d.last_offset for d in s.delivered}
            st.delivered = list(s.delivered)
            st.facts = loaded.facts.get(s.key, {})
        self._follower.restore(files, {s.key: s.next_generation for s in sources}, loaded.written_at,
                               loaded.heads, loaded.listings)

        self._delivery = Delivery(base_resource(self._env), make_transport(self._dest), cfg, self.log,
                                  self._stop.is_set)
        self.health = Health(self.counters, self._parser, self._sources, self._follower, self._delivery,
                             self._checkpointer, redact_url(self._dest.endpoint), self._join, self._gateway_parser,
                             self._detector)
        self.health.stall_timeout = cfg.stall_timeout
        telemetry = TelemetryServer(cfg.listen, self.health.snapshot, self.health.readiness, self.health.liveness,
                                    self.health.degraded)
        telemetry.start()
        self.telemetry_port = telemetry.port
        for glob_ in cfg.include:
            if matches_rotated_files(glob_):
                self.log.warning("include_matches_rotated_files", include=glob_,
                                 note="rotated files (0.log.<stamp>, .gz, .1) would be followed as files of their own "
                                      "too, and their requests sent again as new traces",
                                 fix="end the glob with the live file's name, e.g. /var/log/pods/*/*/*.log")
        self.log.info("agent_started", include=list(cfg.include), state_dir=cfg.state_dir,
                      endpoint=redact_url(self._dest.endpoint), protocol=self._dest.protocol, telemetry_port=telemetry.port,
                      resumed_files=len(files))
        try:
            self._loop(first_run)
        finally:
            self._shutdown()
            telemetry.stop()
        return 0

    def _loop(self, first_run: bool) -> None:
        cfg = self.cfg
        next_discovery = 0.0
        next_checkpoint = time.monotonic() + _CHECKPOINT_EVERY_S
        next_tick = 0.0
        first_round = True
        last_lines = 0.0
        while not self._stop.is_set():
            now = self.health.turned_at = time.monotonic()
            if now >= next_discovery:
                self._follower.discover(first_round=first_round and first_run)
                if first_round and first_run:
                    # Saved at once, before a line is read and before the look is reported: from
                    # the first look on, a restart resumes (files that appear or rotate later are
                    # caught up) rather than being a first run, which leaves the rotated files it
                    # finds unread as history.
                    self._dirty = not self._checkpoint()
                    next_checkpoint = now + _CHECKPOINT_EVERY_S
                self._report_discovery(first_round)
                first_round = False
                next_discovery = now + cfg.poll_interval
                self.health.ready = True
            got = 0
            self._memory_paused = self._over_memory()
            if not self._memory_paused:
                for tf, lines in self._follower.poll():
                    got += len(lines)
                    self._process(tf, lines)
                for tf in self._follower.just_retired:
                    self._retire(tf)
                for ck in self._follower.just_truncated:
                    self._state(ck.source_key, None).retired.append(ck)
            if now >= next_tick:
                self._tick()
                self._progress(self.health.progress_counts)
                next_tick = now + _TICK_S
            self._delivery.send_due(cfg.batch_delay)
            if got or self._follower.just_retired or self._follower.just_truncated:
                self._dirty = True
            # Right after an ack (keeps what a crash would re-send small), else once a second
            # if anything moved; an idle agent writes nothing.
            if (self._drain_acks() and not self._checkpointer.failing) or (now >= next_checkpoint and self._dirty):
                self._dirty = not self._checkpoint()  # a failed save is tried again in a second
                next_checkpoint = now + _CHECKPOINT_EVERY_S
            elif now >= next_checkpoint:
                self._checkpointer.still_current()
                next_checkpoint = now + _CHECKPOINT_EVERY_S
            if got:
                last_lines = now
            else:
                # Busy files are looked at every batch_delay; after a quiet second, every
                # poll_interval (what an idle node pays for each watched file).
                busy = now - last_lines < 1.0 or not self._delivery.empty
                self._stop.wait(min(cfg.poll_interval, cfg.batch_delay) if busy else cfg.poll_interval)

    def _report_discovery(self, first_round: bool) -> None:
        """What is followed and skipped, logged at start and on each change (bridge.tail.report)."""
        changes = self._follower.take_changes()
        if self._detector is not None:
            for found in self._detector.take_found():
                self.log.info("vllm_detected", path=found.path, evidence=found.evidence, line=found.line)
        log_changes(self.log, changes)
        followed = len(self._follower.files)
        if first_round or (changes and followed != self._followed_last):
            if not followed:
                warn_if_nothing(self.log, followed, self.cfg.include, self._follower.skipped_by_kind())
            elif first_round or not self._followed_last:
                history = {"history_skipped_bytes": self._follower.stats.history_skipped} \
                    if first_round and self._follower.stats.history_skipped else {}
                self.log.info("following", files=followed, skipped=len(self._follower.skipped), **history)
        self._followed_last = followed

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.cfg.shutdown_grace - 1.0
        if self._join is not None:  # nothing more will come: send the waiting with what they have
            for t, token in self._join.drain():
                self._batch(t, token)
        drained = self._delivery.close(deadline)
        self._drain_acks()
        self._checkpoint()
        self._follower.close()
        counts = self.health.progress_counts()
        extra = {"note": "requests still open are not exported by this run; the checkpoint stays before them, so "
                         "the next start sends them"} if counts["requests_open"] else {}
        self.log.info("agent_stopped", all_sent=drained, spans_sent=self._delivery.stats.spans_sent,
                      requests_finished=counts["requests_finished"], requests_open=counts["requests_open"], **extra)

    def _over_memory(self) -> bool:
        try:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return False
        if rss > self.cfg.memory_limit_mb * 1024 * 1024:
            if self.counters.memory_pauses == 0:
                self.log.warning("memory_limit_reached", rss_mb=rss >> 20, limit_mb=self.cfg.memory_limit_mb,
                                 fix="raise memory_limit_mb or lower max_queue_spans / ttl")
            self.counters.memory_pauses += 1
            time.sleep(0.05)
            return True
        return False

    # -- the pipeline --------------------------------------------------------------------

    def _state(self, key: str, source: Source | None) -> SourceState:
        st = self._sources.get(key)
        if st is None:
            st = self._sources[key] = SourceState(source or Source(key, ""))
        if st.assembler is None and source is not None and not st.gateway:
            st.source = source
            if self._join is not None and any(fnmatch.fnmatch(source.path, p) for p in self.cfg.gateway_include):
                st.gateway = True
            else:
                st.assembler = Assembler(source, lambda t, st=st: self._emit(st, t), self._assemble_cfg)
                if st.facts:  # what the banner before the resume position said
                    st.assembler.resume_facts(st.facts)
        return st

    def _process(self, tf: TrackedFile, lines: list[tuple[int, bytes]]) -> None:
        st = self._state(tf.source.key, tf.source)
        if st.assembler is not None:  # its timelines name this file (a copytruncate renumbers it)
            st.assembler.add_file(tf.generation, tf.source if tf.path == tf.source.path else file_of(tf.source, tf.path))
        key = id(tf)
        stream = st.streams.get(key)
        if stream is None:
            try:
                mtime = os.fstat(tf.fh.fileno()).st_mtime
            except (OSError, ValueError, AttributeError):  # AttributeError: parked (no descriptor)
                mtime = None
            stream = st.streams[key] = RecordStream(Decoder(tz=self._tz, year=self.cfg.year, mtime=mtime),
                                                    lead=not st.gateway)  # (the join reads its own time)
            st.files[key] = tf
            self._go_on(st, tf, stream)
        if len(st.streams) > 1:
            self._finish_older(st, tf)
        st.quiet_since[key] = time.monotonic()
        self.counters.lines_read += len(lines)
        jumps = st.assembler.stats.clock_jumps if st.assembler is not None else 0
        it = self._stages.lines(lines)
        record = self._drive(st, tf.path, lambda: stream.each(it),
                             lambda: lines[len(lines) - operator.length_hint(it) - 1][0])
        # (the log's clock follows a jump back too: the wall clock extends the new time, not the old)
        if record is not None and (record.ts_ns > st.last_ts or clock_jumped(st.last_ts, record.ts_ns)):
            st.last_ts, st.last_wall = record.ts_ns, time.time_ns()
        if st.assembler is not None and st.assembler.stats.clock_jumps > jumps:
            self.log.warning("clock_jump", file=tf.path, jumps=st.assembler.stats.clock_jumps - jumps,
                             note="the log's clock stepped a year or more ahead or a day or more back between lines; "
                                  "no request is split by it (vllm.clock_jump events, clock_jumps_total)")
        if st.assembler is not None and st.assembler.open_requests > self.cfg.max_open_requests:
            try:
                st.assembler.evict_oldest(self.cfg.max_open_requests)
            except Exception as exc:
                self._line_error("assemble", tf.path, None, exc)

    def _go_on(self, st: SourceState, tf: TrackedFile, stream: RecordStream) -> None:
        """Before a file's first line: the partial lines an older file of the same writer ended
        in (a kubelet rotation between a `P` part and its `F` end) go on in this file's decoder,
        as `replay` reads them; their `F` ends are here. They come from the older file's decoder
        (read to its end) or, when that file was closed first, from `st.carry`. A partial line
        left by another writer (a restart's new container) is a line of its own, before this
        file's (`_finish_older`)."""
        carries = []
        if st.carry is not None:
            path, gen, carry = st.carry
            if gen < tf.generation and same_writer(path, tf.path):
                st.carry = None
                carries.append(carry)
            else:
                self._flush_carry(st)
        older = sorted((o for o in st.files.values() if o.generation < tf.generation and o.at_eof
                        and same_writer(o.path, tf.path)), key=lambda o: o.generation)
        for other in older:
            old = st.streams.get(id(other))
            if old is None or old.decoder.held_position is None:
                continue
            try:
                records, carry = old.hand_on()
            except Exception as exc:
                self._line_error("decode", other.path, None, exc)
                continue
            self._drive(st, st.source.path, lambda: records)
            if carry is not None:
                carries.append(carry)
        for carry in carries[:-1]:  # more than one file's (never seen): the older are lines of their own
            self._drive(st, st.source.path, lambda carry=carry: self._carried_lines(st, carry))
        if carries:
            stream.decoder.adopt(carries[-1])

    def _carried_lines(self, st: SourceState, carry) -> list:
        """The partial lines of `carry` as lines of their own: their file's successor never
        went on with them."""
        stream = RecordStream(Decoder(tz=self._tz, year=self.cfg.year), lead=not st.gateway)
        stream.decoder.adopt(carry)
        return stream.flush()

    def _flush_carry(self, st: SourceState) -> None:
        _path, _gen, carry = st.carry
        st.carry = None
        try:
            records = self._carried_lines(st, carry)
        except Exception as exc:
            self._line_error("decode", st.source.path, None, exc)
            return
        self._drive(st, st.source.path, lambda: records)

    def _successor_waits(self, st: SourceState, path: str, generation: int) -> bool:
        """Whether a newer file of the writer of `path` is followed and has had no line yet:
        the partial lines `path` ended in go on there."""
        return any(o.source.key == st.source.key and o.generation > generation and id(o) not in st.streams
                   and same_writer(path, o.path) for o in self._follower.files)

    def _finish_older(self, st: SourceState, tf: TrackedFile) -> None:
        """Lines of a newer file of the stream: an older file read to its end is finished (the
        runtime writes the new file only once it let the old one go: kubelet's rotation, a
        container's restart), so what its decoder still holds (a record kept for a continuation,
        a partial line) goes first, where `replay` reads it; not later, after newer lines, when
        the file is closed or the quiet release comes."""
        for key, other in st.files.items():
            if other.generation < tf.generation and other.at_eof:
                stream = st.streams.get(key)
                if stream is not None and stream.held_position is not None:
                    try:
                        records = stream.flush()
                    except Exception as exc:
                        self._line_error("decode", other.path, None, exc)
                        continue
                    self._drive(st, st.source.path, lambda: records)

    def _line_error_at(self, stage: str, path: str, offset: int | None, exc: BaseException) -> None:
        self._line_error(stage, path, None if offset is None else offset & _MASK, exc)

    def _drive(self, st: SourceState, path: str, records, where=lambda: None):
        """Records of one of `st`'s files through parse and assemble, the one way every record
        goes (a batch of new lines, or what a flush or a quiet release gives): `pipeline.drive`,
        as replay runs it, with its error policy. A gateway's records feed the join instead; a
        source resumed with delivered requests filters them out (`skip.unsent`). Returns the
        last record read, or None."""
        if st.gateway:
            return drive(records, self._gateway_entry, lambda record, entry: self._on_gateway(st, record, entry),
                         self._line_error_at, path, where)
        return drive(records, self._stages.parse(self._parser.parse), self._stages.feed(st.assembler.feed),
                     self._line_error_at, path, where, self._not_delivered(st) if st.skip else None)

    def _gateway_entry(self, message: str, _level, _origin):
        return self._gateway_parser(message)

    def _not_delivered(self, st: SourceState):
        """The filter of a source resumed with requests delivered before the restart: their
        lines are not fed again (each skip counted)."""
        counters = self.counters

        def keep(record, event):
            kept = unsent(st.skip, record.offset, event)
            if kept is not event:
                counters.skipped_delivered += 1
            return kept
        return keep

    def _emit(self, st: SourceState, t: Timeline) -> None:
        if self._k8s_on_spans:
            with_k8s_identity(t)
        if st.skip and sent_before(st.skip, t):
            self.counters.skipped_delivered += 1  # delivered before the restart
            return
        st.seq += 1
        self._dirty = True
        st.pending[st.seq] = Pending(t.first_offset, delivery_key(t), t.last_offset)  # held back until acked
        token = (st.source.key, st.seq)
        if self._join is not None and isinstance(t, RequestTimeline) and (t.parent is None or t.parent.span_id is None):
            seen, ctx, released = self._join.request(upstream_id(t.request_id), (t, token), time.monotonic_ns())
            for item in released:
                self._batch(*item)
            if not seen:
                return  # waits for its gateway line (or the window)
            if ctx is not None:
                self._joined(t, ctx)
        self._batch(t, token)

    def _batch(self, t: Timeline, token) -> None:
        try:
            self._delivery.add(t, token)
        except Exception as exc:  # cannot be encoded: it would fail again after a restart, so let it go
            self._line_error("export", t.source.path, t.first_offset & _MASK, exc)
            st = self._sources.get(token[0])
            if st is not None:
                p = st.pending.pop(token[1], None)
                if p is not None:
                    st.delivered.append(Delivered(p.key, p.last))
            return
        self._delivery.send_full()

    def _on_gateway(self, st: SourceState, record, entry) -> None:
        hold = (st.source.key, record.offset)  # the checkpoint stays before it while it waits
        for (t, token), ctx in self._join.gateway(entry.request_id, entry.context, time.monotonic_ns(), hold):
            if ctx is not None:
                self._joined(t, ctx)
            self._batch(t, token)

    @staticmethod
    def _joined(t: RequestTimeline, ctx: TraceContext) -> None:
        """The gateway's full context wins over a trace id alone read from the request id
        (nginx's own 32-hex `$request_id` looks like one)."""
        t.parent = ctx
        t.attrs["vllm.trace_context"] = ctx.source

    def _retire(self, tf: TrackedFile) -> None:
        st = self._sources.get(tf.source.key)
        if st is None:
            return
        stream = st.streams.pop(id(tf), None)
        st.files.pop(id(tf), None)
        st.quiet_since.pop(id(tf), None)
        carry = None
        if stream is not None:
            try:
                # Its writer went on in a newer file with no line yet: the partial lines it
                # ended in wait there (`st.carry`, `_go_on`); otherwise they are lines now.
                if stream.decoder.held_position is not None and self._successor_waits(st, tf.path, tf.generation):
                    records, carry = stream.hand_on()
                else:
                    records = stream.flush()
            except Exception as exc:
                self._line_error("decode", tf.path, tf.offset, exc)
                records = []
            self._drive(st, st.source.path, lambda: records)
        if carry is not None:
            if st.carry is not None:
                self._flush_carry(st)
            st.carry = (tf.path, tf.generation, carry)
        st.retired.append(file_checkpoint(tf, tf.offset))

    def _tick(self) -> None:
        """Time passes for quiet sources too: extrapolate each log clock by the wall clock,
        and release a multi-line record held for a continuation that has not come."""
        wall = time.time_ns()
        now = time.monotonic()
        paused = self._memory_paused
        for st in self._sources.values():
            if st.carry is not None and not self._successor_waits(st, st.carry[0], st.carry[1]):
                self._flush_carry(st)  # its file's successor is gone (or another file went on)
            for key, stream in st.streams.items():
                if stream.joiner.held_position is not None and now - st.quiet_since.get(key, now) >= _JOIN_IDLE_S:
                    self._drive(st, st.source.path, stream.release)
            # The wall clock stands in for the log's only while every file of the source is read
            # to its end: behind (backlog, a memory pause) the lines still to come are the clock,
            # so a request closes at the same line as when the log is read after a restart.
            if st.assembler is not None and st.last_wall and not paused and self._read_to_end(st, now):
                try:
                    st.assembler.tick(st.last_ts + (wall - st.last_wall))
                except Exception as exc:
                    self._line_error("assemble", st.source.path, None, exc)
        if self._join is not None:
            dropped = self._join.stats.contexts_dropped
            for t, token in self._join.expire(time.monotonic_ns()):
                self._batch(t, token)
            if self._join.stats.contexts_dropped != dropped:
                self._dirty = True  # gateway lines let go: their files' checkpoints may move on

    @staticmethod
    def _read_to_end(st: SourceState, now: float) -> bool:
        """Every line written to the source's files has been read and handled: only then may its
        log clock run on the wall clock. While lines wait, their own stamps move it (as in
        `replay`), so a file complete when read gives replay's spans."""
        for key, tf in st.files.items():
            stream = st.streams.get(key)
            if stream is not None and stream.joiner.held_position is not None:
                return False
            if now - st.quiet_since.get(key, now) < _JOIN_IDLE_S:
                return False
            try:
                if os.fstat(tf.fh.fileno()).st_size > tf.offset + len(tf.partial):
                    return False
            except (OSError, ValueError, AttributeError):
                pass
        return True

    # -- delivery and checkpoints --------------------------------------------------------

    def _drain_acks(self) -> bool:
        changed = False
        for batch, _ok in self._delivery.acks():  # given up or not, it will not be sent again
            changed = True
            for source_key, seq in batch.tokens:
                st = self._sources[source_key]
                p = st.pending.pop(seq, None)
                if p is not None:
                    st.delivered.append(Delivered(p.key, p.last))
        return changed

    def _checkpoint(self) -> bool:
        """Save where each file may resume (`resume.Checkpointer`); False when the save failed."""
        holds = self._join.holds() if self._join is not None else ()
        return self._checkpointer.save(self._follower, self._sources, holds, lambda key: self._state(key, None))


def install_signal_handlers(agent: Agent) -> None:
    signal.signal(signal.SIGTERM, agent.stop)
    signal.signal(signal.SIGINT, agent.stop)
