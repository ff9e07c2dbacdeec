"""The resource attributes every exported span carries, before each source adds its own k8s
identity. Kept apart from the protobuf mapping (`otlp`) so that starting the agent does not
import the protobuf stubs the C encoder never needs."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

# What the SDK's OTELResourceDetector reads; with neither set it adds nothing.
_DETECTOR_ENV = ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME")


def base_resource(env: Mapping[str, str]) -> dict[str, str]:
    """Our defaults, overridden by `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` as the
    SDK's own detector reads them (so syntax and percent-decoding match every other
    OpenTelemetry component). The detector reads the process environment, as the SDK does;
    it is imported only when one of its variables is set there."""

    attrs: dict[str, str] = {"service.name": "vllm", "host.name": socket.gethostname()}
    node = env.get("K8S_NODE_NAME") or env.get("NODE_NAME")
    if node:
        attrs["k8s.node.name"] = node
    if any(os.environ.get(k) for k in _DETECTOR_ENV):
        from opentelemetry.sdk.resources import OTELResourceDetector

        attrs.update({k: str(v) for k, v in OTELResourceDetector().detect().attributes.items()})
    return attrs
