"""Upstream vLLM's lines (v0.4 → 2026, V0 and V1) → typed events.

Formats are those of `reference/vllm-log-formats.md`. Same contract as `seed`: a rule per
first-four-characters key, tried only after the cheap lookup; `fallback` handles lines whose
start varies (error levels, header-less writers). Privacy: `Received request` and
`Generated response` lines carry the prompt and the generated text; rules read only the id, the
numbers after the text, and never put any of the text into an event.
"""

from __future__ import annotations

import re

from bridge.parse.events import (
    AccessLog,
    EngineConfig,
    EngineError,
    EngineStats,
    Event,
    KvBlocksInvalid,
    KvLeaseExpired,
    KvLoadFailed,
    KvTransferFailed,
    KvTransferMetrics,
    Notice,
    RequestAdded,
    RequestDetails,
    RequestFailed,
    RequestFinished,
    RequestReceived,
    RequestsAborted,
    RequestWaiting,
    ResponseGenerated,
    SequencePreempted,
    ENGINE_EXITED,
    SERVED_MODEL,
    WEIGHTS_READ_S,
    ServerStop,
    StartupFact,
)
from bridge.parse.literals import blank_literals, literal_end, redact_error_text
from bridge.parse.numbers import count, fits

_NUM = r"(\d[\d,]*(?:\.\d+)?)"
#: Memory left for the KV cache can be negative: the weights and activations took more than allowed.
_SIGNED = r"(-?\d[\d,]*(?:\.\d+)?)"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# -- per-request lines ---------------------------------------------------------------------

_RECEIVED = re.compile(r"Received request (\S+?): (?:prompt|params|sampling_params): ")
_PARAM = re.compile(r"(?:\(|, )(n|temperature|top_p|max_tokens)=(None|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?=[,)])")
#: What follows the params repr, every era (reference b.1).
_AFTER_PARAMS = ("), prompt_token_ids: ", "), lora_request: ", "), prompt_adapter_request: ", "), prompt_embeds")
_LORA = "lora_request: LoRARequest(lora_name="


def _received(msg: str) -> Event | None:
    if msg.startswith("Received a request with trace context"):
        return Notice("request_trace_context")
    if msg.startswith(_SIGNAL_RECEIVED) or _SIGNAL_DEBUG.match(msg):
        return _STOP_SIGNAL
    m = _RECEIVED.match(msg)
    if m is None:
        return None
    if m[1].startswith("tokenize-"):
        # /tokenize and /detokenize (serve/tokenize/serving.py) log their inputs under this
        # fixed prefix and never reach the engine: no request to trace.
        return Notice("tokenize_request")
    # Parameters come only from their own fields. The prompt, stop strings and any other client
    # text are quoted literals: blanked out first (positions kept), so text inside them
    # (`n=5, max_tokens=7`, `lora_name='x'`, `SamplingParams(`) is never read as a field. Only
    # numbers and a LoRA name leave here.
    shape = blank_literals(msg)
    values: dict[str, str] = {}
    i = shape.find("SamplingParams(", m.end())
    if i >= 0:
        ends = [e for e in (shape.find(a, i) for a in _AFTER_PARAMS) if e >= 0]
        for key, value in _PARAM.findall(shape, i + 14, min(ends) + 1 if ends else len(shape)):
            values.setdefault(key, value)

    def get(key: str, cast):
        v = values.get(key)
        return None if v is None or v == "None" else fits(int(float(v))) if cast is int else cast(v)

    lora = None
    j = shape.rfind(_LORA, m.end())
    if j >= 0 and msg[j + len(_LORA):j + len(_LORA) + 1] in ("'", '"'):
        start = j + len(_LORA)
        end = literal_end(msg, start)
        if end < len(msg) and msg[end - 1] == msg[start]:
            lora = msg[start + 1:end - 1]
    role = remote = engine = None
    k = shape.find("extra_args={", i) if i >= 0 else -1
    if k >= 0:
        role, remote, engine = _kv_params(msg, shape, k, min(ends) + 1 if ends else len(shape))
    return RequestReceived(m[1], get("max_tokens", int), get("temperature", float), get("top_p", float),
                           get("n", int), lora, role, remote, engine)


#: a dict entry of the params' repr, on the blanked shape: `<key literal>: <literal or word>`
_KV_ENTRY = re.compile(r"(_{3,40}): (_{2,400}|[A-Za-z0-9.+-]{1,40})")
_KV_KEYS = ("do_remote_decode", "do_remote_prefill", "remote_request_id", "remote_engine_id")


def _kv_params(msg: str, shape: str, start: int, end: int) -> tuple[str | None, str | None, str | None]:
    """(role, remote_request_id, remote_engine_id) from `extra_args={'kv_transfer_params': {…}}`
    (vLLM's toy proxy / llm-d's sidecar put them there). Read from the blanked shape, so a key is
    only ever a dict key of the params, never text inside a literal; values from the message."""
    found: dict[str, str] = {}
    for e in _KV_ENTRY.finditer(shape, start, end):
        ks, ke = e.span(1)
        if msg[ks] not in "'\"" or msg[ke - 1] != msg[ks]:
            continue
        key = msg[ks + 1:ke - 1]
        if key in _KV_KEYS and key not in found:
            vs, ve = e.span(2)
            value = msg[vs:ve]
            if shape[vs] == "_":  # a literal: its text without the quotes
                if msg[vs] not in "'\"" or msg[ve - 1] != msg[vs]:
                    continue
                value = msg[vs + 1:ve - 1]
            found[key] = value
    role = "prefill" if found.get("do_remote_decode") == "True" else \
        "decode" if found.get("do_remote_prefill") == "True" else None
    if role is None:
        return None, None, None
    return role, found.get("remote_request_id") if role == "decode" else None, \
        found.get("remote_engine_id") if role == "decode" else None


def _id_before_dot(msg: str, start: int) -> str | None:
    rid = msg[start:].rstrip()
    if rid.endswith("."):
        rid = rid[:-1]
    return rid if rid and " " not in rid else None


def _added(msg: str) -> Event | None:
    if msg.startswith("Added request "):
        rid = _id_before_dot(msg, 14)
        return RequestAdded(rid) if rid else None
    return None


def _finished(msg: str) -> Event | None:
    if msg.startswith("Finished request "):
        rid = _id_before_dot(msg, 17)
        return RequestFinished(rid) if rid else None
    return None


def _aborted(msg: str) -> Event | None:
    for head in ("Aborted request(s) ", "Aborted request "):
        if msg.startswith(head):
            body = msg[len(head):].rstrip()
            if body.endswith("."):
                body = body[:-1]
            ids = tuple(x.strip() for x in body.split(",") if x.strip())
            return RequestsAborted(ids) if ids else None
    return None


_REQUEST_V1 = re.compile(r"Request (\S+) (aborted|failed)(?: \(([^)]*)\)| due to (.*?)| with (an internal error.*?))?"
                         r"(?:: (.*?))?\.?$", re.S)
_FAILED_REASON = {"engine dead": "engine_dead", "bad request": "input", "input error": "input"}
#: vLLM's admission control refuses with HTTP 503 under "bad request" (GracefulHTTPError,
#: vllm/exceptions.py): the server was full, the request was not at fault.
_OVERLOADED = ("The engine is currently busy", "The engine has reached its prefill token backlog limit")


_PROMPT_IDS = ", prompt_token_ids: ["


def _request(msg: str) -> Event | None:
    if msg.startswith("Request ") and (" details: " in msg[:200] or " JSON body: " in msg[:200]):
        # DEBUG: these carry the prompt or the body. Only the number of prompt token ids leaves
        # here, read from the right of the prompt text, which may contain anything.
        rid, sep, _ = msg[8:].partition(" details: ")
        if rid.startswith("tokenize-"):  # /tokenize and /detokenize: no request (as `_received`)
            return Notice("tokenize_request")
        i = msg.rfind(_PROMPT_IDS)
        if sep and i >= 0 and " " not in rid:
            j = msg.find("]", i)
            inner = msg[i + len(_PROMPT_IDS):j].strip() if j >= 0 else ""
            if j >= 0 and all(p.strip().isdigit() for p in inner.split(",") if p.strip()):
                return RequestDetails(rid, inner.count(",") + 1 if inner else 0)
        return Notice("request_details")
    m = _REQUEST_V1.match(msg)
    if m is None:
        return None
    rid, what, paren, due, internal, detail = m.groups()
    if what == "aborted":
        return RequestsAborted((rid,))
    reason = paren or due or internal or ""
    if detail and detail.startswith(_OVERLOADED):
        error_type = "overloaded"
    else:
        # A client's quoted text cannot make it an engine death (`classify`).
        error_type = _FAILED_REASON.get(paren or "") or (
            classify(reason + " " + (detail or ""), redact_error_text(reason + " " + (detail or "")))
            if reason or detail else "other")
    return RequestFailed(rid, error_type, (reason + (": " + detail if detail else "")).strip() or "failed")


_GENERATED = re.compile(r"Generated response (\S+?)(?: \(streaming (delta|complete)\))?: ")
_TOKEN_IDS = ", output_token_ids: "
_FINISH = ", finish_reason: "
#: The ids are a list, or a tuple (the Responses API's, `(7,)` for one).
_DETAILS = re.compile(
    r"Generated response (\S+?)(?: \(streaming (delta|complete)\))? details: output_token_ids: "
    r"(?:\[([^\]]*)\]|\(([^)]*)\)|None)")


