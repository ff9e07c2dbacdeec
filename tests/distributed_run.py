"""Real distributed vLLM runs with the plugin, and the client's own record of them (the truth the
fast suite's distributed tests read): a NIXL prefill/decode pair behind tests/pd_proxy.py, and
a data-parallel (DP=2) server.

NIXL comes from an overlay directory beside the shared vLLM venv (`nixl` + `nixl-cu12` wheels,
which need no GPU; installed with `pip install --no-deps --target`, never into the venv): see
`nixl_overlay()`. `kv_buffer_device: cpu` makes the NIXL connector stage the KV through host
memory, what vLLM's CPU build supports.

`python tests/distributed_run.py OUTDIR` records both runs into OUTDIR (the fixtures under
tests/fixtures/distributed/ were made so, under `flock /tmp/vllm.lock`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "plugin"))
from pd_proxy import PdProxy  # noqa: E402
from vllm_proc import VENV, Vllm, free_port  # noqa: E402
from waits import deadline  # noqa: E402

OVERLAY = Path(os.environ.get("VLLM_NIXL_OVERLAY", VENV.parent / "nixl-overlay"))
PROMPT_WORDS = "the quick brown fox jumps over the lazy dog one two three four five six seven".split()


def nixl_overlay() -> str | None:
    """The directory that gives vLLM `nixl`, or None. `pip install --no-deps --target` keeps the
    wheels' torch pin out of it (a second torch on PYTHONPATH would shadow vLLM's)."""
    return str(OVERLAY) if (OVERLAY / "nixl").is_dir() and (OVERLAY / "nixl_cu12").is_dir() else None


def _prompt(i: int) -> str:
    n = 24 + 16 * (i % 4)  # several block counts (16 tokens a block)
    return " ".join(PROMPT_WORDS[(i + k) % len(PROMPT_WORDS)] for k in range(n))


def _kv_config(engine_id: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu",
                       "engine_id": engine_id})


def _client(base: str, model: str, ids: list[str], max_tokens: list[int],
            traceparents: dict[str, str] | None = None) -> list[dict]:
    """Sequential completions through `base`; the client's record of each (`traceparents`: the
    W3C header sent with the request of that X-Request-Id, recorded as sent)."""
    import urllib.error
    import urllib.request

    out = []
    for i, (xid, mt) in enumerate(zip(ids, max_tokens)):
        prompt = _prompt(i)
        body = {"model": model, "prompt": prompt, "max_tokens": mt, "ignore_eos": True, "temperature": 0}
        headers = {"Content-Type": "application/json", "X-Request-Id": xid}
        tp = (traceparents or {}).get(xid)
        if tp:
            headers["traceparent"] = tp
        req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(), headers=headers)
        sent = time.time()
        try:
            with urllib.request.urlopen(req, timeout=deadline(600)) as r:
                status, resp = r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            status, resp = e.code, {}
        got = time.time()
        usage = resp.get("usage") or {}
        out.append({"x_request_id": xid, "status": status, "response_id": resp.get("id"), "max_tokens": mt,
                    "prompt_words": len(prompt.split()),
                    "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
                    "sent": round(sent, 6), "received": round(got, 6), "traceparent": tp})
    return out


def _finished_per_engine(base: str) -> dict[str, int]:
    """`vllm:request_success_total{engine="<n>",…}` summed per engine, from /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=deadline(30)) as r:
        text = r.read().decode()
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            labels, _, value = line.rpartition(" ")
            engine = labels.split('engine="', 1)[1].split('"', 1)[0] if 'engine="' in labels else "?"
            out[engine] = out.get(engine, 0) + int(float(value))
    return out


