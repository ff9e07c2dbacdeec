"""`vllm-trace-bridge`: command-line entry point.

Exit codes: 0 ok, 1 export failed (spans not acknowledged), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import replace
from collections.abc import Mapping, Sequence
from typing import TextIO

from bridge.assemble import AssembleConfig, Thresholds
from bridge.decode.clock import zone
from bridge.export.batch import OtlpSink
from bridge.export.console import Selection, Waterfall
from bridge.export.resource import base_resource
from bridge.export.summary import Summary
from bridge.export.transforms import K8sOnSpans, LastEnd, Shift, fan_out
from bridge.export.transport import destination, make_transport
from bridge.export.trouble import export_fix
from bridge.export.secrets import redact_text, redact_url, secrets_from
from bridge.logs import make_logger, route_library_logs
from bridge.pipeline import ReplayConfig, ReplayStats, replay

EXIT_OK, EXIT_EXPORT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad flag value or input; the message says what to fix."""


class _Parser(argparse.ArgumentParser):
    """Errors as one line naming the fix, like every other usage error (not usage + error)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(EXIT_USAGE, f"{self.prog}: {message}; see `{self.prog} --help`\n")


def _with_default(text: str, default) -> str:
    return f"{text} (default: {default})"


def _add_shared(p: argparse.ArgumentParser, *, run: bool) -> None:
    """Flags `replay` and `run` share, with one spelling and one set of accepted values. For
    `run` a flag only overrides (default None): the file, the environment or the config default
    decide otherwise, and `run --help` shows that default."""
    from bridge.config import AgentConfig

    d = AgentConfig()
    dest = (lambda name: f"cfg_{name}") if run else (lambda name: name)
    unset = (lambda v: None) if run else (lambda v: v)
    p.add_argument("--otlp-endpoint", dest=dest("otlp_endpoint"), metavar="URL",
                   help=_with_default("OTLP receiver, e.g. http://127.0.0.1:4317 (gRPC) or http://127.0.0.1:4318 "
                                      "(HTTP)", "OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT"
                                      + ("" if run else "; none: waterfalls in the terminal")))
    p.add_argument("--otlp-protocol", dest=dest("otlp_protocol"), metavar="PROTOCOL",
                   help=_with_default("grpc, or http/protobuf (http for short)",
                                      "OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else grpc"))
    # The old spelling of --otlp-protocol (replay's): still taken, no longer shown.
    p.add_argument("--protocol", dest=dest("otlp_protocol"), help=argparse.SUPPRESS)
    p.add_argument("--year", dest=dest("year"), type=int, metavar="YYYY",
                   help=_with_default("year of the first line (vLLM headers have none)",
                                      "from the file's modification time"))
    p.add_argument("--timezone", dest=dest("timezone"), default=unset(d.timezone), metavar="ZONE",
                   help=_with_default("timezone of vLLM's header stamps, e.g. Europe/Paris", d.timezone))
    p.add_argument("--ttl", dest=dest("ttl"), type=float, default=unset(d.ttl), metavar="SECONDS",
                   help=_with_default("end a request with no new line for this long, as incomplete", f"{d.ttl:g}"))
    for name, text in _THRESHOLDS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=dest(name), type=float,
                       metavar=name.rsplit("_", 1)[1].upper(), default=unset(getattr(d, name)),
                       help=_with_default(text, f"{getattr(d, name):g}"))
    bool_kw = {"action": argparse.BooleanOptionalAction, "default": None} if run else {"action": "store_true"}
    p.add_argument("--export-error-text", dest=dest("export_error_text"), **bool_kw,
                   help=_with_default("export error messages and tracebacks as logged; they can carry users' "
                                      "prompts", "off: quoted text redacted, no tracebacks"))
    p.add_argument("--k8s-attributes-on-spans", dest=dest("k8s_attributes_on_spans"), **bool_kw,
                   help=_with_default("also put the pod's namespace, name, uid and container on each root span, for "
                                      "backends that drop resource attributes (Phoenix)", "off: on the resource only"))


_THRESHOLDS = {
    "slow_ttft_ms": "diagnose slow_ttft above this time to first token",
    "slow_itl_ms": "diagnose slow_itl above this inter-token latency",
    "low_free_blocks_pct": "diagnose memory_pressure below this percentage of free KV blocks",
    "high_gpu_memory_pct": "diagnose gpu_memory_high above this percentage of GPU memory used",
}
_SHARED = ("otlp_endpoint", "otlp_protocol", "year", "timezone", "ttl", "export_error_text", "k8s_attributes_on_spans",
           *_THRESHOLDS)
_PATHS_HELP = ("log files, or directories of them (their *.log files and rotated siblings, .gz too): plain, "
               "CRI or docker json-file")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vllm-trace-bridge", description="vLLM logs → OpenTelemetry traces")
    sub = p.add_subparsers(dest="command", required=True, metavar="{replay,check,run,inject,plugin}")
    r = sub.add_parser("replay", help="run finished log files through the pipeline once, then exit",
                       description="Without an OTLP endpoint (flag or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT) "
                                   "the summary is printed, then each request as a waterfall.")
    r.add_argument("paths", nargs="+", metavar="PATH", help=_PATHS_HELP)
    _add_shared(r, run=False)
    r.add_argument("--waterfalls", type=int, default=10, metavar="N",
                   help=_with_default("draw at most N requests in the terminal, after the summary (0: summary "
                                      "only)", 10))
    r.add_argument("--rules", metavar="FILE",
                   help=_with_default("YAML file of your own line rules (docs/rules.md)", "none"))
    r.add_argument("--request", action="append", default=[], metavar="ID",
                   help=_with_default("draw only this request: the id the client received (cmpl-…, "
                                      "chatcmpl-…) or the bridge's; repeat for more", "all"))
    r.add_argument("--errors", action="store_true",
                   help=_with_default("draw only failed requests and engine incidents", "off"))
    r.add_argument("--shift-to-now", action="store_true",
                   help=_with_default("move every time so that the log's last event is now (demo data, old logs: "
                                      "inside a backend's default search window); reads the files twice", "off"))
    r.add_argument("--max-open-requests", type=int, default=ReplayConfig().max_open_requests, metavar="N",
                   help=_with_default("open requests kept per log; beyond this the oldest are closed (counted, "
                                      "reported; an unended one as incomplete)", ReplayConfig().max_open_requests))
    r.add_argument("--slowest", type=int, default=0, metavar="N",
                   help=_with_default("draw the N slowest requests by measured e2e, slowest first", "off"))
    c = sub.add_parser("check", help="report which lines of a log the bridge understands",
                       description="Per file: the vLLM version family, records recognised per kind, the "
                                   "percentage unrecognised and the top unrecognised line templates.")
    c.add_argument("paths", nargs="+", metavar="PATH", help=_PATHS_HELP)
    c.add_argument("--top", type=int, default=10, metavar="N", help=_with_default("unrecognised templates to list", 10))
    c.add_argument("--rules", metavar="FILE",
                   help=_with_default("YAML file of your own line rules (docs/rules.md): coverage with them, and "
                                      "the lines each took", "none"))
    _add_run(sub)
    _add_plugin(sub)
    from bridge.inject import add_arguments

    add_arguments(sub.add_parser("inject", help="add the vLLM plugin to the vLLM containers of Kubernetes YAML",
                                 description="Reads Kubernetes YAML (a file, or - for standard input) and writes it "
                                             "to standard output with the plugin added to every vLLM container: "
                                             "an init container that installs it into an emptyDir, the mount, and "
                                             "PYTHONPATH. docs/plugin.md."))
    return p


def _add_plugin(sub) -> None:
    p = sub.add_parser("plugin", help="the vLLM plugin as a pure-Python wheel, or laid into a directory",
                       description="The plugin alone (no dependency, Python 3.10+, any vLLM image): docs/plugin.md.")
    actions = p.add_subparsers(dest="plugin_command", required=True, metavar="{wheel,install}")
    w = actions.add_parser("wheel", help="write the plugin's py3-none-any wheel into DIR")
    w.add_argument("dir", metavar="DIR", help="directory to write the wheel into (made if missing)")
    i = actions.add_parser("install", help="lay the plugin into DIR, for vLLM to find through PYTHONPATH=DIR")
    i.add_argument("--target", required=True, metavar="DIR",
                   help="directory to install into (made if missing; an earlier copy of the plugin there is replaced)")


def run_plugin(args: argparse.Namespace, out: TextIO) -> int:
    from bridge import plugin_dist

    try:
        if args.plugin_command == "wheel":
            out.write(plugin_dist.write_wheel(args.dir) + "\n")
        else:
            dist = plugin_dist.install(args.target)
            out.write(f"vllm-trace-bridge plugin {dist.version} installed in {args.target}: run vLLM with "
                      f"PYTHONPATH={args.target} (entry point {plugin_dist.ENTRY_GROUP}: {plugin_dist.ENTRY_NAME})\n")
    except plugin_dist.PluginBuildError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK


def run_inject(args: argparse.Namespace, out: TextIO) -> int:
    from bridge.inject import InjectError, inject_command

    try:
        inject_command(args, out, sys.stdin, sys.stderr)
    except InjectError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK


#: The metavar of each `run` flag; its help text is the setting's own (`config.DOC`).
_RUN_METAVAR = {
    "include": "PATTERN",
    "exclude": "PATTERN",
    "namespaces": "PATTERN",
    "pods": "PATTERN",
    "containers": "PATTERN",
    "detect": "WHAT",
    "detect_bytes": "BYTES",
    "state_dir": "DIR",
    "start_at": "WHERE",
    "history_bytes": "BYTES",
    "history_age": "SECONDS",
    "poll_interval": "SECONDS",
    "linger": "SECONDS",
    "kv_hold": "SECONDS",
    "listen": "HOST:PORT",
    "max_queue_spans": "N",
    "max_batch_spans": "N",
    "max_batch_bytes": "BYTES",
    "batch_delay": "SECONDS",
    "max_open_requests": "N",
    "memory_limit_mb": "MB",
    "shutdown_grace": "SECONDS",
    "stall_timeout": "SECONDS",
    "export_give_up": "SECONDS",
    "read_chunk_bytes": "BYTES",
    "log_format": "FORMAT",
    "trace_context": "RULE",
    "client_trace_context": None,
    "gateway_include": "PATTERN",
    "gateway_format": "FORMAT",
    "gateway_request_id_field": "FIELD",
    "gateway_traceparent_field": "FIELD",
    "join_window": "SECONDS",
    "progress_interval": "SECONDS",
    "rules": "FILE",
}


def _shown_default(name: str, value) -> str:
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _add_run(sub) -> None:
    from bridge.config import DOC, FIELDS, _kind

    r = sub.add_parser("run", help="follow live vLLM logs and export traces until SIGTERM",
                       description="Settings: flag > VLLM_TRACE_BRIDGE_<KEY> environment > --config file "
                                   "> default. OTLP delivery also honours the standard OTEL_EXPORTER_OTLP_* "
                                   "variables. docs/configuration.md describes every setting.")
    r.add_argument("--config", metavar="FILE", help="YAML file of settings (keys as the flags, with _)")
    r.add_argument("--print-config", action="store_true", help="print the effective settings as YAML and exit")
    _add_shared(r, run=True)
    for name, f in FIELDS.items():
        if name in _SHARED:
            continue
        flag = "--" + name.replace("_", "-")
        metavar = _RUN_METAVAR[name]
        text = _with_default(DOC[name].rstrip("."), _shown_default(name, f.default))
        if _kind(name) == "list":
            r.add_argument(flag, dest=f"cfg_{name}", action="append", metavar=metavar, help=text)
        elif _kind(name) == "bool":  # --flag / --no-flag; absent: the file, environment or default decides
            r.add_argument(flag, dest=f"cfg_{name}", action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            r.add_argument(flag, dest=f"cfg_{name}", metavar=metavar, help=text)


def run_agent(args: argparse.Namespace, env: Mapping[str, str], out: TextIO) -> int:
    from bridge.agent import Agent, install_signal_handlers
    from bridge.faults import stages_from_env
    from bridge.config import FIELDS, ConfigError, as_dict, load, unknown_env

    file_data = None
    if args.config:
        import yaml  # only for a config file: 30 ms of start-up

        from bridge.parse import yamlsafe

        try:
            file_data = yamlsafe.load(args.config, max_bytes=1 << 20) or {}
        except OSError as exc:
            raise UsageError(f"--config {args.config}: {exc.strerror or exc}") from None
        except yamlsafe.YamlLimitError as exc:
            raise UsageError(f"--config {args.config}: {exc}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise UsageError(f"--config {args.config}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    flags = {name: getattr(args, f"cfg_{name}") for name in FIELDS}
    try:
        cfg, _origins = load(file_data, env, flags, file_name=args.config or "config file")
        dest = destination(env, cfg.otlp_endpoint, cfg.otlp_protocol)
    except (ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    json_logs = {"json": True, "console": False}.get(cfg.log_format)
    log = make_logger(json=json_logs, secrets=secrets_from(env, dest.endpoint))
    for problem in unknown_env(env):
        log.warning("unknown_environment_variable", problem=problem)
    if args.print_config:
        import yaml

        shown = as_dict(cfg)
        shown["otlp_endpoint"] = redact_url(shown["otlp_endpoint"])  # never its user:password
        out.write(yaml.safe_dump(shown, sort_keys=False))
        return EXIT_OK
    if dest.endpoint is None:
        raise UsageError("no OTLP endpoint: set otlp_endpoint (--otlp-endpoint, VLLM_TRACE_BRIDGE_OTLP_ENDPOINT) "
                         "or OTEL_EXPORTER_OTLP_ENDPOINT")
    try:
        os.makedirs(cfg.state_dir, exist_ok=True)
        probe = os.path.join(cfg.state_dir, ".write-test")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"state_dir {cfg.state_dir}: not writable ({exc.strerror}); give a writable directory "
                         "with --state-dir") from None
    from bridge.tail.checkpoint import StateDirInUse, lock_state_dir
    try:
        lock = lock_state_dir(cfg.state_dir)
    except StateDirInUse as exc:
        raise UsageError(f"state_dir {cfg.state_dir}: in use by another agent (pid {exc.holder or 'unknown'}); "
                         "give each agent its own state_dir (--state-dir), or stop the other one") from None
    except OSError as exc:  # a lock file left by another user, a directory in its place, no flock
        raise UsageError(f"state_dir {cfg.state_dir}: cannot take its lock file {os.path.join(cfg.state_dir, 'lock')} "
                         f"({exc.strerror or exc}); remove that file, or give a state_dir this user owns "
                         "(--state-dir)") from None
    with lock:  # held until the agent has stopped
        agent = Agent(cfg, dest, env, log, stages_from_env(env))
        install_signal_handlers(agent)
        with route_library_logs(log):  # the SDK's and gRPC's own lines as the agent's JSON, not plain text
            return agent.run()


def _replay_config(args: argparse.Namespace) -> ReplayConfig:
    try:
        tz = zone(args.timezone)
    except ValueError as exc:
        raise UsageError(f"--timezone: {exc}") from None
    if args.year is not None and not 1970 <= args.year <= 9999:
        raise UsageError(f"--year {args.year}: give a four-digit year such as 2025")
    if not args.ttl > 0:
        raise UsageError(f"--ttl {args.ttl:g}: give a number of seconds greater than 0")
    if args.max_open_requests < 1:
        raise UsageError(f"--max-open-requests {args.max_open_requests}: give a number of requests, 1 or more")
    for name in _THRESHOLDS:
        if not getattr(args, name) >= 0:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(args, name):g}: give a number of 0 or more")
    thresholds = Thresholds(args.slow_ttft_ms / 1000, args.slow_itl_ms / 1000,
                            args.low_free_blocks_pct / 100, args.high_gpu_memory_pct / 100)
    return ReplayConfig(tz=tz, year=args.year, assemble=AssembleConfig(thresholds=thresholds, ttl_s=args.ttl,
                                                                       export_error_text=args.export_error_text),
                        rules=_rules(args.rules), max_open_requests=args.max_open_requests)


def _rules(path: str | None):
    """The user rule file, validated; a bad one stops here (exit 2) with the rule, field and fix."""
    if path is None:
        return None
    from bridge.parse.rules import RuleError, load_rules
    try:
        return load_rules(path)
    except RuleError as exc:
        raise UsageError(f"--rules {exc}") from None


def log_files(paths: Sequence[str]) -> list[str]:
    """The files to read for the paths given: a file as it is; a directory as its `*.log`
    files and the files rotation made of them (`0.log.<stamp>`, `.gz` too). Ordered by
    `tail.source.streams`: each container's files together, in the order they were written
    (rotated files oldest first, then the live file; `0.log`'s before `1.log`'s)."""
    from bridge.tail.files import rotated_from
    from bridge.tail.source import streams

    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                raise UsageError(f"{path}: directory not readable ({exc.strerror})") from None
            found = [os.path.join(path, n) for n in names if (n.endswith(".log") or rotated_from(n))
                     and os.path.isfile(os.path.join(path, n))]
            if not found:
                raise UsageError(f"{path}: a directory with no *.log file in it; give log files, or the directory "
                                 "holding them (e.g. /var/log/pods/<ns>_<pod>_<uid>/<container>)")
            files += found
        elif not os.path.exists(path):
            raise UsageError(f"{path}: no such file or directory (give vLLM log files or a directory of them)")
        elif not os.path.isfile(path):
            raise UsageError(f"{path}: not a regular file (give vLLM log files or a directory of them)")
        else:
            files.append(path)
    for path in files:
        if not os.access(path, os.R_OK):
            raise UsageError(f"{path}: not readable by this user (run as a user that may read it)")
    return [f for stream in streams(files) for f in stream]


def _stats_lines(stats: ReplayStats, max_open: int = 0) -> str:
    from bridge.tail.files import MAX_LINE_BYTES

    p, d = stats.parse, stats.decode
    malformed = sum(p.malformed.values())
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(p.by_kind.items()))
    return (f"lines        {d.lines} in {stats.files} file(s): {p.recognised} recognised, "
            f"{p.unrecognised} unrecognised, {malformed} malformed"
            + (f", {d.invalid_utf8} invalid UTF-8" if d.invalid_utf8 else "")
            + (f", {stats.cut['lines_oversized']} over {MAX_LINE_BYTES >> 20} MiB cut there "
               f"({stats.cut['bytes_cut']} bytes dropped)" if stats.cut.get("lines_oversized") else "")
            + (", errors skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.line_errors.items()))
               if stats.line_errors else "")
            + f"\nkinds        {kinds or 'none'}"
            + ("\nrules        " + ", ".join(f"{k} {v}" for k, v in sorted(p.by_rule.items())) if p.by_rule else "")
            + _limits_lines(stats, max_open))


def _limits_lines(stats: ReplayStats, max_open: int) -> str:
    """What the open-request limit and the logs' clocks did, when they did anything (the
    agent's /metrics: requests_capped_total, clock_jumps_total)."""
    a = stats.assemble
    out = ""
    if a.requests_capped:
        out += (f"\nopen limit   {a.requests_capped} requests closed early: more than {max_open} were open at once "
                "(--max-open-requests); an unended one is exported as incomplete")
    if a.clock_jumps:
        out += (f"\nclock        {a.clock_jumps} clock jump(s) between neighbouring lines (a year or more ahead, a day "
                "or more back): a vllm.clock_jump event on the requests in flight, none split by it")
    return out