def _generated(msg: str) -> Event | None:
    d = _DETAILS.match(msg)
    if d is not None:  # DEBUG (≈ v0.30+): the token ids alone; only their count leaves here
        ids = d[3] if d[3] is not None else d[4]
        if ids is None or d[2] == "delta":
            # A stream's deltas are not all logged (an empty one is skipped), so their sum would
            # undercount; `(streaming complete)` says None. Only a whole response is counted.
            return ResponseGenerated(d[1], None, None, d[2] or "details")
        inner = ids.strip().rstrip(",")
        return ResponseGenerated(d[1], None, inner.count(",") + 1 if inner else 0, d[2] or "details")
    m = _GENERATED.match(msg)
    if m is None:
        return None
    # The output text comes first and may contain anything: it is a quoted literal, blanked out
    # before the fields are looked for (a cut line's open quote blanks everything after it).
    shape = blank_literals(msg)
    f = shape.rfind(_FINISH)
    if f < 0:
        return None
    reason = shape[f + len(_FINISH):].strip()
    # `(streaming complete) … finish_reason: streaming_complete` marks the end of the stream; it
    # is no finish reason (the last delta carried the real one).
    finish = None if reason in ("None", "", "streaming_complete") else reason
    tokens = None
    t = shape.rfind(_TOKEN_IDS, 0, f)
    if t >= 0:
        ids = shape[t + len(_TOKEN_IDS):f].strip()
        if ids.startswith("[") and ids.endswith("]"):
            inner = ids[1:-1].strip()
            tokens = inner.count(",") + 1 if inner else 0
    return ResponseGenerated(m[1], finish, tokens, m[2] or "")


_PREEMPTED_V0 = re.compile(
    r"Sequence group (\S+) is preempted by (?:PreemptionMode\.)?(\w+) mode .*?total_num_cumulative_preemption=(\d+)", re.S
)


def _sequence(msg: str) -> Event | None:
    m = _PREEMPTED_V0.match(msg)
    return SequencePreempted(m[1], m[2], count(m[3])) if m else None


_FAILING_V0 = re.compile(r"Failing the request (\S+) because (.*?)\.?$")


#: v1/core/sched/scheduler.py `_handle_invalid_blocks` (0.11+): the requests a failed KV load
#: fails, as a Python set's repr of their engine request ids
_FAILING_KV = re.compile(r"Failing (\d{1,9}) request\(s\) due to KV load failure \(failure_policy=\w+, "
                         r"(\d{1,12}) tokens affected\)\. Request IDs: \{")
_SET_ITEM = re.compile(r"'([^'\s]{1,400})'")


#: vllm-omni's stage worker (entrypoints/omni_stage.py `generation_single_request`) around its
#: AsyncLLM's `generate(…, rid)`: `logger.exception("Failed on request %s: %s", rid, e)` through
#: vLLM's logger, the traceback after it. The id is the one the stage gave vLLM, the text the
#: exception's: the request ended failed, of what that says.
_FAILED_ON = re.compile(r"Failed on request (\S+?): ([^\n]*)")


def _failing(msg: str) -> Event | None:
    m = _FAILING_V0.match(msg)
    if m:
        return RequestFailed(m[1], "oom", m[2])
    m = _FAILED_ON.match(msg)
    if m is not None:
        detail = m[2].strip()
        return RequestFailed(m[1], classify(detail, redact_error_text(detail)) if detail else "other",
                             detail or "failed")
    m = _FAILING_KV.match(msg)
    if m is not None:
        end = msg.find("}", m.end())
        ids = tuple(_SET_ITEM.findall(msg, m.end(), end if end >= 0 else len(msg)))
        if ids:
            return KvLoadFailed(ids, count(m[2]))
    if msg.startswith("Failing ") and "request(s)" in msg[:40]:
        return EngineError("other", "KVLoadFailure", msg[:500], False, "")
    return None


# -- KV connectors (disaggregated prefill/decode) ------------------------------------------
# A connector's scheduler side is told of every request the engine frees (scheduler.py
# `_connector_finished`) and logs it at DEBUG with the request's final status (nixl/
# pull_scheduler.py:203 `NIXLConnector request_finished(%s), request_status=%s, …`, push_scheduler.py
# `NixlPushConnector …`, mooncake_connector.py `MooncakeConnector request_finished, req_id=%s,
# request_status=%s, …`). A `FINISHED_*` status is how the request ended in this engine; the same
# connector's `request_finished(%s) waiting for %d seconds before releasing blocks` is its blocks
# held for the remote reader, no end of its own.

_CONNECTOR_FINISHED = re.compile(r"\w+ request_finished(?:\((\S+?)\)|, req_id=([^,\s]+)),"
                                 r" request_status=(?:RequestStatus\.)?(\w+)")
_ENDED_AS_FINISHED = frozenset({"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_IGNORED",
                                "FINISHED_REPETITION"})
_KV_TRANSFER = Notice("kv_transfer")


def _connector_finished(msg: str) -> Event | None:
    m = _CONNECTOR_FINISHED.match(msg)
    if m is None:
        return _KV_TRANSFER  # the blocks-held line, or a form without an id
    rid, status = m[1] or m[2], m[3]
    if status in _ENDED_AS_FINISHED:
        return RequestFinished(rid)
    if status == "FINISHED_ABORTED":
        return RequestsAborted((rid,))
    if status == "FINISHED_ERROR":  # vLLM answers the client finish_reason "error"
        return RequestFailed(rid, "other", "request_status=FINISHED_ERROR")
    return _KV_TRANSFER


#: kv_connector/v1/metrics.py `KV Transfer metrics: %s`, the connector's stats dict as `k=v, …`
#: (nixl/stats.py `reduce`, 0.32: every key below but `Num failed recvs`; mooncake/stats.py: no
#: post times, no notifications, `Num failed recvs`). Keys this bridge knows → (field, scale).
_KV_METRIC_KEYS = {
    "Num successful transfers": ("transfers", None),
    "Avg xfer time (ms)": ("avg_xfer_s", 1e3),
    "P90 xfer time (ms)": ("p90_xfer_s", 1e3),
    "Avg post time (ms)": ("avg_post_s", 1e3),
    "P90 post time (ms)": ("p90_post_s", 1e3),
    "Avg MB per transfer": ("avg_bytes", 2**-20),  # vLLM's MB is MiB (bytes / 2**20)
    "Throughput (MB/s)": ("throughput_bps", 2**-20),
    "Avg number of descriptors": ("avg_descriptors", 1.0),
    "Num failed transfers": ("failed", None),  # NIXL: failed transfers + handshakes + notifications
    "Num failed recvs": ("failed_recvs", None),
    "Num KV expired reqs": ("expired", None),
    "Num notifs after expiry": ("notifs_after_expiry", None),
}
_KV_METRIC = re.compile(r"([A-Za-z0-9 ()/]{1,48})=(-?\d{1,15}(?:\.\d{1,9})?)(?:, |$)")


def _kv_transfer_metrics(msg: str) -> Event | None:
    if not msg.startswith("KV Transfer metrics: "):
        return _stats_extra(msg)
    found: dict = {}
    pos, end = len("KV Transfer metrics: "), len(msg)
    while pos < end:
        m = _KV_METRIC.match(msg, pos)
        if m is None:
            break  # a value this grammar does not know (another connector's): the rest is left out
        known = _KV_METRIC_KEYS.get(m[1])
        if known is not None:
            name, scale = known
            if scale is None:
                found[name] = count(m[2]) if "." not in m[2] else int(float(m[2]))
            elif scale == 1.0:
                found[name] = float(m[2])
            elif name == "avg_bytes":
                found[name] = fits(round(float(m[2]) / scale))
            else:
                found[name] = float(m[2]) / scale
        pos = m.end()
    if not found:
        return Notice("stats_extra")
    return KvTransferMetrics(**found)


#: NIXL worker (base_worker.py `_reap_expired_send_leases`, WARNING) and pull_worker.py (ERROR);
#: before the worker split (nixl_connector.py, 0.10 – 0.1x) its readers were `decode worker(s)`.
_LEASE_EXPIRED = re.compile(r"Releasing expired KV blocks for request (\S+?) which were retrieved by (\d+) "
                            r"(?:remote|decode) worker")
_BLOCKS_INVALID = re.compile(r"Potentially invalid KV blocks for unrecognized request (\S+?) were retrieved")


def _lease_expired(msg: str) -> Event | None:
    m = _LEASE_EXPIRED.match(msg)
    return KvLeaseExpired(m[1], count(m[2])) if m else None


def _blocks_invalid(msg: str) -> Event | None:
    m = _BLOCKS_INVALID.match(msg)
    return KvBlocksInvalid(m[1]) if m else None


#: The NIXL library's own Python logger (nixl/_api.py, `%(asctime)s NIXL %(levelname)-8s
#: %(filename)s:%(lineno)d %(message)s`; decode takes its stamp off as a shipper's): agent and
#: backend set-up. A failed transfer is vLLM's own line (`NIXL transfer failure: …`), not these.
_NIXL_LEVELS = ("NIXL DEBUG ", "NIXL INFO ", "NIXL WARNING ", "NIXL ERROR ", "NIXL CRITICAL ")
_NIXL_LIB = re.compile(r"NIXL [A-Z]{4,8} +[\w.-]+\.py:\d+ ")
_NIXL_LOG = Notice("nixl_library")


def _nixl_library(msg: str) -> Event | None:
    return _NIXL_LOG if _NIXL_LIB.match(msg) else None


_NIXL_FAILURE = re.compile(r"NIXL transfer failure: ([a-z_]{1,48})\b[^|]*\| Context: \{")
_EXC_CLASS = re.compile(r"([A-Za-z_][\w.]{0,120})(?:: |$)")
#: an id in the context dict's repr: vLLM's own ids, quoted by repr; anything else is left out
_CONTEXT_ID = {k: re.compile(r"'" + k + r"': '([^'\s]{1,400})'") for k in
               ("request_id", "remote_request_id", "remote_engine_id")}


def _nixl_failure(msg: str) -> Event | None:
    m = _NIXL_FAILURE.match(msg)
    if m is None:
        return None
    ids = []
    for key in ("request_id", "remote_request_id", "remote_engine_id"):
        found = _CONTEXT_ID[key].search(msg, m.end(), m.end() + 2000)
        ids.append(found[1] if found else None)
    cause = None
    if "\nTraceback (most recent call last):" in msg:  # `exc_info`: the joined traceback's last line
        last = _EXC_CLASS.match(msg, msg.rfind("\n") + 1)
        cause = last[1] if last else None
    return KvTransferFailed(m[1], *ids, cause=cause)


#: scheduler.py (V1, DEBUG, every step): a request whose KV cache a remote prefill still sends
_STILL_WAITING = " is still in WAITING_FOR_"
_WAITING = re.compile(r"(\S+) is still in (WAITING_FOR_\w+) state\.?\s*$")


