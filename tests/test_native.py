"""The C fast paths (bridge/*/_fast*.c) give exactly what the pure-Python stages give.

Each stage is run twice over the same input, with its C path and without it (`fast=None` /
`fast=False`, what VLLM_TRACE_BRIDGE_PURE=1 selects for the whole process), and everything it
hands on is compared: records and decode/join counters, events and parse counters, timelines
(attribute order included) and assemble counters, OTLP payload bytes. Inputs: the synth
generator's logs (plain, CRI with partial lines), the upstream and plugin fixtures, the bundled
sample, and hypothesis with hostile input (garbage bytes, truncated and huge lines, invalid
UTF-8, odd numbers).

When the extensions are not built (no compiler at install) these tests are skipped, except
the one that says so when a compiler is there.
"""

from __future__ import annotations

import glob
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
from functools import partial
from itertools import accumulate

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from receivers import CapturingTransport

from bridge.assemble import Assembler, build
from bridge.assemble.timeline import IncidentEvent, IncidentRef, Phase, RequestTimeline, SpanEvent
from bridge.decode import Decoder
from bridge.tail.source import source_for
from bridge.decode import stream as stream_mod
from bridge.decode.framing import CRI, PLAIN, CriUnwrapper, DockerUnwrapper, detect
from bridge.decode.joiner import Joiner
from bridge.decode.record import CLOCK_HEADER, CLOCK_RUNTIME, Record
from bridge.decode.stream import RecordStream
from bridge.export import mapping
from bridge.export.batch import OtlpSink
from bridge.export.wire import FAST_REQUEST, KeyValues, WireEncoder
from bridge.parse import FAST_PARSE, Parser
from bridge.parse.context import TraceContext
from bridge.synth import SynthConfig, write_file
from bridge.synth.seed import _cri_stamp, _header
from bridge.tail import read_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "*", "*.log"))) + [
    os.path.join(ROOT, "bridge", "samples", "seed.log")]
PURE = os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0")
NATIVE = all(x is not None for x in (stream_mod.FAST, FAST_PARSE, build.FAST_REQUEST_TIMELINE, FAST_REQUEST))
native = pytest.mark.skipif(not NATIVE, reason="C extensions not built or VLLM_TRACE_BRIDGE_PURE=1")


def test_extensions_are_built_where_a_compiler_is():
    if PURE:
        assert not NATIVE  # the variable switches every stage to Python
        return
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler: the pure-Python path is the one installed")
    assert NATIVE, "a compiler is installed but the extensions were not built (pip install -e . rebuilds them)"


def test_pure_variable_switches_every_stage_to_python():
    code = ("from bridge.decode import stream; from bridge.parse import FAST_PARSE; from bridge.assemble import build;"
            "from bridge.export.wire import FAST_REQUEST;"
            "print([x is None for x in (stream.FAST, FAST_PARSE, build.FAST_REQUEST_TIMELINE, FAST_REQUEST)])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "VLLM_TRACE_BRIDGE_PURE": "1"},
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[True, True, True, True]"


# -- the whole pipeline, stage by stage ---------------------------------------------------------


def _run(path: str, fast: bool, lines=None):
    """Every stage's output and counters for one file, with or without the C paths."""
    lines = list(read_lines(path)) if lines is None else lines
    stream = RecordStream(Decoder(mtime=1.7e9), fast=stream_mod.FAST if fast else None)
    records = list(stream.over(lines))
    parser = Parser(fast=FAST_PARSE if fast else None)
    pairs = [(r, parser.parse(r.message, r.level, r.origin)) for r in records]  # as the pipeline calls it
    timelines: list = []
    transport = CapturingTransport()
    sink = OtlpSink(transport, {"service.name": "vllm"}, max_batch=256,
                    encoder=WireEncoder if fast else partial(WireEncoder, fast=None))

    def emit(t):
        timelines.append(t)
        sink(t)

    assembler = Assembler(source_for(path), emit, fast=fast)
    for r, e in pairs:
        if e is not None:
            assembler.feed(r, e)
    assembler.flush()
    sink.flush()
    return {
        "records": records, "decode": stream.decoder.stats, "join": stream.joiner.stats,
        "events": [e for _, e in pairs], "parse": parser.snapshot(),
        "timelines": timelines, "attr_order": [_order(t) for t in timelines], "assemble": assembler.stats,
        "payloads": transport.payloads,
    }


def _order(t):
    phases = [(list(p.attrs), [list(e.attrs) for e in p.events]) for p in getattr(t, "phases", ())]
    return list(t.attrs), [list(e.attrs) for e in getattr(t, "events", ())], phases


def _assert_same(path, lines=None):
    fast, pure = _run(path, True, lines), _run(path, False, lines)
    for key in pure:
        assert fast[key] == pure[key], f"{os.path.basename(path)}: {key} differs"
    assert [type(e) for e in fast["events"]] == [type(e) for e in pure["events"]]
    return fast


@pytest.fixture(scope="module")
def synth_logs(tmp_path_factory):
    d = tmp_path_factory.mktemp("native")
    out = []
    for name, cfg in [
        ("plain.log", SynthConfig(requests=400, seed=11, preempt_ratio=0.5, timeout_ratio=0.2, oom_failures=6,
                                  nccl_incidents=3)),
        ("cri.log", SynthConfig(requests=400, seed=12, cri=True, cri_partial_ratio=0.3, timeout_ratio=0.1,
                                oom_failures=4, nccl_incidents=2)),
        ("dense.log", SynthConfig(requests=300, seed=13, mean_interarrival_s=0.01, preempt_ratio=0.6)),
    ]:
        path = str(d / name)
        write_file(path, cfg)
        out.append(path)
    return out


@native
def test_synth_logs_give_the_same_records_events_timelines_and_bytes(synth_logs):
    for path in synth_logs:
        got = _assert_same(path)
        assert got["payloads"] and got["timelines"]


def _fixture_params():
    return list(FIXTURES)


@native
@pytest.mark.parametrize("path", _fixture_params(), ids=os.path.basename)
def test_fixtures_give_the_same_everything(path):
    _assert_same(path)


@native
def test_cri_stamps_late_for_their_header_give_the_same(tmp_path):
    """A runtime stamp after its header's second is bounded by it in Python; C takes only lines
    whose stamp is in the header's second-of-minute, in every combination with `P` parts."""
    path = tmp_path / "late.log"
    out = []
    for i, (head, stamp) in enumerate([("17:59:00", "17:59:00.5"), ("17:59:00", "17:59:01.662"),
                                       ("17:59:01", "17:59:01.9"), ("17:59:01", "17:59:03.2"),
                                       ("17:59:02", "17:59:01.999"), ("17:59:03", "17:59:03.0"),
                                       ("17:59:03", "18:00:03.1"), ("17:59:59", "18:00:00.25")]):
        cri = f"2026-12-03T{stamp}Z"
        text = f"(APIServer pid=1) INFO 12-03 {head} [async_llm.py:578] Added request r{i}."
        if i % 3 == 2:
            out.append(f"{cri} stdout P {text[:20]}\n{cri} stdout F {text[20:]}\n")
        else:
            out.append(f"{cri} stdout F {text}\n")
    path.write_text("".join(out))
    got = _assert_same(str(path))
    late = [r.ts_ns % 1_000_000_000 for r in got["records"]]
    assert late[1] == late[3] == late[7] == 999_999_999 and late[0] == 500_000_000


_TWIN = ("INFO 02-15 10:23:00 logger.py:43] Received request X: prompt: 'hi', params: SamplingParams(n=1, "
         "temperature=0.5, max_tokens=5), prompt_token_ids: [1], lora_request: None.\n")


@native
@pytest.mark.parametrize("tail", [
    "INFO 02-15 10:23:00 x.py:1] Request X\x00{at}: prompt_tokens=3, generated_tokens=2, ttft=0.1s, itl=0.01s, "
    "total_latency=0.5s\nINFO 02-15 10:23:00 scheduler.py:312] Running queue: 1 requests, waiting queue: 0 "
    "requests, free blocks: 10/512\n",
])
def test_a_summary_naming_a_twin_by_its_key_gives_the_same(tmp_path, tail):
    """A second request under a reused id is open under `<id>\\0<occurrence>`; a line naming
    that key (a NUL in an id) finished it in C under the other request's key in `_in_flight`
    (a review's differential fuzzing: a lost diagnosis and a different span set)."""
    path = tmp_path / "twin.log"
    path.write_text(_TWIN + _TWIN + tail.format(at=len(_TWIN)))
    _assert_same(str(path))


@native
def test_a_file_cut_anywhere_gives_the_same(synth_logs):
    with open(synth_logs[0], "rb") as f:
        data = f.read()
    rnd = random.Random(3)
    for _ in range(5):
        cut = rnd.randrange(len(data))
        offset, lines = 0, []
        for raw in data[:cut].splitlines(keepends=True):
            lines.append((offset, raw))
            offset += len(raw)
        _assert_same(synth_logs[0], lines)


# -- hostile input ------------------------------------------------------------------------------

SEED_MESSAGES = [msg for path in FIXTURES[-1:] for _, raw in read_lines(path)
                 for msg in [raw.decode("utf-8", "replace").split("] ", 1)[-1].rstrip("\n")]][:400]
HEADERS = ["INFO 02-15 10:23:00 scheduler.py:234] ", "INFO 02-15 10:23:00 [scheduler.py:234] ",
           "WARNING 02-15 10:23:01,123 a.py:1]", "ERROR 02-15 10:23:02 b.py:9] ", "DEBUG 12-31 23:59:59 c:1] ",
           "INFO 02-30 10:23:00 x.py:1] ", "INFO 02-15 10:23:00 [:12] ", "CRITICAL 02-15 10:23:00 d.py:2] "]
NUMBERS = st.sampled_from(["0", "7", "-3", "16", "1.5", "3.", ".5", "12.250", "9" * 30, "1" * 400, "١٢", "007"])
UNITS = st.sampled_from(["", "KB", "KiB", "MB", "GiB", "TB", "B", "ms", "s", "us", "µs", "ns", "m", "min", "mi",
                         " KB", "  ms", "Kx", "KiX", "\t"])


@st.composite
def seed_messages(draw):
    """Seed messages with their numbers, ids and separators perturbed."""
    n, u, m, v = draw(NUMBERS), draw(UNITS), draw(NUMBERS), draw(UNITS)
    rid = draw(st.sampled_from(["0x7f", "req-1", "a:b", "x,y", "", "é", "id\x1c", "cmpl-1-0"]))
    return draw(st.sampled_from([
        f"Allocated block 0x1 for request {rid}, size={n}{u}",
        f"Freed block 0x1 for request {rid}, reason={draw(st.sampled_from(['completed', '', ' ', 'a b', 'é']))}",
        f"Freed block 0x1 for request {rid}",
        f"Scheduling request {rid}: priority={n}, num_scheduled_blocks={m}, remaining_blocks=3{u}",
        f"Scheduling request {rid}: priority=0, num_scheduled_blocks=1, remaining_blocks=2, queued={n}{u}",
        f"Request {rid}: prompt_tokens={m}, generated_tokens=2, ttft={n}{u}, itl={m}{v}, total_latency={n}{v}",
        f"Preempting request {rid}: reason={draw(st.sampled_from(['kv', 'a:b', 'x,y', '']))}, preempted_blocks={m}",
        f"Running queue: {m} request{draw(st.sampled_from(['', 's', 'x']))}, waiting queue: 2 requests, "
        f"free blocks: {m}/512",
        f"GPU memory usage: {n}{u}/{m}{v} ({n}%), cache usage: {m}{u}, kv_cache blocks: 4/{m}",
        f"GPU memory usage: {n}{u} / {m}{v}  ({n}%), cache usage: {m}{u}, kv_cache blocks: 4/512",
        f"Request {rid} timed out after {n}{u}",
    ])) + draw(st.sampled_from(["", " trailing", "\r", ",", "x"] + [
        # the plugin's exact time and the engine id it states after it (seed.py's _internal)
        ", t=1796397150.761755, internal_id=cmpl-1-0-85697c83", ", t=17, internal_id=", ", t=2.5, internal_id=a:b",
        ", t=3, internal_id=" + "y" * 257, ", t=3, internal_id=" + "y" * 256, ", internal_id=z",
        ", t=1.25, internal_id=id, more", ", t=1.25, internal_id=é", ", t=4.5, internal_id=id ", ", t=4.5,internal_id=a"]))


def _parse_both(message: str):
    fast, pure = Parser(), Parser(fast=None)
    expected = pure(message, "INFO", "x.py:1")  # never raises: an overflowing number is malformed
    got = fast(message, "INFO", "x.py:1")
    assert got == expected and type(got) is type(expected), message
    assert fast.snapshot() == pure.snapshot()
    once = Parser()
    assert once.parse(message) == pure.__class__(fast=None)(message)  # the C call, defaults for level/origin
    assert once.parse(message, "INFO", "x.py:1") == expected


@native
@settings(max_examples=600, deadline=None)
@given(seed_messages())
def test_parse_fast_path_matches_on_perturbed_seed_lines(message):
    _parse_both(message)


_CHATTER_STARTS = ["Route: ", "Waiting for ", "EngineCore waiting", "Found ", "Using ", "Padding batch",
                   "Memory usage", "Engine 000: ", "Received request x", "Avg prompt", "[shutdown] ", "", "É", "x",
                   # keys a rule claims, with and without their guards' prefixes (GUARDS)
                   "Engine", "EngineCore failed to start", "EngineCore loop active", "Memory profiling takes ",
                   "Memo", "Processed prompts", "Process ", "Initializing a", "Initialized", "Worker", "torch",
                   "GPU KV cache size: ", "Requ", "Sche"]


@native
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(
    st.sampled_from(_CHATTER_STARTS),
    st.text(max_size=30),
    st.sampled_from(["INFO", "DEBUG", "WARNING", "ERROR", "CRITICAL", "WARN", ""]),
    st.sampled_from(["launcher.py:28", "core.py:688", "gpu_model_runner.py:2131", "uvicorn.access",
                     "vllm.v1.engine.core", "vllm.model_executor.x", "x.py:1", ""])), min_size=1, max_size=12))