def run_replay(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, log) -> int:
    config = _replay_config(args)
    if args.waterfalls < 0:
        raise UsageError(f"--waterfalls {args.waterfalls}: give 0 (summary only) or more")
    paths = log_files(args.paths)
    try:
        dest = destination(env, args.otlp_endpoint, args.otlp_protocol)
    except ValueError as exc:
        raise UsageError(f"--otlp-protocol / --otlp-endpoint: {exc}") from None
    if args.slowest < 0:
        raise UsageError(f"--slowest {args.slowest}: give a number of requests, 1 or more")
    summary = Summary()
    sinks = [summary]
    waterfall = sink = select = None
    if dest.endpoint is None:
        # Nothing leaves the machine: the user's own terminal shows the error text of their own
        # file as logged (export keeps redacting it unless --export-error-text).
        config = replace(config, assemble=replace(config.assemble, export_error_text=True))
        if args.waterfalls:
            waterfall = Waterfall(limit=args.waterfalls)
            select = Selection(args.request, args.errors, args.slowest)
            sinks.append(select)
    else:
        sink = OtlpSink(make_transport(dest), base_resource(env))
        sinks.append(sink)

    # Transforms change a timeline in place, so each goes once in front of all the sinks.
    if args.k8s_attributes_on_spans:
        sinks = [K8sOnSpans(fan_out(sinks))]
    if args.shift_to_now:
        last = LastEnd()
        replay(paths, [last], config)  # a first pass, for where the log ends
        if last.end_ns is not None:
            sinks = [Shift(fan_out(sinks), time.time_ns() - last.end_ns)]
    trouble = _ExportTrouble(log, dest)
    with route_library_logs(log, on_export_trouble=trouble):
        stats = replay(paths, sinks, config, log)
        delivered = sink.close() if sink is not None else True

    out.write(summary.render() + "\n")
    out.write(_stats_lines(stats, config.max_open_requests) + "\n")
    if sink is not None:
        s = sink.stats
        out.write(f"export       {s.spans_sent} spans sent to {redact_url(dest.endpoint)} ({dest.protocol})"
                  + (f", {s.spans_failed} NOT delivered" if s.spans_failed else "") + "\n")
        if not delivered:
            log.error("export_failed", endpoint=redact_url(dest.endpoint), protocol=dest.protocol,
                      spans_sent=s.spans_sent, spans_not_delivered=s.spans_failed,
                      fix=trouble.fix or "check that an OTLP receiver listens there and accepts this protocol")
            return EXIT_EXPORT_FAILED
    if select is not None:
        select.drain(waterfall)
        if args.slowest and select.unranked:
            out.write(f"slowest      {select.unranked} requests not ranked: no line states their end\n")
        if not waterfall.drawn and (args.request or args.errors or args.slowest):
            out.write("selection    no request matches --request / --errors / --slowest\n")
    if waterfall is not None and waterfall.drawn:
        out.write("\n" + waterfall.render())
    return EXIT_OK


