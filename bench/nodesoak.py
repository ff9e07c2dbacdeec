"""Node-scale soak: 8 vLLM containers at their peak line rate, kubelet rotation, a receiver
outage and two `kill -9` of the agent, against a real OTLP gRPC receiver in its own process.

    python bench/nodesoak.py                 # full: 120 s, a 600 s outage, 180 s after (~17 min)
    python bench/nodesoak.py --quick         # 20 s, a 30 s outage, 40 s after (~2 min)
    python bench/nodesoak.py --quick --rate 200 --json out.json   # what tests/test_nodesoak.py runs

**Peak line rate of one vLLM container: 1,000 lines/s** (`--rate`). A GPU vLLM's request rate
is bounded by its token throughput: Llama-3.1-8B on one H100 decodes ~12,500 output tokens/s
at saturation; at ShareGPT's ~200 output tokens per request that is ~60 requests/s (vLLM's
v0.6.0 figures use 32 QPS for the same pair). 100 requests/s is taken as the peak, above
both. Per request, vLLM with the plugin and its engine lines (`VLLM_TRACE_BRIDGE_PLUGIN_ENGINE=1`)
writes its summary, `Scheduling`, `Freed` (and a `Preempting` + `Scheduling` per preemption),
uvicorn's access line, and with `--enable-log-requests` `Received` and `Added`: ~6-8 lines;
the ground-truth generator's mix (`bridge.synth`, per-block lines, gauges, preemptions,
timeouts) writes ~10.2, so 100 requests/s is ~1,000 lines/s of that mix, ~155 bytes each,
5 % of them split into CRI `P`/`F` parts. 8 containers (a node of 8 GPUs, one vLLM each):
8,000 lines/s, ~1.2 MB/s on the node.

What runs: each container's CRI log (the generator's lines, as containerd writes them, and
its truth) is generated once into bench/out/nodesoak/; one writer thread appends them to 8
kubelet paths at `--rate` lines/s each, flushing every 20 ms and noting when each line became
visible; at `--rotate-mib` a file is rotated as the kubelet does (`0.log` →
`0.log.<YYYYMMDD-HHMMSS>`, the one rotated before gzipped: tests/replay_equiv.py's
`kubelet_rotate`). Rotated files are never deleted: at this rate a 10-minute outage writes
~90 MB per container, and the kubelet's default 5 × 10 MiB would delete logs no agent could
read in time — a loss at the source, not the agent's. The agent (`vllm-trace-bridge run`,
default settings, `--start-at beginning`) is killed with SIGKILL twice (in the first phase,
and during the catch-up after the outage) and started again 10 s later, as a DaemonSet's pod
is restarted (the kubelet's first back-off). The receiver (tests/receiver_proc.py's, noting
each request's arrival time) is stopped for the outage and started again on the same port.

Printed: the agent's CPU (user + sys of its three processes, µs per line and % of a core over
the run), its RSS sampled over time (min / median / max and a series), p50 / p99 line → span
latency (the flush that made a request's last needed line visible → its root span's arrival)
for requests written outside the outage, the lag (bytes not yet read; the catch-up after the
outage), and lost / split / changed requests against the generator's truth: lost = a true
request with no root span, split = one with more than one trace, changed = a span id sent
twice with different content or a root whose outcome is not the truth's; extra = a root no
true request matches. The machine's load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), HERE]

from _common import as_installed  # noqa: E402

LINES_PER_REQUEST = 10.2  # the generator's default mix (bench/replay_cpu.py)


# --- the logs and their truth -------------------------------------------------------------

def _generate(path: str, index: int, requests: int, rate: float) -> None:
    """One container's CRI log (ending with a closing line, tests/replay_equiv.py), its truth and,
    per true request, the physical line that completes it. Run in a child: generating holds
    the whole log in memory."""
    from agent import last_lines
    from replay_equiv import closing_line

    from bridge.synth import SynthConfig, generate, write

    cfg = SynthConfig(requests=requests, seed=1000 + index, cri=True, mean_interarrival_s=LINES_PER_REQUEST / rate,
                      model_load_failure=False, incomplete_tail=0, reuse_ratio=0.05,
                      start=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1_771_149_600 + index)))
    lines, truth = generate(cfg)

    class Collect(list):
        def write(self, s):
            self.extend(s.splitlines(keepends=True))
    text = Collect()
    write(lines, text, cfg)
    phys, logical = [], -1  # physical index of each logical line's F part
    for k, raw in enumerate(text):
        if raw.split(" ", 3)[2] == "F":
            logical += 1
            phys.append(k)
    last = last_lines(lines)
    occurrences: dict[str, list] = {}
    for r in sorted(truth.requests, key=lambda r: r.arrival_ns):
        occurrences.setdefault(r.request_id, []).append(r)
    out = []
    for rid, rs in occurrences.items():
        # Latency only where each occurrence of the id is one `last_lines` counts (all scheduled).
        usable = all(r.outcome == "finished" for r in rs) and all((rid, n) in last for n in range(len(rs)))
        for n, r in enumerate(rs):
            start = r.arrival_ns if r.outcome in ("finished", "timeout") else r.first_line_ns
            out.append([rid, start, r.outcome, phys[last[(rid, n)]] if usable else -1])
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(text)
        f.write(closing_line(text[-20:]))
    with open(path + ".truth.json", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


def logs(containers: int, requests: int, rate: float) -> list[str]:
    out = os.path.join(HERE, "out", "nodesoak")
    os.makedirs(out, exist_ok=True)
    paths = []
    for i in range(containers):
        path = os.path.join(out, f"c{i}-r{requests}-rate{rate:g}.cri")
        if not os.path.exists(path):
            t = time.time()
            subprocess.run([sys.executable, __file__, "--generate", path, str(i), str(requests), str(rate)],
                           cwd=ROOT, check=True)
            print(f"generated {path} in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
        paths.append(path)
    return paths


# --- the receiver -------------------------------------------------------------------------

def _receive(port: int, out: str) -> None:
    """tests/receiver_proc.py's receiver, each request preceded by its arrival time."""
    from receiver_proc import FileReceiver

    class Timed(FileReceiver):
        def add(self, raw: bytes) -> None:
            now = time.time()
            with self._wlock:
                self._out.write(struct.pack(">Qd", len(raw), now) + raw)
                self._out.flush()

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with Timed(port, out):
        print("ready", flush=True)
        done.wait()


