"""synth: logs written from a known ground truth (tests, benchmarks, the shipped sample)."""

from bridge.synth.seed import SynthConfig, Truth, TruthIncident, TruthRequest, generate, write, write_file

__all__ = ["SynthConfig", "Truth", "TruthIncident", "TruthRequest", "generate", "write", "write_file"]
