"""The agent's configuration: one typed record, filled from defaults < file < environment < flags.

Every field can come from the YAML file (`key: value`), the environment
(`VLLM_TRACE_BRIDGE_<KEY>`, lists comma-separated) or a flag (`--key-with-dashes`). A bad
value fails at start with a message that names the field, where it came from, and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "VLLM_TRACE_BRIDGE_"
#: Variables the project reads on purpose outside the settings (C paths off, the vLLM plugin,
#: fault injection and test/figure switches): never reported as unknown.
OTHER_ENV = frozenset(ENV_PREFIX + n for n in (
    "PURE", "PLUGIN", "PLUGIN_BLOCKS", "PLUGIN_QUEUE_INTERVAL_S", "INJECT_FAULT", "FIGURES", "SCENARIOS",
    "CACHE"))


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message says which and how to fix it."""


@dataclass(frozen=True)
class AgentConfig:
    include: tuple[str, ...] = ("/var/log/pods/*/*/*.log",)
    exclude: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ("*",)
    pods: tuple[str, ...] = ("*",)
    containers: tuple[str, ...] = ("*",)
    # Follow a container's file only once a line shows vLLM wrote it (bridge/detect.py): `vllm`
    # or `off` (the name patterns alone decide). Read: at most detect_bytes of each file's start.
    detect: str = "vllm"
    detect_bytes: int = 64 << 10
    state_dir: str = "/var/lib/vllm-trace-bridge"
    start_at: str = "beginning"        # for files that existed before the agent first ran
    # With start_at: beginning, how much of those files a first start reads back (0: no bound).
    history_bytes: int = 64 << 20      # per file: its last 64 MiB (kubelet's files are 10 MiB by default)
    history_age: float = 0.0           # seconds: a file last written before this is started at its end
    poll_interval: float = 1.0         # seconds between looks for new or rotated files, and at quiet ones
    timezone: str = "UTC"
    year: int | None = None
    ttl: float = 600.0
    linger: float = 5.0
    # Seconds a disaggregated prefill waits after its end for its `KV blocks released` line
    # (NIXL's lease is 30 s by default, `kv_lease_duration`; a decode's heartbeats extend it).
    kv_hold: float = 60.0
    otlp_endpoint: str | None = None   # None: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT
    otlp_protocol: str | None = None   # None: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc
    listen: str = "[::]:9464"         # [::]: IPv4 and IPv6 where the node has both, else IPv4
    max_queue_spans: int = 20000
    max_batch_spans: int = 1024        # bench/batch_size.py: cheaper to ship than 512 or 2048
    max_batch_bytes: int = 3 << 20     # under the Collector's 4 MiB gRPC message limit
    batch_delay: float = 0.2           # a partial batch is sent after this long
    max_open_requests: int = 100000    # beyond this the oldest open request is evicted
    memory_limit_mb: int = 512
    shutdown_grace: float = 10.0
    stall_timeout: float = 120.0       # /healthz fails when the main loop has not turned for this long
    export_give_up: float = 900.0      # a batch refused this long is dropped (counted, logged)
    read_chunk_bytes: int = 1 << 20    # per file per round: fairness across files
    log_format: str = "auto"
    # Caller's trace context in request ids: `w3c` (traceparent, trace-span, or trace id inside
    # X-Request-Id), `off`, or a regex with a (?P<trace>…) and optional (?P<span>…) group.
    trace_context: str = "w3c"
    # Trust the trace context a client supplied: the W3C traceparent the vLLM plugin logged with
    # a request, and the `trace_context` rule on its X-Request-Id. Off for clusters whose clients
    # are not trusted to choose a trace (a gateway's access log, `gateway_include`, still joins).
    client_trace_context: bool = True
    # A gateway's JSON access log, joined on the request id (docs/trace-context.md).
    gateway_include: tuple[str, ...] = ()  # globs of access logs; empty: no join
    gateway_format: str = "nginx"          # field-name preset: nginx | envoy
    gateway_request_id_field: str | None = None   # override the preset's request id field
    gateway_traceparent_field: str | None = None  # override the preset's traceparent field
    join_window: float = 30.0              # seconds a request waits for its gateway line (and back)
    # Export error text as vLLM logged it (messages unredacted, tracebacks as
    # exception.stacktrace). Off: a user's prompt or values can be quoted in error text.
    export_error_text: bool = False
    # Copy the Kubernetes identity (namespace, pod, uid, container) from the resource onto every
    # root and engine span's attributes, for backends that drop resource attributes (Phoenix).
    k8s_attributes_on_spans: bool = False
    # Diagnosis thresholds (the seed's rules of thumb), the same flags as `replay`.
    slow_ttft_ms: float = 200.0
    slow_itl_ms: float = 50.0
    low_free_blocks_pct: float = 10.0
    high_gpu_memory_pct: float = 90.0
    # Seconds between the agent's `export_progress` log lines (only when something changed).
    progress_interval: float = 60.0
    # A YAML file of user line rules (docs/rules.md): formats the built-in grammar does not know.
    rules: str | None = None