def test_parse_fast_path_matches_on_chatter(lines):
    """vLLM modules' chatter answered in C (`chatter` in _fastseed.c) against the Python rules,
    each line twice: the second time the origin's module is cached, and the C may answer."""
    fast, pure = Parser(), Parser(fast=None)
    for start, rest, level, origin in lines + lines:
        message = start + rest
        expected = pure(message, level, origin)
        got = fast.parse(message, level, origin)
        assert got == expected and type(got) is type(expected), (message, level, origin)
    assert fast.snapshot() == pure.snapshot()


_HEADERLESS_STARTS = ["INFO:     ", "WARNING:  ", "ERROR:\t", "INFO:", "INFO: ", "DEBUG:    ", "CRITICAL: ",
                      "[W1115 10:00:00.1 x.cpp:1", "[W ", "[W", "[E1115 ", "[F1115 ", "[rank0]:[W1115 ", "[PG 1",
                      "[", "Processed prompts: ", "Loading safetensors", "Process ", "Traceback (most recent",
                      "Engine 000: ", "2 Engines Aggregated: ", "x.py:1: UserWarning: ", "", "x"]
_HEADERLESS_PARTS = ["10.0.0.7:5123", " - \"", "POST", "GET", " ", "/v1/chat/completions", "?a=1", " HTTP/1.1",
                     " HTTP/", "\" ", "200", "4", " OK", "it/s]", "s/it]", "] ", "\n", "[E", "[PG ", "█", "%|",
                     "\t", "\x1c", "é", "0"]


@native
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_HEADERLESS_STARTS),
                          st.lists(st.one_of(st.sampled_from(_HEADERLESS_PARTS), st.text(max_size=6)), max_size=12)),
                min_size=1, max_size=8))
def test_parse_fast_path_matches_on_headerless_lines(lines):
    """Lines with no vLLM header (uvicorn, torch glog, tqdm, ...) answered in C (`headerless` in
    _fastseed.c) against the Python rules and fallback."""
    fast, pure = Parser(), Parser(fast=None)
    for start, parts in lines:
        message = start + "".join(parts)
        expected = pure(message, "", "")
        got = fast.parse(message, "", "")
        assert got == expected and type(got) is type(expected), message
        got = fast.parse(message)  # the same line, level and origin left out
        assert got == expected and type(got) is type(expected), message
        pure(message)
    assert fast.snapshot() == pure.snapshot()


