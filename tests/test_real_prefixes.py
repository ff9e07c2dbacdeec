"""Prefixes and framing users really have (issue #15 item 5), line by line, expected by hand.

Each expectation is read off the input: the message is what follows the prefixes, the time is
the stamp the line carries (a runtime's or shipper's exact one first, else the line's own).
The C decode path must give the same records: it takes none of these lines itself (none starts
with vLLM's header or V1's process prefix), which is checked here too.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from bridge.assemble.timeline import RequestTimeline
from bridge.decode import Decoder
from bridge.decode import stream as stream_mod
from bridge.decode.stream import RecordStream
from bridge.pipeline import ReplayConfig, replay

NS = 1_000_000_000
E = "\x1b"
HEAD = "INFO 10-22 09:33:49 [logger.py:43] Added request cmpl-abc-0-1234abcd."
MSG = "Added request cmpl-abc-0-1234abcd."


def at(iso: str, frac_ns: int = 0) -> int:
    return int(datetime.fromisoformat(iso).replace(tzinfo=timezone.utc).timestamp()) * NS + frac_ns


def decode(line: str):
    return Decoder(year=2025)(line.encode() + b"\n", 0)


@pytest.mark.parametrize("line, process, level, message, clock, ts", [
    # the Kubernetes dashboard's log viewer gutter, docker compose's service column
    ("  | " + HEAD, "", "INFO", MSG, "header", at("2025-10-22T09:33:49")),
    ("  | (APIServer pid=1) " + HEAD, "APIServer pid=1", "INFO", MSG, "header", at("2025-10-22T09:33:49")),
    ("vllm-1  | (APIServer pid=1) " + HEAD, "APIServer pid=1", "INFO", MSG, "header", at("2025-10-22T09:33:49")),
    ("  | Traceback (most recent call last):", "", "", "Traceback (most recent call last):", "anchored", 0),
    # Ray's colour codes, intact and with the ESC byte dropped by a shipper
    (f"{E}[36m(RayWorkerVllm pid=123){E}[0m [E ProcessGroupNCCL.cpp:1316] boom", "RayWorkerVllm pid=123", "",
     "[E ProcessGroupNCCL.cpp:1316] boom", "anchored", 0),
    ("[36m(RayWorkerVllm pid=123)[0m [E ProcessGroupNCCL.cpp:1316] boom", "RayWorkerVllm pid=123", "",
     "[E ProcessGroupNCCL.cpp:1316] boom", "anchored", 0),
    ("[36m(RayWorkerVllm pid=123, ip=10.0.0.7)[0m " + HEAD, "RayWorkerVllm pid=123, ip=10.0.0.7", "INFO", MSG,
     "header", at("2025-10-22T09:33:49")),
    ("[1;36m(RayWorkerVllm pid=9)[0m   File \"x.py\", line 3", "RayWorkerVllm pid=9", "", "  File \"x.py\", line 3",
     "anchored", 0),
    # V1's data-parallel engine prefix
    ("(EngineCore_DP0 pid=77) ERROR 10-22 09:33:49 [core.py:1] EngineCore failed", "EngineCore_DP0 pid=77",
     "ERROR", "EngineCore failed", "header", at("2025-10-22T09:33:49")),
    # journald (short, short-precise, short-iso) and docker `logs -t`, cloud exports
    ("Oct 22 09:33:49 gpu-1 vllm[1234]: " + HEAD, "", "INFO", MSG, "header", at("2025-10-22T09:33:49")),
    ("Oct 22 09:33:50.250000 gpu-1 vllm[1234]: INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK", "", "",
     "INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK", "header", at("2025-10-22T09:33:50", NS // 4)),
    ("Oct  2 09:33:50 gpu-1 python3[7]: Traceback (most recent call last):", "", "",
     "Traceback (most recent call last):", "header", at("2025-10-02T09:33:50")),
    ("2025-10-22T09:33:50+0200 gpu-1 vllm[1234]: Traceback (most recent call last):", "", "",
     "Traceback (most recent call last):", "shipper", at("2025-10-22T07:33:50")),
    ("2025-10-22T09:33:50.123456789Z " + HEAD, "", "INFO", MSG, "shipper", at("2025-10-22T09:33:50", 123456789)),
    ("2025-10-22 09:33:50.5 UTC  (APIServer pid=1) " + HEAD, "APIServer pid=1", "INFO", MSG, "shipper",
     at("2025-10-22T09:33:50", NS // 2)),
    ("2025-10-22 09:33:50.5 GMT\t" + HEAD, "", "INFO", MSG, "shipper", at("2025-10-22T09:33:50", NS // 2)),
    # torch C++ (c10 / glog) lines: their own microsecond time, the text kept whole for parse
    ("[E1022 09:33:51.123456 1234 ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Watchdog caught collective "
     "operation timeout", "", "", "[E1022 09:33:51.123456 1234 ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Watchdog "
     "caught collective operation timeout", "header", at("2025-10-22T09:33:51", 123456000)),
    ("[W1022 09:33:52.5 77 socket.cpp:1] x", "", "", "[W1022 09:33:52.5 77 socket.cpp:1] x", "header",
     at("2025-10-22T09:33:52", NS // 2)),
    ("[36m(RayWorkerVllm pid=5)[0m [E1022 09:33:53.000001 5 ProcessGroupNCCL.cpp:1] y", "RayWorkerVllm pid=5", "",
     "[E1022 09:33:53.000001 5 ProcessGroupNCCL.cpp:1] y", "header", at("2025-10-22T09:33:53", 1000)),
])
def test_prefix_and_time(line, process, level, message, clock, ts):
    r = decode(line)
    assert (r.process, r.level, r.message, r.clock) == (process, level, message, clock)
    if clock != "anchored":
        assert r.ts_ns == ts


def test_a_runtime_stamp_wins_over_a_torch_line_own_time():
    """The runtime's stamp is exact and zone-safe; the C++ stamp is local time with no year."""
    r = decode("2025-10-22T09:33:59.000000001Z stdout F [E1022 09:33:51.123456 1 x.cpp:1] z")
    assert (r.clock, r.ts_ns) == ("runtime", at("2025-10-22T09:33:59", 1))


