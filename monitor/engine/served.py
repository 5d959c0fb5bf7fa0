"""The served answer's metrics: what the users saw, beside the level's top answer.

Built by :class:`monitor.engine.metrics.Metrics` on its registry (``metrics.served``).
The two counters are counted when an item is scored (no review needed): every item whose
event carried production's answer, and of those, the ones whose served answer's class
was not the top-ranked class. The two gauges are estimates from the calibration window
(:class:`monitor.core.window.ServedSnapshot`): like the level, they do not exist while
no reviewed item of the window has a served answer (a 0 would read as "every served
answer was wrong").
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from monitor.core.window import ServedSnapshot

__all__ = ["ServedAnswerMetrics"]


class ServedAnswerMetrics:
    """``relmon_served_answer_*`` and ``relmon_served_answers_total`` (labels ``model``,
    ``task``; docs/metrics.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        mt = ("model", "task")
        self.acceptable_ratio = Gauge(
            "relmon_served_answer_acceptable_ratio",
            "Weighted share (decay, 1/pi, as the level) of the window's reviewed items with "
            "a served answer whose served answer was acceptable: what users saw.",
            mt,
            registry=registry,
        )
        self.acceptable_lower_bound = Gauge(
            "relmon_served_answer_acceptable_lower_bound",
            "One-sided Clopper-Pearson lower bound (95%) on that share, from the effective "
            "counts of those items.",
            mt,
            registry=registry,
        )
        self.answers = Counter(
            "relmon_served_answers",
            "Scored items whose event carried the answer production served.",
            mt,
            registry=registry,
        )
        self.disagreements = Counter(
            "relmon_served_answer_disagreements",
            "Scored items whose served answer's class was not the top-ranked class.",
            mt,
            registry=registry,
        )

    def init(self, model: str, task: str) -> None:
        """The counters of one (model, task) at 0 (the gauges wait for an estimate)."""
        self.answers.labels(model, task)
        self.disagreements.labels(model, task)

    def count(self, model: str, task: str, *, top: bool) -> None:
        """A scored item with a served answer; ``top``: its class was the top class."""
        self.answers.labels(model, task).inc()
        if not top:
            self.disagreements.labels(model, task).inc()

    def publish(self, model: str, task: str, served: ServedSnapshot | None) -> None:
        """The gauges of one (model, task); absent without an estimate."""
        if served is None:
            for gauge in (self.acceptable_ratio, self.acceptable_lower_bound):
                with contextlib.suppress(KeyError):
                    gauge.remove(model, task)
            return
        self.acceptable_ratio.labels(model, task).set(served.acceptable_ratio)
        self.acceptable_lower_bound.labels(model, task).set(served.lower_bound)
