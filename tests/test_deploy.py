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
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
    proc = subprocess.run(argv, cwd=src, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return src, venv


def test_image_install_steps_give_a_working_agent(tmp_path):
    """The build stage's COPY + RUN in a fresh virtualenv, then the agent starts from it."""
    _, venv = _build_stage_copy_and_run(tmp_path)
    exe = venv / "bin" / "vllm-trace-bridge"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not (venv / "bin" / "pip").exists(), "the runtime environment should carry no pip"
    # Test dependencies stay out of the image.
    freeze = subprocess.run([str(venv / "bin" / "python"), "-c",
                             "import importlib.metadata as m; print('\\n'.join(sorted(d.metadata['Name'].lower() "
                             "for d in m.distributions())))"], capture_output=True, text=True, env=env)
    installed = set(freeze.stdout.split())
    assert "vllm-trace-bridge" in installed
    assert not installed & {"pytest", "hypothesis", "yamllint", "helm-python-sdk", "kubernetes-validate"}
    # The build stage has a compiler (as the image's does): the C fast paths were built.
    if shutil.which("gcc") or shutil.which("cc"):
        native = subprocess.run([str(venv / "bin" / "python"), "-c",
                                 "from bridge.decode import stream; from bridge.parse import FAST_PARSE; "
                                 "from bridge.assemble import build, requests; from bridge.export import wire; "
                                 "print(all(x is not None for x in (stream.FAST, FAST_PARSE, build.FAST_REQUEST_TIMELINE, "
                                 "requests._FEEDER, wire.FAST_REQUEST)))"],
                                capture_output=True, text=True, env=env, cwd=tmp_path)
        assert native.stdout.strip() == "True", native.stderr

    # The image's command, with the chart's config: it prints its settings, then really runs.
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(_configmap_config())
    proc = subprocess.run([str(exe), "run", "--config", str(config), "--print-config",
                           "--state-dir", str(state)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["containers"] == ["*vllm*"] and printed["listen"] == "0.0.0.0:9464"
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
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    ready = r.status
                    break
            except OSError:
                time.sleep(0.1)
        assert ready == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            assert b"vllm_trace_bridge_files_watched 1.0" in r.read()
        agent.terminate()
        assert agent.wait(15) == 0, agent.stderr.read()
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
        ok = subprocess.run([sys.executable, script], capture_output=True, timeout=30,
                            env=dict(os.environ, VLLM_TRACE_BRIDGE_LISTEN=f"0.0.0.0:{server.server_port}"))
        assert ok.returncode == 0
    finally:
        server.shutdown()
    down = subprocess.run([sys.executable, script], capture_output=True, timeout=30,
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
    "config": {"namespaces": ["inference-*"], "containers": ["vllm", "engine"], "start_at": "end",
               "poll_interval": 0.5, "ttl": 300, "log_format": "console", "shutdown_grace": 20,
               "export_error_text": True},
    "otlp": {"endpoint": "https://otel-gateway.observability.svc:4317", "protocol": "grpc",
             "compression": "gzip", "headers": "authorization=Bearer abc,x-scope-orgid=gpu",
             "tls": {"secretName": "otlp-tls", "caKey": "ca.crt", "certKey": "tls.crt", "keyKey": "tls.key"}},
    "resourceAttributes": {"k8s.cluster.name": "prod-eu", "deployment.environment": "prod"},
    "stateDir": {"hostPath": "/var/lib/trace-bridge", "mountPath": "/state", "initChown": True},
    "metrics": {"port": 19464, "podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}}},
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

VALUE_SETS = {"default": None, "non-default": NON_DEFAULT}


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


# CRDs have no schema in kubernetes-validate; these checks stand in for it.
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
        if obj["kind"] == "PodMonitor":
            _check_podmonitor(obj, values)
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
    # GPU nodes: affinity on the NVIDIA label, toleration for the NVIDIA taint.
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
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
    # Identity from the downward API.
    env = {e["name"]: e for e in c["env"]}
    assert env["K8S_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
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
    assert config["state_dir"] == "/var/lib/vllm-trace-bridge" and config["listen"] == "0.0.0.0:9464"
    assert "PodMonitor" not in objs and "Secret" not in objs


# Keys of the agent's config file (the contract); the chart may set any of them, no others.
CONTRACT_KEYS = {"include", "exclude", "namespaces", "pods", "containers", "state_dir", "start_at",
                 "poll_interval", "timezone", "ttl", "otlp_endpoint", "otlp_protocol", "listen",
                 "max_queue_spans", "memory_limit_mb", "shutdown_grace", "log_format", "export_error_text"}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_configmap_holds_only_contract_keys(values):
    config = yaml.safe_load(_configmap_config(values))
    assert set(config) <= CONTRACT_KEYS
    assert config["memory_limit_mb"] < 512  # below the container's memory limit


def test_non_default_values_reach_the_pod():
    objs = _by_kind(_objects(NON_DEFAULT))
    pod = objs["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
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
    assert config["listen"] == "0.0.0.0:19464" and config["state_dir"] == "/state"
    assert config["start_at"] == "end" and config["namespaces"] == ["inference-*"]
    assert config["export_error_text"] is True
    assert pod["terminationGracePeriodSeconds"] == 25
    (init,) = pod["initContainers"]
    assert init["command"] == ["chown", "10001:0", "/state"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert objs["PodMonitor"]["metadata"]["labels"]["release"] == "kps"


def test_existing_secret_wins_over_inline_headers():
    objs = _by_kind(_objects({"otlp": {"headers": "a=b", "existingSecret": {"name": "mine", "key": "h"}}}))
    assert "Secret" not in objs
    env = {e["name"]: e for e in objs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "h"}


def test_config_change_rolls_the_pods():
    def checksum(values):
        return _by_kind(_objects(values))["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum(None) != checksum({"config": {"ttl": 30}})


BAD_VALUES = {
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


def test_demo_log_writer_writes_logs_the_bridge_reads(tmp_path):
    proc = subprocess.run([sys.executable, str(COMPOSE / "vllm-logs.py"), "--root", str(tmp_path),
                           "--batches", "1", "--requests", "12", "--no-pace"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    (log,) = tmp_path.glob("*_*_*/vllm/0.log")  # the kubelet's <ns>_<pod>_<uid>/<container>/N.log
    import io

    from bridge.cli import main

    out = io.StringIO()
    assert main(["replay", str(log), "--waterfalls", "0"], env={}, out=out) == 0
    text = out.getvalue()
    assert "requests     12 (" in text and " 0 malformed" in text
