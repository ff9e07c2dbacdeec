"""`vllm-trace-bridge inject`: Kubernetes YAML in, the same YAML out with the vLLM plugin added
to every vLLM container, as `linkerd inject` does for its proxy. No image rebuild: an init
container from the agent's image runs `vllm-trace-bridge plugin install --target` into an
`emptyDir`, which the vLLM container mounts and puts first on its `PYTHONPATH`; vLLM then finds
the plugin's entry point there (importlib.metadata reads every .dist-info on sys.path).

A vLLM container is found by what it runs, never by its name (charts name it anything):
`vllm serve` or `vllm.entrypoints.…` in its command or args, or an image whose own name (the
repository's last part) names vLLM (`vllm/vllm-openai`, `*vllm*`), the agent's own image excepted. `--container NAME` adds
containers no rule can recognise (an image's default command, KServe's huggingfaceserver).

Output rules: a document with no vLLM container comes out byte for byte as it came in; an
injected one is re-written (its comments are lost, like `kubectl`'s); injecting twice gives what
injecting once gave. The YAML is read with the safe loader, at most `MAX_INPUT_BYTES`, and a
document with more than `MAX_ALIASES` aliases is refused (an alias bomb expands exponentially).
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from typing import TextIO

from bridge import __version__

MOUNT = "/vllm-trace-bridge-plugin"
VOLUME = "vllm-trace-bridge-plugin"
INIT_NAME = "vllm-trace-bridge-plugin"
DEFAULT_IMAGE = f"vllm-trace-bridge:{__version__}"  # the chart's default: deploy/helm/…/values.yaml
MAX_INPUT_BYTES = 8 * 1024 * 1024
MAX_ALIASES = 100
_TEMPLATE_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController")
_KSERVE_RUNTIMES = ("ServingRuntime", "ClusterServingRuntime")
_SERVE = re.compile(r"(?:^|[\s/'\"])vllm\s+serve\b|\bvllm\.entrypoints\.|--backend[= ]vllm\b")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


class InjectError(Exception):
    """YAML inject cannot change safely; the message names the document, the field and the fix."""


@dataclass(frozen=True)
class InjectConfig:
    image: str = DEFAULT_IMAGE
    env: tuple[tuple[str, str], ...] = ()       # plugin settings, set on each vLLM container
    containers: tuple[str, ...] = ()            # names to inject whatever they run
    pull_policy: str | None = None


@dataclass(frozen=True)
class InjectResult:
    text: str
    injected: tuple[str, ...]   # "<document>: <field>" of each vLLM container given the plugin
    notes: tuple[str, ...]      # what the user must still do (KServe runtimes)


# --- reading ------------------------------------------------------------------------------

class _TooManyAliases(Exception):
    pass


@functools.lru_cache(maxsize=1)
def _yaml():
    """PyYAML with the safe loader counting aliases per document, and a dumper writing multi-line
    strings as blocks; imported on use (30 ms), not when the command line is built."""
    import yaml

    class Loader(yaml.SafeLoader):
        aliases = 0

        def compose_document(self):
            self.aliases = 0
            return super().compose_document()

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise _TooManyAliases
            return super().compose_node(parent, index)

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml, Loader, Dumper


def _documents(text: str, source: str) -> tuple[str, list[tuple[str, object]]]:
    """(text before the first document, [(each document's own text, its data)]): a document's text
    runs from its start to the next one's, so an untouched document is written back as it was."""
    yaml, loader_cls, _ = _yaml()
    loader = loader_cls(text)
    starts: list[int] = []
    data: list[object] = []
    try:
        while loader.check_node():
            starts.append(loader.peek_event().start_mark.index)
            node = loader.get_node()
            data.append(None if node is None else loader.construct_document(node))
    except _TooManyAliases:
        raise InjectError(f"{source}: document {len(starts)} has more than {MAX_ALIASES} YAML aliases; refused "
                          "(an alias bomb); write it out without anchors") from None
    except RecursionError:
        raise InjectError(f"{source}: document {len(starts)} is nested too deeply to be Kubernetes YAML") from None
    except yaml.YAMLError as exc:
        raise InjectError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    bounds = starts + [len(text)]
    return text[:starts[0]] if starts else text, [(text[bounds[i]:bounds[i + 1]], d) for i, d in enumerate(data)]


def _dump(data) -> str:
    yaml, _, dumper = _yaml()
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=1 << 30)


# --- finding --------------------------------------------------------------------------------

def _text(value) -> str:
    """A name for messages; never the str() of a structure (an aliased one can be huge)."""
    return value if isinstance(value, str) else f"<{type(value).__name__}>"


def _repository(image: str) -> str:
    """`ghcr.io/org/vllm-openai:v1@sha256:…` → `org/vllm-openai` (registry, tag, digest dropped)."""
    image = image.split("@", 1)[0]
    slash = image.rfind("/")
    if ":" in image[slash + 1:]:
        image = image[:image.rfind(":")]
    first, _, rest = image.partition("/")
    return rest if rest and ("." in first or ":" in first or first == "localhost") else image


def is_vllm(container: dict, forced: tuple[str, ...] = ()) -> bool:
    """A vLLM server container, by what it runs (command, args, image), or named in `forced`."""
    name = container.get("name")
    if name == INIT_NAME:
        return False
    if name in forced:
        return True
    image = container.get("image")
    repo = _repository(image if isinstance(image, str) else "").lower()
    if "vllm-trace-bridge" in repo:
        return False
    words = [w for key in ("command", "args") if isinstance(container.get(key), list)
             for w in container[key] if isinstance(w, str)]
    if _SERVE.search(" ".join(words)):
        return True
    return "vllm" in repo.rsplit("/", 1)[-1]  # the image's own name: `vllm-project/…/router` is no vLLM


class _Doc:
    """One document being injected: where errors point, and what was done."""

    def __init__(self, number: int, data: dict, source: str) -> None:
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        ident = "/".join(x for x in (meta.get("namespace"), meta.get("name")) if isinstance(x, str) and x)
        self.label = f"{source}: document {number} ({_text(data.get('kind'))}{' ' + ident if ident else ''})"
        self.injected: list[str] = []
        self.notes: list[str] = []
        self.changed = False  # tracked, not found by comparing: a document may share subtrees (aliases)

    def error(self, field: str, problem: str) -> InjectError:
        return InjectError(f"{self.label}: {field}: {problem}")

    def mapping(self, parent: dict, key: str, where: str, *, create: bool = False):
        value = parent.get(key)
        if value is None:
            if not create:
                return None
            value = parent[key] = {}
        if not isinstance(value, dict):
            raise self.error(f"{where}.{key}" if where else key, f"expected a mapping, found {type(value).__name__}")
        return value

    def seq(self, parent: dict, key: str, where: str, *, create: bool = False):
        value = parent.get(key)
        if value is None:
            if not create:
                return None
            value = parent[key] = []
        if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
            raise self.error(f"{where}.{key}", "expected a list of mappings")
        return value


# --- changing -------------------------------------------------------------------------------

def _init_container(cfg: InjectConfig) -> dict:
    c = {"name": INIT_NAME, "image": cfg.image}
    if cfg.pull_policy:
        c["imagePullPolicy"] = cfg.pull_policy
    c.update({
        "command": ["vllm-trace-bridge", "plugin", "install", "--target", MOUNT],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
    })
    return c


def _upsert(items: list, name: str, value: dict) -> bool:
    """Replace the item of that name, or add it at the end; True when that changed the list."""
    for i, item in enumerate(items):
        if item.get("name") == name:
            if item == value:
                return False
            items[i] = value
            return True
    items.append(value)
    return True


def _container(c: dict, doc: _Doc, where: str, cfg: InjectConfig) -> None:
    mounts = doc.seq(c, "volumeMounts", where, create=True)
    for i, m in enumerate(mounts):
        if m.get("mountPath") == MOUNT and m.get("name") != VOLUME:
            raise doc.error(f"{where}.volumeMounts[{i}]", f"volume {m.get('name')!r} is already mounted at {MOUNT}")
    doc.changed |= _upsert(mounts, VOLUME, {"name": VOLUME, "mountPath": MOUNT, "readOnly": True})
    env = doc.seq(c, "env", where, create=True)
    paths = [i for i, e in enumerate(env) if e.get("name") == "PYTHONPATH"]
    if not paths:
        # An `envFrom` source may set PYTHONPATH, which this entry would replace: Kubernetes
        # expands `$(PYTHONPATH)` from it (and leaves the text as it is when none does, a path
        # entry Python skips).
        value = f"{MOUNT}:$(PYTHONPATH)" if c.get("envFrom") else MOUNT
        env.append({"name": "PYTHONPATH", "value": value})
        doc.changed = True
    else:
        i = paths[-1]  # the last one wins in Kubernetes
        e = env[i]
        if "value" not in e and e.get("valueFrom") is not None:
            raise doc.error(f"{where}.env[{i}]", f"PYTHONPATH comes from valueFrom, which inject cannot extend; set "
                                                f"it as a value, or put {MOUNT} first in it yourself")
        old = "" if e.get("value") is None else e["value"]
        if not isinstance(old, str):
            raise doc.error(f"{where}.env[{i}].value", "expected a string")
        if MOUNT not in old.split(":"):
            e["value"] = f"{MOUNT}:{old}" if old else MOUNT
            doc.changed = True
    for name, value in cfg.env:
        doc.changed |= _upsert(env, name, {"name": name, "value": value})
    doc.injected.append(f"{doc.label}: {where} ({_text(c.get('name'))})")


def _volume(volumes: list, doc: _Doc, where: str) -> None:
    for i, v in enumerate(volumes):
        if v.get("name") == VOLUME and set(v) - {"name", "emptyDir"}:
            raise doc.error(f"{where}.volumes[{i}]", f"a volume named {VOLUME} that is not an emptyDir; rename it")
    doc.changed |= _upsert(volumes, VOLUME, {"name": VOLUME, "emptyDir": {"sizeLimit": "16Mi"}})


def _pod_spec(spec: dict, doc: _Doc, where: str, cfg: InjectConfig, *, init: bool = True,
              extra: tuple[tuple[dict, str], ...] = ()) -> bool:
    """Inject the vLLM containers of one pod spec (plus `extra` containers already judged vLLM);
    True when there was one."""
    containers = doc.seq(spec, "containers", where) or []
    targets = [(c, f"{where}.containers[{i}]") for i, c in enumerate(containers) if is_vllm(c, cfg.containers)]
    targets += list(extra)
    if not targets:
        return False
    for c, path in targets:
        _container(c, doc, path, cfg)
    _volume(doc.seq(spec, "volumes", where, create=True), doc, where)
    if init:
        doc.changed |= _upsert(doc.seq(spec, "initContainers", where, create=True), INIT_NAME, _init_container(cfg))
    return True


def _walk(path: str, data: dict, doc: _Doc) -> dict | None:
    node, where = data, ""
    for key in path.split("."):
        node = doc.mapping(node, key, where.lstrip("."))
        where += "." + key
        if node is None:
            return None
    return node


def _inject_doc(data: dict, doc: _Doc, cfg: InjectConfig, runtimes: set[str]) -> None:
    kind = data.get("kind")
    specs: list[str] = []
    if kind == "Pod":
        specs = ["spec"]
    elif kind in _TEMPLATE_KINDS:
        specs = ["spec.template.spec"]
    elif kind == "CronJob":
        specs = ["spec.jobTemplate.spec.template.spec"]
    elif kind == "LeaderWorkerSet":
        specs = ["spec.leaderWorkerTemplate.leaderTemplate.spec", "spec.leaderWorkerTemplate.workerTemplate.spec"]
    elif kind in _KSERVE_RUNTIMES:
        found = False
        for path in ("spec", "spec.workers"):
            spec = _walk(path, data, doc)
            if spec is not None and _pod_spec(spec, doc, path, cfg, init=False):
                found = True
        if found:
            doc.notes.append(f"{doc.label}: KServe runtimes have no init containers; inject each InferenceService "
                             "that uses this runtime too (its predictor gets the init container), or the plugin's "
                             "directory stays empty and vLLM runs without it")
        return
    elif kind == "InferenceService":
        _inject_isvc(data, doc, cfg, runtimes)
        return
    for path in specs:
        spec = _walk(path, data, doc)
        if spec is not None:
            _pod_spec(spec, doc, path, cfg)


def _inject_isvc(data: dict, doc: _Doc, cfg: InjectConfig, runtimes: set[str]) -> None:
    """KServe's predictor is a pod spec whose `model` is the runtime's `kserve-container`, merged
    by KServe with the runtime's own: the init container and volume go on the predictor."""
    predictor = _walk("spec.predictor", data, doc)
    if predictor is None:
        return
    extra = ()
    model = doc.mapping(predictor, "model", "spec.predictor")
    if model is not None:
        runtime = model.get("runtime") if isinstance(model.get("runtime"), str) else ""
        if is_vllm({"name": "kserve-container", **model}, cfg.containers) or runtime in runtimes \
                or "vllm" in runtime.lower():
            extra = ((model, "spec.predictor.model"),)
    _pod_spec(predictor, doc, "spec.predictor", cfg, extra=extra)
    worker = doc.mapping(predictor, "workerSpec", "spec.predictor")
    if worker is not None:
        _pod_spec(worker, doc, "spec.predictor.workerSpec", cfg)


def _vllm_runtimes(docs: list[tuple[str, object]], cfg: InjectConfig) -> set[str]:
    """Names of the KServe runtimes in the input that run vLLM: an InferenceService naming one
    gets the plugin's init container even when its own fields don't show vLLM."""
    names = set()
    for _, data in docs:
        if isinstance(data, dict) and data.get("kind") in _KSERVE_RUNTIMES:
            spec = data.get("spec") if isinstance(data.get("spec"), dict) else {}
            containers = spec.get("containers") if isinstance(spec.get("containers"), list) else []
            meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
            if any(isinstance(c, dict) and is_vllm(c, cfg.containers) for c in containers) \
                    and isinstance(meta.get("name"), str):
                names.add(meta["name"])
    return names


def inject_text(text: str, cfg: InjectConfig, source: str = "<stdin>") -> InjectResult:
    """The input with the plugin added; the rest of the text untouched."""
    preamble, docs = _documents(text, source)
    runtimes = _vllm_runtimes(docs, cfg)
    out = [preamble]
    injected: list[str] = []
    notes: list[str] = []
    for number, (original, data) in enumerate(docs, 1):
        objects = data.get("items") if isinstance(data, dict) and data.get("kind") == "List" else [data]
        if not isinstance(objects, list):
            objects = []
        changed = False
        for item_number, item in enumerate(objects):
            if isinstance(item, dict) and isinstance(item.get("kind"), str):
                doc = _Doc(number, item, source)
                if item is not data:
                    doc.label += f" items[{item_number}]"
                _inject_doc(item, doc, cfg, runtimes)
                injected += doc.injected
                notes += doc.notes
                changed |= doc.changed
        if not changed:
            out.append(original)
            continue
        if out[-1] and not out[-1].endswith("\n"):
            out.append("\n")
        explicit = original.startswith("---")
        out.append(("---\n" if explicit or number > 1 else "") + _dump(data))
    return InjectResult("".join(out), tuple(injected), tuple(notes))


# --- command ------------------------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument("file", nargs="?", default="-", metavar="FILE",
                   help="Kubernetes YAML, several documents allowed (default: -, standard input)")
    p.add_argument("--image", default=DEFAULT_IMAGE, metavar="IMAGE",
                   help=f"the agent's image, for the init container (default: {DEFAULT_IMAGE})")
    p.add_argument("--image-pull-policy", choices=("Always", "IfNotPresent", "Never"),
                   help="the init container's imagePullPolicy (default: the cluster's)")
    p.add_argument("--container", action="append", default=[], metavar="NAME",
                   help="also inject the container of this name, whatever it runs (KServe's predictor.model is "
                        "kserve-container)")
    p.add_argument("--set-env", action="append", default=[], metavar="KEY=VALUE",
                   help="set this variable on each vLLM container (e.g. a VLLM_TRACE_BRIDGE_PLUGIN_* setting)")
    p.add_argument("--plugin-blocks", action="store_true",
                   help="the plugin writes a line per KV block given or freed (VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS=1)")
    p.add_argument("--plugin-queue-interval", type=float, metavar="SECONDS",
                   help="at most one queue-state line per interval (VLLM_TRACE_BRIDGE_PLUGIN_QUEUE_INTERVAL_S)")


def config_from_args(args) -> InjectConfig:
    env: list[tuple[str, str]] = []
    for item in args.set_env:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise InjectError(f"--set-env {item}: give KEY=VALUE, KEY a variable name")
        if name == "PYTHONPATH":
            raise InjectError("--set-env PYTHONPATH: inject sets PYTHONPATH itself (keeping an existing value); "
                              "set yours in the YAML")
        env.append((name, value))
    if args.plugin_blocks:
        env.append(("VLLM_TRACE_BRIDGE_PLUGIN_BLOCKS", "1"))
    if args.plugin_queue_interval is not None:
        if not args.plugin_queue_interval > 0:
            raise InjectError(f"--plugin-queue-interval {args.plugin_queue_interval:g}: give seconds greater than 0")
        env.append(("VLLM_TRACE_BRIDGE_PLUGIN_QUEUE_INTERVAL_S", f"{args.plugin_queue_interval:g}"))
    if not args.image or any(ch.isspace() for ch in args.image):
        raise InjectError(f"--image {args.image!r}: give an image reference such as registry.example/vllm-trace-bridge:"
                          f"{__version__}")
    last = dict(env)  # a name given twice: the last value, once
    return InjectConfig(image=args.image, env=tuple(last.items()), containers=tuple(args.container),
                        pull_policy=args.image_pull_policy)


def read_input(path: str, stdin: TextIO) -> tuple[str, str]:
    """(text, name for messages), at most MAX_INPUT_BYTES."""
    try:
        if path == "-":
            raw = stdin.buffer.read(MAX_INPUT_BYTES + 1) if hasattr(stdin, "buffer") else \
                stdin.read(MAX_INPUT_BYTES + 1).encode()
            name = "<stdin>"
        else:
            with open(path, "rb") as f:
                raw = f.read(MAX_INPUT_BYTES + 1)
            name = path
    except OSError as exc:
        raise InjectError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise InjectError(f"{name}: more than {MAX_INPUT_BYTES // (1024 * 1024)} MiB of YAML; inject fewer objects "
                          "at a time")
    try:
        return raw.decode("utf-8-sig"), name
    except UnicodeDecodeError as exc:
        raise InjectError(f"{name}: not UTF-8 text (byte {exc.start})") from None


def inject_command(args, out: TextIO, stdin: TextIO = sys.stdin, err: TextIO = sys.stderr) -> None:
    cfg = config_from_args(args)
    text, name = read_input(args.file, stdin)
    result = inject_text(text, cfg, name)
    out.write(result.text)
    for line in result.injected:
        err.write(f"injected: {line}\n")
    for line in result.notes:
        err.write(f"note: {line}\n")
    if not result.injected:
        err.write(f"note: {name}: no vLLM container found (by command, args or image); nothing changed. "
                  "Name one with --container NAME\n")
