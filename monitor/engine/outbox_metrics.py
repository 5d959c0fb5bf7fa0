"""The review outbox's metrics (:mod:`monitor.engine.outbox`; docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ReviewOutboxMetrics"]


class ReviewOutboxMetrics:
    """``relmon_review_outbox_items``, ``relmon_review_outbox_dropped_total`` (labels
    ``model``, ``task``) and ``relmon_review_outbox_unreadable_total``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        mt = ("model", "task")
        self.items = Gauge(
            "relmon_review_outbox_items",
            "Scored review items waiting in the review outbox for the review queue to take "
            "them (counted as waiting for review).",
            mt,
            registry=registry,
        )
        self.dropped = Counter(
            "relmon_review_outbox_dropped",
            "Scored review items lost because the review outbox was full "
            "(review.outbox_max_items): never shown to a reviewer.",
            mt,
            registry=registry,
        )
        self.unreadable = Counter(
            "relmon_review_outbox_unreadable",
            "Records of the on-disk review outbox that could not be read at start (set "
            "aside as *.unreadable, not written).",
            registry=registry,
        )

    def init(self, model: str, task: str) -> None:
        """A task's series at 0."""
        self.items.labels(model, task)
        self.dropped.labels(model, task)
