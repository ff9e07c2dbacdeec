"""`vllm-trace-bridge`: command-line entry point.

Exit codes: 0 ok, 1 export failed (spans not acknowledged), 2 usage or input error.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from bridge.assemble import AssembleConfig, Thresholds
from bridge.decode.clock import zone
from bridge.export.batch import OtlpSink
from bridge.export.console import Waterfall
from bridge.export.otlp import base_resource
from bridge.export.summary import Summary
from bridge.export.transport import PROTOCOLS, destination, make_transport
from bridge.logs import make_logger
from bridge.pipeline import ReplayConfig, ReplayStats, replay

EXIT_OK, EXIT_EXPORT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad flag value or input; the message says what to fix."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-trace-bridge", description="vLLM logs → OpenTelemetry traces")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="run finished log files through the pipeline once, then exit",
                       description="Without an OTLP endpoint (flag or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT) "
                                   "each request is drawn as a waterfall in the terminal.")
    r.add_argument("paths", nargs="+", metavar="PATH", help="log files: plain, CRI or docker json-file; .gz too")
    r.add_argument("--otlp-endpoint", help="OTLP receiver, e.g. http://127.0.0.1:4317 (gRPC) or "
                                           "http://127.0.0.1:4318 (HTTP)")
    r.add_argument("--protocol", choices=PROTOCOLS + ("http",), help="default: OTEL_EXPORTER_OTLP_PROTOCOL or grpc")
    r.add_argument("--year", type=int, help="year of the first line (vLLM headers have none); "
                                            "default: inferred from the file's modification time")
    r.add_argument("--timezone", default="UTC", help="timezone of vLLM's header stamps (default UTC)")
    r.add_argument("--ttl", type=float, default=600.0, metavar="SECONDS",
                   help="evict a request with no new line for this long, as incomplete (default 600)")
    r.add_argument("--waterfalls", type=int, default=100, metavar="N",
                   help="draw at most N requests in the terminal (default 100; 0: summary only)")
    d = Thresholds()
    r.add_argument("--slow-ttft-ms", type=float, default=d.ttft_s * 1000, help="diagnose slow_ttft above (200)")
    r.add_argument("--slow-itl-ms", type=float, default=d.itl_s * 1000, help="diagnose slow_itl above (50)")
    r.add_argument("--low-free-blocks-pct", type=float, default=d.free_blocks_ratio * 100,
                   help="diagnose memory_pressure below this %% of free KV blocks (10)")
    r.add_argument("--high-gpu-memory-pct", type=float, default=d.gpu_memory_ratio * 100,
                   help="diagnose gpu_memory_high above this %% (90)")
    r.add_argument("--rules", metavar="FILE", help="YAML file of your own line rules (docs/rules.md)")
    r.add_argument("--export-error-text", action="store_true",
                   help="export error messages and tracebacks as logged (default: quoted text redacted, no "
                        "tracebacks; they can carry users' prompts)")
    c = sub.add_parser("check", help="report which lines of a log the bridge understands",
                       description="Per file: the vLLM version family, records recognised per kind, "
                                   "%% unrecognised and the top unrecognised line templates.")
    c.add_argument("paths", nargs="+", metavar="PATH", help="log files: plain, CRI or docker json-file; .gz too")
    c.add_argument("--top", type=int, default=10, metavar="N", help="unrecognised templates to list (default 10)")
    c.add_argument("--rules", metavar="FILE", help="YAML file of your own line rules (docs/rules.md): coverage "
                                                   "with them, and the lines each took")
    _add_run(sub)
    return p


_RUN_HELP = {
    "include": "glob of files to follow (repeatable)", "exclude": "glob of files to skip (repeatable)",
    "namespaces": "namespace patterns (repeatable)", "pods": "pod name patterns (repeatable)",
    "containers": "container name patterns (repeatable)", "state_dir": "directory for checkpoints",
    "start_at": "beginning|end: where to start files that existed before the first run",
    "otlp_endpoint": "OTLP receiver (default: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)",
    "otlp_protocol": "grpc|http/protobuf", "listen": "HOST:PORT for /healthz, /readyz, /metrics",
    "trace_context": "w3c|off|REGEX: caller's trace context inside request ids (default w3c)",
    "rules": "YAML file of your own line rules (docs/rules.md)",
    "export_error_text": "export error messages and tracebacks as logged (default off: quoted text redacted, "
                         "no tracebacks; they can carry users' prompts)",
}


def _add_run(sub) -> None:
    from bridge.config import FIELDS, _kind

    r = sub.add_parser("run", help="follow live vLLM logs and export traces until SIGTERM",
                       description="Settings: flag > VLLM_TRACE_BRIDGE_<KEY> environment > --config file "
                                   "> default. OTLP delivery also honours the standard OTEL_EXPORTER_OTLP_* "
                                   "variables.")
    r.add_argument("--config", metavar="FILE", help="YAML file of settings (keys as the flags, with _)")
    r.add_argument("--print-config", action="store_true", help="print the effective settings as YAML and exit")
    for name in FIELDS:
        flag = "--" + name.replace("_", "-")
        if _kind(name) == "list":
            r.add_argument(flag, dest=f"cfg_{name}", action="append", metavar="PATTERN", help=_RUN_HELP.get(name))
        elif _kind(name) == "bool":  # --flag / --no-flag; absent: the file, environment or default decides
            r.add_argument(flag, dest=f"cfg_{name}", action=argparse.BooleanOptionalAction, default=None,
                           help=_RUN_HELP.get(name))
        else:
            r.add_argument(flag, dest=f"cfg_{name}", metavar=name.split("_")[-1].upper(), help=_RUN_HELP.get(name))


def run_agent(args: argparse.Namespace, env: Mapping[str, str], out: TextIO) -> int:
    import yaml

    from bridge.agent import Agent, install_signal_handlers
    from bridge.config import FIELDS, ConfigError, as_dict, load

    file_data = None
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                file_data = yaml.safe_load(f) or {}
        except OSError as exc:
            raise UsageError(f"--config {args.config}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise UsageError(f"--config {args.config}: not valid YAML: {exc}") from None
    flags = {name: getattr(args, f"cfg_{name}") for name in FIELDS}
    try:
        cfg, _origins = load(file_data, env, flags, file_name=args.config or "config file")
        dest = destination(env, cfg.otlp_endpoint, cfg.otlp_protocol)
    except (ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if args.print_config:
        out.write(yaml.safe_dump(as_dict(cfg), sort_keys=False))
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
    json_logs = {"json": True, "console": False}.get(cfg.log_format)
    agent = Agent(cfg, dest, env, make_logger(json=json_logs))
    install_signal_handlers(agent)
    return agent.run()


def _replay_config(args: argparse.Namespace) -> ReplayConfig:
    try:
        tz = zone(args.timezone)
    except ValueError as exc:
        raise UsageError(f"--timezone: {exc}") from None
    if args.year is not None and not 1970 <= args.year <= 9999:
        raise UsageError(f"--year {args.year}: give a four-digit year such as 2025")
    if not args.ttl > 0:
        raise UsageError(f"--ttl {args.ttl}: give a number of seconds greater than 0")
    try:
        thresholds = Thresholds(args.slow_ttft_ms / 1000, args.slow_itl_ms / 1000,
                                args.low_free_blocks_pct / 100, args.high_gpu_memory_pct / 100)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for path in args.paths:
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such file (give the path of a vLLM log file)")
        if not os.access(path, os.R_OK):
            raise UsageError(f"{path}: not readable by this user")
    return ReplayConfig(tz=tz, year=args.year, assemble=AssembleConfig(thresholds=thresholds, ttl_s=args.ttl,
                                                                       export_error_text=args.export_error_text),
                        rules=_rules(args.rules))


def _rules(path: str | None):
    """The user rule file, validated; a bad one stops here (exit 2) with the rule, field and fix."""
    if path is None:
        return None
    from bridge.parse.rules import RuleError, load_rules
    try:
        return load_rules(path)
    except RuleError as exc:
        raise UsageError(f"--rules {exc}") from None


def _stats_lines(stats: ReplayStats) -> str:
    p, d = stats.parse, stats.decode
    malformed = sum(p.malformed.values())
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(p.by_kind.items()))
    return (f"lines        {d.lines} in {stats.files} file(s): {p.recognised} recognised, "
            f"{p.unrecognised} unrecognised, {malformed} malformed"
            + (f", {d.invalid_utf8} invalid UTF-8" if d.invalid_utf8 else "")
            + (", errors skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.line_errors.items()))
               if stats.line_errors else "")
            + f"\nkinds        {kinds or 'none'}"
            + (f"\nrules        " + ", ".join(f"{k} {v}" for k, v in sorted(p.by_rule.items())) if p.by_rule else ""))


def run_replay(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, log) -> int:
    config = _replay_config(args)
    try:
        dest = destination(env, args.otlp_endpoint, args.protocol)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    summary = Summary()
    sinks = [summary]
    waterfall = sink = None
    if dest.endpoint is None:
        if args.waterfalls:
            waterfall = Waterfall(out, limit=args.waterfalls)
            sinks.append(waterfall)
    else:
        sink = OtlpSink(make_transport(dest), base_resource(env))
        sinks.append(sink)

    stats = replay(args.paths, sinks, config, log)
    delivered = sink.close() if sink is not None else True

    if waterfall is not None and waterfall.skipped:
        out.write(f"(+{waterfall.skipped} more not drawn; --waterfalls N draws more)\n")
    out.write(("\n" if waterfall is not None and waterfall.drawn else "") + summary.render() + "\n")
    out.write(_stats_lines(stats) + "\n")
    if sink is not None:
        s = sink.stats
        out.write(f"export       {s.spans_sent} spans sent to {dest.endpoint} ({dest.protocol})"
                  + (f", {s.spans_failed} NOT delivered" if s.spans_failed else "") + "\n")
        if not delivered:
            log.error("export_failed", endpoint=dest.endpoint, protocol=dest.protocol,
                      spans_sent=s.spans_sent, spans_not_delivered=s.spans_failed,
                      fix="check that an OTLP receiver listens there and accepts this protocol")
            return EXIT_EXPORT_FAILED
    return EXIT_OK


def run_check_command(args: argparse.Namespace, out: TextIO) -> int:
    from bridge.check import run_check

    for path in args.paths:
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such file (give the path of a vLLM log file)")
    run_check(args.paths, out, args.top, _rules(args.rules))
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
    log = make_logger()
    try:
        if args.command == "run":
            return run_agent(args, env, out)
        if args.command == "check":
            return run_check_command(args, out)
        return run_replay(args, env, out, log)
    except UsageError as exc:
        print(f"vllm-trace-bridge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `… | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
