"""Render the Helm chart offline, and write the plain manifests for `kubectl apply` users.

    python deploy/render.py            # rewrite deploy/kubernetes/vllm-trace-bridge.yaml
    python deploy/render.py --check    # exit 1 if that file differs from the chart's render

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
# Set the OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) and image before applying: see the README's
# "Deploy" section.
"""


def render(values: dict | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> list[tuple[str, str]]:
    """(template path, manifest text) for every non-empty rendered object, in install order."""
    import helm_python as helm
    import yaml

    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=values, name=name, namespace=namespace, is_install=True)
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


def plain_manifests() -> str:
    body = "\n".join(f"---\n# Source: {path}\n{part}" for path, part in render())
    return _HEADER.format(release=RELEASE, namespace=NAMESPACE) + body + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args(argv)
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
