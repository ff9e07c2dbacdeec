"""What the bridge's spans must say about a randomized run, from the client's record alone.

Each check is named (`Violation.invariant`) so a failure says which rule broke, for which
request of which set-up, with the log lines that name the request. The rules:

- roots.count      a client request that some log line names has exactly one `vllm.request`
                   root (n>1 included: one root for the client request); one no line names has
                   none. A line names a request when it holds the client's X-Request-Id or the
                   response's id (vLLM builds its own ids from them: `cmpl-<id>-0`,
                   `chatcmpl-<id>`, `resp_<uuid>`).
- roots.unexplained  a root whose id no client request explains.
- outcome          200 read to the end → finished without error; 4xx → error.type (`input`
                   for 400); the client closed a stream mid-way → aborted, or finished if
                   vLLM was done before the close (every choice's finish reason read, or a
                   root that ends by the close: the whole stream was already in the socket;
                   or no line states its end). A request
                   whose end no line states, with no idle stats line between its end and the
                   stop, may also read `shutdown` (ending at the stop): the log cannot tell.
- finish_reasons   when the root has them, the client's (as multisets; for a stream, some of
                   the client's: an empty last delta is not logged); a chat's whole
                   response with --enable-log-outputs must have them (its `Generated response`
                   line states them).
- usage            when the root has token counts, the client's `usage` (prompt once;
                   completion summed over the n choices).
- window.start     client send ≤ root start ≤ client's first byte + TOL. The lower bound is
                   exact: every clock involved (CRI stamp, the plugin's `t=`, vLLM's arrival) is
                   read on this machine after the client sent. The upper bound allows TOL for
                   the CRI stamp, taken when the line is read from vLLM's pipe: the worst lag
                   this log shows between a line's own clock (`t=`, JSON's ms, a text header's
                   second's end) and its stamp (stamp_lag_ns), at least 250 ms.
- window.end       client send ≤ last end of the trace ≤ client's end + TOL; for an end the
                   bridge marks `inferred` (no line states it), up to the first stats line that
                   shows the engine idle after the request's own lines; for a client abort, up to ABORT_S after the client
                   closed (vLLM notices the closed socket at its next token and logs the abort).
- ttft             vllm.ttft_s ≤ the client's time to its first chunk with text (+1 ms of
                   printing precision); a whole body: to its first byte.
- privacy          no prompt word in any exported byte.
- setup.plugin     a plugin set-up whose requests reached vLLM has the plugin's lines (`t=`):
                   else the run was of stock vLLM and proves nothing about the plugin.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

from scenario_truth import TOL_NS as MIN_TOL_NS
from scenario_truth import next_idle_ns

ABORT_S = 3.0
TTFT_SLACK_NS = 1_000_000


@dataclass(frozen=True)
class Violation:
    invariant: str
    setup: str
    index: int | None        # the request's index in the run (None: no one request)
    sent_id: str
    detail: str
    lines: tuple[str, ...] = ()

    def render(self) -> str:
        head = f"[{self.invariant}] {self.setup} #{self.index} {self.sent_id}: {self.detail}"
        return "\n".join([head, *("    | " + ln[:300] for ln in self.lines)])


def keys_of(r: dict) -> list[str]:
    """The strings a log line about this request holds: the X-Request-Id, and the response's
    id when vLLM did not build it from the X-Request-Id (the Responses API's `resp_<uuid>`)."""
    keys = [r["spec"]["sent_id"]]
    rid = r.get("response_id") or ""
    if rid and keys[0] not in rid:
        keys.append(rid)
    return keys


def lines_naming(log_lines: list[str], keys: list[str], limit: int = 8) -> tuple[str, ...]:
    out = [ln for ln in log_lines if any(k in ln for k in keys)]
    if len(out) > limit:
        out = out[:limit // 2] + [f"... {len(out) - limit} more ..."] + out[-(limit // 2):]
    return tuple(out)


def logged_reasons(r: dict) -> list[str]:
    empty = r.get("empty_choices") or [False] * len(r["finish_reasons"])
    return [x for x, e in zip(r["finish_reasons"], empty) if not e]


def check(truth: dict, spans: list, exported: bytes, log_text: str) -> list[Violation]:
    setup_name = truth["setup_name"]
    setup = truth["setup"]
    log_lines = log_text.splitlines()
    TOL_NS = max(MIN_TOL_NS, stamp_lag_ns(log_lines) + 50_000_000)  # noqa: N806
    roots = [s for s in spans if s.name == "vllm.request"]
    by_trace: dict[str, list] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    out: list[Violation] = []
    claimed: set[str] = set()
    for r in truth["requests"]:
        spec = r["spec"]
        keys = keys_of(r)
        lines = lines_naming(log_lines, keys)

        def bad(inv: str, detail: str) -> None:
            out.append(Violation(inv, setup_name, spec["index"], spec["sent_id"], detail, lines))

        mine = [s for s in roots if any(k in str(s.attrs.get("vllm.request.id", "")) for k in keys)]
        claimed |= {s.span_id for s in mine}
        named = any(any(k in ln for k in keys) for ln in log_lines)
        for w in spec["words"]:
            if w.encode() in exported:
                bad("privacy", f"prompt word {w!r} is in the exported spans")
                break
        want = 1 if named else 0
        if len(mine) != want:
            bad("roots.count", f"{len(mine)} roots ({[s.attrs.get('vllm.request.id') for s in mine]}), "
                f"want {want}: {_what(r)}")
        if len(mine) != 1:
            continue
        root = mine[0]
        a = root.attrs
        # A request whose end no line states (a V1 completion, an empty chat, a stream cut after
        # its last token) with no idle stats line between its end and the stop (two API servers
        # turn stats off) reads, in the log, as in flight at the stop: `shutdown`, or finished
        # with an inferred end, is all the log allows.
        unknowable = not _end_stated(lines_all(log_lines, keys)) and \
            not _idle_between(log_lines, r["t_end_ns"] - TOL_NS, truth.get("sigterm_ns") or 0)
        # outcome
        outcome, etype = a.get("vllm.outcome"), a.get("error.type")
        done_before_close = r["ended"] == "aborted" and len(r["finish_reasons"]) >= spec["n"]
        if r["status"] == 200 and (r["ended"] == "complete" or done_before_close):
            if unknowable and etype == "shutdown":
                pass
            elif r["ended"] == "complete" and (outcome != "finished" or etype):
                bad("outcome", f"outcome {outcome}/{etype}, the client read it whole: {_what(r)}")
        elif r["status"] == 200 and r["ended"] == "aborted":
            # On a loaded machine vLLM may have written the whole stream into the socket before
            # the client read its first chunks: then it finished before the close, and logs no
            # abort. A finished root must end by the close (or have no end line at all).
            timing = str(a.get("vllm.timing.end") or a.get("vllm.timing") or "")
            done_first = outcome == "finished" and not etype and \
                (root.end_ns <= r["t_end_ns"] + TOL_NS or timing == "inferred")
            if outcome != "aborted" and etype != "aborted" and not unknowable and not done_first:
                bad("outcome", f"outcome {outcome}/{etype}, the client closed it after {r['chunks']} chunks")
        elif r["status"] == 400:
            if etype != "input":
                bad("outcome", f"outcome {outcome}/{etype}, the client got 400 {r['error']}")
        elif r["status"] >= 400:
            if not etype:
                bad("outcome", f"outcome {outcome} with no error.type, the client got {r['status']} {r['error']}")
        # finish reasons
        got = a.get("gen_ai.response.finish_reasons")
        want = logged_reasons(r)
        if r["status"] == 200 and r["ended"] == "complete" and spec["api"] != "responses":
            if got is not None and not _reasons_agree(got, want, r["finish_reasons"], spec["stream"]):
                bad("finish_reasons", f"{got}, the client got {r['finish_reasons']}")
            elif got is None and want and spec["api"] == "chat" and not spec["stream"] and setup["log_outputs"]:
                bad("finish_reasons", f"none, the client got {r['finish_reasons']} and the log states them")
        # usage
        u = r.get("usage") or {}
        if r["status"] == 200 and r["ended"] == "complete" and u:
            for attr, key in (("gen_ai.usage.input_tokens", "prompt_tokens"),
                              ("gen_ai.usage.output_tokens", "completion_tokens")):
                if a.get(attr) is not None and u.get(key) is not None and a[attr] != u[key]:
                    bad("usage", f"{attr}={a[attr]}, the client's usage says {key}={u[key]}")
        # window
        first = r["t_first_byte_ns"] or r["t_end_ns"]
        if not r["t_send_ns"] <= root.start_ns <= first + TOL_NS:
            bad("window.start", f"start {_rel(root.start_ns, r)} outside send .. first byte "
                f"{_rel(first, r)} (+{TOL_NS // 1_000_000} ms, the log's worst stamping lag)")
        last = max(s.end_ns for s in by_trace.get(root.trace_id, [root]))
        end_timing = str(a.get("vllm.timing.end") or a.get("vllm.timing") or "")
        hi = r["t_end_ns"] + TOL_NS
        if r["ended"] == "aborted":
            hi = r["t_end_ns"] + int(ABORT_S * 1e9)
        if end_timing == "inferred" or root.end_ns > hi:
            # An idle stats line stamped before the request's own last line (its `Added
            # request`) predates its arrival at the engine (the API server's stats lag the
            # engine's add: 5001 #8, idle at 07.092, added at 07.280): no line shows the request
            # over before the first idle line after its own lines.
            own_last = max((_stamp_ns(ln) or 0 for ln in lines_all(log_lines, keys)), default=0)
            idle = next_idle_ns(log_text, max(r["t_end_ns"] - TOL_NS, own_last))
            if end_timing == "inferred" and idle is not None:
                hi = max(hi, idle + TOL_NS)
        if unknowable:
            hi = max(hi, _last_stamp(log_lines) + TOL_NS)
        if not r["t_send_ns"] <= last <= hi:
            bad("window.end", f"last end {_rel(last, r)} ({end_timing or '?'}) outside send .. "
                f"{_rel(hi, r)}; client end {_rel(r['t_end_ns'], r)}")
        # ttft
        ttft = a.get("vllm.ttft_s")
        tok = r.get("t_first_token_ns") or 0
        if ttft is not None and tok and ttft * 1e9 > tok - r["t_send_ns"] + TTFT_SLACK_NS:
            bad("ttft", f"vllm.ttft_s={ttft}, the client's first token came "
                f"{(tok - r['t_send_ns']) / 1e9:.6f} s after sending")
    if setup.get("plugin") and any(r["status"] == 200 for r in truth["requests"]) \
            and not any(_T_EQ.search(ln) for ln in log_lines):
        out.append(Violation("setup.plugin", setup_name, None, "", "a plugin set-up, but no line of the "
                             "plugin's (`t=`) is in the log: vLLM ran without it"))
    for s in roots:
        if s.span_id not in claimed:
            rid = str(s.attrs.get("vllm.request.id"))
            out.append(Violation("roots.unexplained", setup_name, None, rid,
                                 f"root {rid} ({s.attrs.get('vllm.outcome')}) matches no client request",
                                 lines_naming(log_lines, [rid])))
    return out


END_WORDS = ("Generated response", "Aborted", "aborted", "prompt_tokens=", "Freed ", "failed")


def lines_all(log_lines: list[str], keys: list[str]) -> list[str]:
    return [ln for ln in log_lines if any(k in ln for k in keys)]


def _end_stated(lines: list[str]) -> bool:
    """Whether any line about the request says it ended (vLLM's output/abort/failure lines, the
    plugin's summary and frees)."""
    return any(w in ln for ln in lines for w in END_WORDS)


def _stamp_ns(line: str) -> int | None:
    stamp = line.split(" ", 1)[0]
    try:
        sec, frac = stamp.rstrip("Z").split(".")
        return int(datetime.strptime(sec, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()) \
            * 10**9 + int(frac.ljust(9, "0")[:9])
    except ValueError:
        return None


def _idle_between(log_lines: list[str], lo: int, hi: int) -> bool:
    """A stats line showing the engine empty, stamped in [lo, hi]."""
    for ln in log_lines:
        if "Running: 0 reqs, Waiting: 0 reqs" in ln:
            t = _stamp_ns(ln)
            if t is not None and lo <= t <= hi:
                return True
    return False


_T_EQ = re.compile(r"\bt=(\d{9,11}\.\d+)")
_HEADER = re.compile(r" (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) \[")
_ASCTIME = re.compile(r'"asctime": "(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})"')


def stamp_lag_ns(log_lines: list[str]) -> int:
    """How late the runtime stamped lines, at worst, measured in this log: its CRI stamp minus
    the line's own clock (the plugin's `t=`, µs; JSON's `asctime`, ms). The CRI stamp is taken
    when the line is read from vLLM's pipe; on a loaded machine that was over a second late
    (seed 2010: `t=…069.733`, stamped 070.831). Text logs without the plugin carry only whole
    seconds: the latest a line can have been written is its header's second's end, so a stamp
    after that shows a lag of at least the difference (seed 4009: header `17:59:00`, stamped
    01.662); within the second there is no measure, and the floor (250 ms) holds."""
    worst = 0
    for ln in log_lines:
        own, cap = None, None
        m = _T_EQ.search(ln)
        if m:
            own = int(float(m.group(1)) * 1e9)
        else:
            m = _ASCTIME.search(ln)
            if m:
                own = int(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
                          .timestamp()) * 10**9 + int(m.group(2)) * 10**6
            else:
                m = _HEADER.search(ln[:120])
                if m:   # the year from the CRI stamp; both clocks UTC on the test machine
                    try:
                        own = int(datetime.strptime(ln[:5] + m.group(1), "%Y-%m-%d %H:%M:%S")
                                  .replace(tzinfo=timezone.utc).timestamp() + 1) * 10**9
                        cap = 10 * 10**9   # beyond: a zone apart, not a lag
                    except ValueError:
                        own = None
        if own is not None:
            t = _stamp_ns(ln)
            if t is not None and (cap is None or t - own < cap):
                worst = max(worst, t - own)
    return worst


def _last_stamp(log_lines: list[str]) -> int:
    for ln in reversed(log_lines):
        t = _stamp_ns(ln)
        if t is not None:
            return t
    return 0


def _reasons_agree(got: list, want: list, client: list, stream: bool) -> bool:
    """A whole response logs every non-empty choice's reason: the same multiset. A stream's
    reason is on its choice's last delta, which vLLM does not log when it is empty
    (serving.py logs a delta only with text): a sub-multiset of the client's, none invented."""
    if not stream:
        return sorted(got) in (sorted(want), sorted(client))
    left = Counter(client)
    left.subtract(got)
    return min(left.values(), default=0) >= 0


def _rel(ns: int, r: dict) -> str:
    return f"send{(ns - r['t_send_ns']) / 1e6:+.3f}ms"


def _what(r: dict) -> str:
    s = r["spec"]
    return (f"{s['api']} stream={s['stream']} n={s['n']} max_tokens={s['max_tokens']} bad={s['bad']} "
            f"abort_after={s['abort_after']} → {r['status']} {r['ended']}")


def summary(violations: list[Violation]) -> Counter:
    return Counter(v.invariant for v in violations)
