"""What the spans must say about a real-vLLM scenario, derived from the client's own truth.

Shared by the fast tests over the saved fixtures (tests/test_scenarios.py) and the live ones
(tests/test_real_scenarios.py). The truth is tests/scenarios/driver.py's record of what the
client sent and saw and what was done to the server; nothing here reads earlier bridge output.

Rules, each from vLLM 0.32's behaviour (its source in vllm/entrypoints/openai/):
- the id vLLM logs for a request: `cmpl-<id>-0` for a completion, `chatcmpl-<id>` for a chat,
  where `<id>` is the `X-Request-Id` sent, else the random part of the response's `id`;
- every request that reached the engine is exactly one `vllm.request` root, even when two
  share an `X-Request-Id`;
- a request no line names (`--enable-log-requests` off; a 400 refused before it got an id)
  gets no root: nothing in the log says it happened;
- outcome: `ok` → finished without error; in flight at a SIGTERM → `error.type=shutdown`; in
  flight when the EngineCore was killed → `error.type=engine_dead`; a 400 → `error.type=input`
  when its id is in the log, else no root at all;
- times: the log's clock here is the container runtime's nanosecond stamp, taken when vLLM
  wrote the line, so a root starts between the client's send and its first byte and ends no
  later than the client saw the end, give or take TOL (a line is written a little after the
  fact, more so on a loaded machine). An end no line states (V1 completions) is inferred from
  the engine going idle: not before the client's end, and by the first line after it that
  shows the engine holding nothing (or IDLE_TOL after it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import permutations
from pathlib import Path

from bridge.assemble.timeline import RequestTimeline
from bridge.pipeline import replay

TOL_NS = 250_000_000
IDLE_TOL_NS = 3_000_000_000


@dataclass(frozen=True)
class Root:
    request_id: str
    outcome: str           # vllm.outcome
    error_type: str | None
    start_ns: int
    end_ns: int
    end_timing: str
    attrs: dict


def spans_of(log: Path) -> tuple[list[Root], Counter]:
    """Replay one log: its request roots, and its engine incidents counted by error type."""
    out: list = []
    replay([str(log)], [out.append])
    roots = [Root(t.request_id, t.outcome, t.error_type, t.start_ns, t.end_ns, t.end_timing, dict(t.attrs))
             for t in out if isinstance(t, RequestTimeline)]
    incidents = Counter(t.error_type for t in out if not isinstance(t, RequestTimeline) and t.kind != "startup")
    return roots, incidents


def logged_id(r: dict) -> str | None:
    """The id vLLM logs for a client request, from what the client sent and received."""
    rid = r["response_id"]
    if not rid and r["sent_id"]:
        rid = ("chatcmpl-" if r["kind"] == "chat" else "cmpl-") + r["sent_id"]
    if not rid:
        return None
    return rid if r["kind"] == "chat" else rid + "-0"


def id_in_log(log_text: str, rid: str) -> bool:
    """Whether vLLM wrote the id at all (a 400 may be refused before any line names it)."""
    return rid in log_text


def plain_log(cri_text: str) -> str:
    """The same log as vLLM wrote it, without the container runtime's framing: what a plain
    file (`vllm serve > log`) holds, where the only clock is vLLM's one-second header (and the
    plugin's `t=`). Partial (`P`) parts are joined as the runtime split them."""
    out = []
    for line in cri_text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4:
            continue
        out.append(parts[3] if parts[2] == "P" else parts[3] + "\n")
    return "".join(out)


