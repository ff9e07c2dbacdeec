"""export: timelines → spans. OTLP over gRPC or HTTP, the terminal waterfall, the summary."""
