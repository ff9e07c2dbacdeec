import gzip
import json
import os
from datetime import datetime, timezone

from bridge.decode import Decoder
from bridge.tail.source import source_for
from bridge.decode.clock import zone
from bridge.tail import read_lines

NS = 1_000_000_000


def ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp()) * NS


def test_header_line_gets_its_year_from_the_flag():
    line = b"INFO 02-15 10:23:45 scheduler.py:234] Scheduling request 0x1\n"
    r = Decoder(year=2024)(line, 100)
    assert (r.ts_ns, r.clock, r.level, r.origin) == (ns("2024-02-15T10:23:45+00:00"), "header", "INFO", "scheduler.py:234")
    assert r.message == "Scheduling request 0x1"
    assert (r.offset, r.end_offset) == (100, 100 + len(line))


def test_bracketed_header_and_carriage_return():
    r = Decoder(year=2025)(b"WARNING 04-10 03:35:45 [async_llm.py:204] Added request x.\r\n", 0)
    assert (r.level, r.origin, r.message) == ("WARNING", "async_llm.py:204", "Added request x.")


def test_year_from_mtime_and_december_to_january_rollover():
    mtime = ns("2025-01-01T00:10:00+00:00") / NS
    d = Decoder(mtime=mtime)
    a = d(b"INFO 12-31 23:59:59 a.py:1] x\n", 0)
    b = d(b"INFO 01-01 00:00:01 a.py:1] y\n", 30)
    assert a.ts_ns == ns("2024-12-31T23:59:59+00:00")
    assert b.ts_ns == ns("2025-01-01T00:00:01+00:00")


def test_a_stray_january_line_moves_only_itself_and_a_late_december_line_keeps_its_year():
    """One stray `01-01` line among December ones used to move every later line a year ahead,
    for good (found by a review); a December line written after the new year belongs to the old."""
    d = Decoder(year=2026)
    times = [d(b"INFO %s a.py:1] x\n" % stamp, i).ts_ns
             for i, stamp in enumerate((b"12-01 09:00:00", b"01-01 00:00:00", b"12-01 09:00:05", b"12-01 09:00:06"))]
    assert times == [ns("2026-12-01T09:00:00+00:00"), ns("2027-01-01T00:00:00+00:00"),
                     ns("2026-12-01T09:00:05+00:00"), ns("2026-12-01T09:00:06+00:00")]
    d = Decoder(year=2026)
    times = [d(b"INFO %s a.py:1] x\n" % stamp, i).ts_ns
             for i, stamp in enumerate((b"12-31 23:59:58", b"01-01 00:00:01", b"12-31 23:59:59", b"01-01 00:00:02"))]
    assert times == [ns("2026-12-31T23:59:58+00:00"), ns("2027-01-01T00:00:01+00:00"),
                     ns("2026-12-31T23:59:59+00:00"), ns("2027-01-01T00:00:02+00:00")]


def test_a_quiet_gap_of_months_moves_no_year():
    """A server quiet from January to August: its next line is in the same year (a review found
    the roll-back firing on any jump ahead of more than six months)."""
    d = Decoder(year=2026)
    times = [d(b"INFO %s a.py:1] x\n" % stamp, i).ts_ns for i, stamp in enumerate((b"01-20 09:00:00", b"08-25 09:00:00"))]
    assert times == [ns("2026-01-20T09:00:00+00:00"), ns("2026-08-25T09:00:00+00:00")]


def test_timezone_is_applied_to_header_stamps():
    r = Decoder(year=2024, tz=zone("Europe/Berlin"))(b"INFO 07-01 12:00:00 a.py:1] x\n", 0)
    assert r.ts_ns == ns("2024-07-01T10:00:00+00:00")


def test_cri_partial_lines_join_and_keep_the_first_stamp():
    d = Decoder(year=2024)
    assert d(b"2024-02-15T10:23:45.000000100Z stdout P INFO 02-15 10:23:45 a.py:1] Req", 0) is None
    second = b"2024-02-15T10:23:45.000000900Z stdout F uest done\n"
    r = d(second, 70)
    assert r.message == "Request done"
    assert (r.ts_ns, r.clock) == (ns("2024-02-15T10:23:45+00:00") + 100, "runtime")
    assert (r.offset, r.end_offset) == (0, 70 + len(second))
    assert d.stats.partials_joined == 1