def _exact_arrival_in_receipt_second(log_text: str, rid: str) -> bool:
    """Whether the log times the request's start more precisely than its receipt's header: the
    engine's arrival the plugin states (its first `Scheduling … queued=…, t=…`, of the request or
    of one of its n>1 children `<i>_<id>`) falls in the whole second its `Received request` line
    is stamped with. Read from the log's text (UTC headers, the year of the CRI stamp)."""
    import re
    from datetime import datetime, timezone
    recv = re.search(r"^(\d{4})-\S+ .*? (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \S+ Received request "
                     + re.escape(rid) + ":", log_text, re.M)
    sched = re.search(r"Scheduling request (?:\d+_)?" + re.escape(rid) + r": .*?queued=([\d.]+)ms, t=([\d.]+)", log_text)
    if recv is None or sched is None:
        return False
    header = datetime(*(int(x) for x in recv.groups()), tzinfo=timezone.utc).timestamp()
    arrival = float(sched[2]) - float(sched[1]) / 1e3
    return header <= arrival < header + 1


def check_roots(truth: dict, roots: list[Root], log_text: str, coarse: bool = False) -> list[str]:
    """Every disagreement between the spans and the truth, as readable lines ([] = agree).

    `coarse`: the roots come from the plain-file form of the log (`plain_log`), whose only
    clock is vLLM's header, to the whole second. A request may then start at its receipt's
    whole second (≤ 1 s before the send), unless a plugin line states its engine arrival within
    that second: then it must still start within the client's window. `log_text` stays the
    CRI text (the same lines)."""
    errors: list[str] = []
    by_id: dict[str, list[Root]] = {}
    for root in roots:
        by_id.setdefault(root.request_id, []).append(root)
    reqs = truth["requests"]
    wanted = Counter()
    for r in reqs:
        rid = logged_id(r)
        if rid is not None and r["status"] == 200 and "--enable-log-requests" in truth["server_args"] \
                and not id_in_log(log_text, rid):
            errors.append(f"{rid}: vLLM logs every request it serves, but not this one")
        if rid is None or not id_in_log(log_text, rid):
            continue   # never named in the log (no --enable-log-requests; a 400 before its id)
        wanted[rid] += 1
    # Count of roots: one per client request that vLLM logged, never merged, never invented.
    for rid, n in wanted.items():
        got = len(by_id.get(rid, []))
        if got != n:
            errors.append(f"{rid}: {got} roots, the client sent {n}")
    extra = set(by_id) - set(wanted)
    if extra:
        errors.append(f"roots no client request explains: {sorted(extra)}")
    # Per request: outcome and times. Requests sharing an id are paired with its roots in the
    # way that agrees best (concurrent ones may reach vLLM in either order).
    groups: dict[str, list[dict]] = {}
    for r in reqs:
        rid = logged_id(r)
        if rid in wanted:
            groups.setdefault(rid, []).append(r)
    for rid, rs in groups.items():
        candidates = by_id.get(rid, [])
        if len(candidates) != len(rs):
            candidates = candidates[:len(rs)]
            rs = rs[:len(candidates)]
        # Chats in flight together under one id: vLLM's `Generated response` line names only
        # that id, so no reader of the log can tell which of them a finish reason belongs to.
        # Their reasons are compared as one multiset over the group, not root by root.
        shared = len(rs) > 1 and all(r["kind"] == "chat" for r in rs) and _overlap(rs)
        if shared:
            errors += _check_shared_reasons(truth, rid, rs, candidates)
        best = None
        for order in permutations(candidates):
            errs = [e for r, root in zip(rs, order)
                    for e in _check_one(truth, r, rid, root, log_text, not shared, len(rs) > 1, coarse)]
            if best is None or len(errs) < len(best):
                best = errs
        errors += best or []
    return errors