_CHOICES = {
    "start_at": ("beginning", "end"),
    "otlp_protocol": (None, "grpc", "http/protobuf"),
    "log_format": ("auto", "json", "console"),
    "gateway_format": ("nginx", "envoy"),
    "detect": ("vllm", "off"),
}
_POSITIVE = {"poll_interval", "ttl", "max_queue_spans", "max_batch_spans", "max_batch_bytes", "batch_delay", "max_open_requests",
             "memory_limit_mb", "shutdown_grace", "stall_timeout", "export_give_up", "read_chunk_bytes", "join_window",
             "detect_bytes",
             "progress_interval"}
_NON_NEGATIVE = {"linger", "slow_ttft_ms", "slow_itl_ms", "low_free_blocks_pct", "high_gpu_memory_pct"}

FIELDS = {f.name: f for f in dataclasses.fields(AgentConfig)}
#: What each setting does, for docs/configuration.md (generated by docs/gen_config.py; a test
#: keeps every field described and the page in step).
DOC = {
    "include": "Globs of log files to follow.",
    "exclude": "Globs of files to skip, even when `include` matches them.",
    "namespaces": "Kubernetes namespace patterns (from the kubelet path) whose files are followed.",
    "pods": "Pod name patterns whose files are followed.",
    "containers": "Container name patterns whose files are followed. A name without wildcards is followed whatever it logs (no `detect` look).",
    "detect": "`vllm`: follow a container's file only once a line in it was written by vLLM (its log header, process prefix or logger), whatever the container's name; `off` (or `false`): the name patterns alone decide. Files outside kubelet's tree and gateway logs are never looked at.",
    "detect_bytes": "Bytes of a file's start `detect` reads at most: a file with no vLLM line by then is skipped (`file_skipped`, `kind=not_vllm`); a shorter one is looked at again as it grows.",
    "state_dir": "Directory for checkpoints (which offsets are delivered); keep it across restarts.",
    "start_at": "Where to start files that existed before the agent first ran: `beginning` or `end`.",
    "history_bytes": "With `start_at: beginning`, the bytes of each file a first start reads back: its last `history_bytes`, from the first line starting there (the older part is not read, and logged). 0: the whole file.",
    "history_age": "With `start_at: beginning`, seconds: a file last written longer ago than this is started at its end on a first start. 0: no age bound.",
    "poll_interval": "Seconds between looks for new or rotated files, and at quiet ones.",
    "timezone": "Timezone of vLLM's header stamps (an IANA name or `UTC`); runtime stamps carry their own.",
    "year": "Year of the first line (vLLM headers have none); empty: from the file's modification time.",
    "ttl": "Seconds an open request may go without a new line before it is evicted, marked incomplete.",
    "linger": "Seconds a finished request waits for its last KV block frees.",
    "kv_hold": "Seconds a disaggregated (P/D) prefill waits after its end for the line saying its KV blocks were released (the end of its `kv_hold` span); past this it is sent without a `kv_hold` span. Keep it above the connector's lease (NIXL's `kv_lease_duration`, 30 s by default). After a release at the lease's end, also how long it waits for NIXL's `Potentially invalid KV blocks` line (a decode that read them late); a later one becomes a `kv_transfer` span in its trace.",
    "otlp_endpoint": "OTLP receiver; empty: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`.",
    "otlp_protocol": "`grpc` or `http/protobuf`; empty: `OTEL_EXPORTER_OTLP_PROTOCOL`, else gRPC.",
    "listen": "HOST:PORT of `/healthz`, `/readyz` and `/metrics` (port 0 picks a free one).",
    "max_queue_spans": "Spans queued for export before reading pauses (backpressure).",
    "max_batch_spans": "Spans per OTLP request.",
    "max_batch_bytes": "Bytes per OTLP request, roughly (a request's spans are never split): keep it under the receiver's message limit (the Collector's gRPC default is 4 MiB).",
    "batch_delay": "Seconds after which a partial batch is sent.",
    "max_open_requests": "Open requests kept; beyond this the oldest is evicted (counted).",
    "memory_limit_mb": "Resident memory (MB) above which reading pauses until it falls, before the kernel would kill the agent.",
    "shutdown_grace": "Seconds to send what is queued after SIGTERM.",
    "stall_timeout": "Seconds the main loop may go without turning before `/healthz` fails (the kubelet then restarts the agent).",
    "export_give_up": "Seconds a batch may be refused before it is dropped (counted and logged).",
    "read_chunk_bytes": "Bytes read per file per round: fairness across files.",
    "log_format": "The agent's own logs: `json`, `console`, or `auto` (console on a terminal).",
    "trace_context": "Caller's trace context in request ids: `w3c`, `off`, or a regex with `(?P<trace>…)`.",
    "client_trace_context": "Put a request under the trace context its client sent (the `traceparent` the vLLM plugin logged, and `trace_context` on the request id); off: ignore client-supplied context (untrusted clients); a gateway's access log still joins.",
    "gateway_include": "Globs of a gateway's JSON access logs to join on the request id; empty: no join.",
    "gateway_format": "Field names of the gateway's access log: `nginx` or `envoy`.",
    "gateway_request_id_field": "Override the preset's request id field.",
    "gateway_traceparent_field": "Override the preset's traceparent field.",
    "join_window": "Seconds a request waits for its gateway line (and a gateway line for its request).",
    "export_error_text": "Export error text and tracebacks as vLLM logged them (off: redacted; they can quote prompts).",
    "k8s_attributes_on_spans": "Also put `k8s.namespace.name`, `k8s.pod.name`, `k8s.pod.uid` and `k8s.container.name` on each root and engine span, for backends that drop resource attributes (Phoenix).",
    "slow_ttft_ms": "Diagnose `slow_ttft` above this time to first token (ms).",
    "slow_itl_ms": "Diagnose `slow_itl` above this inter-token latency (ms).",
    "low_free_blocks_pct": "Diagnose `memory_pressure` below this percentage of free KV blocks.",
    "high_gpu_memory_pct": "Diagnose `gpu_memory_high` above this percentage of GPU memory used.",
    "progress_interval": "Seconds between the agent's `export_progress` log lines (only when something changed).",
    "rules": "YAML file of your own line rules for formats the bridge does not know (docs/rules.md).",
}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _kind(name: str) -> str:
    default = FIELDS[name].default
    if isinstance(default, tuple):
        return "list"
    if name == "year":
        return "int?"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    return "str?"


