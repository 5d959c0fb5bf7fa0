"""The ``otel`` keys: evaluation results and reliability gauges over OTLP/HTTP.

Off by default. When on, every verdict stored by this replica becomes an OpenTelemetry
``gen_ai.evaluation.result`` event and the reliability gauges are exported as OTel
metrics, both over OTLP/HTTP to ``otel.endpoint`` (a Collector, or any OTLP receiver).
Headers (an API key, a tenant) come from ``otel.headers_file``, a mounted Secret in the
``OTEL_EXPORTER_OTLP_HEADERS`` format: ``key=value`` pairs separated by commas or lines.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from monitor.config.secrets import read_secret
from monitor.core.errors import ConfigError

__all__ = ["OtelSettings", "parse_otlp_headers"]


def parse_otlp_headers(text: str, where: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (commas or new lines; ``#`` starts a comment line)."""
    headers: dict[str, str] = {}
    for raw in text.replace("\n", ",").split(","):
        part = raw.strip()
        if not part or part.startswith("#"):
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            # The value may hold a token: name the position, never the text.
            raise ConfigError(f"{where}: expected key=value pairs, entry {len(headers) + 1} is not")
        headers[key.strip()] = value.strip()
    return headers


class OtelSettings(BaseModel):
    """``otel``: OpenTelemetry export (off unless ``enabled``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318"
    """OTLP/HTTP base URL; ``/v1/logs`` and ``/v1/metrics`` are appended."""
    headers_file: Path | None = None
    export_interval_s: float = Field(15.0, gt=0, le=3600)
    """How often the reliability gauges are exported."""
    timeout_s: float = Field(10.0, gt=0, le=120)
    service_name: str = Field("relmon", min_length=1)

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ValueError("must be an http(s) URL such as http://otel-collector:4318")
        return v.rstrip("/")

    def resolved_headers(self) -> dict[str, str]:
        if self.headers_file is None:
            return {}
        return parse_otlp_headers(
            read_secret(self.headers_file, "otel.headers_file"), "otel.headers_file"
        )