def run_pd(outdir: Path, n: int = 4) -> dict:
    """A NIXL prefill/decode pair with the plugin behind the proxy; `n` sequential requests.
    Writes prefill.log, decode.log (CRI-framed, as the kubelet would) and pd_truth.json."""
    overlay = nixl_overlay()
    if overlay is None:
        raise RuntimeError(f"no nixl overlay at {OVERLAY}")
    outdir.mkdir(parents=True, exist_ok=True)
    common = ("--max-num-seqs", "4")
    env_p = {"PYTHONPATH": overlay, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
             "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    env_d = {**env_p, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    ids = [f"pd-{i:03d}" for i in range(n)]
    max_tokens = [4 + 3 * i for i in range(n)]
    with Vllm(outdir / "prefill.log", extra_env=env_p,
              extra_args=(*common, "--kv-transfer-config", _kv_config("prefill-engine-0"))) as p, \
            Vllm(outdir / "decode.log", extra_env=env_d,
                 extra_args=(*common, "--kv-transfer-config", _kv_config("decode-engine-0"))) as d, \
            PdProxy(f"http://127.0.0.1:{p.port}", f"http://127.0.0.1:{d.port}", deadline(600)) as proxy:
        # NIXL's first decode does the handshake with the prefill's side channel, which vLLM gives
        # 5 s (base_worker.py `_nixl_handshake`): on two loaded cores it can miss, and that request
        # fails (its prefill blocks then wait out the lease: `Releasing expired KV blocks`). Warm up
        # until one goes through; the tries stay in the record (they are in the logs too).
        records = []
        for k in range(4):
            records += _client(proxy.base, p.model, [f"pd-warm-{k}"], [2])
            if records[-1]["status"] == 200:
                break
        records += _client(proxy.base, p.model, ids, max_tokens)
        # the prefill's aggregate `KV Transfer metrics` line comes at its next stats interval
        time.sleep(12)
    seen_by_id = {s["x_request_id"]: s for s in proxy.seen}
    for rec in records:
        seen = seen_by_id.get(rec["x_request_id"], {})
        params = seen.get("kv_transfer_params") or {}
        rec["prefill_response_id"] = seen.get("prefill_id")
        rec["remote_request_id"] = params.get("remote_request_id")
        rec["remote_engine_id"] = params.get("remote_engine_id")
        rec["remote_block_ids"] = params.get("remote_block_ids")
    truth = {"kind": "nixl-pd", "prefill_engine_id": "prefill-engine-0", "decode_engine_id": "decode-engine-0",
             "requests": records}
    (outdir / "pd_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def run_dp(outdir: Path, n: int = 6) -> dict:
    """A DP=2 server (`--data-parallel-size 2 --data-parallel-backend mp`) with the plugin; `n`
    sequential requests. Writes dp.log and dp_truth.json."""
    outdir.mkdir(parents=True, exist_ok=True)
    ids = [f"dp-{i:03d}" for i in range(n)]
    max_tokens = [3 + 2 * i for i in range(n)]
    # The API server's summary line cannot name the engine that served the request (its
    # output processor keeps no engine index): the engine cores' own lines (`Scheduling request`,
    # `Freed <n> blocks`, under `EngineCore_DP<n>`) do, so they are asked for.
    with Vllm(outdir / "dp.log", extra_env={"VLLM_TRACE_BRIDGE_PLUGIN_ENGINE": "1"},
              extra_args=("--max-num-seqs", "4", "--data-parallel-size", "2", "--data-parallel-backend", "mp")) as v:
        records = _client(f"http://127.0.0.1:{v.port}", v.model, ids, max_tokens)
        per_engine = _finished_per_engine(f"http://127.0.0.1:{v.port}")
    # which engine served each request the client cannot see; vLLM's own Prometheus counter
    # says how many each engine finished (label `engine`), a count the log must agree with
    truth = {"kind": "dp2", "data_parallel_size": 2, "requests": records, "finished_per_engine": per_engine}
    (outdir / "dp_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def run_api2(outdir: Path, n: int = 8) -> dict:
    """Two API servers (`--api-server-count 2`) in front of DP=2 engines, with the plugin; `n`
    sequential requests, then the first X-Request-Id again (ids repeat: the two sends are two
    requests), a few with a caller's traceparent; then a burst of six at once, one X-Request-Id
    twice among them. Writes api2.log and api2_truth.json. Which
    API server took a request the client cannot see (the kernel balances the shared socket)."""
    outdir.mkdir(parents=True, exist_ok=True)
    ids = [f"api2-{i:03d}" for i in range(n)] + ["api2-000"]
    max_tokens = [3 + i % 4 for i in range(n)] + [2]
    traceparents = {xid: f"00-{(i + 1) * 0x1111:032x}-{(i + 1) * 0x2222:016x}-01"
                    for i, xid in enumerate(ids[:n]) if i % 3 == 1}
    with Vllm(outdir / "api2.log", extra_env={"VLLM_TRACE_BRIDGE_PLUGIN_ENGINE": "1"},
              extra_args=("--max-num-seqs", "4", "--data-parallel-size", "2", "--data-parallel-backend", "mp",
                          "--api-server-count", "2")) as v:
        base = f"http://127.0.0.1:{v.port}"
        records = _client(base, v.model, ids, max_tokens, traceparents)
        for k, rec in enumerate(records):
            rec["order"], rec["burst"] = k, False
        # then at once, one thread each, long enough to overlap: the two API servers' lines
        # interleave, and one X-Request-Id is in flight twice (told apart by the tokens asked for)
        burst = [("api2-b00", 24), ("api2-b01", 28), ("api2-dup", 32), ("api2-dup", 36), ("api2-b02", 40),
                 ("api2-b03", 44)]
        with ThreadPoolExecutor(len(burst)) as pool:
            got = list(pool.map(lambda b: _client(base, v.model, [b[0]], [b[1]], traceparents)[0], burst))
        for k, rec in enumerate(got, len(records)):
            rec["order"], rec["burst"] = k, True
        records += got
        per_engine = _finished_per_engine(base)
    truth = {"kind": "api2-dp2", "api_server_count": 2, "data_parallel_size": 2, "requests": records,
             "finished_per_engine": per_engine}
    (outdir / "api2_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


if __name__ == "__main__":
    out = Path(sys.argv[1])
    which = sys.argv[2:] or ["pd", "dp", "api2"]
    if "pd" in which:
        print(json.dumps(run_pd(out), indent=1))
    if "dp" in which:
        print(json.dumps(run_dp(out), indent=1))
    if "api2" in which:
        print(json.dumps(run_api2(out), indent=1))