def read_timed(path: str):
    """(arrival time, request bytes) for each request the receiver wrote, read as a stream (a
    full run receives a few GB)."""
    with open(path, "rb") as f:
        while True:
            head = f.read(16)
            if len(head) < 16:
                return
            n, t = struct.unpack(">Qd", head)
            raw = f.read(n)
            if len(raw) < n:
                return
            yield t, raw


class Receiver:
    def __init__(self, port: int, out: str) -> None:
        self.port, self.out, self.proc = port, out, None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--receive", str(self.port), self.out],
                                     cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


# --- the writer ---------------------------------------------------------------------------

class Writer(threading.Thread):
    """Appends each container's lines at `rate` lines/s to its kubelet path; notes, per flush, the
    count of lines then visible and the time; rotates as the kubelet does."""

    def __init__(self, sources: list[str], paths: list[str], rate: float, rotate_bytes: int,
                 mid_line: bool = False) -> None:
        super().__init__(daemon=True)
        self.sources, self.paths, self.rate, self.rotate_bytes = sources, paths, rate, rotate_bytes
        self.mid_line = mid_line
        self.mid_line_rotations = 0
        self.flushes: list[tuple[list[int], list[float]]] = [([], []) for _ in paths]
        self.rotations = [0] * len(paths)
        self.written = [0] * len(paths)
        self.started = self.finished = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.error = e

    def _run(self) -> None:
        from replay_equiv import kubelet_rotate

        srcs = [open(s, encoding="utf-8") for s in self.sources]
        outs = [open(p, "a", encoding="utf-8") for p in self.paths]
        sizes = [0] * len(self.paths)
        rotating: list = [None] * len(self.paths)
        done = [False] * len(self.paths)
        whole = [True] * len(self.paths)  # the last line written was an F (not a P part)
        pool = ThreadPoolExecutor(max_workers=2)
        stamps: set[tuple[int, str]] = set()
        self.started = time.time()
        while not all(done):
            due = int((time.time() - self.started) * self.rate)
            for c in range(len(self.paths)):
                if done[c]:
                    continue
                if rotating[c] is not None:
                    if not rotating[c].done():
                        continue
                    rotating[c].result()
                    rotating[c] = None
                    outs[c] = open(self.paths[c], "a", encoding="utf-8")
                    sizes[c] = 0
                chunk = []
                while self.written[c] + len(chunk) < due:
                    line = srcs[c].readline()
                    if not line:
                        done[c] = True
                        break
                    chunk.append(line)
                if chunk:
                    text = "".join(chunk)
                    outs[c].write(text)
                    outs[c].flush()
                    self.written[c] += len(chunk)
                    sizes[c] += len(text.encode())
                    self.flushes[c][0].append(self.written[c])
                    self.flushes[c][1].append(time.time())
                    whole[c] = chunk[-1].split(" ", 3)[2] == "F"
                if sizes[c] >= self.rotate_bytes and not done[c] and (whole[c] or self.mid_line):
                    self.mid_line_rotations += not whole[c]
                    outs[c].close()
                    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
                    while (c, stamp) in stamps:  # two rotations in one second: never at these sizes
                        time.sleep(0.2)
                        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
                    stamps.add((c, stamp))
                    rotating[c] = pool.submit(kubelet_rotate, self.paths[c], stamp)
                    self.rotations[c] += 1
            time.sleep(0.02)
        for f in outs:
            f.close()
        pool.shutdown()
        self.finished = time.time()

    def lines_at(self, t: float) -> int:
        """Lines visible in all the containers' files at time `t`."""
        total = 0
        for counts, times in self.flushes:
            k = bisect.bisect_right(times, t)
            total += counts[k - 1] if k else 0
        return total

    def visible_at(self, c: int, phys: int) -> float | None:
        """When physical line `phys` (0-based) of container `c` was flushed."""
        counts, times = self.flushes[c]
        k = bisect.bisect_right(counts, phys)
        return times[k] if k < len(times) else None


