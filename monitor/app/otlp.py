"""``traffic.otlp``: the OTLP/HTTP receiver built from settings and started beside the
other sources (docs/opentelemetry.md, "Traces as a source")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from adapters.otlp.intake import SOURCE, OtlpIntake
from adapters.otlp.receiver import OtlpReceiver
from monitor.config import Settings
from monitor.engine.metrics import Metrics
from monitor.engine.ports import Source
from monitor.engine.service import MonitorService

__all__ = ["kafka_span_options", "start_otlp"]

Listen = Callable[[str, str, int, Callable[[], Awaitable[None]]], Awaitable[None]]


def kafka_span_options(service: MonitorService) -> dict[str, Any]:
    """What the Kafka source needs to read events of ``"format": "otlp"`` as the
    receiver reads spans: where to count an inference span without content
    (``unmonitored``), and the attributes some task matches on."""
    return {
        "count_api": service.admission.count_api,
        "attribute_keys": service.router.attribute_keys,
    }


async def start_otlp(
    settings: Settings,
    service: MonitorService,
    metrics: Metrics,
    sources: list[Source],
    listen: Listen,
) -> OtlpReceiver:
    """Start the receiver on ``traffic.otlp.host:port`` (``listen`` names a taken port);
    it joins ``sources``, so it is supervised, reported by ``/readyz`` and stopped with
    them (every span it holds then read and offered)."""
    otlp = settings.traffic.otlp
    metrics.init_source(SOURCE)
    metrics.otlp.init()
    admission = service.admission
    intake = OtlpIntake(
        service.offer,
        service.reject,
        admission.count,
        admission.count_api,
        metrics.otlp,
        attribute_keys=service.router.attribute_keys,
        join_s=otlp.join_s,
        max_waiting_spans=otlp.max_waiting_spans,
        queue_size=otlp.queue_size,
    )
    receiver = OtlpReceiver(
        intake,
        host=otlp.host,
        port=otlp.port,
        max_body_bytes=otlp.max_body_bytes,
        forward_to=otlp.forward_to,
        forward_timeout_s=otlp.forward_timeout_s,
    )
    sources.append(receiver)  # stopped with them, even if its start fails
    await listen("traffic.otlp", otlp.host, otlp.port, receiver.start)
    return receiver