@native
@pytest.mark.parametrize("message", [  # one per branch of `headerless` and `access_line`, and its near misses
    'INFO:     1.2.3.4:5 - "GET /a?b HTTP/1.1" 200 OK', 'WARNING:  h - "GET / HTTP/2" 404',
    'ERROR:\th - "GET / HTTP/1.0" 500', 'INFO:h - "GET / HTTP/1.1" 200', 'INFO:     h - "GET / HTTP/1.1" 20',
    'INFO:     h - "GET / HTTP/1.1"200', 'INFO:     h - "GET / HTTP/1.1" 20x', 'INFO:     h - "GET / HTTP/" 200', 'INFO:     h - "GET  / HTTP/1.1" 200',
    'INFO:     h -  "GET / HTTP/1.1" 200', 'INFO:     h\t- "GET / HTTP/1.1" 200', 'INFO:     é - "GET / HTTP/1.1" 200',
    'INFO:     Started server process [7]', 'DEBUG:    h - "GET / HTTP/1.1" 200',
    "[W1115 10:00:00.1 x.cpp:1] Warning: w", "[W 1 x.cpp:1] w", "[W1115 x.cpp:1]w", "[Wx 1 x.cpp:1] w",
    "[W1115 10:00:00.1 x.cpp:1] [PG 0 Rank 1] w", "[W1115 1 x.cpp:1] [E w", "[W1115 1 x.cpp:1] [F w",
    "[W1115 10:00:00.1 x.cpp:1] Warning: a long line that only then says [E at 60",
    "[W1115 1 x.cpp:1] w\n[W1115 1 x.cpp:1] w", "[W1115 1 x.cpp:1\n] w", "[W1] ", "[W1]  ",
    "Processed prompts: 100%|██| 2/2 [00:01<00:00, 1.50it/s]", "Loading: 1/2 [00:10<00:10, 10.0s/it]",
    "x it/s] y", "x s/it] y", "x it/s y", "Process 7: it/s]", "Process x:\nTraceback it/s]",
])
def test_parse_fast_path_matches_on_headerless_near_misses(message):
    fast, pure = Parser(), Parser(fast=None)
    expected = pure(message, "", "")
    got = fast.parse(message, "", "")
    assert got == expected and type(got) is type(expected)
    assert fast.snapshot() == pure.snapshot()


@native
def test_headerless_access_progress_and_glog_lines_take_the_c_path():
    """The equivalence tests compare answers, and a C that declines gives Python's answer; this
    checks the C is the one answering: a Parse whose Python fallbacks only record being called."""
    from bridge.parse import _FAST, ParseStats
    called = []
    counts: dict[str, int] = {}
    parse = _FAST.Parse(ParseStats(), counts, lambda *a: called.append(a), lambda *a: called.append(a))
    access = [parse(f'{level}:     10.0.0.7:5123 - "POST /v1/chat/completions?x=1 HTTP/1.1" 200 OK', "", "")
              for level in ("INFO", "WARNING", "ERROR")]
    glog = [parse(m, "", "") for m in ("[W1115 10:00:00.123 ProcessGroupNCCL.cpp:1250] Warning: TORCH_NCCL_AVOID",
                                       "[W1] w", "[W1115 10:00:00.1 x.cpp:1] Warning: a long line, and [E at 60")]
    bars = [parse(m, "", "") for m in ("Processed prompts:  50%|█████     | 1/2 [00:01<00:01, 1.00it/s]",
                                       "Loading: 1/2 [00:10<00:10, 10.0s/it]")]
    assert called == []
    assert {(e.method, e.path, e.status) for e in access} == {("POST", "/v1/chat/completions", 200)}
    assert [e.kind for e in glog + bars] == ["torch_log"] * 3 + ["noise"] * 2
    assert counts == {"http_access": 3, "torch_log": 3, "noise": 2}
    parse("[W1115 10:00:00.123 x.cpp:1] Warning: two\nlines", "", "")  # joined: Python decides
    assert len(called) == 1


@native
@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["Allo", "Free", "Sche", "Requ", "Runn", "Pree", "GPU ", "A", "R", "Rq"]), st.text(max_size=80))
def test_parse_fast_path_matches_on_any_text(prefix, rest):
    _parse_both(prefix + rest)


@native
def test_parse_fast_path_matches_on_every_fixture_message():
    for path in FIXTURES:
        for _, raw in read_lines(path):
            _parse_both(raw.decode("utf-8", "replace").rstrip("\n").split("] ", 1)[-1])


def _decode_both(raws: list[bytes]):
    lines, offset = [], 0
    for raw in raws:
        lines.append((offset, raw))
        offset += len(raw)
    out = []
    for fast in (stream_mod.FAST, None):
        s = RecordStream(Decoder(mtime=1.7e9), fast=fast)
        records = list(s.over(lines))
        out.append((records, s.decoder.stats, s.joiner.stats))
    assert out[0] == out[1]
    # one line at a time, as the live agent feeds it
    per_line = []
    for fast in (stream_mod.FAST, None):
        s = RecordStream(Decoder(mtime=1.7e9), fast=fast)
        got, held = [], []  # held: where a resume must re-read from, after each line (a part held)
        for offset, raw in lines:
            got += s(raw, offset)
            held.append(s.held_position)
        got += s.flush()
        per_line.append((got, held, s.decoder.stats, s.joiner.stats))
    assert per_line[0] == per_line[1]


LINE_PARTS = st.one_of(
    st.sampled_from(HEADERS),
    st.sampled_from(SEED_MESSAGES or ["Allocated block 1 for request 2, size=16KB"]),
    st.binary(max_size=40),
    st.sampled_from([b"\r", b"\x1b[32m", b"\xff\xfe", b"\xc3", "é".encode(), b"\x00", b"{", b" ", b"\t",
                     b"Traceback (most recent call last):", b"  File \"x.py\", line 1", b"ValueError: x",
                     b"Memory profiling takes 1s", b"(APIServer pid=1) ", b"2025-01-01T00:00:00Z "]),
)


@st.composite
def hostile_lines(draw):
    lines = []
    for _ in range(draw(st.integers(1, 12))):
        parts = draw(st.lists(LINE_PARTS, min_size=1, max_size=4))
        raw = b"".join(p.encode() if isinstance(p, str) else p for p in parts).replace(b"\n", b" ")
        lines.append(raw + draw(st.sampled_from([b"\n", b"\r\n", b"\n", b""])))
    return lines


@native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_lines())
def test_decode_fast_path_matches_on_hostile_lines(raws):
    _decode_both(raws)


@native
def test_decode_fast_path_matches_on_huge_and_truncated_lines():
    header = HEADERS[0].encode()
    _decode_both([header + b"Allocated block 1 for request 2, size=16KB" + b"x" * 5_000_000 + b"\n",
                  header + b"ok\n", header[:10], b"\n", header + b"\xff" * 1000 + b"\n", header + b"tail"])


@native
@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(SEED_MESSAGES[:60]), min_size=1, max_size=50),
       st.randoms(use_true_random=False))
def test_assemble_fast_path_matches_on_shuffled_and_mutated_logs(messages, rnd):
    lines = []
    ts = 1_700_000_000
    for msg in messages:
        if rnd.random() < 0.3:
            msg = msg[: rnd.randrange(len(msg) + 1)]
        ts += rnd.choice([0, 0, 0, 1, -1, 5, 700])
        lines.append(_header(ts * 10**9, "INFO", "x.py:1", msg).encode() + b"\n")
    offset, pairs = 0, []
    for raw in lines:
        pairs.append((offset, raw))
        offset += len(raw)
    _assert_same("/var/log/pods/ns_pod_0123456789ab/vllm/0.log", pairs)


# -- CRI framing (containerd, CRI-O): `<RFC3339Nano> stdout|stderr P|F <text>` ---------------------


def _cri_files():
    """The fixtures whose framing is CRI, and each plain fixture wrapped as containerd would store it
    (stamps in nanoseconds, one line in five split into a `P` and an `F` part)."""
    cri, rewrapped = [], []
    for path in FIXTURES:
        lines = list(read_lines(path))
        first = next((raw for _, raw in lines if raw.strip()), b"")
        if detect(first.decode("utf-8", "replace").rstrip("\n")) == CRI:
            cri.append(pytest.param(path, None, id=os.path.basename(path)))
            continue
        rnd, ts, raws = random.Random(path), 1_739_614_980 * 10**9, []
        for _, raw in lines:
            ts += rnd.choice([0, 1, 999_999, 10**8, 10**9, 3 * 10**9])
            text = raw.rstrip(b"\n")
            stream = rnd.choice([b"stdout", b"stderr"])
            if len(text) > 2 and rnd.random() < 0.2:
                cut = rnd.randrange(1, len(text))
                raws.append(_cri_stamp(ts).encode() + b" " + stream + b" P " + text[:cut] + b"\n")
                text = text[cut:]
            raws.append(_cri_stamp(ts).encode() + b" " + stream + b" F " + text + b"\n")
        rewrapped.append(pytest.param(path, raws, id="cri-" + os.path.basename(path)))
    return cri + rewrapped


@native
@pytest.mark.parametrize("path, raws", _cri_files())
def test_decode_fast_path_matches_on_cri_fixtures(path, raws):
    if raws is None:
        raws = [raw for _, raw in read_lines(path)]
    _decode_both(raws)