def _coerce(name: str, value: Any, origin: str) -> Any:
    kind = _kind(name)
    where = f"{name} (from {origin})"
    try:
        if kind == "list":
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
            return tuple(value)
        if value is None or value == "":
            if kind in ("str?", "int?"):
                return None
            raise ConfigError(f"{where}: a value is required")
        if kind == "bool":
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word in _TRUE or word in _FALSE:
                return word in _TRUE
            raise ValueError
        if kind in ("int", "int?"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        wanted = "a number" if kind in ("int", "float", "int?") else "true or false" if kind == "bool" else kind
        raise ConfigError(f"{where}: expected {wanted}, "
                          f"got {value!r}") from None


def _check(cfg: AgentConfig, origins: Mapping[str, str]) -> None:
    for name, allowed in _CHOICES.items():
        if getattr(cfg, name) not in allowed:
            shown = ", ".join(a for a in allowed if a)
            raise ConfigError(f"{name} (from {origins.get(name, 'default')}): {getattr(cfg, name)!r} is not "
                              f"allowed; use one of: {shown}")
    for name in _POSITIVE:
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name} (from {origins.get(name, 'default')}): must be greater than 0, "
                              f"got {getattr(cfg, name)!r}")
    for name in _NON_NEGATIVE:
        if not getattr(cfg, name) >= 0:  # NaN too
            raise ConfigError(f"{name} (from {origins.get(name, 'default')}): must be 0 or more")
    if not 0 < cfg.kv_hold < float("inf"):  # NaN too; int(inf ns) would not be a deadline
        raise ConfigError(f"kv_hold (from {origins.get('kv_hold', 'default')}): {cfg.kv_hold!r} is not a wait; give "
                          "seconds greater than 0, above the KV connector's lease, e.g. kv_hold: 60 "
                          "(NIXL's kv_lease_duration is 30 s by default)")
    for name in ("history_bytes", "history_age"):
        value = getattr(cfg, name)
        if not value >= 0 or value == float("inf"):  # NaN too
            raise ConfigError(f"{name} (from {origins.get(name, 'default')}): {value!r} is not a bound; give 0 (no "
                              f"bound) or more, e.g. {name}: " + ("67108864 (64 MiB of each file)" if name == "history_bytes"
                                                                  else "3600 (files written in the last hour)"))
    if not cfg.include:
        raise ConfigError("include: give at least one glob, e.g. /var/log/pods/*/*/*.log")
    host, sep, port = cfg.listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen (from {origins.get('listen', 'default')}): {cfg.listen!r} is not HOST:PORT, "
                          "e.g. [::]:9464 or 0.0.0.0:9464 (port 0 picks a free one)")
    from bridge.decode.clock import zone
    try:
        zone(cfg.timezone)
    except ValueError as exc:
        raise ConfigError(f"timezone (from {origins.get('timezone', 'default')}): {exc}") from None
    from re import error as RegexError

    from bridge.parse.context import make_rule
    try:
        make_rule(cfg.trace_context)
    except (ValueError, RegexError) as exc:
        raise ConfigError(f"trace_context (from {origins.get('trace_context', 'default')}): {exc}; use w3c, off "
                          "or a regular expression with a (?P<trace>…) group") from None