# -- shutdown --------------------------------------------------------------------------------
# vLLM 0.32's shutdown sequence (site-packages/vllm): launcher.py:254 `[shutdown] API server:
# shutdown triggered` (its SIGTERM/SIGINT handler), v1/engine/core.py:1455 `[shutdown] EngineCore:
# trigger received signal=SIGTERM`, core.py:1636 `… start mode=abort timeout=0s`, core.py:1645/1656
# `… aborting|draining in-flight requests count=N`, core.py:1667 `… request processing complete;
# starting resource teardown`; v1/utils.py:597 `Received KeyboardInterrupt, shutting down API
# servers...`; cli/serve.py:210 DEBUG `Received 15 signal.`; uvicorn/server.py:282 `Shutting down`.
# core_client.py:818 `[shutdown] MPClient: engine core exited unexpectedly; starting cleanup` is
# no stop but the engine core's death (killed, OOM-killed): an error.

_STOP_SIGNAL, _STOP_SERVER, _STOP_DRAINED = ServerStop("signal"), ServerStop("server"), ServerStop("drained")
_SIGNAL_RECEIVED = ("Received KeyboardInterrupt", "Received SIGTERM", "Received SIGINT", "Received shutdown signal")
_SIGNAL_DEBUG = re.compile(r"Received \d+ signal\.?$")
_SIGNAL_STARTS = ("[shutdown] API server: shutdown triggered", "[shutdown] EngineCore: trigger received signal",
                  "[shutdown] EngineCore: start mode=")
_IN_FLIGHT = re.compile(r"\[shutdown\] EngineCore: (?:aborting|draining) in-flight requests count=(\d+)")
#: core.py:1712 (DEBUG): during a drain the engine core aborts each request that arrives
_REJECTED = "[shutdown] EngineCore: rejecting new request request_id="


_MODE = re.compile(r" mode=(abort|drain)\b")


def _shutdown(msg: str) -> Event | None:
    if not msg.startswith("[shutdown]"):
        return None
    mode = _MODE.search(msg, 0, 120)
    if mode is not None:  # launcher.py:271 `stopping engine client mode=…`, core.py:1636 `start mode=…`
        return ServerStop("signal", None, mode[1])
    if msg.startswith(_SIGNAL_STARTS):
        return _STOP_SIGNAL
    m = _IN_FLIGHT.match(msg)
    if m is not None:
        return ServerStop("in_flight", int(m[1]))
    if msg.startswith(_REJECTED):
        rid = msg[len(_REJECTED):].split(" ", 1)[0].rstrip(".")
        return RequestsAborted((rid,)) if rid else _STOP_SERVER
    if msg.startswith("[shutdown] EngineCore: request processing complete"):
        return _STOP_DRAINED
    if msg.startswith(ENGINE_EXITED):
        return EngineError("engine_dead", "", msg[:_MAX_MESSAGE], True, "", exited=True)
    return _STOP_SERVER


def _shutting(msg: str) -> Event | None:
    """`Shutting down` (uvicorn), `Shutting down.` (headless serve), `Shutting down vLLM …`: the
    server winds down; other things shutting down (`Shutting down profiler`) are chatter."""
    if msg.rstrip(". ") == "Shutting down" or msg.startswith("Shutting down vLLM"):
        return _STOP_SERVER
    return Notice("startup_info")


#: uvicorn's own lines of a stop (server.py, main.py): the HTTP server winds down.
_UVICORN_STOP = ("Shutting down", "Waiting for application shutdown", "Application shutdown complete",
                 "Finished server process", "Waiting for connections to close", "Waiting for background tasks")


# -- stats -----------------------------------------------------------------------------------

_ENGINE_PREFIX = re.compile(r"(?:Engine (\d+)|(\d+ Engines Aggregated)): ")
_VALUE = re.compile(r"\s*(-?\d[\d,]*(?:\.\d+)?)")
_INT_FIELDS = {"Running": "running", "Waiting": "waiting", "Pending": "waiting", "Swapped": "swapped",
               "Deferred": "deferred", "Preemptions": "preemptions", "Corrupted": "corrupted"}
_FLOAT_FIELDS = {"Avg prompt throughput": "prompt_throughput", "Avg generation throughput": "generation_throughput"}
_PCT_FIELDS = {"GPU KV cache usage": "gpu_kv_usage", "CPU KV cache usage": "cpu_kv_usage",
               "Prefix cache hit rate": "prefix_cache_hit_rate",
               "External prefix cache hit rate": "external_prefix_cache_hit_rate",
               "MM cache hit rate": "mm_cache_hit_rate"}
_STATS_FIELDS = EngineStats.__slots__
_KV_FETCH = re.compile(r"(\d{1,9}) waiting to start, (\d{1,9}) in progress, (\d{1,9}) completed waiting")


def _stats(msg: str) -> Event | None:
    """Any order, any optional field: `Key: value` pairs split on `, `."""
    if "Running: " not in msg:  # no `Running` field, no stats (below): most `Engi…` lines
        return None
    engine = None
    m = _ENGINE_PREFIX.match(msg)
    body = msg
    if m is not None:
        engine = m[1] or m[2]
        body = msg[m.end():]
    values: dict[str, float | int | str | None] = dict.fromkeys(_STATS_FIELDS)
    values["engine"] = engine
    seen = 0
    parts = body.split(", ")
    for i, part in enumerate(parts):
        key, sep, value = part.partition(": ")
        if not sep:
            continue
        key = key.strip()
        if key == "KV fetch":  # three fields in one (v1/metrics/loggers.py `KV_FETCH_STAGES`)
            m = _KV_FETCH.match(", ".join(parts[i:i + 3]), len("KV fetch: "))
            if m is not None:
                values["kv_fetch_waiting"], values["kv_fetch_in_progress"], values["kv_fetch_completed"] = (
                    fits(int(m[1])), fits(int(m[2])), fits(int(m[3])))
            continue
        v = _VALUE.match(value)
        if v is None:
            continue
        if key in _INT_FIELDS:
            values[_INT_FIELDS[key]] = fits(int(_num(v[1])))
        elif key in _FLOAT_FIELDS:
            values[_FLOAT_FIELDS[key]] = _num(v[1])
        elif key in _PCT_FIELDS:
            values[_PCT_FIELDS[key]] = _num(v[1]) / 100.0
        else:
            continue
        seen += 1
    if values["running"] is None or seen < 2:
        return None
    return EngineStats(**values)


# -- startup ---------------------------------------------------------------------------------

# 0.2's banner names no version: `Initializing an LLM engine with config: model=…`
_BANNER = re.compile(r"Initializing an? (?:(V[01]) )?LLM engine (?:\(v([^)]*)\) )?with config: ")
_MODEL = re.compile(r"(?:^|[\s,(])model=(?:'([^']*)'|\"([^\"]*)\")")
_SERVED = re.compile(r"[\s,(]served_model_name=([^,\s)]+)")
_DATA_PARALLEL = re.compile(r"[\s,(]data_parallel_size=(\d{1,4})\b")
_PADDING = re.compile(r" {2,}")
_FACTS = [  # (key, regex, attribute names of the groups)
    # Gaudi's model runner: `Loading model weights took in total 15.05 GiB of device memory (…)`
    ("Load", re.compile(r"Loading model weights took (?:in total )?" + _NUM + r" Gi?B"), ("vllm.startup.weights_gib",)),
    ("Mode", re.compile(r"Model loading took " + _NUM + r" Gi?B(?: memory)? and " + _NUM + r" s"),
     ("vllm.startup.weights_gib", "vllm.startup.load_s")),
    ("Memo", re.compile(r"Memory profiling takes " + _NUM + r" seconds"), ("vllm.startup.profile_s",)),
    ("Avai", re.compile(r"Available KV cache memory: " + _SIGNED + r" GiB"), ("vllm.startup.kv_cache_gib",)),
    ("GPU ", re.compile(r"GPU KV cache size: " + _NUM + r" tokens"), ("vllm.startup.kv_cache_tokens",)),
    ("CPU ", re.compile(r"CPU KV cache size: " + _NUM + r" tokens(?:, Maximum concurrency for " + _NUM
                        + r" tokens per request: " + _NUM + r"x)?"),
     ("vllm.startup.kv_cache_tokens", "vllm.startup.max_model_len", "vllm.startup.max_concurrency")),
    ("Maxi", re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x"),
     ("vllm.startup.max_model_len", "vllm.startup.max_concurrency")),
    ("Grap", re.compile(r"Graph capturing finished in " + _NUM + r" secs?(?:, took " + _NUM + r" GiB)?"),
     ("vllm.startup.graph_capture_s", "vllm.startup.graph_memory_gib")),
    ("init", re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s"),
     ("vllm.startup.init_s",)),
    ("torc", re.compile(r"torch\.compile (?:takes|took) " + _NUM + r" s in total"), ("vllm.startup.compile_s",)),
    # the model runner names what it loads (the path): the model when no banner names it
    ("Star", re.compile(r"Starting to load model (\S+?)(?:\.\.\.)?$"), ("gen_ai.request.model",)),
    ("vLLM", re.compile(r"vLLM (?:API )?server version ([^\s,]+)(?:, serving model (\S+))?"),
     ("vllm.version", "vllm.startup.model_path")),
    ("Engi", re.compile(r"Engine \d+: vllm cache_config_info with initialization after num_gpu_blocks is: (\d+)"),
     ("vllm.startup.gpu_blocks",)),
]
_BLOCKS = re.compile(r"# (\w+) blocks: (\d+), # CPU blocks: (\d+)")
_MEMORY_SPLIT = re.compile(
    r"total_gpu_memory \(" + _NUM + r"GiB\) x gpu_memory_utilization \(" + _NUM + r"\) = " + _NUM + r"GiB"
    r"|reserved for KV Cache is " + _SIGNED + r"GiB"
)
_STRINGS = {"vllm.version", "vllm.startup.model_path", "gen_ai.request.model"}
#: The logo banner (0.2x, `log_version_and_model`): two of its lines name the version and the
#: served model beside the art. Keyed by the art's start as vLLM's template writes it.
_LOGO = re.compile(r"[ ▀▄█]+ (version|model) +(\S+)$")
_LOGO_FACT = {"version": "vllm.version", "model": "gen_ai.request.model"}


