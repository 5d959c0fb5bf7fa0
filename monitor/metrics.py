"""Prometheus metrics, built in one place from a registry that is passed in.

Names and labels follow DESIGN §3. No prompt or answer text ever goes into a label:
label values are model names, task names, alphas, sources and fixed enumerations.
``relmon_set_size`` observes the set size at the task's target level
alpha = 1 - reliability_target (one histogram per model and task, as §3 fixes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from monitor.window import WindowSnapshot

__all__ = ["Metrics"]


def _rank_buckets(k_max: int) -> list[float]:
    return [float(b) for b in range(1, k_max + 1)]


class Metrics:
    def __init__(self, registry: CollectorRegistry, *, k_max: int = 20) -> None:
        mt = ("model", "task")
        self.reliability_level = Gauge(
            "relmon_reliability_level",
            "Weighted conformal reliability level 1 - alpha*: mass of calibration items whose "
            "top answer was accepted.",
            mt,
            registry=registry,
        )
        self.reliability_lower_bound = Gauge(
            "relmon_reliability_lower_bound",
            "One-sided Clopper-Pearson lower bound (95%) on P(top answer acceptable) from the "
            "effective calibration counts.",
            mt,
            registry=registry,
        )
        self.reliability_target = Gauge(
            "relmon_reliability_target",
            "The task's configured reliability target (SLO).",
            mt,
            registry=registry,
        )
        self.conformal_threshold = Gauge(
            "relmon_conformal_threshold",
            "Conformal threshold M* at level alpha: the top-M* answers cover an acceptable one "
            "with probability >= 1 - alpha (+Inf: no finite set does).",
            (*mt, "alpha"),
            registry=registry,
        )
        self.calibration_items = Gauge(
            "relmon_calibration_items",
            "Scored verdicts in the calibration window.",
            mt,
            registry=registry,
        )
        self.calibration_effective_items = Gauge(
            "relmon_calibration_effective_items",
            "Effective size (sum w)^2 / sum w^2 of the decayed, inclusion-weighted window.",
            mt,
            registry=registry,
        )
        self.set_size = Histogram(
            "relmon_set_size",
            "Prediction set size at the task's target alpha, per monitored item.",
            mt,
            buckets=_rank_buckets(k_max),
            registry=registry,
        )
        self.samples_per_item = Histogram(
            "relmon_samples_per_item",
            "Model samples used per monitored item (sequential stopping).",
            mt,
            buckets=_rank_buckets(k_max),
            registry=registry,
        )
        self.model_calls = Counter(
            "relmon_model_calls",
            "Calls to the model endpoint by outcome.",
            (*mt, "outcome"),
            registry=registry,
        )
        self.traffic_events = Counter(
            "relmon_traffic_events",
            "Traffic events by source and what relmon did with them.",
            ("source", "decision"),
            registry=registry,
        )
        self.items = Counter(
            "relmon_items",
            "Sampled items by outcome: scored, or abandoned after failed model calls.",
            (*mt, "outcome"),
            registry=registry,
        )
        self.review_queue_depth = Gauge(
            "relmon_review_queue_depth",
            "Review items waiting for a verdict.",
            mt,
            registry=registry,
        )
        self.reviews = Counter(
            "relmon_reviews",
            "Verdicts received: accepted (a candidate), none (none of these), duplicate, "
            "unknown (no such item), invalid.",
            (*mt, "verdict"),
            registry=registry,
        )

    def publish(
        self, model: str, task: str, snapshot: WindowSnapshot, alphas: Sequence[float]
    ) -> None:
        """Set the window gauges of one (model, task)."""
        self.reliability_level.labels(model, task).set(snapshot.reliability_level)
        self.reliability_lower_bound.labels(model, task).set(snapshot.reliability_lower_bound)
        self.calibration_items.labels(model, task).set(snapshot.n)
        self.calibration_effective_items.labels(model, task).set(snapshot.n_eff)
        for alpha in alphas:
            value = snapshot.thresholds.get(alpha, math.inf)
            self.conformal_threshold.labels(model, task, f"{alpha:g}").set(value)
