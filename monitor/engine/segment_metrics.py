"""The per-segment calibration's metrics (DESIGN.md §6 "Reliability per segment").

Built by :class:`monitor.engine.metrics.Metrics` on its registry (``metrics.segments``).
Labels ``model``, ``task``, ``segment`` (and ``alpha`` for the thresholds). The label
values of ``segment`` are the segment values stored with the verdicts of the task's
window (:attr:`monitor.engine.ports.CalibrationRecord.segment`) that have a label of
their own at export time, and ``other`` for the rest, chosen from those verdicts alone
(:mod:`monitor.engine.segments`), so that every replica exports the same series; a
label's series exist while it has verdicts and a label. Like the task's level, they do
not exist before the segment's first verdict: a 0 would read as "reliability 0".
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge

from monitor.core.window import WindowSnapshot

__all__ = ["SegmentMetrics"]


class SegmentMetrics:
    """``relmon_segment_*`` (docs/metrics.md, "Segments")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        mts = ("model", "task", "segment")
        self.reliability_level = Gauge(
            "relmon_segment_reliability_level",
            "Weighted conformal reliability level 1 - alpha* of one segment's calibration "
            "window (Mondrian: the segment's verdicts only).",
            mts,
            registry=registry,
        )
        self.reliability_lower_bound = Gauge(
            "relmon_segment_reliability_lower_bound",
            "One-sided Clopper-Pearson lower bound (95%) on P(top answer acceptable) in one "
            "segment, from its effective calibration counts.",
            mts,
            registry=registry,
        )
        self.calibration_items = Gauge(
            "relmon_segment_calibration_items",
            "Scored verdicts in one segment's calibration window.",
            mts,
            registry=registry,
        )
        self.conformal_threshold = Gauge(
            "relmon_segment_conformal_threshold",
            "Conformal threshold M* at level alpha in one segment: the top-M* answers cover an "
            "acceptable one with probability >= 1 - alpha within the segment (+Inf: no "
            "finite set does).",
            (*mts, "alpha"),
            registry=registry,
        )
        self.reliability_alarm_evalue = Gauge(
            "relmon_segment_reliability_alarm_evalue",
            "E-detector statistic for 'reliability below target' in one segment (anytime-"
            "valid; the alarm fires at m/alpha_alarm, m = segments.max + 2: the false-alarm "
            "rate is held over all segments of the task together).",
            mts,
            registry=registry,
        )
        self.reliability_alarm = Gauge(
            "relmon_segment_reliability_alarm",
            "1 while the anytime-valid reliability alarm of one segment is raised, else 0.",
            mts,
            registry=registry,
        )

    def publish(
        self,
        model: str,
        task: str,
        segment: str,
        snapshot: WindowSnapshot,
        alphas: Sequence[float],
    ) -> None:
        """The gauges of one segment's window (an empty one has none)."""
        if snapshot.n <= 0:
            self.remove(model, task, segment, alphas)
            return
        self.reliability_level.labels(model, task, segment).set(snapshot.reliability_level)
        self.reliability_lower_bound.labels(model, task, segment).set(
            snapshot.reliability_lower_bound
        )
        self.calibration_items.labels(model, task, segment).set(snapshot.n)
        for alpha in alphas:
            value = snapshot.thresholds.get(alpha, math.inf)
            self.conformal_threshold.labels(model, task, segment, f"{alpha:g}").set(value)

    def publish_alarm(self, model: str, task: str, segment: str, value: float, alarm: bool) -> None:
        """One segment's alarm: its statistic, and 1 while raised."""
        self.reliability_alarm_evalue.labels(model, task, segment).set(value)
        self.reliability_alarm.labels(model, task, segment).set(1.0 if alarm else 0.0)

    def remove(self, model: str, task: str, segment: str, alphas: Sequence[float]) -> None:
        """Every series of one segment gone (it left the task's window)."""
        for gauge in (
            self.reliability_level,
            self.reliability_lower_bound,
            self.calibration_items,
            self.reliability_alarm_evalue,
            self.reliability_alarm,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(model, task, segment)
        for alpha in alphas:
            with contextlib.suppress(KeyError):
                self.conformal_threshold.remove(model, task, segment, f"{alpha:g}")
