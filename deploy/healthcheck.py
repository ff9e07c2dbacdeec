"""Container HEALTHCHECK: GET /healthz on the agent's self-telemetry port.

Docker and compose use this; Kubernetes ignores HEALTHCHECK and uses the chart's probes.
The address comes from VLLM_TRACE_BRIDGE_LISTEN (default [::]:9464), the same variable
the agent reads; a `listen` set only in the config file is not seen here.
"""

import os
import sys
import urllib.request

listen = os.environ.get("VLLM_TRACE_BRIDGE_LISTEN", "[::]:9464")
port = listen.rsplit(":", 1)[-1]
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as resp:
        sys.exit(0 if resp.status == 200 else 1)
except OSError as exc:
    print(f"healthcheck: {exc}", file=sys.stderr)
    sys.exit(1)
