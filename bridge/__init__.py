"""vllm-trace-bridge: vLLM's logs → OpenTelemetry traces. Stages: tail, decode, parse, assemble, export."""

__version__ = "0.1.0"