# --- the agent ----------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gauge(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"vllm_trace_bridge_{name}") and not line.startswith("#"))


class Run:
    """One soak: the timeline, the samples, the figures."""

    def __init__(self, a) -> None:
        from agentkit import AgentProc, free_port

        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="vtb-nodesoak-")
        self.total = a.warm + a.outage + a.after
        requests = int(a.rate * self.total / LINES_PER_REQUEST)
        self.sources = logs(a.containers, requests, a.rate)
        self.paths = []
        for i in range(a.containers):
            d = os.path.join(self.tmp, "pods", f"llm_vllm-{i}_3f2a9c1e-1111-2222-3333-{i:012d}", "vllm")
            os.makedirs(d)
            self.paths.append(os.path.join(d, "0.log"))
        self.rx = Receiver(free_port(), os.path.join(self.tmp, "received.bin"))
        self.agent_args = (f"{self.tmp}/pods/*/*/*.log", f"{self.tmp}/state", f"http://127.0.0.1:{self.rx.port}",
                           "--start-at", "beginning")
        self.AgentProc = AgentProc
        self.agent = None
        self.cpu = 0.0           # CPU seconds of the agents already gone
        self.cpu_each: list[float] = []
        self.agents = 0
        self.samples: list[dict] = []
        self.events: list[tuple[float, str]] = []
        self._sampling = threading.Event()

    def start_agent(self) -> None:
        self.agent = self.AgentProc(*self.agent_args).start()
        self.agents += 1
        self.events.append((time.time(), f"agent {self.agents} up"))

    def kill9(self) -> None:
        pid = self.agent.proc.pid
        cpu = cpu_seconds(pid)
        self.agent.kill9()
        self.cpu += cpu
        self.cpu_each.append(round(cpu, 1))
        self.events.append((time.time(), "kill -9"))
        self.agent = None

    def sampler(self) -> None:
        while not self._sampling.wait(self.a.sample_every):
            agent = self.agent
            s = {"t": time.time(), "load": os.getloadavg()[0]}
            if agent is not None and agent.proc.poll() is None:
                try:
                    s["agent"] = self.agents
                    s["cpu_s"] = cpu_seconds(agent.proc.pid)
                    s["rss_mb"] = agent.rss_mb()
                    _, text = agent.get("/metrics")
                    for g in ("file_bytes_behind", "export_queue_spans", "requests_open"):
                        s[g] = _gauge(text, g)
                except (OSError, ValueError):
                    pass
            self.samples.append(s)

    def at(self, t: float) -> None:
        while time.time() < self.t0 + t:
            if self.writer.error:
                raise self.writer.error
            time.sleep(0.1)

    def run(self) -> dict:
        a = self.a
        self.rx.start()
        self.start_agent()
        self.writer = Writer(self.sources, self.paths, a.rate, int(a.rotate_mib * 2**20), a.rotate_mid_line)
        sampler = threading.Thread(target=self.sampler, daemon=True)
        self.t0 = time.time()
        self.writer.start()
        sampler.start()
        self.at(a.warm / 2)
        self.kill9()
        time.sleep(a.restart_after)
        self.start_agent()
        self.at(a.warm)
        self.rx.stop()
        self.outage = (time.time(), None)
        self.events.append((time.time(), "receiver down"))
        self.at(a.warm + a.outage)
        self.rx.start()
        self.outage = (self.outage[0], time.time())
        self.events.append((time.time(), "receiver up"))
        self.at(a.warm + a.outage + a.kill_after_outage)
        self.kill9()
        time.sleep(a.restart_after)
        self.start_agent()
        self.writer.join()
        if self.writer.error:
            raise self.writer.error
        self.events.append((time.time(), "writing done"))

        def settled() -> bool:
            s = self.samples[-1] if self.samples else {}
            return all(s.get(g) == 0 for g in ("file_bytes_behind", "export_queue_spans", "requests_open"))
        while not settled():  # wait on the event; a stuck agent shows in the printed samples
            time.sleep(a.sample_every)
        size = -1
        while size != os.path.getsize(self.rx.out):  # nothing more in one more batch delay
            size = os.path.getsize(self.rx.out)
            time.sleep(2)
        self._sampling.set()
        sampler.join()
        pid = self.agent.proc.pid
        cpu = cpu_seconds(pid)
        code, _ = self.agent.term(60)
        self.cpu += cpu
        self.cpu_each.append(round(cpu, 1))
        self.end = time.time()
        self.rx.stop()
        return self.figures(code)

    # --- figures --------------------------------------------------------------------------

    def figures(self, exit_code: int) -> dict:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        from receivers import attrs

        truth: list[dict] = []  # per container: rid → [(start, outcome, phys, index)]
        wanted = 0
        for src in self.sources:
            with open(src + ".truth.json") as f:
                rows = json.load(f)
            by_id: dict[str, list] = {}
            for rid, start, outcome, phys in rows:
                by_id.setdefault(rid, []).append([start, outcome, phys, set(), None])
            truth.append(by_id)
            wanted += len(rows)
        digests: dict[bytes, bytes] = {}
        changed = extra = spans = resent = 0
        for t, raw in read_timed(self.rx.out):
            for rs in ExportTraceServiceRequest.FromString(raw).resource_spans:
                pod = attrs(rs.resource.attributes).get("k8s.pod.name", "")
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        spans += 1
                        d = hashlib.blake2b(s.SerializeToString(deterministic=True), digest_size=16).digest()
                        seen = digests.setdefault(s.span_id, d)
                        if seen is not d:
                            resent += 1
                            changed += seen != d
                            continue
                        if s.name != "vllm.request":
                            continue
                        a = attrs(s.attributes)
                        c = int(pod.rsplit("-", 1)[1]) if pod.startswith("vllm-") else -1
                        hit = None
                        for occ in truth[c].get(a.get("vllm.request.id"), []) if 0 <= c < len(truth) else []:
                            if abs(occ[0] - s.start_time_unix_nano) <= 1_000_000:
                                hit = occ
                        if hit is None:
                            extra += 1
                            continue
                        hit[3].add(s.trace_id)
                        hit[4] = t if hit[4] is None else min(hit[4], t)
                        changed += a.get("vllm.outcome") != hit[1]
        lost = split = 0
        delivered: list[tuple[float, float]] = []  # (arrival, write) of every request timed
        for c, by_id in enumerate(truth):
            for occs in by_id.values():
                for start, outcome, phys, traces, arrived in occs:
                    lost += not traces
                    split += len(traces) > 1
                    if phys >= 0 and arrived is not None:
                        w = self.writer.visible_at(c, phys)
                        if w is not None:
                            delivered.append((arrived, w))
        lag = self.lag(delivered)
        lat: dict[str, list[float]] = {"steady": [], "outside": [], "outage": []}
        o0, o1 = self.outage
        kills = [t for t, e in self.events if e == "kill -9"]
        ups = [t for t, e in self.events if e.startswith("agent ")][1:]
        caught_up = next((t for t, behind in lag if t > o1 and behind is not None and behind < 2), None)
        # Disturbed: the outage until the lag is back under 2 s, and each kill until 20 s after
        # the restart. A request is steady when nothing disturbed it between write and arrival.
        disturbed = [(o0, caught_up or float("inf"))] + [(k, u + 20) for k, u in zip(kills, ups)]
        for arrived, w in delivered:
            if o0 <= w < o1:
                lat["outage"].append(arrived - w)
                continue
            lat["outside"].append(arrived - w)
            if not any(w < end and arrived > begin for begin, end in disturbed):
                lat["steady"].append(arrived - w)
        lines = sum(self.writer.written)
        wall = self.end - self.t0
        # Steady: the first agent from 5 s after the start to its kill; the second from 20 s
        # after its start to the outage. CPU per line written in those windows.
        steady_cpu = steady_lines = steady_wall = 0.0
        for n, (t_from, t_to) in ((1, (self.t0 + 5, kills[0])),
                                  (2, (self.events[2][0] + 20, o0))):
            win = [s for s in self.samples if s.get("agent") == n and "cpu_s" in s and t_from <= s["t"] <= t_to]
            if len(win) >= 2:
                steady_cpu += win[-1]["cpu_s"] - win[0]["cpu_s"]
                steady_lines += self.writer.lines_at(win[-1]["t"]) - self.writer.lines_at(win[0]["t"])
                steady_wall += win[-1]["t"] - win[0]["t"]
        rss = [s["rss_mb"] for s in self.samples if "rss_mb" in s]
        return {
            "containers": self.a.containers, "rate": self.a.rate, "lines": lines, "requests": wanted,
            "rotations": self.writer.rotations, "agents": self.agents, "exit_code": exit_code,
            "spans": spans, "resent": resent, "lost": lost, "split": split, "changed": changed, "extra": extra,
            "cpu_s": self.cpu, "cpu_each_s": self.cpu_each, "wall_s": wall, "native": native(),
            "mid_line_rotations": self.writer.mid_line_rotations, "cpu_us_per_line": self.cpu / lines * 1e6,
            "cpu_pct": 100 * self.cpu / wall,
            "steady_cpu_s": steady_cpu, "steady_wall_s": steady_wall, "steady_lines": steady_lines,
            "rss_mb": rss, "latency": {k: sorted(v) for k, v in lat.items()},
            "lag": [(round(t - self.t0, 1), None if b is None else round(b, 1)) for t, b in lag],
            "outage_s": o1 - o0, "catch_up_s": None if caught_up is None else caught_up - o1,
            "write_s": self.writer.finished - self.writer.started,
            "samples": [{k: (round(v - self.t0, 1) if k == "t" else v) for k, v in s.items()} for s in self.samples],
            "events": [(round(t - self.t0, 1), e) for t, e in self.events],
            "load": [s["load"] for s in self.samples],
        }

    def lag(self, delivered: list[tuple[float, float]]) -> list[tuple[float, float | None]]:
        """At each sample time: how old the newest request that had arrived at the receiver was
        (its last line's write → now), in seconds: what a backend shows as lag, whatever the
        agent's own gauges say (`file_bytes_behind` sees only the files it has open)."""
        delivered = sorted(delivered)
        out, newest, k = [], None, 0
        for s in self.samples:
            if s["t"] > self.writer.finished:  # no newer request to wait for
                break
            while k < len(delivered) and delivered[k][0] <= s["t"]:
                newest = delivered[k][1] if newest is None else max(newest, delivered[k][1])
                k += 1
            out.append((s["t"], None if newest is None else s["t"] - newest))
        return out