def _check_rules(cfg: AgentConfig, origins: Mapping[str, str]) -> None:
    if cfg.rules is None:
        return
    from bridge.parse.rules import RuleError, load_rules
    try:
        load_rules(cfg.rules)
    except RuleError as exc:
        raise ConfigError(f"rules (from {origins.get('rules', 'default')}): {exc}") from None


def load(file_data: Mapping[str, Any] | None, env: Mapping[str, str], flags: Mapping[str, Any],
         file_name: str = "config file") -> tuple[AgentConfig, dict[str, str]]:
    """The effective config and where each non-default value came from."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if file_data is not None:
        if not isinstance(file_data, Mapping):
            raise ConfigError(f"{file_name}: expected a mapping of key: value, got {type(file_data).__name__}")
        for key, value in file_data.items():
            if key not in FIELDS:
                raise ConfigError(f"{file_name}: unknown key {key!r}; {did_you_mean(str(key))}")
            values[key] = _coerce(key, value, file_name)
            origins[key] = file_name
    for key in FIELDS:
        env_key = ENV_PREFIX + key.upper()
        if env_key in env:
            values[key] = _coerce(key, env[env_key], env_key)
            origins[key] = env_key
    for key, value in flags.items():
        if value is not None:
            flag = "--" + key.replace("_", "-")
            values[key] = _coerce(key, value, flag)
            origins[key] = flag
    if values.get("detect") in ("False", "false"):  # YAML 1.1 (PyYAML, Helm) reads a bare `off` as false
        values["detect"] = "off"
    if values.get("otlp_protocol") == "http":  # the same spelling `replay` takes
        values["otlp_protocol"] = "http/protobuf"
    cfg = AgentConfig(**values)
    _check(cfg, origins)
    _check_rules(cfg, origins)
    return cfg, origins


def as_dict(cfg: AgentConfig) -> dict[str, Any]:
    return {name: (list(v) if isinstance(v, tuple) else v) for name in FIELDS for v in [getattr(cfg, name)]}


def did_you_mean(key: str) -> str:
    """The fix for an unknown key: the nearest known ones, else where the list is."""
    close = difflib.get_close_matches(key.lower().replace("-", "_"), FIELDS, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "`vllm-trace-bridge run --help` lists the keys (as flags, with - for _)"


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """One message per `VLLM_TRACE_BRIDGE_*` variable that no setting reads (a typo is
    otherwise silently ignored), with the nearest known name."""
    known = {ENV_PREFIX + name.upper() for name in FIELDS} | OTHER_ENV
    out = []
    for name in sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        out.append(f"{name} is not a setting and is ignored"
                   + (f"; did you mean {close[0]}?" if close else "; `vllm-trace-bridge run --help` lists them"))
    return out