@native
def test_decode_fast_path_matches_on_synth_cri_logs(synth_logs, tmp_path):
    paths = [p for p in synth_logs if p.endswith("cri.log")]
    for k, ratio in enumerate([0.0, 0.5, 1.0]):  # no partial lines, many, all
        path = str(tmp_path / f"cri-{k}.log")
        write_file(path, SynthConfig(requests=120, seed=20 + k, cri=True, cri_partial_ratio=ratio, oom_failures=2,
                                     nccl_incidents=1, timeout_ratio=0.1))
        paths.append(path)
    for path in paths:
        _decode_both([raw for _, raw in read_lines(path)])


@native
def test_a_cri_log_rotated_between_parts_gives_the_same(tmp_path):
    """A kubelet rotation after any physical line of a CRI log with many `P` parts, stdout and
    stderr interleaved: the rotated file's pending parts handed to the next file's decoder
    (`Decoder.carry`, `adopt`) give the same records, counters and held positions on both
    paths, and the same messages as the file not rotated."""
    from bridge.core.position import GEN_SHIFT

    path = str(tmp_path / "cri.log")
    write_file(path, SynthConfig(requests=40, seed=31, cri=True, cri_partial_ratio=0.6, timeout_ratio=0.1))
    raws = [raw for _, raw in read_lines(path)]
    rng = random.Random(31)
    for k, raw in enumerate(raws):  # a third of the lines on stderr: each stream's parts join apart
        if rng.random() < 0.3:
            raws[k] = raw.replace(b" stdout ", b" stderr ", 1)
    whole = [r.message for r in RecordStream(Decoder(mtime=1.7e9), fast=None).over(
        list(zip(accumulate(map(len, raws), initial=0), raws)))]
    cuts = [k for k in range(1, len(raws)) if b" P " in raws[k - 1][:45]][:40] + rng.sample(range(len(raws)), 10)
    carried = 0
    for cut in cuts:
        out = []
        for fast in (stream_mod.FAST, None):
            older = list(zip(accumulate(map(len, raws[:cut]), initial=0), raws[:cut]))
            newer = list(zip(accumulate(map(len, raws[cut:]), initial=1 << GEN_SHIFT), raws[cut:]))
            first = RecordStream(Decoder(mtime=1.7e9), fast=fast)
            got, held = list(first.over(older, carry=True)), []
            carry = first.decoder.carry()
            second = RecordStream(Decoder(mtime=1.7e9), fast=fast)
            if carry is not None:
                second.decoder.adopt(carry)
            for offset, raw in newer:
                got += second(raw, offset)
                held.append(second.held_position)
            got += second.flush()
            out.append((got, held, carry, first.decoder.stats, second.decoder.stats, second.joiner.stats))
        assert out[0] == out[1], cut
        assert [r.message for r in out[0][0]] == whole, cut
        carried += out[0][2] is not None
    assert carried >= 40  # every cut after a `P` part left one pending


CRI_SECOND = "2025-02-15T10:23:00"
CRI_OTHER_SECONDS = st.sampled_from([
    "2025-02-15T10:23:01", "2025-02-15T10:22:59", "2025-02-16T10:23:00", "2025-12-31T23:59:59",
    "1900-01-01T00:00:00", "1800-06-01T12:00:00",  # a negative base; one too far back for the C
    "2200-01-01T00:00:00", "9999-12-31T23:59:59",  # too far ahead for the C's int64 margin
    "2262-04-11T23:47:16", "1677-09-21T00:12:44",  # the last seconds an int64 of ns holds
    "2025-13-15T10:23:00", "2025-02-30T10:23:00", "2025-02-15 10:23:00", "2025-02-15T10:23", "2025-02-15T1:23:00",
    "2025-02-15T10:23:0x", "٢٠٢٥-02-15T10:23:00", "", "x"])
CRI_FRACTIONS = st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=12).map(lambda d: "." + d))
CRI_BAD_FRACTIONS = st.sampled_from([".", ".x", ",5", ".5.5", ".١", ". 5"])
CRI_ZONES = st.one_of(
    st.sampled_from(["Z", "Z", "z", ""]),
    st.tuples(st.sampled_from("+-"), st.text("0123456789", min_size=2, max_size=2), st.sampled_from([":", ""]),
              st.text("0123456789", min_size=2, max_size=2)).map("".join))
CRI_BAD_ZONES = st.sampled_from(["+02:0", "+020", "+02000", "+0200x", "+02:00Z", "+2:00", "+02-00", "+02::00", "Zz",
                                 "ZULU", "Z0", "\t", "\r", "é", "\x1b", "+", "-", "UTC"])
CRI_STREAMS = st.sampled_from(["stdout", "stderr"])
CRI_BAD_STREAMS = st.sampled_from(["stdin", "", "STDOUT", "stdoutx", "std\x1bout", "stdou"])
CRI_BAD_TAGS = st.sampled_from(["P", "P", "X", "", "FF", "f", "F\t"])
CRI_HEADERS = HEADERS + ["DEBUG 02-30 99:99:99 [x.py:1] ", "INFO 02-15 10:23:00.5 x.py:12]",
                         "WARNING 01-01 00:00:00 [a/b.py:7] "] + ["INFO 02-15 10:23:00 [x.py:1] ",
                                                                  "ERROR 02-15 10:23:00 [x.py:1] "] * 3
# lines that open a group, and lines that continue one (same level, origin and second)
CRI_GROUP_MESSAGES = ["Memory profiling takes 1.5 seconds", "the current vLLM instance can use 10GiB",
                      "model weights take 1GiB", "Traceback (most recent call last):", '  File "x.py", line 1',
                      "ValueError: x"]
CRI_TEXT = st.tuples(st.sampled_from(CRI_HEADERS), st.sampled_from(SEED_MESSAGES[:80] + CRI_GROUP_MESSAGES * 8),
                     st.sampled_from(["", "", "", "\r", " trailing", "é", "\x1b[0m", "\rmid"])
                     ).map(lambda t: "".join(t).encode())
CRI_BAD_TEXT = st.lists(LINE_PARTS, min_size=1, max_size=3).map(
    lambda ps: b"".join(p.encode() if isinstance(p, str) else p for p in ps))


@st.composite
def cri_lines(draw):
    """CRI lines around the common one, each field of which may be perturbed: stamps in other
    seconds, with 1–12 fraction digits or none, every zone form and garbage; both streams and
    others; `F`, `P` and other tags; fields missing; text with and without vLLM's header (ERROR
    lines that start a group, non-ASCII, ESC, `\r`)."""
    lines = []
    if draw(st.sampled_from([True] * 9 + [False])):  # a first line that makes the framing CRI
        lines.append(f"{CRI_SECOND}.1Z stdout F INFO 02-15 10:23:00 [x.py:1] start\n".encode())
    for _ in range(draw(st.integers(1, 12))):
        bad = set(draw(st.lists(st.sampled_from(["second", "fraction", "zone", "stream", "tag", "text", "shape"]),
                                max_size=2)))
        stamp = (draw(CRI_OTHER_SECONDS) if "second" in bad else CRI_SECOND)
        stamp += draw(CRI_BAD_FRACTIONS if "fraction" in bad else CRI_FRACTIONS)
        stamp += draw(CRI_BAD_ZONES if "zone" in bad else CRI_ZONES)
        stream = draw(CRI_BAD_STREAMS if "stream" in bad else CRI_STREAMS).encode()
        tag = draw(CRI_BAD_TAGS).encode() if "tag" in bad else b"F"
        text = draw(CRI_BAD_TEXT if "text" in bad else CRI_TEXT)
        fields = [stamp.encode(), stream, tag, text]
        if "shape" in bad:  # fields missing, or two spaces
            raw = draw(st.sampled_from([b" ".join(fields[:k]) for k in (1, 2, 3)] +
                                       [b" ".join(fields[:k]) + b" " for k in (1, 2, 3)] + [b"  ".join(fields)]))
        else:
            raw = b" ".join(fields)
        lines.append(raw.replace(b"\n", b" ") + draw(st.sampled_from([b"\n", b"\n", b"\r\n", b""])))
    return lines


@native
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cri_lines())
def test_decode_fast_path_matches_on_perturbed_cri_lines(raws):
    _decode_both(raws)


