"""Render the Helm chart offline, and write the plain manifests for `kubectl apply` users.

    python deploy/render.py            # rewrite deploy/kubernetes/vllm-trace-bridge.yaml
    python deploy/render.py --check    # exit 1 if that file differs from the chart's render
    python deploy/render.py --values my-values.yaml [--values more.yaml] > my-manifests.yaml
                                       # the chart with your values (as `helm template -f`),
                                       # on stdout; the chart's notes on stderr

Needs helm-python-sdk (Helm's Go SDK as a library; no helm binary). tests/test_deploy.py uses
the same functions, and fails when the committed file is not the chart's default render.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
CHART = DEPLOY / "helm" / "vllm-trace-bridge"
PLAIN = DEPLOY / "kubernetes" / "vllm-trace-bridge.yaml"
RELEASE = "vllm-trace-bridge"
NAMESPACE = "vllm-trace-bridge"

# Helm's own install order (kinds not listed go last), so `kubectl apply -f` creates what a
# pod references before the pod.
_ORDER = ["Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodDisruptionBudget",
          "ServiceAccount", "Secret", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Role",
          "RoleBinding", "Service", "DaemonSet", "Deployment", "StatefulSet"]

_HEADER = """\
# Generated from deploy/helm/vllm-trace-bridge with its default values
# (release "{release}", namespace "{namespace}") by `python deploy/render.py`.
# Do not edit: change the chart and re-run that command; tests/test_deploy.py checks this file.
# Set the OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) and image before applying (docs/deploy.md,
# plain manifests), or render your own values: python deploy/render.py --values FILE.
"""

_USER_HEADER = """\
# Generated from deploy/helm/vllm-trace-bridge with values from {files}
# (release "{release}", namespace "{namespace}") by `python deploy/render.py --values`.
"""


def load_values(paths: list[str]) -> dict:
    """The values of `-f` files as Helm merges them: each file parsed by Helm's own YAML reader,
    later files winning key by key in nested maps (a list or scalar is replaced whole)."""
    import helm_python as helm

    merged: dict = {}
    for path in paths:
        values = helm.values_from_yaml(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a values file holds a mapping, not a {type(values).__name__}")
        merged = _merge(merged, values)
    return merged


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _rendered(values: dict | None, name: str, namespace: str) -> dict[str, str]:
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=name, namespace=namespace, is_install=True)


def notes(values: dict | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> str:
    """What `helm install` would print after installing with these values (NOTES.txt)."""
    return next((text for path, text in _rendered(values, name, namespace).items()
                 if path.endswith("NOTES.txt")), "")


def render(values: dict | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> list[tuple[str, str]]:
    """(template path, manifest text) for every non-empty rendered object, in install order."""
    import yaml

    rendered = _rendered(values, name, namespace)
    docs: list[tuple[int, str, str, str]] = []
    for path, text in rendered.items():
        if not path.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        for part in text.split("\n---"):
            part = part.strip("\n")
            obj = yaml.safe_load(part)
            if not obj:
                continue
            kind = obj["kind"]
            rank = _ORDER.index(kind) if kind in _ORDER else len(_ORDER)
            docs.append((rank, obj["metadata"]["name"], path.split("/", 1)[1], part))
    docs.sort(key=lambda d: (d[0], d[1], d[2]))
    return [(path, part) for _, _, path, part in docs]


def plain_manifests(values: dict | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE,
                    header: str = _HEADER) -> str:
    body = "\n".join(f"---\n# Source: {path}\n{part}" for path, part in render(values, name=name,
                                                                                 namespace=namespace))
    return header.format(release=name, namespace=namespace) + body + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    p.add_argument("--values", "-f", action="append", metavar="FILE", default=[],
                   help="render with these values (repeatable; later files win) to stdout")
    p.add_argument("--release", default=RELEASE, help=f"release name with --values (default {RELEASE})")
    p.add_argument("--namespace", default=NAMESPACE, help=f"namespace with --values (default {NAMESPACE})")
    args = p.parse_args(argv)
    if args.values:
        import helm_python as helm

        try:
            values = load_values(args.values)
            text = plain_manifests(values, name=args.release, namespace=args.namespace,
                                   header=_USER_HEADER.replace("{files}", ", ".join(args.values)))
            sys.stdout.write(text)
            print(notes(values, name=args.release, namespace=args.namespace), file=sys.stderr)
        except (OSError, ValueError, helm.HelmError) as exc:
            print(f"render.py: {exc}", file=sys.stderr)
            return 1
        return 0
    text = plain_manifests()
    if args.check:
        if PLAIN.read_text() != text:
            print(f"{PLAIN} differs from the chart's default render: run python deploy/render.py",
                  file=sys.stderr)
            return 1
        return 0
    PLAIN.parent.mkdir(parents=True, exist_ok=True)
    PLAIN.write_text(text)
    print(f"wrote {PLAIN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
