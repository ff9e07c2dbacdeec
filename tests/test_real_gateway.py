"""A real nginx in front of a real vLLM: vLLM's spans land in the client's trace, both ways.

The client makes spans with the OpenTelemetry SDK and sends the standard `traceparent` header.
nginx (Debian's package, started with docs/gateway/nginx.conf, the README's recipe) either puts
that traceparent into `X-Request-Id` (`/ctx/`), or sends its own plain `$request_id` and writes
both to its JSON access log (`/join/`), which the agent tails beside vLLM's log and joins.
"""

from __future__ import annotations

import os

import pytest
from agentkit import free_port
from nginx_gateway import Nginx, nginx_binary
from receivers import attrs
from test_real_vllm import run_scenario  # noqa: F401 - the session fixture comes with it
from test_real_vllm import vllm_install  # noqa: F401
from vllm_client import Client

pytestmark = pytest.mark.real_vllm


def test_real_vllm_behind_nginx_both_ways(tmp_path, vllm_install):  # noqa: F811
    if nginx_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed: .ci/run installs Debian's nginx")
        pytest.skip("nginx is not installed (apt-get install nginx)")
    gw_dir = str(tmp_path / "gateway")
    clients: dict[str, Client] = {}

    def gateway(server):
        return Nginx(gw_dir, free_port(), f"127.0.0.1:{server.port}").start()

    def driver(client: Client) -> None:
        base = f"http://{client.host}:{client.port}"
        ctx, join = clients["ctx"], clients["join"] = Client(base + "/ctx"), Client(base + "/join")
        for c in (ctx, join):
            c.traced("chat", form="header")
            c.traced("completion", form="header")
            c.traced("chat", stream=True, form="header")
            c.request("chat")  # no trace context at all
        client.sent = ctx.sent + join.sent

    run = run_scenario(tmp_path, vllm_install, gateway=gateway, driver=driver,
                       agent_args=("--gateway-include", os.path.join(gw_dir, "*.json"), "--join-window", "20"))
    roots = {}
    for s in run["spans"]:
        if s.name == "vllm.request":
            rid = attrs(s.attributes)["vllm.request.id"]
            assert rid not in roots, f"{rid} twice"
            roots[rid] = s
    for way, c in clients.items():
        for s in c.sent:
            assert s.status == 200, s
            root = roots[s.logged_id]
            a = attrs(root.attributes)
            if s.trace_id is not None:
                # Every vLLM root in the client's trace, under the client's span.
                assert (root.trace_id, root.parent_span_id) == (s.trace_id, s.span_id), (way, s.logged_id, a)
                assert a["vllm.trace_context"] == ("request_id" if way == "ctx" else "access_log"), a
            else:
                assert root.parent_span_id == b"", a
                if way == "join":  # nginx's 32-hex $request_id reads as a trace id: searchable by it
                    nginx_id = s.logged_id.split("-")[1]
                    assert root.trace_id == bytes.fromhex(nginx_id) and a["vllm.trace_context"] == "request_id"
            if way == "ctx" and s.trace_id is not None:  # nginx moved the traceparent into the id
                assert f"-00-{s.trace_id.hex()}-{s.span_id.hex()}-" in s.logged_id
            if way == "join":
                assert len(s.logged_id.split("-")[1]) == 32  # a plain nginx id, no context in it
    assert os.path.getsize(os.path.join(gw_dir, "access.json")) > 0