_CRI_HEAD = "INFO 02-15 10:23:00 [x.py:1] hello"
CRI_NEAR_MISSES = [  # one per branch of `cri_frame` in _fastdecode.c, and its near misses
    *(f"{CRI_SECOND}{tail} stdout F {_CRI_HEAD}" for tail in [
        "", ".1", ".123456789", ".1234567891", ".000000000001", "Z", "z", ".5Z", ".5z", "+02:00", "-02:00", "+0200",
        "-0530", ".5+02:00", "+99:99", "-00:00", "+00:60",
        ".", ".Z", ".x", ",5", ". 5", "+02:0", "+020", "+02000", "+0200x", "+02:00Z", "+02:00:00", "+02-00", "+02::0",
        "+2:00", "Zz", "Z0", "z+02:00", "ZULU", "+", "-", "\t", "é", "\x1b", "\r"]),
    "2025-02-15T10:23:01.5Z stdout F " + _CRI_HEAD, "2025-02-15T10:22:59.5Z stdout F " + _CRI_HEAD,
    "2025-02-15T10:23 stdout F " + _CRI_HEAD, "2025-02-15T10:23:0 stdout F " + _CRI_HEAD,
    "2025-13-15T10:23:00Z stdout F " + _CRI_HEAD, " stdout F " + _CRI_HEAD,
    "1900-01-01T00:00:00.5-01:00 stdout F " + _CRI_HEAD,  # a negative base
    "2262-04-11T23:47:16.9Z stdout F " + _CRI_HEAD, "2262-04-11T23:47:16-01:00 stdout F " + _CRI_HEAD,  # past int64
    "1677-09-21T00:12:44+01:00 stdout F " + _CRI_HEAD,
    *(f"{CRI_SECOND}.5Z {fields}" for fields in [
        "stderr F " + _CRI_HEAD, "stdout P " + _CRI_HEAD, "stdin F " + _CRI_HEAD, "stdout X " + _CRI_HEAD,
        "stdout FF " + _CRI_HEAD, "stdout  F " + _CRI_HEAD, "stdout F  " + _CRI_HEAD, "stdout\tF " + _CRI_HEAD,
        "stdout F", "stdout F ", "stdout", "stdout F hello", "stdout F ERROR 02-15 10:23:00 [x.py:1] boom",
        "stdout F CRITICAL 02-15 10:23:00 [x.py:1] boom", "stdout F INFO 02-15 10:23:00 [x.py:1] Memory profiling takes",
        "stdout F INFO 02-15 10:23:00 [x.py:1] Memory profiling takes 1s\n"  # a group, and its continuation
        f"{CRI_SECOND}.2Z stdout F INFO 02-15 10:23:00 [x.py:1] the current vLLM instance can use 10GiB",
        "stdout F ERROR 02-15 10:23:00 [x.py:1] Traceback (most recent call last):\n"
        f"{CRI_SECOND}.2Z stderr F ERROR 02-15 10:23:00 [x.py:1]   File \"x.py\", line 1",
        "stdout F WARNING 02-15 10:23:00 [x.py:1] a\n"  # not a group: the next line is the C's too
        f"{CRI_SECOND}.2Z stdout F WARNING 02-15 10:23:00 [x.py:1]   File \"x.py\", line 1",
        "stdout F INFO 02-15 10:23:00 [x.py:1] é", "stdout F INFO 02-15 10:23:00 [x.py:1] \x1b[0m",
        "stdout F INFO 02-15 10:23:00 [x.py:1] a\r", "stdout F (APIServer pid=1) " + _CRI_HEAD,
        "stdout F {\"level\": \"INFO\"}", "stdout F INFO 02-30 10:23:00 [x.py:1] not a date, not read"]),
]


@native
@pytest.mark.parametrize("line", CRI_NEAR_MISSES)
def test_decode_fast_path_matches_on_cri_near_misses(line):
    """Each line twice (the first of a new second refreshes the cache, the second may be the C's)
    after a common CRI line, then a line with no framing at all (timed from the last stamp:
    `_last_ts` shows), then the common line again (the cached second shows)."""
    first = f"{CRI_SECOND}.1Z stdout F {_CRI_HEAD}\n".encode()
    raws = [part.encode() + b"\n" for part in line.split("\n")]  # a few entries are two lines
    _decode_both([first, *raws, *raws, b"no framing here\n", first, b"no framing here\n"])


@native
@pytest.mark.parametrize("framing, unwrap", [(PLAIN, CriUnwrapper), (CRI, None), (CRI, DockerUnwrapper),
                                             ("".join(["c", "ri"]), CriUnwrapper), (None, CriUnwrapper)])
def test_decode_fast_path_reads_the_framing_python_acts_on(framing, unwrap):
    """The C goes by `_framing` (by identity) and by `_unwrap`, which is what Decoder acts on: state
    where the two disagree (not made by Decoder itself) is declined, and Python's answer stands."""
    cri, plain = f"{CRI_SECOND}.1Z stdout F {_CRI_HEAD}\n".encode(), _CRI_HEAD.encode() + b"\n"
    lines = [cri, plain, plain, cri, cri]  # each twice: the header clock's and Rfc3339's caches filled
    got = []
    for fast in (stream_mod.FAST, None):
        s = RecordStream(Decoder(mtime=1.7e9), fast=fast)
        s(lines[0], 0)
        s.decoder._framing, s.decoder._unwrap = framing, unwrap() if unwrap else None
        got.append(([r for raw in lines for r in s(raw, 100)] + s.flush(), s.decoder.stats, s.decoder._last_ts))
    assert got[0] == got[1]


