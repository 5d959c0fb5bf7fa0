"""Kafka: the traffic source, the review and verdict topics, client options."""

__all__: list[str] = []
