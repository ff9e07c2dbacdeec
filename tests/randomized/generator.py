"""Seeded draws of server set-ups and request mixes: the same seed always gives the same
set-up and the same requests (what the client sends; what vLLM does with them is the run's)."""

from __future__ import annotations

import random
import string
from dataclasses import asdict, dataclass

APIS = ("completion", "chat", "responses")
BAD = ("wrong_type", "too_long", "negative_max_tokens", "unknown_model")


@dataclass(frozen=True)
class Setup:
    """One server: each field is one dimension issue #31 lists."""

    plugin: bool            # the project's vLLM plugin on (VLLM_TRACE_BRIDGE_PLUGIN=1)
    log_requests: bool      # --enable-log-requests
    log_outputs: bool       # --enable-log-outputs (vLLM refuses it without --enable-log-requests)
    json_logs: bool         # --logging-config.formatter json
    debug: bool             # VLLM_LOGGING_LEVEL=DEBUG
    api_servers: int        # --api-server-count
    policy: str             # --scheduling-policy fcfs | priority
    small_kv: bool          # a KV cache of a few blocks: concurrent long requests get preempted

    @property
    def name(self) -> str:
        return "-".join([
            "plugin" if self.plugin else "stock",
            "out" if self.log_outputs else ("req" if self.log_requests else "quiet"),
            "json" if self.json_logs else "text",
            "debug" if self.debug else "info",
            f"api{self.api_servers}",
            self.policy,
            "smallkv" if self.small_kv else "kv"])

    @property
    def max_model_len(self) -> int:
        return 512 if self.small_kv else 4096

    def server_args(self) -> tuple[list[str], dict[str, str]]:
        """(`vllm serve` arguments beyond tests/vllm_server.py's own, environment); the
        harness's --enable-log-requests/--enable-log-outputs are removed by the caller when off."""
        args = ["--max-model-len", str(self.max_model_len), "--scheduling-policy", self.policy,
                "--api-server-count", str(self.api_servers), "--max-num-seqs", "8"]
        if self.small_kv:   # the CPU backend's blocks hold 128 tokens: 6 (768) are 1.5 requests
            args += ["--num-gpu-blocks-override", "6"]   # of --max-model-len 512 (4 is vLLM's minimum)
        if self.json_logs:
            args += ["--logging-config.formatter", "json"]
        env = {"VLLM_TRACE_BRIDGE_PLUGIN": "1" if self.plugin else "0"}
        if self.debug:
            env["VLLM_LOGGING_LEVEL"] = "DEBUG"
        return args, env

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Setup:
        return cls(**d)


@dataclass(frozen=True)
class RequestSpec:
    index: int
    api: str                    # completion | chat | responses
    stream: bool
    n: int
    max_tokens: int
    ignore_eos: bool
    priority: int
    abort_after: int | None     # a stream the client closes after this many data chunks
    bad: str | None             # one of BAD: a request vLLM must refuse
    at_s: float                 # when to send it, seconds after the workload starts
    words: tuple[str, ...]      # the prompt: distinctive random words, scanned for in the spans
    sent_id: str                # X-Request-Id


def draw_setup(rng: random.Random) -> Setup:
    log_requests = rng.random() < 0.75
    return Setup(plugin=rng.random() < 0.5, log_requests=log_requests,
                 log_outputs=log_requests and rng.random() < 0.6, json_logs=rng.random() < 0.4,
                 debug=rng.random() < 0.3, api_servers=rng.choice((1, 1, 2)),
                 policy=rng.choice(("fcfs", "priority")), small_kv=rng.random() < 0.3)


def _word(rng: random.Random) -> str:
    return "zq" + "".join(rng.choice(string.ascii_lowercase) for _ in range(9))


def draw_requests(rng: random.Random, setup: Setup, count: int, tag: str) -> list[RequestSpec]:
    out, at = [], 0.0
    for i in range(count):
        api = rng.choices(APIS, weights=(4, 4, 1))[0]
        stream = rng.random() < 0.5
        n = 1 if api == "responses" else rng.choices((1, 2, 3), weights=(6, 2, 1))[0]
        # A small KV cache gets long requests in bursts: together they outgrow it (preemption).
        max_tokens = rng.choice((48, 120, 200, 300, 300) if setup.small_kv else (1, 4, 16, 48, 120))
        abort_after = rng.randint(1, 8) if stream and rng.random() < 0.25 else None
        if abort_after is not None:
            max_tokens = max(max_tokens, 120)   # long enough to be cut in the middle
        bad = rng.choice(BAD) if rng.random() < 0.12 else None
        priority = rng.choice((-5, 0, 0, 3, 10)) if setup.policy == "priority" else \
            rng.choices((0, 1), weights=(9, 1))[0]
        if rng.random() >= (0.6 if setup.small_kv else 0.35):   # else a burst: sent with the one before
            at += rng.expovariate(1 / 0.3)
        out.append(RequestSpec(index=i, api=api, stream=stream, n=n, max_tokens=max_tokens,
                               ignore_eos=rng.random() < (0.9 if setup.small_kv else 0.6), priority=priority,
                               abort_after=abort_after,
                               bad=bad, at_s=round(at, 3),
                               words=tuple(_word(rng) for _ in range(rng.randint(3, 12))),
                               sent_id=f"rnd-{tag}-{i:03d}-{rng.getrandbits(32):08x}"))
    return out