#: The API server's arguments (`non-default args: {…}` since 0.9, `args: Namespace(…)` before):
#: the served name clients send, else the model. Read from their own keys only. The served name
#: is also told as such: it wins over the model the logo named before it (`args.model`).
_ARGS_SERVED = re.compile(r"""['"]?served_model_name['"]?(?::\s*|=)\[['"]([^'"]+)['"]""")
_ARGS_MODEL = re.compile(r"""(?:^|[{(,]\s*)['"]?model['"]?(?::\s*|=)['"]([^'"]+)['"]""")
#: `vllm serve <model>`'s positional (`args: Namespace(subparser='serve', model_tag='…', …)`), which
#: vLLM sets the model from: the model where the `model` key's value is not whole (a cut line).
_ARGS_MODEL_TAG = re.compile(r"""(?:^|[{(,]\s*)['"]?model_tag['"]?(?::\s*|=)['"]([^'"]+)['"]""")


def _server_args(msg: str) -> Event | None:
    if not msg.startswith(("non-default args: {", "args: Namespace(")):
        return None
    body = msg[msg.index(" ") + 1:]
    served = _ARGS_SERVED.search(body)
    if served is not None:
        return StartupFact((("gen_ai.request.model", served[1]), (SERVED_MODEL, served[1])))
    m = _ARGS_MODEL.search(body) or _ARGS_MODEL_TAG.search(body)
    return StartupFact((("gen_ai.request.model", m[1]),)) if m is not None else None


_server_args.prefixes = ("non-default args: {", "args: Namespace(")


def _logo(msg: str) -> Event | None:
    m = _LOGO.fullmatch(msg)
    return StartupFact(((_LOGO_FACT[m[1]], m[2]),)) if m is not None else None


#: gpu_model_runner.py (V1 ≥ 0.19) before it captures and measures the CUDA graphs, per mode:
#: `Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)`.
_GRAPH_PROFILE = "Profiling CUDA graph memory: "
_GRAPH_MODE = re.compile(r"[A-Z_]+=(\d+) \(largest=(\d+)\)")


def _graph_profile(msg: str) -> Event | None:
    modes = _GRAPH_MODE.findall(msg, len(_GRAPH_PROFILE))
    if not modes:
        return None
    return StartupFact((("vllm.startup.cuda_graphs", fits(sum(int(n) for n, _ in modes))),
                        ("vllm.startup.cuda_graph_largest", fits(max(int(b) for _, b in modes)))))


#: Lines of a model being compiled, warmed up or its graphs captured: vLLM's torch.compile and
#: CUDA graphs, the XLA precompile of vLLM's TPU runner and of tpu-inference
#: (`compilation_manager.py`: `Precompile <graph> --> {…}`, `Compilation [of <graph>] finished in
#: 3.53 [secs].`), Gaudi's warm-up. A start does them once, before it serves: each is a startup
#: line, whatever the platform. A graph's own compile time is summed (`_SUMMED` in assemble).
_COMPILING_LINES = (
    "Precompile ", "Compilation finished in ", "Compilation of ", "Compiling a graph", "Compiling the model",
    "Compile and warming up", "Capturing CUDA graph", "Capturing cudagraphs", "Capturing the model",
    "Dynamo bytecode transform", "Directly load", "Cache the graph", "Warm-up call pass finished",
    "Starting torch.compile", "Initial profiling/warmup run took", "Warmup finished in", "[Warmup]",
    # the worker's kernel warm-up before graph capture (model_executor/warmup/*: `Warming up FlashInfer
    # attention.`, `… Qwen GDN Triton kernels …`; the CPU runner's `Warming up model for the
    # compilation...`), and the JIT kernels' (`JIT kernel warmup starting.` / `finished in 1.20s.`)
    "Warming up ", "JIT kernel warmup ")
#: Lines a start prints once while it loads its model and builds its workers, on any platform:
#: the weights read (`Loading weights from …`, V1's `Loading weights took 24.84 seconds`), a worker
#: given its ranks (parallel_state: `rank 0 in world size 1 is assigned as DP rank 0, …`),
#: tpu-inference's runner and worker built (`Init mesh | …`, `Init worker | …`, `Init model | hbm=…`),
#: vllm-gaudi's sampler warm-up; and what a start sets up once, whose lines carry no number: the
#: checkpoint's shards read (`Loading safetensors checkpoint shards:`, its progress bar), the
#: executor's message queues (shm_broadcast: `vLLM message queue communication handle: …`).
#: Startup lines, like the compile lines above (under keys that hold no other rule: a new
#: prefilter key would make every other line under it a near miss, `MALFORMED`). Not pynccl's `Found nccl from library` / `vLLM is using nccl==`: a trainer's weight
#: sync (TRL, verl) builds an NCCL communicator in a serving engine and prints them again.
_LOADING_LINES = ("Loading weights from ", "Loading weights took ", "Init mesh | ", "Init worker | ",
                  "Init model | ", "Starting sampler warmup", "Loading safetensors checkpoint shards",
                  "vLLM message queue communication handle")
_RANK_ASSIGNED = re.compile(r"rank \d+ in world size \d+ is assigned as ")
_GRAPH_COMPILED = re.compile(r"Compilation (?:of .{1,300}? )?finished in " + _NUM + r" \[?secs?\]?")


def _compiling(msg: str) -> Event | None:
    m = _GRAPH_COMPILED.match(msg)
    if m is None:
        return _COMPILE_LINE
    return StartupFact((("vllm.startup.precompile_s", _num(m[1])), ("vllm.startup.precompiled_graphs", 1)))


_COMPILE_LINE = StartupFact(())

#: The API server's line as its start ends and it begins to listen (api_server.py: `Starting vLLM
#: API server on http://…`, later `Starting vLLM server on http://…`, `Starting vLLM API server 0
#: on …` with several): the last line of a start, so a startup line (it ends the span, or opens
#: one where the lines begin there). The route listing after it is not: a list of paths.
_LISTENING_LINES = ("Starting vLLM API server", "Starting vLLM server")
_LISTENING = StartupFact((), listening=True)


def _listening(msg: str) -> Event | None:
    return _LISTENING


def _loading(msg: str) -> Event | None:
    return _COMPILE_LINE


#: The loader's own time for reading the weights (default_loader.py: `Loading weights took 16.18
#: seconds`), printed before the model runner's `Model loading took … GiB and … s` (the whole load):
#: the start's load time only where the runner's line never came (a start that failed in between).
_WEIGHTS_READ = re.compile(r"Loading weights took " + _NUM + r" s(?:ec(?:ond)?s?)?\b")


def _weights_read(msg: str) -> Event | None:
    m = _WEIGHTS_READ.match(msg)
    return None if m is None else StartupFact(((WEIGHTS_READ_S, _number(m[1])),))


def _rank_assigned(msg: str) -> Event | None:
    return _COMPILE_LINE if _RANK_ASSIGNED.match(msg) else None


def _fact_rule(pattern: re.Pattern[str], names: tuple[str, ...]):
    def rule(msg: str) -> Event | None:
        m = pattern.match(msg)
        if m is None:
            return None
        facts = []
        for name, value in zip(names, m.groups()):
            if value is not None:
                facts.append((name, value if name in _STRINGS else _number(value)))
        return StartupFact(tuple(facts))
    return rule


def _number(text: str) -> int | float:
    v = _num(text)
    return fits(int(v)) if "." not in text and v.is_integer() else v


def _memory_profile(msg: str) -> Event | None:
    """V0's 3-line message (joined by decode), or V1's one-line DEBUG variant."""
    m = _FACT_RULES["Memo"](msg)
    if m is None:
        return None
    facts = list(m.facts)
    for mm in _MEMORY_SPLIT.finditer(msg):
        if mm[1] is not None:
            facts += [("vllm.startup.total_gpu_gib", _num(mm[1])),
                      ("vllm.startup.gpu_memory_utilization", _num(mm[2]))]
        else:
            facts.append(("vllm.startup.kv_cache_gib", _num(mm[4])))
    return StartupFact(tuple(facts))


def _banner(msg: str) -> Event | None:
    m = _BANNER.match(msg)
    if m is None:
        return None
    # The name clients send in `model` (--served-model-name) is what `gen_ai.request.model` means;
    # the path or hub id is the fallback.
    served = _SERVED.search(msg, m.end() - 1)
    mm = _MODEL.search(msg, m.end() - 1)
    model = served[1] if served else (mm[1] if mm[1] is not None else mm[2]) if mm else None
    if model is not None and "  " in model:
        # a long line a terminal wrapped, copied with the padding of its rows: no model name holds
        # a run of spaces (`model='                google/gemma-2-2b-it'`)
        model = _PADDING.sub("", model).strip()
    dp = _DATA_PARALLEL.search(msg, m.end() - 1)
    return EngineConfig(m[2] or "", m[1] or "", model, int(dp[1]) if dp else 1)


def _blocks(msg: str) -> Event | None:
    m = _BLOCKS.match(msg)
    if m is None:
        return None
    return StartupFact((("vllm.startup.gpu_blocks", count(m[2])), ("vllm.startup.cpu_blocks", count(m[3]))))


_FACT_RULES = {key: _fact_rule(p, names) for key, p, names in _FACTS}

# -- errors ----------------------------------------------------------------------------------

#: A worker's call that raised, as the worker reports it (`EngineError.basis` "rpc").
_WORKER_RPC = "workerproc hit an exception"


#: Ordered: the first family whose marker occurs wins, so a CUDA OOM wrapped in an engine-dead
#: error is `oom`, and an NCCL watchdog "timeout" is `distributed`. Markers are read in what the
#: error says (`_evidence`): its messages and exception lines, not its traceback's frames.
#: A process killed by a signal (faulthandler's report, Ray's and glog's) died, at start too; so did
#: one whose GPU faulted on a memory access (ROCm's runtime prints it and aborts the process).
_SIGNALS = ("fatal python error", "segmentation fault", "sigsegv", "sigabrt", "sigbus", "core dumped",
            "memory access fault by gpu")