class _ExportTrouble:
    """The first failed export attempt, said at once in one line (the SDK then retries with
    backoff for seconds per batch); the SDK's own retry lines after it are left out. The fix
    follows the error's cause (`export.trouble`): a TLS failure means a receiver answered.
    `fix`: that cause's fix, for the final line too (None: no cause recognised)."""

    def __init__(self, log, dest) -> None:
        self.log, self.dest, self.said, self.fix = log, dest, False, None

    def __call__(self, message: str) -> None:
        if self.said:
            if self.fix is None:  # a later attempt's error may name the cause the first did not
                self.fix = export_fix(message)
            return
        self.said = True
        self.fix = export_fix(message)
        self.log.warning("export_retrying", endpoint=redact_url(self.dest.endpoint), protocol=self.dest.protocol,
                         error=message[:200] if self.fix is None else _cause(message),
                         fix=self.fix or "start an OTLP receiver there, or fix --otlp-endpoint / --otlp-protocol; "
                                         "each batch is retried for about 10 s before replay gives up")


def _cause(message: str) -> str:
    """The part of an exporter's message that names the cause (gRPC's is at its end, past 200
    characters of preamble)."""
    head, sep, tail = message.partition("Error details: ")
    return (tail if sep else head)[-300:]


def run_check_command(args: argparse.Namespace, out: TextIO) -> int:
    from bridge.check import run_check

    run_check(log_files(args.paths), out, args.top, _rules(args.rules))
    return EXIT_OK


