"""Container HEALTHCHECK: GET /healthz on the agent's self-telemetry port.

Docker and compose use this; Kubernetes ignores HEALTHCHECK and uses the chart's probes.
The address comes from VLLM_TRACE_BRIDGE_LISTEN (default [::]:9464), the same variable
the agent reads; a `listen` set only in the config file is not seen here. A wildcard is
asked on the loopback; a single address (the pod's IP) there, since nothing else answers.
"""

import os
import sys
import urllib.request

listen = os.environ.get("VLLM_TRACE_BRIDGE_LISTEN", "[::]:9464")
host, _, port = listen.rpartition(":")
host = host.strip("[]")
host = "127.0.0.1" if host in ("", "::", "0.0.0.0") else f"[{host}]" if ":" in host else host
try:
    with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=3) as resp:
        sys.exit(0 if resp.status == 200 else 1)
except OSError as exc:
    print(f"healthcheck: {exc}", file=sys.stderr)
    sys.exit(1)
