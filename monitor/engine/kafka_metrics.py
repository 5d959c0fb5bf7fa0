"""The Kafka consumers' metrics (adapters/kafka; docs/metrics.md, "Kafka")."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["KafkaMetrics"]


class KafkaMetrics:
    """``relmon_kafka_consumer_lag{topic,partition}`` and
    ``relmon_kafka_offset_resets_total{topic}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.consumer_lag = Gauge(
            "relmon_kafka_consumer_lag",
            "Records behind the log end, per topic and partition.",
            ("topic", "partition"),
            registry=registry,
        )
        self.offset_resets = Counter(
            "relmon_kafka_offset_resets",
            "Positions of a Kafka consumer found past their partition's log end (the broker "
            "lost its data or the topic was recreated) and reset: per "
            "kafka.auto_offset_reset on the traffic topic, to the start on the review and "
            "verdict topics.",
            ("topic",),
            registry=registry,
        )

    def init(self, topics: Iterable[str]) -> None:
        """Each followed topic's ``relmon_kafka_offset_resets_total`` at 0."""
        for topic in topics:
            self.offset_resets.labels(topic)
