"""OpenTelemetry: evaluation events and reliability gauges over OTLP/HTTP."""

__all__: list[str] = []
