"""The agent's checkpointing, one job: where each file may resume, saved so that a crash loses
nothing and re-sends little (DESIGN.md §5).

A file's saved position stays before every line of a request not yet acknowledged, a
multi-line record still held, and a gateway line still waiting in the join; requests
delivered past that position are listed so a restart skips their lines. A failed save is
counted, logged once and retried by the caller; a damaged file is reported and survived.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from bridge.sources import SourceState
from bridge.tail.checkpoint import CheckpointStore, FileCheckpoint, Loaded, SourceCheckpoint
from bridge.core.position import GEN_SHIFT, IN_FILE as _MASK
from bridge.tail.follow import Follower, TrackedFile


def file_checkpoint(tf: TrackedFile, offset: int) -> FileCheckpoint:
    tail = (tf.tail_fp, tf.tail_end) if tf.tail_end >= offset else ("", 0)
    return FileCheckpoint(tf.path, tf.source.key, tf.generation, tf.inode, tf.fp, tf.fp_len, offset, *tail)


class Checkpointer:
    """Loads and saves `checkpoints.json` in `state_dir`; knows whether the last save failed."""

    def __init__(self, state_dir: str, log) -> None:
        self.store = CheckpointStore(state_dir)
        self.log = log
        self.failures = 0      # saves that failed, ever
        self.failing = False   # the last save failed

    def load(self, start_at: str) -> Loaded:
        """The saved state; a damaged file is logged once with what is done instead."""
        loaded = self.store.load()
        if loaded.damaged:
            if loaded.used == "previous":
                action = f"resuming from the previous good checkpoint {self.store.prev_path}"
            else:
                action = (f"no good checkpoint left: starting as on a first run, start_at={start_at} "
                          + ("(files already there are read from the beginning; what was sent is sent "
                             "again, with the same ids)" if start_at == "beginning"
                             else "(lines already in the files are skipped)"))
            self.log.error("checkpoint_damaged", file=self.store.path, problems=loaded.damaged, action=action)
        return loaded

    def still_current(self) -> None:
        """Nothing to record: the saved state is still current (for checkpoint_age_seconds)."""
        self.store.written_at = time.time()

    def save(self, follower: Follower, sources: Mapping[str, SourceState], holds,
             state: Callable[[str], SourceState]) -> bool:
        """Save where each file may resume: before every line of a request not yet acked.
        Every tracked file is written, read since the start or not, so a quiet restart
        saves what it loaded. `holds`: (source key, position) of gateway lines still waiting.
        `state(key)` makes a source's state for a tracked file that has none yet.
        False when the save failed (counted; retried by the caller)."""
        files: list[FileCheckpoint] = list(follower.awaiting_resume())  # not found again yet: kept
        checkpoints: list[SourceCheckpoint] = []
        facts: dict[str, dict] = {}
        next_gen = follower.next_generations()
        gateway_held: dict[str, int] = {}  # a gateway file: its lines still waiting in the join
        for key, position in holds:
            gateway_held[key] = min(position, gateway_held.get(key, position))
        tracked: dict[str, list[TrackedFile]] = {}
        for tf in follower.files:
            tracked.setdefault(tf.source.key, []).append(tf)
        for key in tracked.keys() - sources.keys():
            state(key)
        for key, st in sources.items():
            held = [gateway_held[key]] if key in gateway_held else []
            if st.assembler is not None and st.assembler.min_open_offset is not None:
                held.append(st.assembler.min_open_offset)
            held.extend(p.first for p in st.pending.values())
            held.extend(s.held_position for s in st.streams.values() if s.held_position is not None)
            if st.carry is not None:  # partial lines waiting for their file's successor
                held.append(st.carry[2].position)
            low = min(held) if held else None
            safe_positions = []
            for tf in tracked.get(key, ()):
                offset = tf.offset
                if low is not None:
                    gen = low >> GEN_SHIFT
                    if gen == tf.generation:
                        offset = min(offset, low & _MASK)
                    elif gen < tf.generation:
                        offset = 0
                files.append(file_checkpoint(tf, offset))
                safe_positions.append((tf.generation << GEN_SHIFT) + offset)
            if low is not None:
                keep_from = low >> GEN_SHIFT
                st.retired = [r for r in st.retired if r.generation >= keep_from]
                for r in st.retired:
                    # As for a file still open: the one holding `low` resumes there, a later one
                    # (read to its end and closed while a request from before it was open) from
                    # its start, or a restart would skip its lines. A copy: `r` keeps its end.
                    offset = min(r.offset, low & _MASK) if r.generation == keep_from else 0
                    files.append(dataclasses.replace(r, offset=offset))
                    safe_positions.append((r.generation << GEN_SHIFT) + offset)
            else:
                st.retired = []
            floor = min(safe_positions, default=None)
            if floor is None:
                st.delivered = []
            elif floor != st.pruned_at:
                # Only when the floor moved: a request acked since the last prune lies past it
                # (it was open or pending then, so the floor stayed before its lines), and an
                # unfinished request can hold the floor still for the whole TTL.
                st.delivered = [d for d in st.delivered if d.last_offset >= floor]
                if st.skip:
                    st.skip = {k: v for k, v in st.skip.items() if v >= floor}
            st.pruned_at = floor
            if floor is not None and st.assembler is not None:
                st.facts = st.assembler.facts_at(floor)
            if st.facts:
                facts[key] = st.facts
            checkpoints.append(SourceCheckpoint(key, next_gen.get(key, 0), st.delivered))  # read, not kept
        # In the order written (per source, oldest generation first), not the order the files
        # were opened or retired in: a quiet restart, which opens rotated files first, then
        # saves what it loaded, byte for byte (and the unchanged save is skipped).
        files.sort(key=lambda f: (f.source_key, f.generation, f.path))
        try:
            self.store.save(files, checkpoints, facts, follower.known_heads(), follower.listings())
        except OSError as exc:
            self.failures += 1
            if not self.failing:
                self.log.error("checkpoint_failed", file=self.store.path, error=exc.strerror or str(exc),
                               action="retrying each second; lines stay in the log files meanwhile",
                               fix="make the state directory (state_dir) writable and give it free space")
            self.failing = True
            return False
        if self.failing:
            self.log.info("checkpoint_recovered", file=self.store.path, failures=self.failures)
        self.failing = False
        return True