_CLASSES = (
    ("oom", ("out of memory", "outofmemoryerror", "no available memory for the cache blocks",
             "maximum number of tokens that can be stored in kv cache",
             "is larger than the available kv cache memory", "resource_exhausted", "error allocating device buffer",
             # V0's scheduler: a preempted request's KV blocks did not fit the CPU swap space
             "lack of cpu swap space",
             # the device runtime's own: Level Zero's (XPU) UR_RESULT_…, ROCm's HSA_STATUS_…
             "error_out_of_resources",
             # a start refused because the device has less free memory than the share asked of it
             # (gpu_worker init_device: `Free memory on device (3.22/4.0 GiB) on startup is less
             # than desired GPU memory utilization (0.9, 3.6 GiB)`): the memory is not there
             "less than desired gpu memory utilization")),
    ("distributed", ("nccl", "processgroup", "watchdog", "heartbeat monitor", "collective operation",
                     "distbackenderror", "gloo",
                     "actordiederror", "actor died", "actor is dead",
                     # a KV connector's transport (disaggregated serving): the NIXL library's own
                     # C++ lines (`nixl_agent.cpp:1198] postXferReq: remote agent … was
                     # disconnected`, status `NIXL_ERR_REMOTE_DISCONNECT`) and UCX's under it
                     "nixl_agent", "nixl_err", "ucx error")),
    ("engine_dead", _SIGNALS),
    # shm_broadcast's wait for a reader: the engine or a worker hangs (vLLM says so since #25566:
    # "processes are hanging or doing some time-consuming work"), its message queue is sound
    ("timeout", ("timed out", "timeouterror", "timeout", "shared memory broadcast", "no available block found")),
    ("model_load", ("failed to load model", "safetensors", "huggingface_hub", "repository not found",
                    "no such file or directory", "does not appear to have a file", "load_weights",
                    "model_loader", "gated repo", "is not a valid model", "model architectures",
                    "entrynotfounderror", "repositorynotfounderror", "initialization failed",
                    "failed to start", "401 client error", "403 client error", "404 client error",
                    "invalid repository id", "hfvalidationerror")),
    ("engine_dead", ("enginedeaderror", "engine loop is not running", "background loop",
                     # a CUDA error that poisons the device's context (CUDA's sticky errors): the
                     # process cannot go on, the engine dies of it (while it is built: a failed start)
                     "illegal memory access", "device-side assert",
                     "background task failed", "terminating server process", "died", "fatal error",
                     "killing local vllm worker", "output_handler failed", "engine dead",
                     # the engine core's dump of a step that raised (dump_input.py), before it re-raises:
                     # one line since 0.9, `Dumping input data` then `V1 LLM engine (v…) with config` before;
                     # V0's worker dumps the input of a model execution that raised (model_runner_base.py)
                     "dumping input data", "writing input of failed execution",
                     # EngineDeadError's own message (v1/engine/exceptions.py), quoted by what it failed
                     "enginecore encountered an issue",
                     # the executor lost a worker (its monitor sets `is_failed`): the engine core's busy
                     # loop, or its next collective RPC, raises `RuntimeError("Executor failed.")`
                     "executor failed",
                     # V1's engine client (0.8–0.9, core_client.py): the engine core, failing, signalled
                     # its parent (SIGUSR1), which logs this and shuts down: the engine died (or its
                     # start failed, told by the frames of a traceback with it)
                     "got fatal signal from worker processes",
                     # a V1 worker's RPC raised (multiproc_executor's busy loop: `WorkerProc hit an
                     # exception.`): outside a start that is the batch it was running, and the engine
                     # core, its collective RPC failed, raises in its busy loop and dies (its next line,
                     # `EngineCore encountered a fatal error`, says so when it is there); under a
                     # start's frames a failed start (`_started`). Not fatal by itself: a utility RPC
                     # (a LoRA, sleep) fails the call only
                     _WORKER_RPC)),
    ("input", ("bad request", "badrequest", "input error", "is too long", "validation error",
                     "maximum context length", "invalid input", "invalid request")),
    ("aborted", ("abort", "cancellederror")),
)
_FATAL = ("enginedeaderror", "engine loop is not running", "background loop", "background task failed",
          "terminating server process", "died", "fatal error", "killing local vllm worker",
          "output_handler failed", "taking the entire process down", "will be terminated",
          "initialization failed", "failed to start", "engine iteration timed out", "terminate called",
          "dumping input data", "writing input of failed execution", "executor failed",
          "got fatal signal from worker processes", *_SIGNALS)
#: An exception line: a class named like one, or Python's bare `Exception` with its colon (vLLM
#: raises it: multiproc_executor's `Exception: WorkerProc initialization failed due to …`; torch's
#: `Exception raised from …` is a C++ block's line, no exception).
_EXC = re.compile(r"^(?:\[rank\d+\]: ?)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)|Exception(?=:)):? ?(.*)$",
                  re.M)
_MAX_MESSAGE, _MAX_STACK = 1024, 8 * 1024
#: A list of what *may* have caused an error (Ray's "There are some potential root causes. (1) …
#: OOM killer …") names every cause its writer could think of: it is no evidence of any of them.
_POSSIBLE_CAUSES = re.compile(
    r"(?:there are some potential root causes|some common causes include|possible causes?)\b.*$", re.I | re.M)
_CARETS = re.compile(r"[\s^~]+")
#: Where the error was raised, when what it says names no cause (the exception line cut off, a
#: wrapper's message): frames of vLLM's model fetch and load, of an engine being built (a failed
#: start), and of the serving loop or the model's forward (the engine died while serving). Read in
#: that order: a start also runs the model once (`profile_run`, graph capture, precompile) through
#: the serving code, so a start frame anywhere in the text makes it a start.
_LOAD_FRAMES = ("model_loader", "load_weights", "safetensors", "huggingface_hub", "hf_raise_for_status")
_START_FRAMES = (
    "enginecoreproc(", "mqllmengine.from_", "from_engine_args", "from_vllm_config", "_initialize_kv_caches",
    "determine_num_available_blocks", "determine_available_memory", "profile_run", "initialize_from_config",
    "compile_or_warm_up_model", "capture_model", "warmup_model", "in load_model", "_init_executor", "_init_workers",
    "launch_core_engines", "wait_for_engine_startup", "make_async_mp_client", "make_client",
    "build_async_engine_client", "get_kv_cache_config",
    # a worker taking its device and joining its group (every platform's worker: init_device; the
    # TPU runners build their device mesh), done once before any model runs
    "in init_device", "init_worker_distributed_environment", "init_distributed_environment",
    "initialize_model_parallel", "ensure_model_parallel_initialized", "_init_mesh", "create_device_mesh",
    "make_mesh(",
    # a worker built (multiproc_executor's worker_main constructs WorkerProc, then serves) and its
    # process groups created (parallel_state: one GroupCoordinator per group, at start only)
    "workerproc(", "groupcoordinator(", "init_model_parallel_group", "init_world_group",
    # XLA / torch.compile precompilation and warm-up of the shapes a start prepares (TPU, Gaudi, NPU)
    "precompile", "in warm_up", "_warm_up_", "in warmup",
    # the API server's entry: an exception that leaves run_server reaches `main` only when the
    # server could not be set up (serving errors are answered per request, a stop returns)
    "run_server(", "in run_server", "in setup_server", "in init_app_state",
    # Ray Serve starts a replica (whose constructor builds the engine) in initialize_and_get_metadata;
    # its controller's check_ready is where that start's failure comes out
    "initialize_and_get_metadata", "in check_ready")
_SERVING_FRAMES = (
    "run_busy_loop", "_process_engine_step", "step_with_batch_queue", "in execute_model", "output_handler",
    "get_output_async", "in get_output", "engine_step", "step_async", "run_engine_loop", "_process_request",
    "stream_generator", "in get_response", "in step", "_run_engine",
    # V0's non-driver workers run each scheduled batch in their execution loop
    "start_worker_execution_loop", "execute_model_async",
    # the model's forward (torch's Module call): with no start frame around it, a batch being served
    ", in forward\n", "in _call_impl", "forward_call(")
#: What an error says or where it was raised of a kernel or graph being compiled: a compiler's
#: command that failed (`subprocess`'s `Command '['/usr/bin/clang++', …]'`, Triton's and inductor's
#: builds), the compiler stack's own errors, or frames of vLLM's torch.compile backend and of
#: dynamo / inductor compiling a frame. vLLM compiles its graphs and kernels while it starts
#: (torch.compile, warm-up, graph capture, XLA precompile): with no serving frame, a failed start.
_COMPILING = re.compile(
    r"command '\[[^\]\n]{0,200}?\b(?:clang\+\+|clang|g\+\+|gcc|c\+\+|cc|nvcc|hipcc|icpx|bisheng|ld)'"
    r"|backendcompilerfailed|inductorerror|compilationerror|compilation failed|\bptxas\b"
    r"|/compilation/(?:backends|compiler_interface|piecewise_backend)\.py|compiler_manager\.compile"
    r"|torch/_dynamo/convert_frame\.py|torch/_inductor/compile_fx\.py")


_INTERRUPTED = "keyboardinterrupt"


#: Source lines that say what was raised: a `raise X("…")` and the continuation of its string
#: (the exception line itself may be cut off where the paste ended).
_RAISED = ("raise ", '"', "'")


def _evidence(text: str) -> str:
    """What an error says: its messages and exception lines, without its traceback's frames (a
    frame's source line, `get_response(w, dequeue_timeout)`, says nothing of the failure) and
    without a list of possible causes."""
    keep = [line for line in text.split("\n")
            if line and (not line[0].isspace() or line.lstrip().startswith(_RAISED))
            and not line.startswith('File "') and not _CARETS.fullmatch(line)]
    return _POSSIBLE_CAUSES.sub("", "\n".join(keep))


def _by_frames(text: str) -> tuple[str, str]:
    low = text.lower()
    for error_type, markers in (("model_load", _LOAD_FRAMES), ("model_load", _START_FRAMES),
                                ("engine_dead", _SERVING_FRAMES)):
        if any(marker in low for marker in markers):
            return error_type, "frames"
    if _COMPILING.search(low):
        return "model_load", "said"
    return "other", "said"


def classify(text: str, shape: str | None = None) -> str:
    """The error type of `text`. `shape`: the same text with what a client may have typed
    masked (`redact_error_text`); given, an engine death must be said there, in vLLM's own
    words: a client's model name or prompt holding `died` does not kill the engine, while an
    exception's repr (`RuntimeError('CUDA out of memory')`) still tells the other types.
    The root cause wins over its wrappers: what the error says first (`_CLASSES`), and only when
    it names no cause, where it was raised (`_by_frames`)."""
    return _classified(text, shape)[0]