def test_a_cri_line_with_an_empty_stamp_is_a_framing_error_not_the_epoch():
    """While no stamp was cached yet (the first one was no date), `stamp[:19]` of "" equalled the
    empty cache: the line read as 1970-01-01 on the runtime clock."""
    d = Decoder(year=2024)
    d(b"2024-13-45T10:23:45.5Z stdout F INFO 02-15 10:23:45 a.py:1] month 13\n", 0)
    assert d.framing == "cri" and d.stats.framing_errors == 1
    r = d(b" stdout F INFO 02-15 10:23:46 a.py:1] no stamp\n", 100)
    assert (r.ts_ns, r.clock) == (ns("2024-02-15T10:23:46+00:00"), "header")
    assert d.stats.framing_errors == 2


def test_docker_json_file_lines():
    d = Decoder()
    line = json.dumps({"log": "ERROR 02-15 10:23:47 memory.py:300] CUDA out of memory.\n", "stream": "stderr",
                       "time": "2024-02-15T10:23:47.5+01:00"}).encode() + b"\n"
    r = d(line, 0)
    assert d.framing == "docker"
    assert r.ts_ns == ns("2024-02-15T09:23:47+00:00") + NS // 2
    assert r.message == "CUDA out of memory."


def test_lines_without_header_are_timed_from_the_last_one_and_ansi_is_stripped():
    d = Decoder(year=2024)
    d(b"\x1b[32mINFO\x1b[0m 02-15 10:23:45 a.py:1] first\n", 0)
    r = d(b"Traceback (most recent call last):\n", 40)
    assert (r.clock, r.ts_ns, r.level) == ("anchored", ns("2024-02-15T10:23:45+00:00"), "")


def test_invalid_utf8_is_counted_not_fatal():
    d = Decoder(year=2024)
    r = d(b"INFO 02-15 10:23:45 a.py:1] caf\xe9\n", 0)
    assert r.message == "caf\ufffd" and d.stats.invalid_utf8 == 1


def test_kubelet_path_gives_kubernetes_identity():
    s = source_for("/var/log/pods/llm_vllm-0_3f2a9c1e-1111-2222-3333-444455556666/vllm/2.log")
    assert s.resource["k8s.namespace.name"] == "llm"
    assert s.resource["k8s.pod.name"] == "vllm-0"
    assert s.resource["k8s.pod.uid"] == "3f2a9c1e-1111-2222-3333-444455556666"
    assert s.resource["k8s.container.name"] == "vllm"
    assert s.resource["k8s.container.restart_count"] == 2
    assert s.key == "k8s/llm/vllm-0/3f2a9c1e-1111-2222-3333-444455556666/vllm"


def test_gzip_rotated_files_are_read_through(tmp_path):
    p = tmp_path / "0.log.20240215-102345.gz"
    with gzip.open(p, "wb") as f:
        f.write(b"a\nbb\nccc")
    assert list(read_lines(str(p))) == [(0, b"a\n"), (2, b"bb\n"), (5, b"ccc")]
    assert os.path.exists(p)


def test_a_runtime_stamp_read_after_the_headers_second_is_bounded_by_it():
    """vLLM stamps its header when it makes the record; the runtime stamps the line when it reads
    vLLM's pipe, on a loaded machine over a second later (soak 4009: header `17:59:00`, stamped
    `17:59:01.662`, the client's send at 00.747). The line was written by the header's second's
    end; a stamp inside that second, ahead of it, or a zone apart is kept as it is."""
    head = "(APIServer pid=1) INFO 12-03 17:59:00 [async_llm.py:578] Added request a.\n"

    def at(stamp: str) -> tuple[int, str]:
        d = Decoder(year=2026)
        d(b"2026-12-03T17:58:59.000000000Z stdout F INFO 12-03 17:58:59 [x.py:1] first\n", 0)
        r = d(f"{stamp} stdout F {head}".encode(), 100)
        return r.ts_ns, r.clock

    second = ns("2026-12-03T17:59:00+00:00")
    assert at("2026-12-03T17:59:01.662483047Z") == (second + NS - 1, "runtime")
    assert at("2026-12-03T17:59:00.250000000Z") == (second + NS // 4, "runtime")
    assert at("2026-12-03T17:58:59.900000000Z") == (second - NS // 10, "runtime")
    assert at("2026-12-03T18:59:01.000000000Z") == (second + 3601 * NS, "runtime")   # a zone apart
