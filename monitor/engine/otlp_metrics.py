"""The OTLP receiver's metrics (adapters/otlp; docs/metrics.md, "Traces as a source")."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter

from monitor.core.traces.shapes import OUTCOMES, SHAPES

__all__ = ["LOG_RECORD_OUTCOMES", "REFUSED_STATUSES", "OtlpMetrics"]

LOG_RECORD_OUTCOMES: Final = ("taken", "ignored", "rejected", "dropped")
"""``relmon_otlp_log_records_total{outcome}`` values."""
REFUSED_STATUSES: Final = ("400", "413", "415", "429", "503")
"""``relmon_otlp_requests_refused_total{status}`` values."""


class OtlpMetrics:
    """``relmon_otlp_spans_total{shape,outcome}``, ``relmon_otlp_log_records_total{outcome}``
    and ``relmon_otlp_requests_refused_total{status}``, created when the receiver starts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.spans = Counter(
            "relmon_otlp_spans",
            "Spans the OTLP receiver took, by shape (genai, genai_events, openinference, "
            "openllmetry, other) and outcome: read (a traffic event), no_content (an "
            "inference span without messages: content capture off), not_inference, "
            "rejected (messages cut or of another schema, no model).",
            ("shape", "outcome"),
            registry=registry,
        )
        self.log_records = Counter(
            "relmon_otlp_log_records",
            "GenAI log records the OTLP receiver took, by outcome: taken (held to be "
            "joined to their span), ignored (not a gen_ai event), rejected (naming no span), "
            "dropped (taken, but their span never came within traffic.otlp.join_s, or past "
            "the bounds).",
            ("outcome",),
            registry=registry,
        )
        self.requests_refused = Counter(
            "relmon_otlp_requests_refused",
            "Requests the OTLP receiver refused whole, by the status it answered: 400 (a "
            "body that does not decode), 413 (past traffic.otlp.max_body_bytes, as sent or "
            "gunzipped), 415 (another content type or encoding), 429 (no room: the exporter "
            "retries), 503 (relmon stopping). Counted with forward_to too, whose answer the "
            "client gets instead.",
            ("status",),
            registry=registry,
        )

    def init(self) -> None:
        """Every series at 0."""
        for shape in SHAPES:
            for outcome in OUTCOMES:
                self.spans.labels(shape, outcome)
        for outcome in LOG_RECORD_OUTCOMES:
            self.log_records.labels(outcome)
        for status in REFUSED_STATUSES:
            self.requests_refused.labels(status)
