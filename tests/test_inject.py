"""`vllm-trace-bridge inject` (bridge/inject.py, issue 32). Each kind's output validates against
Kubernetes' own schemas (kubernetes-validate, strict, oldest supported and newest version; the
pod specs inside CRDs are validated as the core PodSpec they are), and is wired as Kubernetes
reads it: the vLLM container's first PYTHONPATH entry is a mount of an emptyDir that an init
container fills by running `plugin install --target` there. That command is then run for real
and the tree it leaves is what vLLM's Python loads."""

from __future__ import annotations

import argparse
import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bridge import inject
from waits import deadline

ROOT = Path(__file__).resolve().parents[1]
KUBE_VERSIONS = ["1.28.0", "latest"]

_CONTAINER = """
      - name: {name}
        image: {image}
        {run}
        ports:
        - containerPort: 8000
"""


def _pod_template(name="server", image="vllm/vllm-openai:v0.32.0", run='args: ["--model", "m"]', extra=""):
    return f"""
    metadata:
      labels:
        app: llm
    spec:
      containers:{_CONTAINER.format(name=name, image=image, run=run)}{extra}"""


KINDS = {
    "Deployment": f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: llm
  namespace: ml
spec:
  selector:
    matchLabels:
      app: llm
  template:{_pod_template(extra='''      - name: metrics-sidecar
        image: nginx:1.27
''')}""",
    "StatefulSet": f"""apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: llm
spec:
  serviceName: llm
  selector:
    matchLabels:
      app: llm
  template:{_pod_template(image="registry.example/team/server:7", run='command: ["vllm", "serve", "m"]')}""",
    "DaemonSet": f"""apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: llm
spec:
  selector:
    matchLabels:
      app: llm
  template:{_pod_template(image="registry.example/team/server:7",
                          run='command: ["python3", "-m", "vllm.entrypoints.openai.api_server"]')}""",
    "Pod": """apiVersion: v1
kind: Pod
metadata:
  name: llm
spec:
  containers:
  - name: engine
    image: registry.example/team/server:7
    command: ["/bin/sh", "-c", "exec vllm serve m --port 8000"]
""",
    "Job": f"""apiVersion: batch/v1
kind: Job
metadata:
  name: bench
spec:
  template:{_pod_template()}
      restartPolicy: Never
""",
    "CronJob": f"""apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
spec:
  schedule: "0 1 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: x
            image: lmcache/vllm-openai:latest
""",
    "LeaderWorkerSet": """apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: llm
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    leaderTemplate:
      spec:
        containers:
        - name: leader
          image: vllm/vllm-openai:v0.32.0
          command: ["sh", "-c", "ray start --head && vllm serve m --tensor-parallel-size 2"]
    workerTemplate:
      spec:
        containers:
        - name: worker
          image: vllm/vllm-openai:v0.32.0
          command: ["sh", "-c", "ray start --address=$(LWS_LEADER_ADDRESS):6379 --block"]
""",
    "ServingRuntime": """apiVersion: serving.kserve.io/v1alpha1
kind: ServingRuntime
metadata:
  name: vllm-runtime
spec:
  supportedModelFormats:
  - name: huggingface
    autoSelect: true
  containers:
  - name: kserve-container
    image: vllm/vllm-openai:v0.32.0
    command: ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    args: ["--model", "/mnt/models"]
""",
    "InferenceService": """apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: llama
spec:
  predictor:
    model:
      modelFormat:
        name: huggingface
      runtime: my-runtime
      args: ["--max-model-len", "4096"]
    minReplicas: 1
""",
    "InferenceService-containers": """apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: custom
spec:
  predictor:
    containers:
    - name: kserve-container
      image: vllm/vllm-openai:v0.32.0
      args: ["--model", "m"]
""",
}
BUILT_IN = ("Deployment", "StatefulSet", "DaemonSet", "Pod", "Job", "CronJob")
CFG = inject.InjectConfig(image="registry.example/vllm-trace-bridge:0.1.0")
_MODEL_ONLY = {"modelFormat", "runtime", "protocolVersion", "storageUri", "storage"}
_PREDICTOR_ONLY = {"model", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency",
                   "timeout", "canaryTrafficPercent", "logger", "batcher", "workerSpec", "deploymentStrategy",
                   "autoScaling", "labels", "annotations"}


def _run(text: str, cfg=CFG) -> inject.InjectResult:
    return inject.inject_text(text, cfg, "test.yaml")


def _pod_specs(obj: dict) -> list[dict]:
    """Every pod spec an object holds, as the core PodSpec Kubernetes will build from it."""
    kind, spec = obj["kind"], obj["spec"]
    if kind == "Pod":
        return [spec]
    if kind == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    if kind == "LeaderWorkerSet":
        t = spec["leaderWorkerTemplate"]
        return [t[k]["spec"] for k in ("leaderTemplate", "workerTemplate") if k in t]
    if kind == "ServingRuntime":
        return [{k: v for k, v in spec.items() if k in ("containers", "volumes")}]
    if kind == "InferenceService":
        p = spec["predictor"]
        pod = {k: copy.deepcopy(v) for k, v in p.items() if k not in _PREDICTOR_ONLY}
        if "model" in p:
            model = {k: v for k, v in p["model"].items() if k not in _MODEL_ONLY}
            pod["containers"] = [{"name": "kserve-container", "image": "runtime-image", **model}]
        return [pod]
    return [spec["template"]["spec"]]


def _validate(obj: dict, version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.utils.latest_version()
    if obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Pod", "Job", "CronJob"}:
        kubernetes_validate.validate(obj, version, strict=True)
    else:  # a CRD: its pod specs are core PodSpecs
        for spec in _pod_specs(obj):
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                                          "spec": spec}, version, strict=True)


def _wired(spec: dict, container: dict, *, init_here: bool = True) -> None:
    """Read as Kubernetes would: where the container's PYTHONPATH starts is an emptyDir mount,
    and an init container runs `plugin install --target` on that same volume."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    env = {e["name"]: e for e in container.get("env", [])}  # a repeated name: the last wins
    first = env["PYTHONPATH"]["value"].split(":")[0]
    (mount,) = [m for m in container.get("volumeMounts", []) if m["mountPath"] == first]
    assert set(volumes[mount["name"]]) == {"name", "emptyDir"}
    if not init_here:
        return
    installers = []
    for init in spec.get("initContainers", []):
        cmd = init.get("command", []) + init.get("args", [])
        if cmd[-4:-1] == ["plugin", "install", "--target"]:
            (m,) = [m for m in init.get("volumeMounts", []) if m["mountPath"] == cmd[-1]]
            if m["name"] == mount["name"]:
                installers.append(init)
    assert len(installers) == 1, spec.get("initContainers")


def _vllm_containers(obj: dict) -> list[tuple[dict, dict]]:
    """(pod spec, container) that the fixtures mean as vLLM (they say so by name)."""
    names = {"server", "engine", "x", "leader", "worker", "kserve-container"}
    return [(s, c) for s in _pod_specs(obj) for c in s["containers"] if c["name"] in names]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_comes_out_valid_and_wired(kind):
    text = KINDS[kind]
    if kind == "InferenceService":  # its runtime, in the same input, is what shows it runs vLLM
        text = KINDS["ServingRuntime"].replace("vllm-runtime", "my-runtime") + "---\n" + text
    docs = [d for d in yaml.safe_load_all(text)]
    for version in KUBE_VERSIONS:
        for d in docs:
            _validate(d, version)  # the fixture itself is valid
    result = _run(text)
    out = list(yaml.safe_load_all(result.text))
    assert len(out) == len(docs)
    for version in KUBE_VERSIONS:
        for d in out:
            _validate(d, version)
    obj = out[-1]
    pairs = _vllm_containers(obj)
    assert pairs
    for spec, container in pairs:
        _wired(spec, container, init_here=obj["kind"] != "ServingRuntime")
    others = [c for s in _pod_specs(obj) for c in s["containers"] if (s, c) not in pairs]
    assert all("env" not in c and "volumeMounts" not in c for c in others)  # the sidecar is left alone
    assert result.injected


def test_a_serving_runtime_alone_says_its_inference_services_need_injecting():
    result = _run(KINDS["ServingRuntime"])
    (note,) = result.notes
    assert "ServingRuntime vllm-runtime" in note and "InferenceService" in note
    assert "initContainers" not in yaml.safe_load(result.text)["spec"]  # not in KServe's API


@pytest.mark.parametrize("kind", KINDS)
def test_injecting_twice_is_injecting_once(kind):
    once = _run(KINDS[kind], inject.InjectConfig(image="a/b:1", env=(("VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "1"),),
                                                 containers=("kserve-container",))).text
    twice = _run(once, inject.InjectConfig(image="a/b:1", env=(("VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "1"),),
                                           containers=("kserve-container",))).text
    assert twice == once


def test_an_existing_pythonpath_is_kept_after_the_plugin():
    text = KINDS["Pod"].replace("    command:", "    env:\n    - name: PYTHONPATH\n      value: /opt/a:/opt/b\n"
                                              "    - name: OTHER\n      value: x\n    command:")
    (c,) = yaml.safe_load(_run(text).text)["spec"]["containers"]
    assert c["env"][:2] == [{"name": "PYTHONPATH", "value": f"{inject.MOUNT}:/opt/a:/opt/b"},
                            {"name": "OTHER", "value": "x"}]


def test_a_pythonpath_an_envfrom_source_may_set_is_kept_through_kubernetes_expansion():
    text = KINDS["Pod"].replace("    command:", "    envFrom:\n    - configMapRef:\n        name: settings\n    command:")
    out = _run(text).text
    (c,) = yaml.safe_load(out)["spec"]["containers"]
    assert c["env"] == [{"name": "PYTHONPATH", "value": f"{inject.MOUNT}:$(PYTHONPATH)"}]
    assert _run(out).text == out
    for version in KUBE_VERSIONS:
        _validate(yaml.safe_load(out), version)


def test_settings_reach_each_vllm_container_and_a_new_image_replaces_the_old():
    first = _run(KINDS["LeaderWorkerSet"], inject.InjectConfig(image="a/b:1")).text
    again = yaml.safe_load(_run(first, inject.InjectConfig(
        image="a/b:2", env=(("VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "1"),), pull_policy="Always")).text)
    for spec in _pod_specs(again):
        (init,) = spec["initContainers"]
        assert init["image"] == "a/b:2" and init["imagePullPolicy"] == "Always"
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS"] == "1"
        assert len(spec["volumes"]) == 1 and len(spec["containers"][0]["volumeMounts"]) == 1


def test_documents_without_vllm_pass_through_byte_for_byte():
    text = ("# leading comment\n"
            "apiVersion: v1\nkind: Service   # trailing comment\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n"
            "---\n# a ConfigMap\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  k: 'quoted'\n"
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {a: b}}\n"
            "  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers:\n      - name: vllm\n"
            "        image: nginx:1.27\n"  # named vllm, runs nginx: not found by name
            "---\n")
    result = _run(text)
    assert result.text == text and result.injected == ()
    mixed = text + KINDS["Pod"]
    out = _run(mixed).text
    assert out.startswith(text) and out != mixed


@pytest.mark.parametrize("container, found", [
    ({"name": "a", "image": "vllm/vllm-openai:v0.32.0"}, True),
    ({"name": "a", "image": "ghcr.io/org/my-vllm-build@sha256:" + "0" * 64}, True),
    ({"name": "a", "image": "localhost:5000/x/server:1", "command": ["/opt/venv/bin/vllm", "serve", "m"]}, True),
    ({"name": "a", "image": "x/server", "args": ["python", "-m", "vllm.entrypoints.openai.api_server"]}, True),
    ({"name": "a", "image": "kserve/huggingfaceserver:v0.15", "args": ["--backend=vllm"]}, True),
    ({"name": "vllm", "image": "nginx:1.27"}, False),
    ({"name": "a", "image": "registry.example/vllm-trace-bridge:0.1.0", "args": ["run"]}, False),
    ({"name": "a", "image": "registry.vllm.example:5000/team/server:1"}, False),  # the registry is not the image
    ({"name": "router", "image": "ghcr.io/vllm-project/production-stack/router:v1"}, False),  # nor the org
    ({"name": "a", "image": "x/server", "command": ["vllm-trace-bridge", "run"]}, False),
])
def test_a_vllm_container_is_found_by_what_it_runs(container, found):
    assert inject.is_vllm(container) is found


def test_container_names_the_user_gives_are_injected_whatever_they_run():
    text = KINDS["Pod"].replace("registry.example/team/server:7", "team/engine:1").replace(
        '["/bin/sh", "-c", "exec vllm serve m --port 8000"]', '["/entrypoint.sh"]')
    assert _run(text).injected == ()
    cfg = inject.InjectConfig(containers=("engine",))
    (c,) = yaml.safe_load(_run(text, cfg).text)["spec"]["containers"]
    _wired(yaml.safe_load(_run(text, cfg).text)["spec"], c)


def test_a_list_from_kubectl_get_is_injected_item_by_item():
    items = [yaml.safe_load(KINDS["Pod"]), {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}]
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    out = yaml.safe_load(_run(text).text)
    spec = out["items"][0]["spec"]
    _wired(spec, spec["containers"][0])
    assert out["items"][1] == items[1]


@pytest.mark.parametrize("change, says", [
    (lambda t: t.replace("    command:", "    env:\n    - name: PYTHONPATH\n      valueFrom:\n        configMapKeyRef:\n"
                                       "          name: c\n          key: k\n    command:"),
     "test.yaml: document 1 (Pod llm): spec.containers[0].env[0]: PYTHONPATH comes from valueFrom"),
    (lambda t: t.replace("    command:", "    volumeMounts:\n    - name: mine\n      mountPath: /vllm-trace-bridge-plugin\n"
                                       "    command:"),
     "spec.containers[0].volumeMounts[0]: volume 'mine' is already mounted at /vllm-trace-bridge-plugin"),
    (lambda t: t + "  volumes:\n  - name: vllm-trace-bridge-plugin\n    hostPath:\n      path: /x\n",
     "spec.volumes[0]: a volume named vllm-trace-bridge-plugin that is not an emptyDir"),
    (lambda t: t.replace("spec:\n  containers:", "spec:\n  containers: oops\n  x:"),
     "document 1 (Pod llm): spec.containers: expected a list of mappings"),
    (lambda t: "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n" + t.replace("spec:\n", "spec: 3\nx:\n", 1),
     "document 2 (Pod llm): spec: expected a mapping"),
    (lambda t: t + "  - [unclosed\n", "test.yaml: not valid YAML"),
])
def test_yaml_it_cannot_change_is_refused_naming_document_and_field(change, says):
    with pytest.raises(inject.InjectError) as err:
        _run(change(KINDS["Pod"]))
    assert says in str(err.value)


def test_an_alias_bomb_is_refused_before_it_expands():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    with pytest.raises(inject.InjectError, match="more than 100 YAML aliases"):
        _run("\n".join(lines) + "\n")
    # a few anchors, as hand-written manifests use them, are fine
    few = KINDS["Pod"].replace("  containers:", "  containers: &c").rstrip("\n") + "\n---\n" + \
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: v}\n"
    assert _run(few).injected
    # under the limit, a subtree shared 10^9 times over (90 aliases) is never expanded, compared or
    # printed: not in a document passed through, nor in one injected (written back with anchors)
    shared = "\n".join(["  x0: &x0 [a, b, c, d, e, f, g, h, i, j]"]
                       + [f"  x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 10) + "]" for i in range(1, 10)])
    pod = KINDS["Pod"].replace("kind: Pod\n", "kind: Pod\nx-shared:\n" + shared + "\n").replace(
        "metadata:\n  name: llm\n", "metadata:\n  name: llm\n  labels: *x9\n").replace(
        '["/bin/sh", "-c", "exec vllm serve m --port 8000"]', '["vllm", "serve", *x9]')
    result = _run("junk:\n" + shared + "\n---\n" + pod)
    assert result.injected and result.text.startswith("junk:\n") and len(result.text) < 10_000
    assert len(list(yaml.safe_load_all(result.text))) == 2  # anchors and aliases, as they came


def _cli(*argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", "inject", *argv], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=deadline(120))


def test_the_command_reads_stdin_writes_stdout_and_says_what_it_did():
    proc = _cli("--image", "r/vtb:1", "--plugin-blocks", "--plugin-queue-interval", "2",
                "--set-env", "VLLM_PLUGINS=vllm_trace_bridge", stdin=KINDS["Deployment"])
    assert proc.returncode == 0, proc.stderr
    spec = yaml.safe_load(proc.stdout)["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env == {"PYTHONPATH": inject.MOUNT, "VLLM_PLUGINS": "vllm_trace_bridge",
                   "VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS": "1", "VLLM_TRACE_BRIDGE_PLUGIN_QUEUE_INTERVAL_S": "2"}
    assert spec["initContainers"][0]["image"] == "r/vtb:1"
    assert "injected: <stdin>: document 1 (Deployment ml/llm): spec.template.spec.containers[0] (server)" in proc.stderr


@pytest.mark.parametrize("argv, stdin, says", [
    (["--set-env", "PYTHONPATH=/x"], "", "inject sets PYTHONPATH itself"),
    (["--set-env", "novalue"], "", "give KEY=VALUE"),
    (["missing.yaml"], "", "missing.yaml: No such file or directory"),
    ([], "a: [\n", "<stdin>: not valid YAML"),
    ([], "x" * (inject.MAX_INPUT_BYTES + 1), "more than 8 MiB"),
])
def test_the_command_refuses_with_exit_2_and_writes_nothing(argv, stdin, says):
    proc = _cli(*argv, stdin=stdin)
    assert proc.returncode == 2 and proc.stdout == "" and says in proc.stderr, proc.stderr


def test_the_init_containers_command_run_for_real_gives_what_vllm_loads(tmp_path):
    """The command inject writes, run as written (the image's `vllm-trace-bridge` being this
    checkout), into a directory standing for the emptyDir; then vLLM's Python reads it."""
    spec = yaml.safe_load(_run(KINDS["Pod"]).text)["spec"]
    (init,) = spec["initContainers"]
    argv = init["command"] + init.get("args", [])
    assert argv[0] == "vllm-trace-bridge"
    target = tmp_path / argv[-1].lstrip("/")
    argv = [sys.executable, "-m", "bridge", *argv[1:-1], str(target)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=deadline(120))
    assert proc.returncode == 0, proc.stderr
    from tests.test_plugin_dist import VLLM_PYTHON, installed_plugin_in_vllm
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON.parent.parent}")
    seen = installed_plugin_in_vllm(target)
    assert seen["wrapped"] and seen["module"].startswith(str(target))


def test_the_parser_takes_the_documented_flags():
    p = argparse.ArgumentParser()
    inject.add_arguments(p)
    args = p.parse_args(["f.yaml", "--container", "a", "--container", "b", "--set-env", "K=1", "--set-env", "K=2"])
    cfg = inject.config_from_args(args)
    assert cfg.containers == ("a", "b") and cfg.env == (("K", "2"),)


def _doc_yaml_blocks(heading: str) -> list:
    text = (ROOT / "docs" / "plugin.md").read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text[start:end], re.S)]


def test_the_chart_recipes_in_the_docs_wire_what_inject_wires():
    """docs/plugin.md's values for the production-stack and llm-d charts say what inject writes:
    the same init command, volume, mount and PYTHONPATH. (The charts are not here to render; done
    by hand with each chart's source, both gave a Deployment that passes `_wired` and strict
    kubernetes-validate.)"""
    init = inject._init_container(CFG)
    (ps,) = _doc_yaml_blocks("### vLLM production-stack")
    (model,) = ps["servingEngineSpec"]["modelSpec"]
    assert model["initContainer"]["command"] == init["command"]
    assert model["initContainer"]["extraVolumeMounts"] == [{"name": inject.VOLUME, "mountPath": inject.MOUNT}]
    assert model["initContainer"]["mountPvcStorage"] is False
    assert model["extraVolumes"] == [{"name": inject.VOLUME, "emptyDir": {}}]
    assert model["extraVolumeMounts"] == [{"name": inject.VOLUME, "mountPath": inject.MOUNT, "readOnly": True}]
    assert model["env"] == [{"name": "PYTHONPATH", "value": inject.MOUNT}]
    (llmd,) = _doc_yaml_blocks("### llm-d")
    decode = llmd["decode"]
    (i,) = decode["initContainers"]
    assert i["command"] == init["command"] and i["volumeMounts"] == [{"name": inject.VOLUME, "mountPath": inject.MOUNT}]
    (c,) = decode["containers"]
    _wired({"volumes": decode["volumes"], "initContainers": decode["initContainers"]}, c)
