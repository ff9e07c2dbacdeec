"""`vllm-trace-bridge check PATH...`: does the bridge understand these logs?

Runs decode and parse (no assembly, no export) and reports, per file: the vLLM version family
the file looks like and why, the records recognised per kind, the share not recognised, and the
most frequent unrecognised line *templates* (ids, paths, hex, numbers and quoted text masked,
so the report shows shapes, not data); given several files, the templates of all of them as
families (lines and files per family), on one screen: what to teach it with `--rules` first.
Progress bars and Python warnings are recognised as kind `noise`: understood to carry nothing,
not unknown. With `--rules FILE` the user's line rules
apply as in replay: coverage counts what they take, and each rule's line count is listed.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from bridge.assemble.clock import jumped
from bridge.decode import Decoder
from bridge.decode.record import CLOCK_ANCHORED
from bridge.decode.stream import RecordStream
from bridge.parse import Parser
from bridge.parse.events import EngineConfig, EngineStats, RequestAdded
from bridge.parse.literals import DOTTED_NAME, mask_literals
from bridge.tail import read_lines
from bridge.tail.files import MAX_LINE_BYTES
from bridge.tail.source import same_writer, streams

SEED_KINDS = frozenset({"request_summary", "request_ended", "scheduling", "preemption", "queue_state", "block_alloc", "block_free",
                        "gpu_memory", "cuda_oom", "alloc_failed", "request_timeout", "model_load",
                        "nccl_timeout", "nccl_hint"})
_MAX_TEMPLATES = 10_000  # distinct templates kept per file: memory stays bounded on any input

_ID = r"\b(?:chatcmpl|cmpl|chat|embd|pool|score|rerank|classify|tokn|trsc)-[\w-]+"
#: Long runs kept for the masks below to name: dotted names (what failed) and request ids.
_KEEP_LONG = re.compile(rf"{DOTTED_NAME.pattern}|{_ID}")
_MASKS = (
    (re.compile(_ID), "<id>"),
    # a path (a file, a model's directory, a Windows path): where, not what
    (re.compile(r"(?:\b[A-Za-z]:)?(?:[/\\][\w.@+~-]+){2,}[/\\]?"), "<path>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F-]*\d)[0-9a-fA-F]{8,}(?:-[0-9a-fA-F]{4,})*\b"), "<hex>"),
    (re.compile(r"\d+(?:[.,:]\d+)*"), "<n>"),
    (re.compile(r"\s+"), " "),  # padding and indentation: the same line, wherever it sat
)
_BRACKETED = re.compile(rb"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[")
_V1_PROCESS = ("EngineCore", "APIServer", "ApiServer", "Worker_", "VllmWorker ")
_V1_INTERNAL_ID = re.compile(r"-[0-9a-f]{8}$")


def template(message: str) -> str:
    """A line's shape: first line only, variable parts masked. Quoted text (to the end of the
    line when a quote is left open) and long literals are masked over the whole line before it
    is cut to 160 characters, so a cut cannot leave part of a user's text unmasked."""
    line = mask_literals(message.split("\n", 1)[0], "'…'", _KEEP_LONG)[:160]
    for pattern, mask in _MASKS:
        line = pattern.sub(mask, line)
    return line.strip()


@dataclass(slots=True)
class FileReport:
    path: str
    physical_lines: int = 0
    records: int = 0
    joined: int = 0
    by_kind: Counter = field(default_factory=Counter)
    malformed: Counter = field(default_factory=Counter)     # template → count
    unrecognised: Counter = field(default_factory=Counter)  # template → count
    unrecognised_lines: int = 0
    malformed_lines: int = 0
    evidence: Counter = field(default_factory=Counter)
    by_rule: Counter = field(default_factory=Counter)  # user rule → lines it took (every rule, 0 too)
    version: str = ""
    engine: str = ""
    rotated: list[str] = field(default_factory=list)  # the stream's older files, read before `path`
    clock_jumps: int = 0  # the clock set a year+ ahead or a day+ back between lines (bridge.assemble.clock)
    cut: dict[str, int] = field(default_factory=dict)  # lines over MAX_LINE_BYTES: lines_oversized, bytes_cut

    @property
    def recognised(self) -> int:
        return sum(self.by_kind.values())

    @property
    def recognised_pct(self) -> float:
        return 100.0 * self.recognised / self.records if self.records else 100.0

    @property
    def family(self) -> str:
        return family(self)


