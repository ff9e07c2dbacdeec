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

import contextlib
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


@contextlib.contextmanager
def _nixl_pair(outdir: Path, prefill_log: str, decode_log: str, kv_extra: dict | None = None):
    """A NIXL prefill/decode pair with the plugin (engine ids `prefill-engine-0`,
    `decode-engine-0`, each its own side-channel port) behind the proxy: (prefill, decode, proxy).
    `kv_extra`: the connector's `kv_connector_extra_config` (a lease, say)."""
    overlay = nixl_overlay()
    if overlay is None:
        raise RuntimeError(f"no nixl overlay at {OVERLAY}")
    outdir.mkdir(parents=True, exist_ok=True)
    common = ("--max-num-seqs", "4")
    env_p = {"PYTHONPATH": overlay, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
             "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    env_d = {**env_p, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}

    def config(engine_id: str) -> str:
        c = json.loads(_kv_config(engine_id))
        if kv_extra:
            c["kv_connector_extra_config"] = kv_extra
        return json.dumps(c)

    with Vllm(outdir / prefill_log, extra_env=env_p,
              extra_args=(*common, "--kv-transfer-config", config("prefill-engine-0"))) as p, \
            Vllm(outdir / decode_log, extra_env=env_d,
                 extra_args=(*common, "--kv-transfer-config", config("decode-engine-0"))) as d, \
            PdProxy(f"http://127.0.0.1:{p.port}", f"http://127.0.0.1:{d.port}", deadline(600)) as proxy:
        yield p, d, proxy


def _warm_up(proxy: PdProxy, model: str) -> list[dict]:
    """NIXL's first decode does the handshake with the prefill's side channel, which vLLM gives
    5 s (base_worker.py `_nixl_handshake`): on two loaded cores it can miss, and that request
    fails (its prefill blocks then wait out the lease: `Releasing expired KV blocks`). Warm up
    until one goes through; the tries stay in the record (they are in the logs too)."""
    records: list[dict] = []
    for k in range(4):
        records += _client(proxy.base, model, [f"pd-warm-{k}"], [2])
        if records[-1]["status"] == 200:
            break
    return records


def _forward_with(proxy: PdProxy, between):
    """The proxy's forward with `between(rid)` called after the prefill's answer and before the
    decode gets the request (a kill, a delay), the prefill's answer kept in `proxy.seen`."""
    from pd_proxy import _post, prefill_body

    def forward(path: str, body: dict, rid: str):
        code, first = _post(proxy.prefill + path, prefill_body(body), rid, proxy.timeout)
        if code != 200:
            return code, first
        params = first.get("kv_transfer_params")
        proxy.seen.append({"x_request_id": rid, "prefill_id": first.get("id"), "kv_transfer_params": params})
        between(rid)
        second = dict(body)
        second["kv_transfer_params"] = params
        return _post(proxy.decode + path, second, rid, proxy.timeout)
    return forward


def _as_the_proxy_saw(records: list[dict], proxy: PdProxy) -> None:
    """Each record with what the proxy saw of it: the prefill's response id and the KV transfer
    params it handed the decode (the remote engine's request id and engine id)."""
    seen_by_id = {s["x_request_id"]: s for s in proxy.seen}
    for rec in records:
        seen = seen_by_id.get(rec["x_request_id"], {})
        params = seen.get("kv_transfer_params") or {}
        rec["prefill_response_id"] = seen.get("prefill_id")
        rec["remote_request_id"] = params.get("remote_request_id")
        rec["remote_engine_id"] = params.get("remote_engine_id")
        rec["remote_block_ids"] = params.get("remote_block_ids")


def run_pd(outdir: Path, n: int = 4) -> dict:
    """A NIXL prefill/decode pair with the plugin behind the proxy; `n` sequential requests.
    Writes prefill.log, decode.log (CRI-framed, as the kubelet would) and pd_truth.json."""
    ids = [f"pd-{i:03d}" for i in range(n)]
    max_tokens = [4 + 3 * i for i in range(n)]
    with _nixl_pair(outdir, "prefill.log", "decode.log") as (p, _d, proxy):
        records = _warm_up(proxy, p.model)
        records += _client(proxy.base, p.model, ids, max_tokens)
        # the prefill's aggregate `KV Transfer metrics` line comes at its next stats interval
        time.sleep(12)
    _as_the_proxy_saw(records, proxy)
    truth = {"kind": "nixl-pd", "prefill_engine_id": "prefill-engine-0", "decode_engine_id": "decode-engine-0",
             "requests": records}
    (outdir / "pd_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def run_pd_kill(outdir: Path) -> dict:
    """A NIXL pair whose prefill dies between its answer and the decode's read: after a warm-up
    that went through (the handshake done), the proxy gets the prefill's answer for `pd-kill`,
    kills the prefill's whole process group (SIGKILL) and forwards to the decode, which posts its
    read to a peer that is gone. Writes pd_kill_prefill.log, pd_kill_decode.log and
    pd_kill_truth.json (the client's record: the HTTP status of each request)."""
    import signal

    killed: dict = {}
    with _nixl_pair(outdir, "pd_kill_prefill.log", "pd_kill_decode.log") as (p, _d, proxy):
        records = _warm_up(proxy, p.model)

        def kill_prefill(_rid: str) -> None:
            os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait(deadline(30))
            killed["at"] = round(time.time(), 6)

        forward, proxy.forward = proxy.forward, _forward_with(proxy, kill_prefill)
        records += _client(proxy.base, p.model, ["pd-kill"], [4])
        proxy.forward = forward
        # the decode's aggregate `KV Transfer metrics` line comes at its next stats interval
        time.sleep(15)
    _as_the_proxy_saw(records, proxy)
    truth = {"kind": "nixl-pd-prefill-killed", "prefill_engine_id": "prefill-engine-0",
             "decode_engine_id": "decode-engine-0", "prefill_killed_at": killed.get("at"),
             "note": "the proxy SIGKILLed the prefill's process group after its answer for pd-kill, "
                     "before forwarding to the decode (tests/distributed_run.py run_pd_kill)",
             "requests": records}
    (outdir / "pd_kill_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def run_pd_lease(outdir: Path, lease_s: int = 6, delay_s: float = 14.0) -> dict:
    """A NIXL pair whose prefill lends its blocks for `lease_s` (`kv_connector_extra_config:
    {kv_lease_duration}`, 30 by default) and a proxy that holds `pd-late` for `delay_s` between
    the prefill's answer and the decode: the lease runs out (`Releasing expired KV blocks`), the
    decode reads the released blocks anyway and the prefill logs `Potentially invalid KV blocks`
    when it reads the read's notification: while its engine steps, so at `pd-after`, the next
    request. `pd-ok`, forwarded at once, is read in time. Writes
    pd_lease_prefill.log, pd_lease_decode.log, pd_lease_truth.json."""
    held: dict = {}
    with _nixl_pair(outdir, "pd_lease_prefill.log", "pd_lease_decode.log",
                    {"kv_lease_duration": lease_s}) as (p, _d, proxy):
        records = _warm_up(proxy, p.model)
        records += _client(proxy.base, p.model, ["pd-ok"], [3])

        def hold(rid: str) -> None:
            held[rid] = [round(time.time(), 6)]
            time.sleep(delay_s)  # the client's request waits here: the proxy is slow
            held[rid].append(round(time.time(), 6))

        forward, proxy.forward = proxy.forward, _forward_with(proxy, hold)
        records += _client(proxy.base, p.model, ["pd-late"], [3])
        proxy.forward = forward
        # NIXL's prefill worker reads the decode's notifications only while its engine steps:
        # an idle prefill logs `Potentially invalid` at its next request
        records += _client(proxy.base, p.model, ["pd-after"], [3])
        time.sleep(15)  # both instances' next `KV Transfer metrics` lines
    _as_the_proxy_saw(records, proxy)
    for rec in records:
        if rec["x_request_id"] in held:
            rec["proxy_held"] = held[rec["x_request_id"]]
    truth = {"kind": "nixl-pd-short-lease", "prefill_engine_id": "prefill-engine-0",
             "decode_engine_id": "decode-engine-0", "kv_lease_duration": lease_s, "proxy_delay_s": delay_s,
             "note": "pd-late: the proxy held the request between the prefill's answer and the decode for "
                     "proxy_delay_s, longer than the lease (tests/distributed_run.py run_pd_lease)",
             "requests": records}
    (outdir / "pd_lease_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
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


def _workers(session: int) -> dict[str, int]:
    """{process title: pid} of vLLM's worker processes in this session (`start_new_session`):
    vLLM names them with setproctitle (`VLLM::Worker_TP1`, multiproc_executor.py
    `setup_proc_title_and_log_prefix`), which is what `ps` shows. A worker whose parent is a
    data-parallel engine core is keyed under it (`EngineCore_DP1/Worker_TP1`): with DP on CPU the
    workers' own titles do not say their engine."""
    titles, parents = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getsid(int(d.name)) != session:
                continue
            title = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ProcessLookupError, ValueError, IndexError):
            continue
        if "::" in title:
            titles[int(d.name)] = title.split("::", 1)[1].split()[0]
            parents[int(d.name)] = ppid
    out = {}
    for pid, title in titles.items():
        if title.startswith("Worker"):
            engine = titles.get(parents[pid], "")
            out[f"{engine}/{title}" if engine.startswith("EngineCore_DP") else title] = pid
    return out


def run_parallel(outdir: Path, kind: str, n: int = 3, victim: str | None = None, settle: float = 5) -> dict:
    """A TP=2, PP=2 or DP=2 x TP=2 server (`kind` "tp2" | "pp2" | "dp2tp2") with the plugin: `n` sequential requests, then
    two long ones at once, and while vLLM serves them one worker process is killed with SIGKILL
    (`victim`, a process title; by default rank 1). Writes <kind>.log and <kind>_truth.json.
    PP runs without --enforce-eager: vLLM's CPU runner then skips the warm-up that allocates the
    second stage's tensors, and every request fails."""
    import signal
    import threading

    outdir.mkdir(parents=True, exist_ok=True)
    args = {"tp2": ("--tensor-parallel-size", "2"), "pp2": ("--pipeline-parallel-size", "2"),
            "dp2tp2": ("--data-parallel-size", "2", "--data-parallel-backend", "mp", "--tensor-parallel-size", "2")}[kind]
    victim = victim or {"tp2": "Worker_TP1", "pp2": "Worker_PP1", "dp2tp2": "EngineCore_DP1/Worker_TP1"}[kind]
    log = outdir / f"{kind}.log"
    ids = [f"{kind}-{i:03d}" for i in range(n)]
    dying = [f"{kind}-dying-{i}" for i in range(2)]
    # vLLM's CPU workers bind their OpenMP threads one NUMA node each by default ("auto"), and
    # refuse two workers on one node: one core each, given by hand
    # (DP x TP: one list per worker, engine after engine)
    env = {"VLLM_TRACE_BRIDGE_PLUGIN_ENGINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1|0|1" if kind == "dp2tp2" else "0|1"}
    with Vllm(log, extra_env=env, eager=kind != "pp2",
              extra_args=("--max-num-seqs", "4", *args)) as v:
        base = f"http://127.0.0.1:{v.port}"
        records = _client(base, v.model, ids, [3 + 2 * i for i in range(n)])
        workers = _workers(v.proc.pid)
        late: list[dict] = []
        threads = [threading.Thread(target=lambda x=x: late.extend(_client(base, v.model, [x], [900])))
                   for x in dying]
        for t in threads:
            t.start()
        until = time.monotonic() + deadline(120)
        # both in flight: the engine core's plugin line names each as it is scheduled
        while time.monotonic() < until and not all(f"Scheduling request cmpl-{x}-0" in log.read_text()
                                                   for x in dying):
            time.sleep(0.05)
        killed_at = time.time()
        os.kill(workers[victim], signal.SIGKILL)
        for t in threads:
            t.join(deadline(300))
        time.sleep(settle)  # what vLLM logs after the clients' 500s: its shutdown
        exited = v.proc.poll()
    records += sorted(late, key=lambda r: r["x_request_id"])
    truth = {"kind": kind, "args": list(args), "workers": workers, "killed": victim,
             "killed_pid": workers[victim], "killed_at": round(killed_at, 6),
             "server_exited_by_itself": exited, "requests": records}
    (outdir / f"{kind}_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


#: The burst `run_api2` sends at once: (X-Request-Id, max_tokens), one id twice.
API2_BURST = (("api2-b00", 24), ("api2-b01", 28), ("api2-dup", 32), ("api2-dup", 36), ("api2-b02", 40),
              ("api2-b03", 44))
#: A burst with three ids twice each: more chances that one API server holds both sends of one
#: id and the two engine cores schedule them in another order than added (each pair: 50% on one
#: API server, as the kernel hands out connections).
API2_TWINS_BURST = (("api2-dup", 32), ("api2-dup", 36), ("api2-dupb", 26), ("api2-dupb", 40),
                    ("api2-dupc", 30), ("api2-dupc", 44), ("api2-b00", 24), ("api2-b01", 28))


def run_api2(outdir: Path, n: int = 8, burst=API2_BURST) -> dict:
    """Two API servers (`--api-server-count 2`) in front of DP=2 engines, with the plugin; `n`
    sequential requests, then the first X-Request-Id again (ids repeat: the two sends are two
    requests), a few with a caller's traceparent; then a burst at once (`burst`: by default six,
    one X-Request-Id twice among them). Writes api2.log and api2_truth.json. Which
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
    for kind in ("tp2", "pp2", "dp2tp2"):
        if kind in which:
            print(json.dumps(run_parallel(out, kind), indent=1))
    if "pd_kill" in which:
        print(json.dumps(run_pd_kill(out), indent=1))
    if "pd_lease" in which:
        print(json.dumps(run_pd_lease(out), indent=1))
    if "api2" in which:
        print(json.dumps(run_api2(out), indent=1))
