"""The hostile lines of issue #17, as regression cases: each crashed `replay`, made the C and
Python paths disagree, exported a false value, took a minute, or forged a line.

Every case is a whole log file: the same well-formed requests written by hand before and after
the hostile lines (`GOOD`, one of them in flight across them), in the case's framing. `expect`
says what the input must be counted as, derived from the input: `("malformed", key)` a line
whose grammar fits but whose number does not, `("decode", field)` a DecodeStats counter (a time
OTLP cannot carry, a cut line), with how many. tests/test_hostile.py runs each through the
whole replay pipeline on both paths.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

_T0 = 1_739_614_980  # 2025-02-15T10:23:00Z


def header(second: int, level: str = "INFO", origin: str = "scheduler.py:234") -> str:
    return f"{level} {time.strftime('%m-%d %H:%M:%S', time.gmtime(_T0 + second))} {origin}] "


def _stamp(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(_T0 + second)) + ".5Z"


@dataclass(frozen=True)
class Good:
    """A well-formed request, and what it must be exported as."""

    rid: str
    prompt_tokens: int
    generated_tokens: int


GOOD = (Good("0xa001", 11, 21), Good("0xa002", 12, 22), Good("0xa003", 13, 23), Good("0xa004", 14, 24))


def _lifecycle(g: Good, second: int) -> list[tuple[int, str]]:
    return [(second, f"Scheduling request {g.rid}: priority=0, num_scheduled_blocks=2, remaining_blocks=100"),
            (second, f"Allocated block {g.rid}0 for request {g.rid}, size=16KB"),
            (second + 1, f"Request {g.rid}: prompt_tokens={g.prompt_tokens}, generated_tokens={g.generated_tokens}, "
                         f"ttft=12.5ms, itl=3.1ms, total_latency=0.8s"),
            (second + 1, f"Freed block {g.rid}0 for request {g.rid}, reason=completed")]


def _frame(framing: str, second: int, text: str) -> bytes:
    if framing == "cri":
        return f"{_stamp(second)} stdout F {text}\n".encode()
    if framing == "docker":
        return (json.dumps({"log": text + "\n", "stream": "stdout", "time": _stamp(second)}) + "\n").encode()
    return (text + "\n").encode()


@dataclass(frozen=True)
class Case:
    name: str
    hostile: tuple[bytes, ...]          # whole physical lines, framing included
    framing: str = "plain"              # plain | cri | docker
    expect: dict = field(default_factory=dict)  # (stage, counter) → count

    def lines(self) -> list[bytes]:
        """GOOD[0] and GOOD[1]'s start, the hostile lines, GOOD[1]'s end, GOOD[2], GOOD[3]."""
        a, b, c, d = (_lifecycle(g, 2 * i) for i, g in enumerate(GOOD))
        before = a + b[:2]
        after = b[2:] + c + d
        framed = [_frame(self.framing, s, header(s) + m) for s, m in before]
        framed += list(self.hostile)
        framed += [_frame(self.framing, s + 10, header(s + 10) + m) for s, m in after]
        return framed


def _plain(message: str, level: str = "INFO", origin: str = "scheduler.py:234") -> bytes:
    return (header(3, level, origin) + message + "\n").encode()


def _json(message: str = "Added request q1.", asctime: str = "2025-02-15 10:23:03,250", **extra) -> bytes:
    record = {"asctime": asctime, "levelname": "INFO", "name": "vllm.v1.engine.async_llm", "message": message,
              "process": 7, "vllm_process_name": "APIServer", **extra}
    return (json.dumps(record) + "\n").encode()


def _json_raw(text: str) -> bytes:
    """A JSON record written as text: a lone surrogate escape (json.dumps would not write one)."""
    return ('{"asctime": "2025-02-15 10:23:03,250", "levelname": "INFO", "name": "vllm.x", ' + text + "}\n").encode()


D4301 = "9" * 4301
BEYOND_U64 = str(2**64 + 12345)   # wrapped to 64 bits: 12345
BEYOND_I64 = str(2**63)
MIB4 = 4 << 20


def _malformed(key: str, n: int = 1) -> dict:
    return {("malformed", key): n}


def _cut_cri() -> tuple[bytes, ...]:
    """A line containerd split into 64 KiB `P` parts, over 4 MiB in all, whose rest (after the
    decoder's cut) holds a forged summary for GOOD[1]: if the rest were read as a line, GOOD[1]
    would be exported with 999999 prompt tokens."""
    part = "x" * (64 << 10)
    n = MIB4 // len(part)  # the first part's text, then these: the cut falls right after the last
    forged = header(3) + f"Request {GOOD[1].rid}: prompt_tokens=999999, generated_tokens=1, ttft=1ms, itl=1ms, " \
                         "total_latency=1s"
    lines = [f"{_stamp(3)} stdout P {header(3)}Received request cmpl-big: prompt: '".encode()]
    lines[0] += b"\n"
    lines += [f"{_stamp(3)} stdout P {part}\n".encode()] * n
    lines += [f"{_stamp(3)} stdout P {forged}\n".encode(), f"{_stamp(3)} stdout F ', params: x\n".encode()]
    return tuple(lines)


CASES = [
    # -- numbers: ≥ 4,301 digits (C raised ValueError, Python did not), beyond int64 (wrapped), huge durations
    Case("summary_tokens_4301_digits", (_plain(f"Request 0x1: prompt_tokens={D4301}, generated_tokens=2, "
                                               "ttft=1ms, itl=1ms, total_latency=1s"),), expect=_malformed("Requ")),
    Case("queue_running_4301_digits", (_plain(f"Running queue: {D4301} requests, waiting queue: 0 requests, "
                                              "free blocks: 1/64"),), expect=_malformed("Runn")),
    Case("ttft_1e307ms_literal", (_plain("Request 0x1: prompt_tokens=1, generated_tokens=2, ttft=1e307ms, itl=1ms, "
                                         "total_latency=1s"),), expect=_malformed("Requ")),
    Case("ttft_1e307ms_digits", (_plain("Request 0x1: prompt_tokens=1, generated_tokens=2, ttft=1" + "0" * 307
                                        + "ms, itl=1ms, total_latency=1s"),), expect=_malformed("Requ")),
    Case("ttft_1e400_digits_inf", (_plain("Request 0x1: prompt_tokens=1, generated_tokens=2, ttft=1" + "0" * 400
                                          + "ms, itl=1ms, total_latency=1s"),), expect=_malformed("Requ")),
    Case("queued_1e40s", (_plain("Scheduling request 0x1: priority=0, num_scheduled_blocks=1, remaining_blocks=2, "
                                 "queued=1" + "0" * 40 + "s"),), expect=_malformed("Sche")),
    Case("timeout_after_1e17s", (_plain("Request 0xdead timed out after 100000000000000000s", "WARNING"),),
         expect=_malformed("Requ")),
    Case("timeout_after_400_digits", (_plain("Request 0xdead timed out after " + "9" * 400 + "s", "WARNING"),),
         expect=_malformed("Requ")),
    Case("nccl_after_1e17s", (_plain("NCCL timeout: rank 2 failed to synchronize after 100000000000000000s", "ERROR"),),
         expect=_malformed("NCCL")),
    Case("free_blocks_2_64_plus_12345", (_plain(f"Running queue: 1 requests, waiting queue: 0 requests, "
                                                f"free blocks: {BEYOND_U64}/64"),), expect=_malformed("Runn")),
    Case("kv_cache_size_2_63", (_plain(f"GPU KV cache size: {BEYOND_I64} tokens", origin="kv_cache_utils.py:1"),),
         expect=_malformed("GPU ")),
    Case("gpu_blocks_2_64", (_plain(f"# GPU blocks: {BEYOND_U64}, # CPU blocks: 1", origin="executor_base.py:1"),),
         expect=_malformed("# GP")),
    Case("max_tokens_1e30", (_plain(f"Received request cmpl-h1: prompt: 'x', params: SamplingParams(n=1, "
                                    f"temperature=0.5, top_p=1.0, max_tokens={10**30 - 1}), lora_request: None.",
                                    origin="logger.py:1"),), expect=_malformed("Rece")),
    Case("alloc_size_2_70_kb", (_plain(f"Allocated block 0x1 for request 0x1, size={2**70}KB"),),
         expect=_malformed("Allo")),
    Case("gpu_memory_kv_blocks_2_64", (_plain(f"GPU memory usage: 14.2GB/16.0GB (88.75%), cache usage: 8.1GB, "
                                              f"kv_cache blocks: 512/{BEYOND_U64}"),), expect=_malformed("GPU ")),
    Case("priority_2_64", (_plain(f"Scheduling request 0x1: priority={BEYOND_U64}, num_scheduled_blocks=4, "
                                  "remaining_blocks=2"),), expect=_malformed("Sche")),
    Case("engine_stats_running_2_64", (_plain(f"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
                                              f"throughput: 0.0 tokens/s, Running: {BEYOND_U64} reqs, Waiting: 0 reqs, "
                                              "GPU KV cache usage: 0.0%", origin="loggers.py:1"),),
         expect=_malformed("Engi")),
    Case("preemption_cumulative_2_64", (_plain(f"Sequence group 9 is preempted by PreemptionMode.RECOMPUTE mode because "
                                               f"there is not enough KV cache space. total_num_cumulative_preemption="
                                               f"{BEYOND_U64}", "WARNING"),), expect=_malformed("Sequ")),
    # -- regexes: 100,000 digits then `%` (or `|` and no `%`) backtracked from every digit
    Case("progress_100k_digits_percent", (("1" * 100_000 + "%\n").encode(), _plain("1" * 100_000 + "%"))),
    Case("progress_100k_digits_bar", (("1" * 100_000 + "|\n").encode(), _plain("1" * 100_000 + "|"))),
    Case("progress_100k_spaces_digits", (("|" + " " * 100_000 + "1" * 100_000 + "\n").encode(),)),
    # -- JSON-format lines: nesting, lone surrogates, years OTLP cannot carry
    Case("json_nested_100k", (('{"levelname": "INFO", "message": "x", "a": ' + "[" * 100_000 + "]" * 100_000
                               + "}\n").encode(),)),
    Case("json_lone_surrogate_request_id", (_json_raw('"message": "Added request \\ud800."'),)),
    Case("json_lone_surrogate_process_name", (_json_raw('"message": "Added request q2.", "process": 1, '
                                                        '"vllm_process_name": "\\udc00"'),)),
    Case("json_lone_surrogate_level_and_logger", (_json_raw('"message": "Added request q3.", "name": "\\udbff", '
                                                            '"levelname": "\\ud800"').replace(
        b'"levelname": "INFO", ', b""),)),
    Case("json_year_1900", (_json(asctime="1900-02-15 10:23:03,250"),), expect={("decode", "times_out_of_range"): 1}),
    Case("json_year_9999", (_json(asctime="9999-02-15 10:23:03,250"),), expect={("decode", "times_out_of_range"): 1}),
    Case("shipper_stamp_1900", (("1900-01-01T00:00:00Z " + header(3) + "Added request q4.\n").encode(),),
         expect={("decode", "times_out_of_range"): 1}),
    # -- container framing: runtime stamps OTLP cannot carry, a cut line's rest, docker json
    Case("cri_stamp_1900", (f"1900-01-01T00:00:00Z stdout F {header(3)}Added request q5.\n".encode(),) * 2,
         framing="cri", expect={("decode", "times_out_of_range"): 2}),
    Case("cri_stamp_9999", (f"9999-12-31T23:59:59.999999999Z stdout F {header(3)}Added request q6.\n".encode(),),
         framing="cri", expect={("decode", "times_out_of_range"): 1}),
    Case("cri_stamp_before_epoch_by_offset", (f"1970-01-01T00:00:00+01:00 stdout F {header(3)}Added request q7.\n"
                                              .encode(),) * 2, framing="cri",
         expect={("decode", "times_out_of_range"): 2}),
    Case("cri_partial_cut_rest_forges_a_summary", _cut_cri(), framing="cri", expect={("decode", "truncated"): 1}),
    Case("docker_lone_surrogate", (b'{"log": "' + header(3).encode() + b'Added request \\ud800x.\\n", '
                                   b'"stream": "stdout", "time": "' + _stamp(3).encode() + b'"}\n',), framing="docker"),
    Case("docker_nested_100k", (b'{"log": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",), framing="docker",
         expect={("decode", "framing_errors"): 1}),
    Case("docker_stamp_1900", (b'{"log": "' + header(3).encode() + b'Added request q8.\\n", "stream": "stdout", '
                               b'"time": "1900-01-01T00:00:00Z"}\n',), framing="docker",
         expect={("decode", "times_out_of_range"): 1}),
]