def _classified(text: str, shape: str | None = None) -> tuple[str, str]:
    """`classify`'s type, and what it rests on (`EngineError.basis`)."""
    low = _evidence(text).lower()
    low_shape = None if shape is None else _evidence(shape).lower()
    if _INTERRUPTED in low:
        return "other", "said"  # a stop someone asked for (Ctrl-C), wherever it came out: no failure
    for error_type, markers in _CLASSES:
        said = low_shape if error_type == "engine_dead" and low_shape is not None else low
        for marker in markers:
            if marker in said:
                return _started(error_type, markers, text, said, marker)
    return _by_frames(text)


#: A process a signal killed: Python's multiprocessing reports its exit code as minus the signal
#: (vLLM: V0's `Worker … died, exit code: -9`, V1's `Worker proc … died unexpectedly (exit code:
#: -9)`, `Process … died with exit code -9`).
_SIGNAL_EXIT = re.compile(r"\bexit[ _]?code[:=]? ?\(?-\d+\b")


def _started(error_type: str, markers: tuple[str, ...], text: str, said: str, marker: str) -> tuple[str, str]:
    """An engine that was still being built cannot die: a fatal error raised under its start's
    frames is a failed start (a killing signal stays a death). A worker's call that raised with
    no such frame is the batch's or the start's: the assembler knows which (basis `rpc`)."""
    if error_type == "engine_dead" and (markers is _SIGNALS or _SIGNAL_EXIT.search(said)):
        return error_type, "signal"
    if error_type == "engine_dead" and any(m in text.lower() for m in _START_FRAMES):
        return "model_load", "said"
    return error_type, "rpc" if marker == _WORKER_RPC else "said"


def engine_error(msg: str) -> EngineError:
    """Any error record: one line or a joined traceback / C++ block. Its type and whether it
    is fatal are read from the text as it would be exported (quoted literals and other user
    values masked): a client's model name `x-died` must not read as an engine death."""
    shape = redact_error_text(msg)
    low = shape.lower()
    excs = _EXC.findall(msg)
    exc_type = excs[-1][0] if excs else ""
    first = msg.split("\n", 1)[0]
    if first.startswith(("Traceback", "Process ")) and excs:
        message = f"{excs[-1][0]}: {excs[-1][1]}".rstrip(": ")
    elif excs and "\n" in msg and excs[-1][0] not in first:
        message = f"{first} {excs[-1][0]}: {excs[-1][1]}".rstrip(": ")
    else:
        message = first
    fatal = any(f in low for f in _FATAL)
    stack = msg if "\n" in msg else ""
    error_type, basis = _classified(msg, shape)
    w = _WORKER_DIED.match(msg) if msg.startswith("Worker ") else None
    worker = "" if w is None else f"{w[1]} pid={w[2]}" if w[2] else w[1]
    m = _HANG.search(msg) if error_type in ("distributed", "timeout") and "found in" in msg else None
    repeats_s = 0.0 if m is None else float(m[1])
    c = _CORE_DIED.match(msg) if msg.startswith("Engine core proc ") else None
    return EngineError(error_type, exc_type.rsplit(".", 1)[-1], message[:_MAX_MESSAGE], fatal,
                       stack[:_MAX_STACK], basis=basis, worker=worker, repeats_s=repeats_s,
                       core="" if c is None else c[1])


#: vLLM's shm_broadcast while a reader or writer waits for a block (a hang, or a long compile):
#: warned again at each interval it goes on waiting (`VLLM_RINGBUFFER_WARNING_INTERVAL`), each
#: warning naming the interval (`No available block found in 60 second.` in V0's wording).
_HANG = re.compile(r"No available (?:shared memory broadcast )?block found in (\d{1,6}(?:\.\d{1,6})?) seconds?")


#: The executor's monitor names the worker that died (multiproc_executor.py `monitor_workers`:
#: `Worker proc VllmWorker-1 died unexpectedly (exit code: -9)`, its multiprocessing name, the
#: executor's rank; V0's multiproc_worker_utils: `Worker VllmWorkerProcess pid 1159 died`).
_WORKER_DIED = re.compile(r"Worker (?:proc )?([\w.-]+)(?: pid (\d+))? died\b")
#: The engine client's monitor names the engine core process that died (core_client.py
#: `Engine core proc EngineCore_DP1 died unexpectedly, shutting down client.`).
_CORE_DIED = re.compile(r"Engine core proc ([\w.-]+) died\b")


#: Error lines of vLLM's own loggers, as (literal start, regex for the rest): the starts are also
#: `_maybe_error`'s guard (`_starting`), so they are written once.
_ERROR_STARTS = (
    ("Engine background task failed", ""), ("Engine iteration timed out", ""),
    ("Engine core initialization failed", ""), ("EngineCore failed to start", ""), ("EngineCore encountered", ""),
    ("Worker ", ".*died"), ("WorkerProc initialization failed", ""), ("RayWorkerProc ", ".*died"),
    # multiproc_executor.py worker_main: `WorkerProc failed to start.` (building the worker) or
    # `WorkerProc failed.` (its busy loop), its traceback following
    ("WorkerProc failed", ""),
    ("AsyncLLMEngine ", "(?:has failed|is already dead)"), ("AsyncLLM output_handler failed", ""),
    ("No available ", "(?:shared memory broadcast )?block found"), ("Process ", r"[\w-]+:\n"),
    ("Traceback (most recent", ""), ("Error in ", ""), ("Exception in ", ""), ("TimeoutError: RPC call", ""),
    ("Fatal Python error: ", ""), ("*** SIG", r"[A-Z]+ received"), ("RESOURCE_EXHAUSTED: ", ""),
    ("Writing input of failed execution", ""), ("Memory access fault by GPU", ""),
    # vLLM's CUDA memory allocator (csrc/cumem_allocator.cpp, sleep mode's pool) prints a failed CUDA
    # call itself, with no header: `CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62`
    ("CUDA Error: ", r".* at \S+:\d+"),
)
_ERROR_TEXT = re.compile("|".join(re.escape(start) + rest for start, rest in _ERROR_STARTS))


def _maybe_error(msg: str) -> Event | None:
    if msg.startswith(_CLIENT_ERRORS):
        return _CLIENT_ERROR
    if _ERROR_TEXT.match(msg):
        return engine_error(msg)
    return None


_STATS_EXTRA = ("Prefix cache hit rate: GPU", "Speculative metrics: ", "SpecDecoding metrics: ",
                "KV Transfer metrics: ", "KV connector", "CUDA graph", "Perf ")


#: V1's first engine core (0.7, core.py `_log_stats`, every 5 s while it has work): the scheduler's
#: two queues and nothing else, `RUNNING: 306 | WAITING: 628`: a stats line all the same.
_CORE_QUEUES = re.compile(r"RUNNING: (\d+) \| WAITING: (\d+)\s*$")


def _core_queues(msg: str) -> Event | None:
    m = _CORE_QUEUES.match(msg)
    if m is None:
        return None
    return EngineStats(None, None, None, fits(int(m[1])), fits(int(m[2])), None, None, None, None, None, None, None,
                       None, None)


def _stats_extra(msg: str) -> Event | None:
    return Notice("stats_extra") if msg.startswith(_STATS_EXTRA) else None


# -- other writers: uvicorn, tqdm, torch C++ -------------------------------------------------

_UVICORN_ACCESS = re.compile(r"(?:INFO|WARNING|ERROR):\s+\S+ - \"(\S+) (\S+) HTTP/[\d.]+\" (\d{3})")
_UVICORN = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):\s{1,8}\S")


def _uvicorn(msg: str) -> Event | None:
    m = _UVICORN_ACCESS.match(msg)
    if m is not None:
        return AccessLog(m[1], m[2].split("?", 1)[0], int(m[3]))
    m = _UVICORN.match(msg)
    if m is None:
        return None
    return _STOP_SERVER if msg.startswith(_UVICORN_STOP, m.end() - 1) else _HTTP_SERVER


# `(?<!\d)`: a run of digits is tried from its first digit only. Without it `search` tried
# `\d+%` from every digit of the run, each scanning to its end: 100,000 digits and no `%|`
# took a minute. A match inside a run implies one from its start, so nothing else changes.
_PROGRESS = re.compile(r"(?<!\d)\d+%(?:\||\s*Completed\s*\|)|\|\s*\d+/\d+ \[[\d:<]+|it/s\]|s/it\]")


def _progress(msg: str) -> bool:
    """A progress bar (tqdm's `42%|` or `| 3/8 [00:01<…`, `it/s]`). Every alternative needs a
    `%`, a `|` or `it]`/`s]`: testing for those first spares most lines the regex search."""
    return ("%" in msg or "|" in msg or "it]" in msg or "s]" in msg) and _PROGRESS.search(msg) is not None
_PY_WARNING = re.compile(r"\S+\.py:\d+: \w*Warning: ")
#: Header-less lines from libraries in vLLM's processes that carry nothing: nanobind's leak report
#: at exit, Triton's backend notice, the source line Python prints under a warning.
_LIBRARY_NOISE = ("nanobind: ", " - leaked ", " - ... skipped remainder", "Triton is installed",
                  "See https://nanobind", "  ")
_GLOG = re.compile(r"(?:\[rank\d+\]:)?\[[EFW][\d ].*?\] |(?:\[rank\d+\]:)?\[PG \d+")
# glog without brackets (older torch, absl): `E1022 09:33:49.123456  1234 ProcessGroupNCCL.cpp:1316] …`
#: KServe's logger (`%(process)d %(name)s %(levelname)s [%(filename)s:%(funcName)s():%(lineno)s]`),
#: its stamp taken off by decode as a shipper's: `1 kserve ERROR [__main__.py:<module>():254] …`.
_KSERVE = re.compile(r"\d+ kserve (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[[^\]\n]*\] ")
_WRAPPER_LOG = Notice("wrapper_log")
#: A glog line's own level is its first letter: W and I are no error, however many lines follow.
_GLOG_QUIET = re.compile(r"(?:\[rank\d+\]:)?\[[WI][\d ]")
_GLOG_BARE = re.compile(r"[EFWI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\s\]]+:\d+\] ")