def test_cloud_logging_export_lines_unwrap_to_their_text_and_time():
    """A GKE log sink's entries: `textPayload` is the container's line, `timestamp` its time."""
    d = Decoder(year=2025)
    lines = ['{"insertId": "a1", "textPayload": "(APIServer pid=1) ' + HEAD + '\\n", "resource": {"type": '
             '"k8s_container"}, "timestamp": "2025-10-22T09:33:49.250Z", "severity": "INFO"}',
             '{"textPayload": "Traceback (most recent call last):", "timestamp": "2025-10-22T09:33:50.5Z"}',
             '{"textPayload": 7, "timestamp": "2025-10-22T09:33:50.5Z"}']
    a, b, c = (d(line.encode() + b"\n", 0) for line in lines)
    assert (a.process, a.level, a.message, a.clock, a.ts_ns) == (
        "APIServer pid=1", "INFO", MSG, "runtime", at("2025-10-22T09:33:49", NS // 4))
    assert (b.message, b.ts_ns) == ("Traceback (most recent call last):", at("2025-10-22T09:33:50", NS // 2))
    assert d.stats.framing_errors == 1 and c.message == lines[2]


@pytest.mark.parametrize("line", [
    "| not a viewer: a table row | a | b |", "Loading safetensors checkpoint shards: 100% Completed | 1/1",
    "[0m", "[36m", "[36mno process", "Octopus 22 09:33:49 x: y", "[E1022 09:33:51 1234 x.cpp:1] no fraction",
])
def test_near_misses_keep_their_text(line):
    r = decode(line)
    assert r.message.endswith(line.split("[36m")[-1].split("| ", 1)[-1]) or r.message == line, r


@pytest.mark.parametrize("line", ["    flags = flags | mask", "        mask | flags", "      x |= y | z"])
def test_a_traceback_code_line_with_a_bar_is_no_viewer_gutter(line):
    assert decode(line).message == line


def test_rank_prefixed_traceback_is_one_incident(tmp_path):
    """`[rank0]:` on every line (torch elastic), a viewer gutter, journald's or a shipper's stamp:
    one record, one incident whose type is the last line's exception."""
    tb = ["Traceback (most recent call last):", '  File "/x/worker.py", line 9, in run',
          "    self.model_runner.execute()", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    for prefix in ("[rank0]: ", "  | [rank0]: ", "[36m(RayWorkerVllm pid=3)[0m [rank0]: ", "  | ",
                   "vllm-1  | ", "Oct 22 09:33:50 gpu-1 vllm[1234]: ", "2025-10-22T09:33:50.5Z ",
                   "Oct 22 09:33:50 gpu-1 vllm[1234]: [rank1]: "):
        lines = ["(APIServer pid=1) INFO 10-22 09:33:48 [logger.py:43] Received request cmpl-r-0: params: x",
                 "(APIServer pid=1) INFO 10-22 09:33:48 [async_llm.py:1] Added request cmpl-r-0-1234abcd."]
        lines += [prefix + t for t in tb]
        p = tmp_path / "r.log"
        p.write_text("\n".join(lines) + "\n")
        out: list = []
        replay([str(p)], [out.append], ReplayConfig(year=2025))
        incidents = [t for t in out if not isinstance(t, RequestTimeline) and t.kind != "startup"]
        assert len(incidents) == 1, (prefix, [(t.kind, t.message[:60]) for t in incidents])
        assert "OutOfMemoryError" in incidents[0].attrs.get("exception.type", incidents[0].message), incidents[0]


LINES = [
    "  | " + HEAD, "vllm-1  | (APIServer pid=1) " + HEAD, f"{E}[36m(RayWorkerVllm pid=123){E}[0m " + HEAD,
    "[36m(RayWorkerVllm pid=123)[0m " + HEAD, "[36m(RayWorkerVllm pid=123)[0m [E ProcessGroupNCCL.cpp:1316] x",
    "(EngineCore_DP0 pid=77) " + HEAD, "Oct 22 09:33:49 gpu-1 vllm[1234]: " + HEAD,
    "Oct 22 09:33:50.25 gpu-1 vllm[1234]: Traceback (most recent call last):",
    "[rank0]: Traceback (most recent call last):", '[rank0]:   File "x.py", line 1', "[rank0]: ValueError: x",
    "[E1022 09:33:51.123456 1234 ProcessGroupNCCL.cpp:1316] Watchdog", "2025-10-22 09:33:50.5 UTC " + HEAD,
]


@pytest.mark.skipif(stream_mod.FAST is None, reason="C decode not built or VLLM_TRACE_BRIDGE_PURE=1")
@pytest.mark.parametrize("framing", ["plain", "cri", "cloud"])
def test_c_decode_gives_python_records(framing):
    frame = {"plain": lambda t: t, "cri": lambda t: f"2025-10-22T09:33:49.5Z stdout F {t}",
             "cloud": lambda t: json.dumps({"textPayload": t, "timestamp": "2025-10-22T09:33:49.5Z"})}[framing]
    raws = [frame(t).encode() + b"\n" for t in ["(APIServer pid=1) " + HEAD, *LINES, *LINES]]
    lines, offset = [], 0
    for raw in raws:
        lines.append((offset, raw))
        offset += len(raw)
    got = []
    for fast in (stream_mod.FAST, None):
        s = RecordStream(Decoder(mtime=1.7e9), fast=fast)
        got.append((list(s.over(lines)), s.decoder.stats, s.joiner.stats))
    assert got[0] == got[1]


@pytest.mark.parametrize("line, kind", [
    ("E1022 09:33:51.123456  1234 ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Watchdog caught collective operation "
     "timeout", "distributed"),
    ("F1022 09:33:51.123456 1234 ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out",
     "distributed"),
    ("E1022 09:33:51.1 9 cuda.cpp:1] CUDA error: out of memory", "oom"),
    ("W1022 09:33:51.5 77 socket.cpp:752] [c10d] The client socket has failed to connect", "torch_log"),
    ("I1022 09:33:51.5 77 ProcessGroupNCCL.cpp:1] NCCL_DEBUG: N/A", "torch_log"),
])
def test_glog_lines_without_brackets_are_torch_lines_timed_by_their_stamp(line, kind):
    """The bracket-less glog form of a torch C++ line: recognised like the bracketed one (an
    error for E/F, a torch notice for W/I), and timed by its own stamp."""
    from bridge.parse import parse_line
    r = decode(line)
    assert (r.clock, r.ts_ns // NS) == ("header", at("2025-10-22T09:33:51") // NS)
    ev = parse_line(r.message, r.level, r.origin)
    if kind == "torch_log":
        assert type(ev).__name__ == "Notice" and ev.kind == "torch_log"
    else:
        assert type(ev).__name__ == "EngineError" and ev.error_type == kind