def next_idle_ns(log_text: str, after_ns: int) -> int | None:
    """The runtime's stamp of the first line at or after `after_ns` that shows the engine holding
    nothing: a stats line with `Running: 0 reqs, Waiting: 0 reqs`, or its shutdown's count of
    what it still held — read from the log (CRI stamps), not from the bridge."""
    from datetime import datetime, timezone
    for line in log_text.splitlines():
        if not ("Running: 0 reqs, Waiting: 0 reqs" in line or "in-flight requests count=" in line
                or "[shutdown]" in line):
            continue
        stamp = line.split(" ", 1)[0]
        try:
            sec, frac = stamp.rstrip("Z").split(".")
            ns = int(datetime.strptime(sec, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()) * 10**9 \
                + int(frac.ljust(9, "0")[:9])
        except ValueError:
            continue
        if ns >= after_ns:
            return ns
    return None


def effective_expect(r: dict) -> str:
    """What the client's own record says became of a request: the scenario meant it to be in
    flight at the stop or the kill, but a response the client saw end with a finish reason for
    every choice, none of them `abort` (what the stop ends a stream with), was served whole (on a loaded machine it may finish just before the signal)."""
    if r["expect"] in ("shutdown", "engine_dead") and r["ended"] == "complete" and r["finish_reasons"] \
            and len(r["finish_reasons"]) >= (r.get("n") or 1) and "abort" not in r["finish_reasons"]:
        return "ok"
    return r["expect"]


def _unlogged_end_at_signal(truth: dict, r: dict) -> bool:
    """A V1 completion logs no end line. One meant to be in flight at the kill or the stop,
    whose client still got it whole after the signal was sent (a loaded machine delivers
    tokens made just before it late), ended when no line says: before the death or with it.
    Both readings are right for the bridge; only the outcome is left open (times still count)."""
    signal = truth.get("kill9_ns") if r["expect"] == "engine_dead" else truth.get("sigterm_ns")
    return r["kind"] == "completion" and r["expect"] in ("engine_dead", "shutdown") and bool(signal) \
        and r["t_end_ns"] >= signal


def logged_reasons(r: dict) -> list[str]:
    """The finish reasons vLLM's log can name: a chat choice that came back empty gets no
    `Generated response` line (serving.py skips it), so its reason is in no line. Truths
    recorded before the client noted empty choices count every choice."""
    empty = r.get("empty_choices") or [False] * len(r["finish_reasons"])
    return [x for x, e in zip(r["finish_reasons"], empty) if not e]


def _overlap(rs: list[dict]) -> bool:
    """Whether any two of these requests were in flight at the same time (client's clock)."""
    spans = sorted((r["t_send_ns"], r["t_end_ns"]) for r in rs)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def _check_shared_reasons(truth: dict, rid: str, rs: list[dict], roots: list[Root]) -> list[str]:
    if "--enable-log-outputs" not in truth["server_args"] or any(r["stream"] or effective_expect(r) != "ok" for r in rs):
        return []
    got = sorted(x for root in roots for x in root.attrs.get("gen_ai.response.finish_reasons") or [])
    want = sorted(x for r in rs for x in logged_reasons(r))
    # Known gap (see the closing note of this change): the older of two concurrent requests is
    # closed when the newer arrives, so a reason may be missing; none may be invented.
    left = Counter(want)
    left.subtract(got)
    if (got or not want) and min(left.values(), default=0) >= 0:
        return []
    return [f"{rid}: finish reasons {got} over its concurrent requests, the clients got {want}"]


def _check_one(truth: dict, r: dict, rid: str, root: Root, log_text: str = "", reasons: bool = True,
               reused: bool = False, coarse: bool = False) -> list[str]:
    out = []
    # A header's whole second, when no line about the request is more precise: the lower bounds
    # below give way by what the header cannot say (it truncates, so only downwards).
    slack = 0 if not coarse or _exact_arrival_in_receipt_second(log_text, rid) else r["t_send_ns"] % 1_000_000_000
    # A stream's reason is on its last delta's line, which vLLM skips when the delta is empty.
    streamed_reason_logged = r["stream"] and r["n"] == 1 and bool(r["finish_reasons"]) and \
        f"{rid} (streaming delta): output: " in log_text and \
        any(f"{rid} (streaming delta)" in line and f"finish_reason: {r['finish_reasons'][0]}" in line
            for line in log_text.splitlines() if rid in line)
    expect = effective_expect(r)
    if expect == "ok" and _unlogged_end_at_signal(truth, r) and root.error_type == r["expect"]:
        expect = r["expect"]  # what the log says: in flight when the engine died or stopped
    if expect == "ok":
        if root.outcome != "finished" or root.error_type:
            out.append(f"{rid}: outcome {root.outcome}/{root.error_type}, the client got {r['status']} "
                       f"{r['finish_reasons']}")
    elif root.error_type != expect:
        out.append(f"{rid}: error.type {root.error_type!r} (outcome {root.outcome}), want {expect!r}")
    if not (r["t_send_ns"] - TOL_NS - slack <= root.start_ns <= (r["t_first_byte_ns"] or r["t_end_ns"]) + TOL_NS):
        out.append(f"{rid}: start {root.start_ns} outside send {r['t_send_ns']} .. first byte "
                   f"{r['t_first_byte_ns']}")
    hi = r["t_end_ns"] + (IDLE_TOL_NS if root.end_timing == "inferred" else TOL_NS)
    lo = r["t_send_ns"] - TOL_NS - slack
    signal = truth.get("kill9_ns") if expect == "engine_dead" else truth.get("sigterm_ns")
    if expect in ("shutdown", "engine_dead") and signal:
        lo = signal - TOL_NS   # it ended at the stop, not before
    elif root.end_timing == "inferred" and root.outcome == "finished" and not reused:
        # (an id used twice: the end line may name the other one, and vLLM gives no other)
        # Inferred from the engine going idle: after the client saw the end, by the first line
        # after it that shows the engine holding nothing (under load that can be much later).
        lo = r["t_end_ns"] - TOL_NS
        idle = next_idle_ns(log_text, r["t_end_ns"] - TOL_NS)
        hi = max(hi, idle + TOL_NS) if idle is not None else hi
    if not lo <= root.end_ns <= hi:
        out.append(f"{rid}: end {root.end_ns} ({root.end_timing}) outside {lo} .. {hi}")
    # A chat's `Generated response … finish_reason: …` line (`--enable-log-outputs`) names it,
    # text and JSON format alike (a stream's last delta may go unlogged: only whole responses).
    logs_outputs = "--enable-log-outputs" in truth["server_args"]
    # One reason per choice (n>1 logs a line per choice); their order in the log is the order
    # the choices finished, the response's is the choices' index: compared as multisets.
    if reasons and expect == "ok" and logs_outputs and r["kind"] == "chat" and (not r["stream"] or streamed_reason_logged):
        got, want = root.attrs.get("gen_ai.response.finish_reasons"), logged_reasons(r)
        if sorted(got or []) != sorted(want):
            out.append(f"{rid}: finish reasons {got}, the client got {r['finish_reasons']}")
    # Usage as the response's own `usage` counts it: the prompt once, the completion tokens
    # summed over the n choices. The plugin's summary lines give it for every served request;
    # without them a count the spans show must still be the client's.
    usage = r.get("usage") or {}
    if usage and expect == "ok":
        got_out = root.attrs.get("gen_ai.usage.output_tokens")
        got_in = root.attrs.get("gen_ai.usage.input_tokens")
        if got_out is None and truth.get("env", {}).get("VLLM_TRACE_BRIDGE_PLUGIN") == "1":
            out.append(f"{rid}: no gen_ai.usage.output_tokens, the plugin logs them (client: {usage})")
        if got_out is not None and got_out != usage.get("completion_tokens"):
            out.append(f"{rid}: output tokens {got_out}, the response's usage says {usage.get('completion_tokens')}")
        if got_in is not None and got_in != usage.get("prompt_tokens"):
            out.append(f"{rid}: input tokens {got_in}, the response's usage says {usage.get('prompt_tokens')}")
    return out


def expect_incidents(truth: dict) -> dict[str, int]:
    """`vllm.engine` incident spans the scenario must give, by error type: one engine death for
    a killed EngineCore, none for a deliberate stop."""
    return {"engine_dead": 1} if "kill9_ns" in truth else {}