@native
def test_common_cri_lines_take_the_c_path():
    """The equivalence tests compare answers, and a C that declines gives Python's answer; this
    checks the C is the one answering the common CRI line: records whose Python fallback only
    records being called. The header's own stamp is not read (the runtime's is the time), so
    neither an impossible date nor a second the HeaderClock has not cached sends a line to Python."""
    decoder, joiner = Decoder(mtime=1.7e9), Joiner()
    first = f"{CRI_SECOND}.000000001Z stdout F INFO 02-15 10:23:00 [x.py:1] first\n".encode()
    assert RecordStream(decoder, joiner)(first, 0)  # Python: framing detected, the second cached
    base = 1_739_614_980 * 10**9
    hour = 3600 * 10**9
    cases = [  # stamp tail, stream, header, the record's ts
        (".123456789Z", "stdout", "INFO 02-15 10:23:00 [scheduler.py:234] ", base + 123_456_789),
        ("Z", "stderr", "DEBUG 02-15 10:23:00 x.py:1] ", base),
        (".5z", "stdout", "WARNING 02-15 10:23:00,123 [a/b.py:12]", base + 500_000_000),
        (".123456789123Z", "stdout", "INFO 02-30 10:23:00 [x.py:1] ", base + 123_456_789),  # 02-30: not read
        (".000001+02:00", "stdout", "INFO 01-01 00:00:00 [x.py:1] ", base + 1_000 - 2 * hour),  # nor another second
        (".25-0530", "stderr", "INFO 02-15 10:23:00 [x.py:1] ", base + 250_000_000 + 5 * hour + hour // 2),
        ("-05:30", "stdout", "INFO 02-15 10:23:00 [x.py:1] ", base + 5 * hour + hour // 2),
        ("+0000", "stdout", "INFO 02-15 10:23:00 [x.py:1] ", base),
        ("", "stdout", "INFO 02-15 10:23:00 [x.py:1] ", base),
        (".7", "stdout", "INFO 02-15 10:23:00 [x.py:1] ", base + 700_000_000),
    ]
    lines, expected, offset = [], [], len(first)
    for tail, stream, header, ts in cases:
        raw = f"{CRI_SECOND}{tail} {stream} F {header}message {len(lines)}\n".encode()
        level, origin = header.split(" ")[0], header.split("[")[-1].split("]")[0].split(" ")[-1]
        expected.append(Record(ts, CLOCK_RUNTIME, level, origin, f"message {len(lines)}", offset, offset + len(raw)))
        lines.append((offset, raw))
        offset += len(raw)
    called = []
    got = list(stream_mod.FAST.records(decoder, joiner, lambda *a: called.append(a) or (), lines))
    assert called == []
    assert got == expected
    assert (decoder.stats.lines, decoder.stats.records, decoder.stats.prefixed) == (1 + len(cases), 1 + len(cases), 0)
    assert decoder._last_ts == expected[-1].ts_ns
    assert decoder._clock._cache_key == ""  # the header clock was never asked
    # a line the runtime split (`P` parts, then the `F` that ends them) is one record, timed
    # and placed at its first part, as containerd's reader joins it
    p1 = f"{CRI_SECOND}.1Z stdout P INFO 02-15 10:23:00 [x.py:1] a".encode() + b"\n"
    p2 = f"{CRI_SECOND}.15Z stdout P b".encode() + b"\n"  # the same stream: another's is never joined in
    f3 = f"{CRI_SECOND}.2Z stdout F c".encode() + b"\n"
    joined = list(stream_mod.FAST.records(decoder, joiner, lambda *a: called.append(a) or (),
                                          [(1000, p1), (1000 + len(p1), p2), (1000 + len(p1) + len(p2), f3)]))
    assert called == []
    assert joined == [Record(base + 100_000_000, CLOCK_RUNTIME, "INFO", "x.py:1", "abc", 1000,
                             1000 + len(p1) + len(p2) + len(f3))]
    assert (decoder.stats.lines, decoder.stats.partials_joined, decoder._parts) == (4 + len(cases), 2, [])
    # a part of the other stream while one is held: which line it joins is Python's to say
    p4 = f"{CRI_SECOND}.3Z stdout P d".encode() + b"\n"
    p5 = f"{CRI_SECOND}.4Z stderr F e".encode() + b"\n"
    list(stream_mod.FAST.records(decoder, joiner, lambda *a: called.append(a) or (), [(5000, p4), (5000 + len(p4), p5)]))
    assert [raw for raw, _ in called] == [p5]
    called.clear()
    decoder._parts.clear()
    # and each of these is Python's: a new second, an ERROR, a part that ends in another second
    decline = [f"2025-02-15T10:23:01.1Z stdout F INFO 02-15 10:23:01 [x.py:1] c",
               f"2025-02-15T10:23:01.3Z stdout F ERROR 02-15 10:23:01 [x.py:1] d"]
    for raw in decline:
        list(stream_mod.FAST.records(decoder, joiner, lambda *a: called.append(a) or (), [(0, raw.encode() + b"\n")]))
    assert len(called) == len(decline)


# -- vLLM V1's process prefix: `(APIServer pid=1) INFO …` -------------------------------------------

V1_PREFIXES = [b"(APIServer pid=1) ", b"(EngineCore_DP0 pid=7) ", b"(VllmWorker rank=0 pid=5) ",
               b"(VllmWorker TP0 pid=5) ", b"(RayWorkerWrapper pid=206994, ip=10.0.0.1) "]


def _with_prefixes(raws: list[bytes], cri: bool) -> list[bytes]:
    """Each logical line with a V1 process prefix in front of its text, as V1 prints it (in a CRI
    file: after the runtime's fields, and not on the part that continues a `P` one)."""
    out, whole = [], True
    for k, raw in enumerate(raws):
        prefix = V1_PREFIXES[k % len(V1_PREFIXES)]
        if not cri:
            out.append(prefix + raw if raw.strip() else raw)
            continue
        fields = raw.split(b" ", 3)
        if len(fields) == 4 and whole:
            fields[3] = prefix + fields[3]
        out.append(b" ".join(fields))
        whole = len(fields) < 3 or fields[2] != b"P"
    return out


@native
@pytest.mark.parametrize("cri", [False, True], ids=["plain", "cri"])
def test_decode_fast_path_matches_on_prefixed_fixtures_and_synth_logs(synth_logs, cri):
    """Every fixture (rewrapped as containerd stores it for `cri`, as _cri_files does) and synth
    log, each logical line given a V1 process prefix; the upstream V1 fixtures have theirs."""
    files = [[raw for _, raw in read_lines(p)] for p in FIXTURES + synth_logs
             if (detect(next((r for _, r in read_lines(p) if r.strip()), b"").decode("utf-8", "replace")) == CRI) == cri]
    if cri:
        files += [p.values[1] for p in _cri_files() if p.values[1] is not None]
    for raws in files:
        _decode_both(_with_prefixes(raws, cri))


V1_HEAD = "INFO 02-15 10:23:00 [x.py:1] hello"
PROCESS_NAMES = st.one_of(
    st.sampled_from(["APIServer", "EngineCore_DP0", "VllmWorker", "RayWorkerWrapper", "Worker_TP0", "a", "_", "Z9",
                     "a.b-c_d", "x-", "x.", "1x", "-x", ".x", "", "é", "A=B", "A:B", "A/B", "A\x1b", "A\r", "A(", "A)"]),
    st.text("aZ_0.-=é", min_size=1, max_size=6))
PROCESS_WORDS = st.one_of(
    st.sampled_from(["rank=0", "TP0", "pid=5", "pid=", "pid=5x", "a.b-c", "_x", "x=", "=x", "0x", "-x", "", "é",
                     "ip=1", "pid=5,", "x)", "rank:0"]),
    st.text("aZ_0.-=:é", min_size=1, max_size=5))
PROCESS_PIDS = st.sampled_from(["pid=1", "pid=206994", "pid=007", "pid=", "pid=x", "pid=1x", "pid=١", "PID=1", "pid1",
                                "pid=1 ", "pid=-1"])
PROCESS_IPS = st.one_of(
    st.sampled_from(["", "", "", ", ip=10.0.0.1", ", ip=fe80::1", ", ip=ABCDEF", ", ip=", ", ip=g", ", ip=1.2.3.4x",
                     ",ip=1", ", ip=1 ", ", IP=1", ", ip=1, ip=2", ","]),
    st.text("0aF:.g ,", max_size=6).map(lambda t: ", ip=" + t))
PROCESS_CLOSES = st.sampled_from([")", ")", ")", "", "))", "]", ") )"])
PROCESS_GAPS = st.sampled_from([" ", " ", " ", "", "  ", "\t", "\r", "x ", "[rank0]: ", "(APIServer pid=1) ", "é "])
PROCESS_BEFORE = st.sampled_from(["", "", "", "", "2025-02-15T10:23:00Z ", "2025-02-15 10:23:00,123 ", "junk ", " ",
                                  "(", "\x1b[32m", "é"])
PROCESS_HEADS = st.sampled_from(CRI_HEADERS + ["INFO:     started", "", "Traceback (most recent call last):",
                                               "{\"level\": \"INFO\"}"])
PROCESS_MESSAGES = st.sampled_from(SEED_MESSAGES[:40] + CRI_GROUP_MESSAGES * 4 + ["", "é", "\x1b[0m", "a\r"])


@st.composite
def prefixed_lines(draw):
    """Lines around `(APIServer pid=1) INFO …`, in a plain or a CRI file, each part of which may
    be perturbed: the name, the extra words (`rank=0`, `TP0`, a `pid=5` before the real one), the
    pid and the Ray address, the `)`, what lies between it and the header, what comes before it,
    the header itself (ERROR ones start a group) and the message (non-ASCII, ESC, `\r`)."""
    cri = draw(st.booleans())
    frame = (lambda text: f"{CRI_SECOND}.5Z stdout F {text}") if cri else (lambda text: text)
    lines = [frame(f"(APIServer pid=1) {V1_HEAD}")]  # the framing known, the second cached
    for _ in range(draw(st.integers(1, 10))):
        words = "".join(" " + w for w in draw(st.lists(PROCESS_WORDS, max_size=3)))
        prefix = f"({draw(PROCESS_NAMES)}{words} {draw(PROCESS_PIDS)}{draw(PROCESS_IPS)}{draw(PROCESS_CLOSES)}"
        if draw(st.integers(0, 3)) == 0:  # most lines are the common one, or almost
            prefix = draw(st.sampled_from([p.decode().rstrip(" ") for p in V1_PREFIXES]))
        text = draw(PROCESS_BEFORE) + prefix + draw(PROCESS_GAPS) + draw(PROCESS_HEADS) + draw(PROCESS_MESSAGES)
        lines.append(frame(text.replace("\n", " ")))
    return [line.encode() + draw(st.sampled_from([b"\n", b"\n", b"\r\n", b""])) for line in lines]


@native
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefixed_lines())
def test_decode_fast_path_matches_on_perturbed_process_prefixes(raws):
    _decode_both(raws)


PREFIX_NEAR_MISSES = [  # one per branch of `process_prefix`, `pid_close` and `word_end`, and their near misses
    # `(` and the name's first character
    "(APIServer pid=1) ", "[APIServer pid=1] ", "APIServer pid=1) ", "(1x pid=1) ", "( x pid=1) ", "(-x pid=1) ",
    "(.x pid=1) ", "(_ pid=1) ", "(é pid=1) ", "(", "(A",
    # the name: a run of [\w.-], then a space
    "(a.b-c_D9 pid=1) ", "(A=B pid=1) ", "(A:B pid=1) ", "(A/B pid=1) ", "(A\tpid=1) ", "(A\x1c pid=1) ", "(A) ",
    # ` pid=\d+`
    "(A pid=1) ", "(A pid=0123456789) ", "(A pid=) ", "(A pid=x) ", "(A pid=1x) ", "(A pid=1 ) ", "(A PID=1) ",
    "(A pid1) ", "(A pid =1) ", "(A pid=-1) ", "(A pid", "(A pid=", "(A pid=1",
    # `(?:, ip=[0-9A-Fa-f.:]+)?`
    "(R pid=1, ip=10.0.0.1) ", "(R pid=1, ip=fe80::1:AB) ", "(R pid=1, ip=...:::) ", "(R pid=1, ip=) ",
    "(R pid=1, ip=g) ", "(R pid=1, ip=10.0.0.1x) ", "(R pid=1, ip=10.0.0.1 ) ", "(R pid=1,ip=1) ", "(R pid=1, IP=1) ",
    "(R pid=1, ip=1, ip=2) ", "(R pid=1,) ", "(R pid=1, ip=1", "(R pid=1, ip", "(R pid=1, ",
    # `\)` and ` ?`: the header right after the optional space, or Python's
    "(A pid=1)", "(A pid=1)  ", "(A pid=1)\t", "(A pid=1)\r", "(A pid=1)x ", "(A pid=1)) ", "(A pid=1 ",
    # the lazy words: each tried as the end first, then taken whole
    "(VllmWorker rank=0 pid=5) ", "(VllmWorker TP0 pid=5) ", "(W pid=5 pid=7) ", "(W pid=5 pid=7, ip=1) ",
    "(W pid=5, ip=1 pid=7) ", "(W a b.c d-e f=g pid=1) ", "(W rank=0 pid=) ", "(W 0 pid=1) ", "(W =a pid=1) ",
    "(W  pid=1) ", "(W rank:0 pid=1) ", "(W pid=1x pid=2) ", "(W pid= pid=2) ", "(W x", "(W x ", "(W pid=5) pid=7) ",
    "(W rank=0é pid=1) ", "(W TP0\x1b pid=1) ",
    # before the prefix: a shipper's stamp, junk
    "2025-02-15T10:23:00Z (A pid=1) ", "2025-02-15 10:23:00,123 (A pid=1) ", "x (A pid=1) ", " (A pid=1) ",
    "((A pid=1) ", "[rank0]: (A pid=1) ",
]
PREFIX_LINES = [  # whole texts: the header missing, further on, or starting a group; a prefix twice
    "(A pid=1) hello", "(A pid=1) INFO:     uvicorn", "(A pid=1) (B pid=2) " + V1_HEAD, "(A pid=1) x " + V1_HEAD,
    "(A pid=1) INFO 02-15 10:23:00 [:1] no origin", "(A pid=1) INFO 02-15 10:23:00.5 [x.py:1]  two spaces",
    "(A pid=1) INFO 02-30 10:23:00 [x.py:1] not a date", "(A pid=1) INFO 02-15 10:23:01 [x.py:1] another second",
    "(A pid=1) ERROR 02-15 10:23:00 [x.py:1] boom", "(A pid=1) CRITICAL 02-15 10:23:00 [x.py:1] boom",
    "(A pid=1) INFO 02-15 10:23:00 [x.py:1] Memory profiling takes 1s",
    "(A pid=1) ERROR 02-15 10:23:00 [x.py:1] Traceback (most recent call last):\n"  # a group and its continuations
    "(A pid=1) ERROR 02-15 10:23:00 [x.py:1]   File \"x.py\", line 1\n(B pid=2) ERROR 02-15 10:23:00 [x.py:1]   x",
    "(A pid=1) WARNING 02-15 10:23:00 [x.py:1] a\n(A pid=1) WARNING 02-15 10:23:00 [x.py:1]   File \"x.py\"",
    "(A pid=1) INFO 02-15 10:23:00 [x.py:1] é", "(A pid=1) INFO 02-15 10:23:00 [x.py:1] \x1b[0m",
    "(A pid=1) INFO 02-15 10:23:00 [x.py:1] a\r", "\x1b[36m(A pid=1)\x1b[0m " + V1_HEAD, "(A pid=1) {\"level\": 1}",
]


@native
@pytest.mark.parametrize("cri", [False, True], ids=["plain", "cri"])
@pytest.mark.parametrize("text", [p + V1_HEAD for p in PREFIX_NEAR_MISSES] + PREFIX_LINES)
def test_decode_fast_path_matches_on_process_prefix_near_misses(text, cri):
    """Each line twice after a common prefixed line (the header clock's second cached), then a
    line that is not (timed from the last one), then the common line again."""
    frame = (lambda t: f"{CRI_SECOND}.5Z stdout F {t}") if cri else (lambda t: t)
    first = frame(f"(APIServer pid=1) {V1_HEAD}").encode() + b"\n"
    raws = [frame(part).encode() + b"\n" for part in text.split("\n")]
    _decode_both([first, *raws, *raws, b"no header here\n", first])


@native
@pytest.mark.parametrize("value", [1.0, 2**63 - 1, 2**63, -1, True, "1"])
def test_decode_fast_path_reads_stats_prefixed_as_python_adds_to_it(value):
    """stats.prefixed is Python's: an int the C can add one to is the C's; anything else (a float,
    a count at the C's limit, a bool) declines, and Python's `+= 1` (or its error) stands."""
    got = []
    for fast in (stream_mod.FAST, None):
        s = RecordStream(Decoder(mtime=1.7e9), fast=fast)
        line = f"(APIServer pid=1) {V1_HEAD}\n".encode()
        s(line, 0)
        s.decoder.stats.prefixed = value
        try:
            got.append((s(line, len(line)), s.decoder.stats))
        except TypeError as exc:
            got.append(type(exc))
    assert got[0] == got[1]
    assert repr(got[0]) == repr(got[1])  # 2.0 and 2 compare equal: the type must be Python's too


@native
@pytest.mark.parametrize("cri", [False, True], ids=["plain", "cri"])
def test_process_prefixed_lines_take_the_c_path(cri):
    """The common V1 line (`(APIServer pid=1) INFO …`, `(EngineCore_DP0 pid=7) `, Ray's
    `(RayWorkerWrapper pid=206994, ip=10.0.0.1) `) answered by the C: records whose Python
    fallback only records being called, with the prefix's group as their process."""
    frame = (lambda t: f"{CRI_SECOND}.25Z stderr F {t}") if cri else (lambda t: t)
    decoder, joiner = Decoder(mtime=1.7e9), Joiner()
    first = frame(f"(APIServer pid=1) {V1_HEAD}").encode() + b"\n"
    assert RecordStream(decoder, joiner)(first, 0)  # Python: framing detected, the second cached
    ts = 1_739_614_980 * 10**9 + 250_000_000 if cri else decoder._clock._cache_ns
    cases = [  # prefix, header, the record's process and origin
        ("(APIServer pid=1) ", "INFO 02-15 10:23:00 [async_llm.py:578] ", "APIServer pid=1", "async_llm.py:578"),
        ("(EngineCore_DP0 pid=7) ", "DEBUG 02-15 10:23:00 core.py:9] ", "EngineCore_DP0 pid=7", "core.py:9"),
        ("(VllmWorker rank=0 pid=5) ", "WARNING 02-15 10:23:00,5 [a.py:1]", "VllmWorker rank=0 pid=5", "a.py:1"),
        ("(VllmWorker TP0 pid=5)", "INFO 02-15 10:23:00 [b.py:2] ", "VllmWorker TP0 pid=5", "b.py:2"),
        ("(RayWorkerWrapper pid=206994, ip=10.0.0.1) ", "INFO 02-15 10:23:00 [shm_broadcast.py:466] ",
         "RayWorkerWrapper pid=206994, ip=10.0.0.1", "shm_broadcast.py:466"),
        ("(RayWorkerWrapper pid=2, ip=fe80::1) ", "INFO 02-15 10:23:00 [c.py:3] ", "RayWorkerWrapper pid=2, ip=fe80::1",
         "c.py:3"),
        ("(W pid=5 pid=7) ", "INFO 02-15 10:23:00 [d.py:4] ", "W pid=5 pid=7", "d.py:4"),
        ("(vllm.worker-1 a.b-c_0 pid=3) ", "INFO 02-15 10:23:00 [e.py:5] ", "vllm.worker-1 a.b-c_0 pid=3", "e.py:5"),
    ]
    lines, expected, offset = [], [], len(first)
    for prefix, header, process, origin in cases:
        raw = frame(f"{prefix}{header}message {len(lines)}").encode() + b"\n"
        expected.append(Record(ts, CLOCK_RUNTIME if cri else CLOCK_HEADER, header.split(" ")[0], origin,
                               f"message {len(lines)}", offset, offset + len(raw), process))
        lines.append((offset, raw))
        offset += len(raw)
    called = []
    got = list(stream_mod.FAST.records(decoder, joiner, lambda *a: called.append(a) or (), lines))
    assert called == []
    assert got == expected
    assert (decoder.stats.lines, decoder.stats.records, decoder.stats.prefixed) == (1 + len(cases),) * 3
    assert decoder._last_ts == ts
    # and each of these is Python's: junk or a stamp before the prefix, two spaces, no header, an ERROR
    decline = ["x (APIServer pid=1) " + V1_HEAD, "2025-02-15T10:23:00Z (APIServer pid=1) " + V1_HEAD,
               "(APIServer pid=1)  " + V1_HEAD, "(APIServer pid=1) hello", "(APIServer pid=) " + V1_HEAD,
               "(APIServer pid=1) ERROR 02-15 10:23:00 [x.py:1] boom"]
    for text in decline:
        list(stream_mod.FAST.records(decoder, joiner, lambda *a: called.append(a) or (), [(0, frame(text).encode() + b"\n")]))
    assert len(called) == len(decline)


# -- the wire encoder -----------------------------------------------------------------------------

VALUES = st.recursive(
    st.one_of(st.text(max_size=20), st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.booleans(),
              st.none()),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children),
    max_leaves=8,
)
ATTRS = st.dictionaries(st.text(max_size=12), VALUES, max_size=8)


