"""The encoded bytes travel through the SDK exporters unchanged, with what the exporters add
(compression here; retry is in test_wire.py)."""

from __future__ import annotations

import io

import pytest
from receivers import GrpcReceiver, HttpReceiver

from bridge.cli import main
from bridge.synth import SynthConfig, write_file


@pytest.mark.parametrize("protocol,receiver", [("grpc", GrpcReceiver), ("http/protobuf", HttpReceiver)])
def test_gzip_compression_from_the_standard_variable(tmp_path, monkeypatch, protocol, receiver):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    path = str(tmp_path / "seed.log")
    truth = write_file(path, SynthConfig(requests=20, seed=5))
    with receiver() as rx:
        out = io.StringIO()
        code = main(["replay", path, "--otlp-endpoint", rx.endpoint, "--protocol", protocol], env={}, out=out)
    assert code == 0, out.getvalue()
    roots = [s for _, s in rx.spans() if s.name == "vllm.request"]
    assert len(roots) == len(truth.requests)