def native() -> bool:
    """The agent runs the C fast paths (built in place, as tests/conftest.py does), as installed."""
    from bridge.decode.stream import FAST
    return FAST is not None


def _pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def report(f: dict) -> str:
    rss = f["rss_mb"]
    series = [(s["t"], round(s["rss_mb"])) for s in f["samples"] if "rss_mb" in s]
    step = max(1, len(series) // 16)
    behind = [(s["t"], round(s.get("file_bytes_behind", 0) / 2**20, 1)) for s in f["samples"]
              if "file_bytes_behind" in s]
    bstep = max(1, len(behind) // 16)
    lag = f["lag"]
    lstep = max(1, len(lag) // 20)
    out = [
        f"{f['containers']} containers × {f['rate']:g} lines/s, {f['lines']:,} lines ({f['requests']:,} requests) "
        f"written in {f['write_s']:.0f} s; rotations per container {f['rotations']} ({f['mid_line_rotations']} after a P "
        f"part); outage {f['outage_s']:.0f} s; "
        f"agent processes {f['agents']} (2 kill -9); last exit {f['exit_code']}",
        f"events (s from start): {f['events']}",
        f"exactness vs the generator's truth: lost {f['lost']}, split {f['split']}, changed {f['changed']}, "
        f"extra {f['extra']}; {f['spans']:,} spans received, {f['resent']:,} re-sent identical",
        f"agent CPU ({'C fast paths' if f['native'] else 'pure Python'}): {f['cpu_s']:.1f} s (per process "
        f"{f['cpu_each_s']}) over {f['wall_s']:.0f} s = {f['cpu_us_per_line']:.2f} µs per line written, "
        f"{f['cpu_pct']:.1f} % of one core (the whole run: start-ups, re-reads after the kills, the catch-up)",
        f"agent CPU steady (no outage, kill or catch-up; {f['steady_wall_s']:.0f} s, {f['steady_lines']:,.0f} lines): "
        f"{f['steady_cpu_s'] / max(1, f['steady_lines']) * 1e6:.2f} µs per line, "
        f"{100 * f['steady_cpu_s'] / max(1e-9, f['steady_wall_s']):.1f} % of one core",
        f"agent RSS MB: min {min(rss):.0f}, median {statistics.median(rss):.0f}, max {max(rss):.0f} "
        f"({len(rss)} samples); series (s, MB): {series[::step]}",
    ]
    for k, label in (("steady", "steady (no outage, catch-up or restart between write and arrival)"),
                     ("outside", "all written outside the outage"), ("outage", "written during the outage")):
        xs = f["latency"][k]
        out.append(f"line → span latency, {label}: {len(xs):,} requests, p50 {_pct(xs, 0.5) * 1000:.0f} ms, "
                   f"p99 {_pct(xs, 0.99) * 1000:.0f} ms, max {(xs[-1] if xs else float('nan')) * 1000:.0f} ms")
    lags = [b for _, b in lag if b is not None]
    out.append(f"lag (now − write time of the newest request received): max {max(lags):.0f} s; back under 2 s "
               f"{'never' if f['catch_up_s'] is None else round(f['catch_up_s'])} s after the outage; series (s, lag s): "
               f"{lag[::lstep]}")
    out.append(f"the agent's file_bytes_behind (its open files only) (s, MiB): {behind[::bstep]}")
    load = f["load"]
    out.append(f"machine load average (1 min) during the run: min {min(load):.1f}, median "
               f"{statistics.median(load):.1f}, max {max(load):.1f} (2 cores, shared)")
    return "\n".join(out)


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        _generate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        return
    if sys.argv[1:2] == ["--receive"]:
        _receive(int(sys.argv[2]), sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 s, a 30 s outage, 40 s after, 1 MiB rotations")
    ap.add_argument("--containers", type=int, default=8)
    ap.add_argument("--rate", type=float, default=1000, help="lines/s per container (see the module's doc)")
    ap.add_argument("--warm", type=float, help="seconds before the outage (the first kill -9 at half)")
    ap.add_argument("--outage", type=float, help="seconds the receiver is down")
    ap.add_argument("--after", type=float, help="seconds of writing after the outage")
    ap.add_argument("--kill-after-outage", type=float, help="the second kill -9, seconds after the receiver is back")
    ap.add_argument("--restart-after", type=float, default=10, help="a killed agent is started again after this")
    ap.add_argument("--rotate-mib", type=float, help="kubelet's containerLogMaxSize (default 10, --quick 1)")
    ap.add_argument("--sample-every", type=float, help="seconds between RSS / lag samples")
    ap.add_argument("--rotate-mid-line", action="store_true",
                    help="let a rotation fall between a CRI P part and its F end (see docs/performance.md)")
    ap.add_argument("--keep", action="store_true", help="keep the logs and what was received (printed path)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    q = a.quick
    for k, full, quick in (("warm", 120, 20), ("outage", 600, 30), ("after", 180, 40), ("kill_after_outage", 30, 10),
                           ("rotate_mib", 10, 1), ("sample_every", 5, 2)):
        if getattr(a, k) is None:
            setattr(a, k, quick if q else full)
    if os.environ.get("VLLM_TRACE_BRIDGE_PURE", "") in ("", "0"):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    as_installed()
    run = Run(a)
    try:
        f = run.run()
    finally:
        for proc in (run.agent and run.agent.proc, run.rx.proc):  # on an error: stop what we started
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if a.keep:
            print(f"kept {run.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(run.tmp, ignore_errors=True)
    print(report(f), flush=True)
    if a.json:
        with open(a.json, "w") as out:
            json.dump(f, out)


if __name__ == "__main__":
    main()