def family(r: FileReport) -> str:
    """The version family the evidence points to, e.g. `V1 (vLLM 0.14.0)`."""
    seed = sum(n for k, n in r.by_kind.items() if k in SEED_KINDS)
    upstream = r.recognised - seed
    if seed and seed >= upstream:
        return "seed dialect"
    version = f" (vLLM {r.version})" if r.version else ""
    e = r.evidence
    if r.engine == "V1" or (not r.engine and e["v1"] > e["v0"]):
        return "V1" + version
    if r.engine == "V0" or e["v0"]:
        old = _older_than_0_8(r.version) if r.version else e["plain_header"] > e["bracket_header"]
        return ("V0 ≤0.7" if old else "V0 0.8+") + version
    if r.version:
        return ("V0 ≤0.7" if _older_than_0_8(r.version) else "vLLM") + version
    if e["bracket_header"] or e["plain_header"]:
        return "vLLM, version unknown (" + ("0.8+" if e["bracket_header"] >= e["plain_header"] else "≤0.7") + " headers)"
    return "unknown"


def _older_than_0_8(version: str) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m[1]), int(m[2])) < (0, 8)


def check_file(path: str, rules=None) -> FileReport:
    """`rules`: user rules (`bridge.parse.rules.Rules`), applied as replay applies them."""
    return check_stream([path], rules)


def check_stream(paths: list[str], rules=None) -> FileReport:
    """One report for the files of one container's stream (`tail.source.streams`: rotated files
    oldest first, then the live one), read in that order as replay reads them: the banner in
    the oldest file tells the version of the lines in the newer ones. Each file has its own
    decoder, as in replay. The report is named after the newest file."""
    report = FileReport(paths[-1])
    report.rotated = paths[:-1]
    parser = Parser(rules=rules)
    stats = parser.stats
    if rules is not None:
        report.by_rule.update(dict.fromkeys(rules.names, 0))
    ev = report.evidence

    clock = [0]  # the latest stamp, as the assembler's clock follows it (a jump back resets it)

    def handle(record) -> None:
        report.records += 1
        ts = record.ts_ns
        if record.clock != CLOCK_ANCHORED:  # a line with no stamp of its own reads no clock
            if jumped(clock[0], ts):
                report.clock_jumps += 1
                clock[0] = ts
            elif ts > clock[0]:
                clock[0] = ts
        if record.process:
            ev["v1" if record.process.startswith(_V1_PROCESS) else "v0" if "VllmWorkerProcess" in record.process
               else "process"] += 1
        unrecognised = stats.unrecognised
        event = parser.parse(record.message, record.level, record.origin)  # replay's call and counters
        if event is None:
            if stats.unrecognised != unrecognised:
                _count(report.unrecognised, record.message)
                report.unrecognised_lines += 1
            else:
                _count(report.malformed, record.message)
                report.malformed_lines += 1
        elif isinstance(event, EngineConfig):
            report.version, report.engine = report.version or event.version, report.engine or event.engine
        elif isinstance(event, EngineStats):
            ev["v0" if event.swapped is not None else "v1"] += 1
        elif isinstance(event, RequestAdded) and _V1_INTERNAL_ID.search(event.request_id):
            ev["v1"] += 1

    carry = None
    for k, path in enumerate(paths):
        stream = RecordStream(Decoder(mtime=os.stat(path).st_mtime))
        if carry is not None:  # the partial lines the last file ended in (replay's rule)
            stream.decoder.adopt(carry)
        hand_on = k + 1 < len(paths) and same_writer(path, paths[k + 1])
        for offset, raw in read_lines(path, cut=report.cut):
            report.physical_lines += 1
            if b"] " in raw:
                if _BRACKETED.search(raw):
                    ev["bracket_header"] += 1
                else:
                    ev["plain_header"] += 1
            for record in stream(raw, offset):
                handle(record)
        for record in stream.flush(partials=not hand_on):
            handle(record)
        carry = stream.decoder.carry() if hand_on else None
        report.joined += stream.joiner.stats.lines_joined
    snapshot = parser.snapshot()
    report.by_kind.update(snapshot.by_kind)
    report.by_rule.update(snapshot.by_rule)
    return report


