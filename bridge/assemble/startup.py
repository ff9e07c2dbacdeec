"""The `vllm.startup` span: from the engine config banner to the last startup line.

It opens at the banner (or the first startup fact, when the banner was missed), gathers the
numbers the startup lines print (weights, memory profile, KV cache size, blocks, concurrency),
and ends at the last of them. It is emitted when the first request arrives, when an error ends
the startup, when a new banner says the engine restarted, or at end of input.
"""

from __future__ import annotations

from bridge.assemble.timeline import EngineTimeline
from bridge.decode.record import Record
from bridge.core.source import Source
from bridge.parse.events import SERVED_MODEL, WEIGHTS_READ_S

STARTUP = "startup"  # EngineTimeline.kind of a startup span (exported as `vllm.startup`)
#: Facts each worker prints for itself, of which the engine's is the smallest.
_LEAST = frozenset({"vllm.startup.kv_cache_gib", "vllm.startup.kv_cache_tokens", "vllm.startup.max_concurrency"})
#: Facts each worker prints for itself, of which the start's is the largest: the workers compile
#: at once and the engine waits for the slowest (`torch.compile takes … s in total`, per rank).
_MOST = frozenset({"vllm.startup.compile_s"})
#: Facts the first line that names them says best: the API server's logo or args, then the
#: banner's, before the path a worker loads; but a name stated as served (`SERVED_MODEL`) wins.
_FIRST = frozenset({"gen_ai.request.model"})
#: Facts told once per graph a start compiles (tpu-inference's precompile): their sum is the start's.
#: So are the broadcast waits its workers' work made the engine warn of (`EngineLife._start_worked`).
_SUMMED = frozenset({"vllm.startup.precompile_s", "vllm.startup.precompiled_graphs", "vllm.startup.waits"})
#: Facts that stand in for another only where that one was never said: the loader's time to read
#: the weights is the start's load time when the model runner's whole-load line never came.
_STAND_IN = {WEIGHTS_READ_S: "vllm.startup.load_s"}


class Startup:
    __slots__ = ("start_ns", "end_ns", "attrs", "first_offset", "last_offset", "has_banner", "ready")

    def __init__(self, record: Record) -> None:
        self.start_ns = self.end_ns = record.ts_ns
        self.first_offset = record.offset
        self.last_offset = record.end_offset
        self.attrs: dict = {}
        self.has_banner = False
        #: a line said the engine is up (the API server listening, the engine's stats): what fails
        #: after it fails a serving engine, no longer its start
        self.ready = False
        if record.process:
            self.attrs["vllm.process"] = record.process

    def add(self, record: Record, facts) -> None:
        if record.ts_ns > self.end_ns:
            self.end_ns = record.ts_ns
        self.last_offset = record.end_offset
        for key, value in facts:
            if key in _LEAST and key in self.attrs:
                # every worker prints its own; the engine sizes its cache by the smallest (a
                # negative one: the model does not fit on that worker)
                value = min(value, self.attrs[key])
            elif key in _MOST and key in self.attrs:
                value = max(value, self.attrs[key])
            elif key in _SUMMED and key in self.attrs:
                value = round(self.attrs[key] + value, 6)
            elif key in _FIRST and key in self.attrs:
                continue  # the served name, not a path named later
            elif key == SERVED_MODEL:  # what clients send, over the model the logo named (args.model)
                self.attrs["gen_ai.request.model"] = value
            self.attrs[key] = value

    @property
    def no_room(self) -> bool:
        """The memory left for the KV cache is none or negative: the model does not fit."""
        room = self.attrs.get("vllm.startup.kv_cache_gib")
        return isinstance(room, (int, float)) and room <= 0

    def timeline(self, source: Source, error_type: str = "", message: str = "") -> EngineTimeline:
        attrs = {"vllm.incident.kind": STARTUP, **self.attrs}
        for key, stands_for in _STAND_IN.items():
            value = attrs.pop(key, None)
            if value is not None and stands_for not in attrs:
                attrs[stands_for] = value
        if error_type:
            attrs["error.type"] = error_type
        return EngineTimeline(source, STARTUP, str(self.start_ns), self.start_ns, self.end_ns, error_type,
                              message, attrs, [], self.first_offset, self.last_offset)