@native
@settings(max_examples=400, deadline=None)
@given(ATTRS)
def test_attribute_encoding_matches(attrs):
    from bridge.export import _fastwire

    assert _fastwire.key_values(0x4A, attrs) == b"".join(KeyValues(0x4A).all(attrs))


TIMINGS = st.sampled_from(["reported", "observed", "inferred"])
NS = st.one_of(st.integers(0, 2**63), st.integers(-5, 5), st.just(2**64 + 1))


class _Str(str):
    """A str subclass: Python formats it through its own methods, so the C declines it."""


# One half of a disaggregated request (mapping.pd_key): the role, the prefill's engine request
# id and engine id where that half keeps them; ids with and without vLLM's random suffix (then
# the engine id joins the key), odd roles and ids too (empty, unencodable, not a str).
PD_KEYS = st.text(max_size=10) | st.sampled_from(["", "\ud800", "cmpl-a-0-1f2e3d4c", "cmpl-a-0", "x-1F2E3D4C",
                                                  "-0123abcd", "é-0123abcg"]) | st.integers(0, 3) | \
    st.builds(_Str, st.text(max_size=4))
PD_ATTRS = st.fixed_dictionaries(
    {mapping.PD_ROLE: st.sampled_from([mapping.PD_PREFILL, mapping.PD_DECODE, "other"]) | st.integers(0, 1)
     | st.builds(_Str, st.just(mapping.PD_DECODE))},
    optional={mapping.INTERNAL_ID: PD_KEYS, mapping.PD_REMOTE_REQUEST: PD_KEYS, mapping.PD_ENGINE: PD_KEYS,
              mapping.PD_REMOTE_ENGINE: PD_KEYS, "vllm.dp.rank": st.integers(0, 3)})