#: Known vLLM lines with nothing to assemble, by prefix: counted as recognised, under a kind.
_NOTICES = (
    ("startup_info", (
        "Automatically detected platform", "Using ", "Starting to load model", "Resolved architecture",
        "Chunked prefill is enabled", "Supported_tasks", "Supported tasks",
        "Default sampling parameters", "non-default args", "This model's",
        "Available routes are", "Route: ", "Waiting for ", "Graph capturing", "Setting max_num_batched_tokens",
        "Disabling", "Enabling",
        "CUDA graph", "Asynchronous scheduling", "AsyncLLM created with", "Started engine process",
        "Multiprocessing frontend",
        "Downcasting", "Casting", "Defaulting", "Overriding", "Possible", "Reducing", "Detected",
        "Found ", "Model loading", "Loading model", "Initializing", "Chat template", "world_size",
        "vLLM is using", "Ray", "Connected", "Sleep mode", "Prefix caching", "Custom allreduce",
        "NCCL", "pynccl", "Attention", "FlashInfer", "flashinfer", "Registering", "V1 LLM engine",
        "Initialized", "Local ", "Loaded ", "Dumping ", "Gracefully", "Stopping",
        "Killing local vLLM worker", "Worker ready", "vLLM server version",
        "Scale-out endpoints", "`--enable-log-requests` is set",
    )),
    ("engine_loop", (  # the engine's own DEBUG heartbeat and IPC set-up and shutdown
        "EngineCore waiting for work", "EngineCore loop active", "Received init message", "HELLO from",
        "Has DP Coordinator", "Poller ", "Binding to ", "Connecting to ", "vLLM message queue communication",
        "Parent process exited", "Waiting for init message", "Core engine process",
        "DP group leader", "Called check_health", "Canceling waiting reads", "WorkerProc handling signal",
    )),
    ("request_rejected", ("create_error_response called with",)),  # DEBUG, no request id
)

#: Modules (file stem, or the last part of a JSON record's logger name) whose lines may carry a
#: request's lifecycle, the engine's stats or its failures. Their INFO/DEBUG/WARNING lines must be
#: matched by a rule or listed above, or `check` shows them as unrecognised: that is how a new
#: format gets noticed. Lines of other vLLM modules at those levels are configuration chatter.
REQUEST_ENGINE_MODULES = frozenset({
    "request_logger", "async_llm", "llm_engine", "async_llm_engine", "core", "core_client", "loggers",
    "metrics", "scheduler", "output_processor", "engine", "multiproc_executor", "multiproc_worker_utils",
    "ray_distributed_executor", "shm_broadcast", "serving_chat", "serving_completion", "serving_engine",
    "error_response", "launcher", "api_server",
})
_CHATTER_LEVELS = frozenset({"INFO", "DEBUG", "WARNING"})