def tune_gc() -> None:
    """The pipeline makes many short-lived container objects (records, events, attribute
    dicts), almost none of them in cycles, so CPython's default young-generation threshold
    (700) runs a collection every few lines. Move what exists at start (modules, the SDK,
    gRPC) out of the collector's sight and collect young objects less often: cycles are
    still collected, memory stays bounded (bench/replay_cpu.py: about 1.5 CPU-µs per line)."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
         out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("run", "replay"):
        tune_gc()
    env = os.environ if env is None else env
    out = out or sys.stdout
    secrets = tuple(s for ep in (getattr(args, "otlp_endpoint", None), getattr(args, "cfg_otlp_endpoint", None),
                                 env.get("OTEL_EXPORTER_OTLP_ENDPOINT"), env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
                    for s in secrets_from(env, ep if isinstance(ep, str) else None))
    log = make_logger(secrets=secrets)
    if args.command != "run":  # run logs them in its own format
        from bridge.config import unknown_env

        for problem in unknown_env(env):
            log.warning("unknown_environment_variable", problem=problem)
    try:
        if args.command == "run":
            return run_agent(args, env, out)
        if args.command == "check":
            return run_check_command(args, out)
        if args.command == "plugin":
            return run_plugin(args, out)
        if args.command == "inject":
            return run_inject(args, out)
        return run_replay(args, env, out, log)
    except UsageError as exc:
        print(f"vllm-trace-bridge: {redact_text(str(exc), secrets)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `… | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