PARENTS = st.none() | st.builds(TraceContext, st.binary(min_size=16, max_size=16),
                                st.none() | st.just(b"") | st.binary(min_size=8, max_size=8))


@st.composite
def timelines(draw, plain=False):
    """`plain`: only what the pipeline puts in a timeline (no time or count the C declines)."""
    NS = st.integers(0, 2**63 - 1) if plain else globals()["NS"]
    events = st.builds(SpanEvent, st.sampled_from(["vllm.kv_block.allocated", "exception", "é"]), NS, ATTRS)
    phases = st.builds(Phase, st.sampled_from(["queued", "prefill", "preempted", "decode", "freed"]),
                       st.integers(0, 3), NS, NS, TIMINGS, TIMINGS, ATTRS | st.just({"vllm.timing": 1}),
                       st.lists(events, max_size=3), st.integers(0 if plain else -2, 3))
    kinds = ["nccl_timeout", "é"] if plain else ["nccl_timeout", "é", "\ud800"]
    incidents = st.builds(IncidentEvent, st.just("vllm.engine.incident"), NS, ATTRS,
                          st.none() | st.builds(IncidentRef, st.sampled_from(kinds),
                                                st.sampled_from(["1.0", "17.2"])))
    shared = draw(st.lists(events | incidents, max_size=3))
    return RequestTimeline(
        source=source_for(draw(st.sampled_from(["/x.log", "/var/log/pods/a_b_0123456789/c/0.log"]))),
        request_id=draw(st.text(max_size=10)), occurrence=draw(st.sampled_from(["1", "1.2", "é"])),
        start_ns=draw(NS), end_ns=draw(NS), start_timing=draw(TIMINGS), end_timing=draw(TIMINGS),
        outcome="finished", error_type=draw(st.sampled_from([None, "", "oom"])),
        error_message=draw(st.sampled_from(["", "boom", "é"])),
        attrs=draw(ATTRS if plain else ATTRS | st.just({"vllm.timing.end": 0, "a": 1})
                   | st.tuples(ATTRS, PD_ATTRS, st.booleans()).map(lambda x: {**x[0], **x[1]} if x[2] else {**x[1], **x[0]})),
        events=draw(st.lists(st.sampled_from(shared), max_size=4)) if shared else [],
        dropped_events=draw(st.integers(0 if plain else -1, 300)), phases=draw(st.lists(phases, max_size=4)),
        first_offset=0, last_offset=1, parent=draw(PARENTS), pd_context=draw(PARENTS),
    )


def _encode(ts, fast: bool):
    enc = WireEncoder({"service.name": "vllm"}) if fast else WireEncoder({"service.name": "vllm"}, fast=None)
    try:
        for t in ts:
            enc.add(t)
    except Exception as exc:  # noqa: BLE001 - the Python encoder's own failures must be kept
        return type(exc)
    return enc.take().payload


@native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(timelines(), min_size=1, max_size=3))
def test_request_spans_encode_to_the_same_bytes(ts):
    assert _encode(ts, True) == _encode(ts, False)


@native
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timelines(plain=True), st.sampled_from([mapping.PD_PREFILL, mapping.PD_DECODE]),
       st.text(min_size=1, max_size=12) | st.sampled_from(["cmpl-a-0-1f2e3d4c", "cmpl-a-0"]),
       st.none() | st.text(max_size=6), st.booleans(), st.booleans())
def test_a_half_of_a_disaggregated_request_is_written_by_the_c(t, role, key, engine, key_first, own_key):
    """Never declined: both halves' ids and the decode's link come from the C, the bytes the
    pure encoder writes from mapping's records, in the caller's trace (its own or the one read
    from the key) or not; with the engine id in the key when the id has no random suffix; a
    prefill without an internal id keyed on its request id."""
    prefill = role == mapping.PD_PREFILL
    pd = {mapping.PD_ROLE: role}
    if own_key or not prefill:
        pd[mapping.INTERNAL_ID if prefill else mapping.PD_REMOTE_REQUEST] = key
    else:
        t.request_id = key
    if engine is not None:
        pd[mapping.PD_ENGINE if prefill else mapping.PD_REMOTE_ENGINE] = engine
    t.attrs = {**pd, **t.attrs} if key_first else {**t.attrs, **pd}
    assert FAST_REQUEST(t, {}) is not None
    pure = WireEncoder({"service.name": "vllm"}, fast=None)
    pure.add(t)
    fast = WireEncoder({"service.name": "vllm"})
    fast.add(t)
    assert fast.take().payload == pure.take().payload
    records = mapping.request_spans(t)
    if engine and re.search(r"-[0-9a-f]{8}\Z", key) is None:
        key = f"{engine}\x1f{key}"
    assert mapping.pd_key(t) == (role, key)
    assert records[0].span_id == mapping.pd_ids(key, role)[1]
    to_prefill = [link.span_id for link in records[0].links[:1]] == [mapping.pd_ids(key, mapping.PD_PREFILL)[1]]
    assert to_prefill == (role == mapping.PD_DECODE)


@native
@given(st.binary(max_size=400), st.sampled_from([8, 16]))
def test_ids_hash_is_blake2b_with_the_bridge_personalisation(data, size):
    from bridge.export import _fastwire

    assert _fastwire.digest(data, size) == hashlib.blake2b(data, digest_size=size, person=b"vllm-trace-bri").digest()


# -- whole process ----------------------------------------------------------------------------------


@native
def test_replay_prints_the_same_report_with_and_without_the_c_paths(synth_logs):
    outs = []
    for env in ({}, {"VLLM_TRACE_BRIDGE_PURE": "1"}):
        p = subprocess.run([sys.executable, "-m", "bridge", "replay", "--waterfalls", "3", *synth_logs],
                           env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1]