def module_of(origin: str) -> str:
    """`v1/engine/core.py:123` or `core.py:123` → `core`; `vllm.v1.engine.core` (JSON) → `core`."""
    if ":" in origin or origin.endswith(".py"):
        return origin.rsplit(":", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return origin.rsplit(".", 1)[-1]


def _notice_groups() -> dict[str, tuple[tuple[Notice, tuple[str, ...]], ...]]:
    """First character → ((Notice, prefixes), …) in `_NOTICES`' order: a chatter line is
    compared with the few prefixes that can match it, not all of them."""
    groups: dict[str, list] = {}
    for kind, prefixes in _NOTICES:
        for c in sorted({p[0] for p in prefixes}):
            groups.setdefault(c, []).append((Notice(kind), tuple(p for p in prefixes if p[0] == c)))
    return {c: tuple(g) for c, g in groups.items()}


_NOTICE_GROUPS = _notice_groups()
# Notices are frozen: one instance per kind serves every line of that kind.
_NOISE, _VLLM_OTHER, _TORCH_LOG, _HTTP_SERVER = (Notice("noise"), Notice("vllm_other"), Notice("torch_log"),
                                                 Notice("http_server"))
_MODULE_OF: dict[str, str] = {}  # origin → module; origins are a few hundred file:line pairs


def _notice(msg: str) -> Event | None:
    for notice, prefixes in _NOTICE_GROUPS.get(msg[:1], ()):
        if msg.startswith(prefixes):
            return notice
    return None


#: The model loader's modules: vLLM's (`model_loader/*_loader.py`, `weight_utils.py`, `loader.py`
#: before 0.7), tpu-inference's (`model_loader.py`, `weight_utils.py`, the MoE weights' padding in
#: `moe_weights.py`). What they print, whatever it says, is the model being loaded: a startup line.
_LOADER_MODULE = re.compile(r"(?:\w*_)?loader|weight_utils|\w+_weights")
#: The name `_chatter_module` gives every loader module: one entry in the module set the C fast
#: path hands back to Python (`LINE_MODULES`), whatever the loader's file is called.
LOADER = "<model loader>"
#: Modules whose lines the fallback reads, rather than count as chatter: the C fast path answers
#: a line of any other module as `vllm_other` without calling Python.
LINE_MODULES = REQUEST_ENGINE_MODULES | {LOADER}


def _chatter_module(origin: str) -> str:
    module = _MODULE_OF.get(origin)
    if module is None:
        if len(_MODULE_OF) >= 4096:
            _MODULE_OF.clear()
        module = module_of(origin)
        module = _MODULE_OF[origin] = LOADER if _LOADER_MODULE.fullmatch(module) else module
    return module


#: ERROR lines about one client's request, not the engine: a model name that is not served
#: (`serving.py`: "Error with model ErrorInfo(… code=404)"), a grammar that does not compile
#: (`structured_output/__init__.py`, the client's schema or regex, its traceback following), and
#: the prompt of a request that could not be rendered or tokenized (serving_*.py before 0.11 logs
#: "Error in preprocessing prompt inputs" and answers the client 400), and
#: `--log-error-stack`'s reports of a request the HTTP layer refused or failed
#: (`exception_handling/handlers/`: an HTTPException, a validation error, an exception in its
#: handler; not "Engine Exception caught", the engine's). The request's own lines say how it ended.
_CLIENT_ERRORS = ("Error with model ", "Failed to compile grammar for request ", "HTTPException caught. Request id: ",
                  "RequestValidationError caught. Request id: ", "Exception caught. Request id: ",
                  "Error in preprocessing prompt inputs")
_CLIENT_ERROR = Notice("client_error")
#: The OpenAI front end's request handlers (entrypoints/openai/serving_*.py): what they log is about
#: the request they serve.
_SERVING_MODULES = frozenset({"serving_chat", "serving_completion", "serving_engine", "serving_responses",
                              "serving_embedding", "serving_pooling", "serving_score", "serving_classification",
                              "serving_tokenization", "serving_transcription"})

_UVICORN_JSON_ACCESS = re.compile(r"\S+ - \"(\S+) (\S+) HTTP/[\d.]+\" (\d{3})")


#: A Python traceback's frame line (decode joins the frames that follow it into one record); its
#: indentation may be squashed by a renderer that collapsed leading whitespace.
_FRAME = re.compile(r' {0,2}File "[^"\n]+", line \d+, in ')

#: vLLM's process prefix alone (`(VllmWorker TP0 pid=42)`): decode takes a prefix off only when
#: a message follows it.
_PROCESS_ONLY = re.compile(r"\([A-Za-z_][\w.-]*(?: [A-Za-z_][\w.=-]*)*? pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)\s*")

#: A record a wrapper re-rendered in its own format, vLLM's message inside: NVIDIA Dynamo relays
#: its Python components' records (vLLM's loggers among them) through Rust's `tracing` as
#: `<ISO stamp>  INFO <module>.<function>: <message>` (the stamp is taken off by decode; the level
#: is padded to five characters).
#: A stamp decode could not read (an ISO stamp that lost digits in a paste: `025-06-12T11:14:08.162Z`)
#: is dropped: the record's time comes from its neighbours.
_RELAYED = re.compile(r"(?:\d[\d-]*T[\d:.]+Z)? ?(TRACE|DEBUG| INFO|INFO| WARN|WARN|ERROR) ([A-Za-z_]\w*)\.[A-Za-z_]\w*: (?=\S)")
_RELAYED_LEVEL = {"TRACE": "DEBUG", "WARN": "WARNING"}


def unwrap(msg: str) -> tuple[str, str, str] | None:
    """A header-less record that holds a vLLM line in another frame → (message, level, origin) to
    read instead, or None. A relayed record (`_RELAYED`) gives its level and module; a line whose
    header the paste or a shipper left out but kept the one space after it gives its message."""
    m = _RELAYED.match(msg)
    if m is not None:
        level = m[1].strip()
        return msg[m.end():].rstrip(), _RELAYED_LEVEL.get(level, level), m[2] + ".py"
    if msg[:1] == " " and msg[1:2].strip():
        return msg[1:], "", ""
    return None


#: A label someone put before a pasted exception line: a bracketed word (`【BUG】：`, `[Error] `,
#: `〔错误〕`; no digits, so no stamp or `[rank0]`), or a short text closed by a full-width colon
#: (`报错：`), which no log format writes; or a process's name in parentheses without the pid
#: vLLM's own prefix holds (`(APIServer) `: a launcher relaying the server's last lines).
#: What follows is read as the exception line it is.
_LABEL = re.compile(r"(?:【[^】\n]{1,16}】|\[[^\]\n\d]{1,16}\]|〔[^〕\n]{1,16}〕|\([A-Za-z_][\w.:-]{0,31}\))\s?[:：]?\s?"
                    r"|[^\s:：]{1,16}：\s?")


#: Ray's RayActorError message, its line saying why the actor died (ray/exceptions.py: `The actor
#: is dead because its worker process has died. Worker exit type: …`).
_RAY_ACTOR_DEAD = "The actor is dead because "


def fallback(msg: str, level: str, origin: str = "") -> Event | None:
    """Lines no key claimed: error levels, header-less writers, progress bars, and (given the
    line's origin) other vLLM modules' chatter."""
    if _STILL_WAITING in msg:
        m = _WAITING.match(msg)
        if m is not None:
            return RequestWaiting(m[1], m[2])
    if origin.startswith("uvicorn"):  # JSON records of uvicorn's loggers: no text header to spot them
        m = _UVICORN_JSON_ACCESS.match(msg)
        if m is not None:
            return AccessLog(m[1], m[2].split("?", 1)[0], int(m[3]))
        return _STOP_SERVER if msg.startswith(_UVICORN_STOP) else _HTTP_SERVER
    if not level:
        c = msg[:1]
        if c == "[" and _GLOG.match(msg):
            head = msg[:40]
            if _GLOG_QUIET.match(msg):  # a warning's or notice's block (IPEX overriding a kernel): no error
                return _TORCH_LOG
            return engine_error(msg) if "[E" in head or "[F" in head or "[PG " in head or "\n" in msg \
                else _TORCH_LOG
        if c in "EFWI" and _GLOG_BARE.match(msg):
            return engine_error(msg) if c in "EF" else _TORCH_LOG
        if c.isdigit() and (k := _KSERVE.match(msg)) is not None:
            # KServe's model server around vLLM, its own lines: its errors are the server's failures
            return engine_error(msg[k.end():]) if k[1] in ("ERROR", "CRITICAL") else _WRAPPER_LOG
        if c in " F" and (_FRAME.match(msg) or c == " " and 0 < (nl := msg.find("\n")) and _FRAME.match(msg, nl + 1)):
            # a traceback whose start was cut off: its frames, maybe its end (decode put a
            # frame's source line left before the first frame with it)
            return engine_error(msg)
        if _progress(msg) or _PY_WARNING.match(msg) or msg.startswith(_LIBRARY_NOISE):
            return _NOISE
        if c.isdigit() and " Engines Aggregated: " in msg[:24]:
            return _stats(msg)
        if (c.isdigit() or c == "[") and (m := _UVICORN_JSON_ACCESS.match(msg)) is not None:
            # uvicorn's access line whose `INFO:` a paste lost: its format alone says what it is
            return AccessLog(m[1], m[2].split("?", 1)[0], int(m[3]))
        e = _EXC.match(msg)
        if e is not None and e.start() == 0 and e[0] == msg.split("\n", 1)[0]:
            return engine_error(msg)
        if (lab := _LABEL.match(msg)) is not None:
            rest = msg[lab.end():]
            e = _EXC.match(rest)
            if e is not None and e[0] == rest.split("\n", 1)[0]:
                return engine_error(rest)
        if c == "(" and _PROCESS_ONLY.fullmatch(msg):
            return _NOISE  # an empty line a vLLM process wrote: its prefix and nothing after it
        if c == "T" and msg.startswith(_RAY_ACTOR_DEAD):
            # Ray's detail of an actor's death, a line of its RayActorError's message: where the
            # exception line before it was cut, or a chained traceback's separator stands between it
            # and the error it caused (`The above exception was the direct cause …`), it is the cause
            return engine_error(msg)
        return None
    if level in ("ERROR", "CRITICAL"):
        if msg.startswith(_CLIENT_ERRORS):
            return _CLIENT_ERROR
        ev = engine_error(msg)
        if ev.error_type == "input" and not ev.fatal and origin and _chatter_module(origin) in _SERVING_MODULES:
            # the OpenAI front end refusing a request for what it asked (its exception line alone,
            # `ValueError: 'max_tokens' … is too large … maximum context length …`): the client's
            # input, as its `Error in preprocessing prompt inputs` header says when it is there
            return _CLIENT_ERROR
        return ev
    if _progress(msg):
        return _NOISE
    notice = _notice(msg)
    if notice is not None:
        return notice
    if origin and level in _CHATTER_LEVELS:
        module = _chatter_module(origin)
        if module == LOADER:
            return _COMPILE_LINE  # the model being loaded: a line of the start
        if module not in REQUEST_ENGINE_MODULES:
            return _VLLM_OTHER
    return None


def _chain(*rules):
    def rule(msg: str) -> Event | None:
        for r in rules:
            ev = r(msg)
            if ev is not None:
                return ev
        return None
    if all(hasattr(r, "prefixes") for r in rules):  # guarded throughout: so is the chain
        rule.prefixes = tuple(p for r in rules for p in r.prefixes)
    return rule


def _starting(prefixes: tuple[str, ...], rule):
    """`rule`, tried only on messages that start with one of `prefixes`.

    Most lines under some keys are chatter (`Engi…`: `EngineCore waiting for work`; `Memo…`:
    `Memory usage …`). A guard rules them out without running the rule, and because the prefixes
    are data (`.prefixes`), the C fast path reads the same guard and answers such a line as
    chatter without calling Python at all."""
    def guarded(msg: str) -> Event | None:
        return rule(msg) if msg.startswith(prefixes) else None
    guarded.prefixes = prefixes
    return guarded


def literal_head(pattern: str) -> str:
    """The literal text every match of `pattern` starts with (maybe ""): the characters before
    the first regex syntax, less one that a quantifier may drop (`an?` → `a`); "" when the
    pattern has a top-level `|`, whose other branch may start with anything."""
    depth, i = 0, 0
    while i < len(pattern):  # a `|` outside groups and classes voids any head
        c = pattern[i]
        if c == "\\":
            i += 1
        elif c == "[":
            i = pattern.find("]", i + 2)  # `[]…]`: a leading `]` is literal
            if i < 0:
                return ""
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            return ""
        i += 1
    i = 0
    while i < len(pattern) and pattern[i] not in "\\.^$*+?{}[]()|":
        i += 1
    if i < len(pattern) and pattern[i] in "*?{":
        i -= 1
    return pattern[:max(i, 0)]


def _regex_rule(pattern: re.Pattern[str], rule):
    return _starting((literal_head(pattern.pattern),), rule)


_FACT_GUARDED = {key: _regex_rule(p, _FACT_RULES[key]) for key, p, _ in _FACTS}
_ERROR_GUARDED = _starting(tuple(start for start, _ in _ERROR_STARTS), _maybe_error)


#: First four characters of a message → the rule that may match it.
PREFILTER = {
    "Rece": _received,
    "[shu": _starting(("[shutdown]",), _shutdown),
    "Shut": _starting(("Shutting down",), _shutting),
    "Adde": _added,
    "Fini": _finished,
    "Abor": _aborted,
    "Requ": _request,
    "Gene": _generated,
    "Sequ": _sequence,
    "Fail": _failing,
    "Avg ": _stats,
    "Runn": _stats,
    "RUNN": _starting(("RUNNING: ",), _core_queues),
    # V1 stats lines all start `Engine 000: `; the key's other lines are the core's chatter
    "Engi": _chain(_starting(("Engine ",), _stats), _FACT_GUARDED["Engi"], _ERROR_GUARDED),
    "Init": _chain(_regex_rule(_BANNER, _banner), _starting(("Initial profiling/warmup run took",), _compiling),
                   _starting(tuple(p for p in _LOADING_LINES if p.startswith("Init")), _loading)),
    "Load": _chain(_FACT_GUARDED["Load"], _starting(("Loading weights took ",), _weights_read),
                   _starting(tuple(p for p in _LOADING_LINES if p.startswith("Load")), _loading)),
    "rank": _starting(("rank ",), _rank_assigned),
    "Mode": _FACT_GUARDED["Mode"],
    # that fact's line and more; ROCm's runtime's fatal `Memory access fault by GPU node-…`
    "Memo": _chain(_starting(_FACT_GUARDED["Memo"].prefixes, _memory_profile), _ERROR_GUARDED),
    "Avai": _FACT_GUARDED["Avai"],
    "GPU ": _FACT_GUARDED["GPU "],
    "CPU ": _FACT_GUARDED["CPU "],
    "Maxi": _FACT_GUARDED["Maxi"],
    "Grap": _FACT_GUARDED["Grap"],
    "init": _FACT_GUARDED["init"],
    "torc": _FACT_GUARDED["torc"],
    "vLLM": _chain(_FACT_GUARDED["vLLM"], _starting(tuple(p for p in _LOADING_LINES if p.startswith("vLLM")),
                                                    _loading)),
    "Star": _chain(_FACT_GUARDED["Star"], _starting(("Starting torch.compile",), _compiling),
                   _starting(_LISTENING_LINES, _listening), _starting(("Starting sampler warmup",), _loading)),
    "non-": _server_args,
    "args": _server_args,
    " ▄▄ ": _logo,
    "  █▄": _logo,
    "INFO": _uvicorn,
    "WARN": _uvicorn,
    "ERRO": _uvicorn,
    "DEBU": _uvicorn,
    "CRIT": _uvicorn,
    # `# %s blocks` names the device type as vLLM's config spells it (`cuda`, `cpu`, `hpu`, `xpu`,
    # `tpu`, `neuron`, `npu`); older and forked executors wrote it upper-case (`GPU`, `HPU`)
    **{k: _blocks for k in ("# GP", "# CU", "# cu", "# XP", "# HP", "# NP", "# TP", "# CP", "# cp", "# hp", "# xp",
                            "# tp", "# np", "# ne")},
    **{k: _ERROR_GUARDED for k in ("Work", "Asyn", "No a", "Proc", "Trac", "Erro", "Exce", "RayW", "Time", "Fata",
                                    "*** ", "RESO", "Writ", "CUDA")},
    **{k: _starting(("NIXLConnector request_finished", "NixlPushConnector request_finished",
                     "MooncakeConnector request_finished"), _connector_finished) for k in ("Nixl", "Moon")},
    "NIXL": _chain(_starting(("NIXLConnector request_finished",), _connector_finished),
                   _starting(_NIXL_LEVELS, _nixl_library),
                   _starting(("NIXL transfer failure: ",), _nixl_failure)),
    "Prof": _starting((_GRAPH_PROFILE,), _graph_profile),
    **{k: _starting(tuple(p for p in _COMPILING_LINES if p.startswith(k)), _compiling)
       for k in sorted({p[:4] for p in _COMPILING_LINES}) if k not in ("Init", "Star")},
    "Pref": _stats_extra,
    "Spec": _stats_extra,
    "KV T": _kv_transfer_metrics,
    "Rele": _starting(("Releasing expired KV blocks for request ",), _lease_expired),
    "Pote": _starting(("Potentially invalid KV blocks for ",), _blocks_invalid),
}
