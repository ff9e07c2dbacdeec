"""The agent's own health: `/healthz`, `/readyz` and `/metrics` (Prometheus text) over HTTP.

Metrics are read from the stages' stats records when scraped, so the hot path only bumps
plain integers it already keeps; prometheus_client does the exposition format, imported at the
first scrape (an agent nobody scrapes does not pay its ~25 ms of imports at start).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AgentCollector:
    """Turns `snapshot()` (a dict of the agent's counters) into metric families on scrape."""

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self._snapshot()
        p = "vllm_trace_bridge_"

        def family(kind, name: str, doc: str, value: float | dict, label: str | None):
            m = kind(p + name, doc, labels=[label] if label else None)
            for k, v in (sorted(value.items()) if isinstance(value, dict) else [(None, value)]):
                m.add_metric([k] if label else [], v)
            return m

        def counter(name: str, doc: str, value: float | dict, label: str | None = None):
            return family(CounterMetricFamily, name, doc, value, label)

        def gauge(name: str, doc: str, value: float | dict, label: str | None = None):
            return family(GaugeMetricFamily, name, doc, value, label)

        yield counter("lines_read", "Physical log lines read.", s["lines_read"])
        yield counter("lines_parsed", "Lines recognised, by kind.", s["lines_by_kind"], "kind")
        yield counter("lines_unrecognised", "Lines no grammar knew (not an error).", s["lines_unrecognised"])
        yield counter("lines_malformed", "Lines that looked like a known kind but did not fit it.",
                      s["lines_malformed"])
        yield counter("lines_invalid_utf8", "Lines that were not valid UTF-8 (decoded with replacement).",
                      s["invalid_utf8"])
        yield counter("lines_oversized", "Lines longer than the line limit: their head read, their rest dropped.",
                      s["lines_oversized"])
        yield counter("bytes_cut", "Bytes of oversized lines past the line limit (dropped, never parsed).",
                      s.get("bytes_cut", 0))
        yield counter("timestamps_out_of_range", "Line times before 1970 or after 2500, replaced by the "
                      "stream's last good time.", s.get("times_out_of_range", 0))
        yield counter("lines_long", "Lines over 64 KiB (read whole).", s["lines_long"])
        yield counter("partial_lines_joined", "CRI/docker partial lines joined into a line.", s["partials_joined"])
        yield counter("framing_errors", "Lines that did not fit their file's container framing.",
                      s["framing_errors"])
        yield counter("lines_no_action", "Lines recognised that the assembler's table has no action for where they "
                      "find their request (as a NIXL transfer failure naming no request): counted, nothing else done "
                      "(`python -m bridge.assemble` prints the table).", s.get("no_action", 0))
        yield gauge("requests_open", "Requests being assembled now.", s["requests_open"])
        yield counter("requests_finished", "Requests assembled and handed to export.", s["requests_emitted"])
        yield counter("requests_evicted", "Requests ended by TTL or the open-request limit (incomplete).",
                      s["requests_evicted"])
        yield counter("requests_capped", "Requests closed early because max_open_requests were open: the oldest "
                      "first (an unended one exported as incomplete, also in requests_evicted).",
                      s.get("requests_capped", 0))
        yield counter("engine_incidents", "Engine-wide incidents (vllm.engine spans).", s["engine_incidents"])
        yield counter("clock_jumps", "Steps of a log's clock between neighbouring lines (a year or more ahead, a day "
                      "or more back): a vllm.clock_jump event on the requests in flight; no request split by it.",
                      s.get("clock_jumps", 0))
        yield counter("spans_exported", "Spans acknowledged by the receiver.", s["spans_sent"])
        yield counter("spans_retried", "Spans in export attempts that failed and were retried.", s["spans_retried"])
        yield counter("spans_dropped", "Spans dropped after the export give-up time.", s["spans_dropped"])
        yield counter("spans_skipped_delivered", "Lines skipped on resume: their request was already delivered.",
                      s["skipped_delivered"])
        yield gauge("export_queue_spans", "Spans waiting to be sent.", s["queued_spans"])
        lat = sorted(s["latencies"])
        h = HistogramMetricFamily(p + "export_latency_seconds", "Time to send one acknowledged batch "
                                  "(recent batches).")
        buckets = [(str(b), sum(1 for x in lat if x <= b)) for b in _BUCKETS] + [("+Inf", len(lat))]
        h.add_metric([], buckets, sum(lat))
        yield h
        yield gauge("file_bytes_behind", "Bytes written to a file but not read yet (the files being read only).",
                    s["behind"], "path")
        yield gauge("log_bytes_unread", "Bytes of a followed log not read yet, its rotated files the agent has not "
                    "reached included (.gz by their uncompressed size): the backlog on disk, per live path.",
                    s.get("unread", {}), "path")
        yield gauge("files_watched", "Files followed (open, or parked: closed with their place kept).",
                    s["files_watched"])
        yield gauge("files_open", "Followed files holding a descriptor now.", s.get("files_open", 0))
        yield gauge("files_open_budget", "Descriptors log files may hold (3/4 of the open-files limit); past "
                    "it the files idle longest are parked.", s.get("files_open_budget", 0))
        yield counter("files_parked", "Times a file's descriptor was closed to stay within the budget.",
                      s.get("files_parked_total", 0))
        yield counter("files_reopened", "Times a parked file was opened again (by inode and first bytes) "
                      "because it changed.", s.get("files_reopened", 0))
        yield gauge("files_skipped", "Candidate files not followed, by reason (filter, unreadable, loop, not_a_file, duplicate, "
                    "not_vllm); "
                    "the agent's file_skipped log lines name each one.", s.get("files_skipped", {}), "reason")
        yield counter("files_detected", "Container files looked at for vLLM lines, by verdict: vllm (followed), "
                      "not_vllm (skipped: none in the first detect_bytes), named (named literally: not looked at); "
                      "no samples with detect: off.", s.get("files_detected") or {}, "verdict")
        yield counter("file_rotations", "Rotations seen, by kind.", s["rotations"], "kind")
        yield counter("file_errors", "File and directory errors, by reason.", s["file_errors"], "reason")
        yield gauge("checkpoint_age_seconds", "Seconds since the checkpoint was last written.", s["checkpoint_age"])
        yield gauge("checkpoint_delivered_listed", "Requests delivered past a file's saved position, listed in "
                    "the checkpoint so a restart skips their lines: grows while an unfinished request holds "
                    "the position (up to its TTL).", s["checkpoint_delivered_listed"])
        yield counter("line_errors", "Lines skipped because a stage raised on them, by stage.",
                      {"decode": 0, "parse": 0, "assemble": 0, "export": 0, **s.get("line_errors", {})}, "stage")
        yield counter("checkpoint_failures", "Checkpoint saves that failed (retried each second).",
                      s.get("checkpoint_failures", 0))
        yield counter("checkpoint_recoveries", "Damaged checkpoints found at start, by what was used instead.",
                      s.get("checkpoint_recoveries", {}), "used")
        yield counter("memory_pauses", "Times reading paused because memory was over its limit.",
                      s["memory_pauses"])
        join = s.get("join")
        if join is not None:  # only with gateway access logs configured
            yield counter("gateway_lines", "Gateway access-log lines read, by result.",
                          {"entry": join["gateway_entries"], "skipped": join["gateway_skipped"]}, "result")
            yield counter("join_requests", "Requests that waited for a gateway line, by how it ended.",
                          {"joined": join["joined"], "expired": join["expired"], "overflow": join["overflow"]},
                          "result")
            yield counter("join_contexts_dropped", "Gateway lines forgotten before their request came.",
                          join["contexts_dropped"])
            yield gauge("join_waiting", "Requests waiting for their gateway line now.", join["waiting"])


class _DualStackServer(ThreadingHTTPServer):
    """IPv6 socket that also takes IPv4 (as ::ffff:a.b.c.d), for dual-stack clusters."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _bind(host: str, port: int, handler) -> ThreadingHTTPServer:
    """`::` (or no host): both families where the node has IPv6, IPv4 alone where it has not
    (IPv6 disabled in the kernel or the pod). An IPv6 literal binds IPv6; anything else IPv4."""
    if host in ("", "::"):
        try:
            return _DualStackServer(("::", port), handler)
        except OSError:  # no IPv6 here: the IPv4 wildcard still serves probes and scrapes
            return ThreadingHTTPServer(("0.0.0.0", port), handler)
    if ":" in host:
        return _V6Server((host, port), handler)
    return ThreadingHTTPServer((host, port), handler)


class _Metrics:
    """`/metrics`' body and content type; the registry is made at the first scrape."""

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self._snapshot = snapshot
        self._lock = threading.Lock()  # scrapes are served on threads of their own
        self._registry = None

    def __call__(self) -> tuple[bytes, str]:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST
        from prometheus_client.process_collector import ProcessCollector

        with self._lock:
            if self._registry is None:
                registry = CollectorRegistry(auto_describe=False)
                registry.register(AgentCollector(self._snapshot))
                ProcessCollector(registry=registry)
                self._registry = registry
        return generate_latest(self._registry), CONTENT_TYPE_LATEST


class TelemetryServer:
    def __init__(self, listen: str, snapshot: Callable[[], dict], ready: Callable[[], bool | str],
                 alive: Callable[[], bool | str] = lambda: True,
                 degraded: Callable[[], str | None] = lambda: None) -> None:
        """`ready()`: True, or what is wrong (a short text: "starting", checkpoint trouble).
        `alive()`: True, or why /healthz fails (the main loop stuck). `degraded()`: trouble
        that leaves the agent ready (the export failing), named in /readyz's body."""
        host, _, port = listen.rpartition(":")
        metrics = _Metrics(snapshot)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    (body, ctype), code = metrics(), 200
                elif path == "/healthz":
                    state = alive()
                    body = b"ok\n" if state is True else f"{state}\n".encode()
                    ctype, code = "text/plain", 200 if state is True else 503
                elif path == "/readyz":
                    state, note = ready(), degraded()
                    ok = state is True
                    text = "ready" if ok else (state or "starting")
                    body = (f"{text}; {note}\n" if note else f"{text}\n").encode()
                    ctype, code = "text/plain", 200 if ok else 503
                else:
                    body, ctype, code = b"not found: try /metrics, /healthz or /readyz\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                try:
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the scraper hung up: its loss, not ours
                    pass

            def log_message(self, *args):
                pass

        self._server = _bind(host.strip("[]"), int(port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="telemetry", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