def _count(counter: Counter, message: str) -> None:
    key = template(message)
    if key in counter or len(counter) < _MAX_TEMPLATES:
        counter[key] += 1
    else:
        counter["(other templates)"] += 1


def render(r: FileReport, top: int = 10) -> str:
    lines = [
        r.path + (f"  (and {len(r.rotated)} rotated file(s) before it: "
                  + ", ".join(os.path.basename(p) for p in r.rotated) + ")" if r.rotated else ""),
        f"  family        {r.family}",
        f"  records       {r.records} from {r.physical_lines} lines ({r.joined} joined into multi-line records)",
        f"  recognised    {r.recognised} ({r.recognised_pct:.1f} %)",
        f"  unrecognised  {r.unrecognised_lines} ({_pct(r.unrecognised_lines, r.records)})"
        + (f", malformed {r.malformed_lines}" if r.malformed_lines else ""),
        "  kinds         " + (", ".join(f"{k} {n}" for k, n in sorted(r.by_kind.items())) or "none"),
    ]
    if r.clock_jumps:
        lines.append(f"  clock jumps   {r.clock_jumps} (the clock set a year or more ahead or a day or more back between "
                     "lines: replay and the agent report each, split no request over it)")
    if r.cut.get("lines_oversized"):
        lines.append(f"  oversized     {r.cut['lines_oversized']} line(s) over {MAX_LINE_BYTES >> 20} MiB: cut there, "
                     f"{r.cut['bytes_cut']} bytes dropped")
    if r.by_rule:
        lines.append("  rules         " + ", ".join(f"{k} {n}" for k, n in r.by_rule.items()))
    for title, counter in (("top unrecognised templates", r.unrecognised), ("malformed (a known start, an unknown rest)", r.malformed)):
        if counter:
            lines.append(f"  {title}:")
            lines += [f"    {n:>7}  {t}" for t, n in counter.most_common(top)]
    return "\n".join(lines)


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f} %" if total else "0.0 %"


def families(reports: list[FileReport]) -> list[tuple[str, int, int]]:
    """The lines of all `reports` no rule understood, by family (their masked template): those
    no rule claims and those a rule's start claimed but whose rest it could not read (malformed:
    `--rules` takes both). (template, lines, files), most lines first: what to teach the bridge,
    biggest first."""
    lines: Counter = Counter()
    files: Counter = Counter()
    for r in reports:
        for key, n in (r.unrecognised + r.malformed).items():
            lines[key] += n
            files[key] += 1
    return [(key, n, files[key]) for key, n in lines.most_common()]


def render_families(reports: list[FileReport], top: int = 20) -> str:
    """One screen: the `top` families of lines no rule understood, across every file."""
    fams = families(reports)
    if not fams:
        return "line families not understood: none"
    shown = fams[:top]
    lines = [f"line families not understood across {len(reports)} files ({len(fams)} families; lines, files):"]
    lines += [f"  {n:>7} {f:>4}  {t}" for t, n, f in shown]
    if len(fams) > top:
        rest = fams[top:]
        lines.append(f"  {sum(n for _, n, _ in rest):>7}       … {len(rest)} more families")
    return "\n".join(lines)


def run_check(paths: list[str], out: TextIO, top: int = 10, rules=None) -> list[FileReport]:
    """One report per container stream (its rotated files and live file read as one log)."""
    reports = [check_stream(files, rules) for files in streams(paths)]
    out.write("\n\n".join(render(r, top) for r in reports) + "\n")
    if len(reports) > 1:
        total = sum(r.records for r in reports)
        known = sum(r.recognised for r in reports)
        files = sum(1 + len(r.rotated) for r in reports)
        out.write(f"\ntotal         {known}/{total} records recognised ({_pct(known, total)}) in {files} files\n")
        out.write("\n" + render_families(reports, max(top, 20)) + "\n")
    return reports
