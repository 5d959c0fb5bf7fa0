"""A minimum review rate per segment (``segments.min_reviews_per_hour``, DESIGN.md §6
"Reliability per segment"): no segment is starved of reviews by a large one.

**The rule** (:func:`raised_inclusion_probability`, pure). For each (task, segment label)
:class:`SegmentReviewRates` keeps two decayed sums over the segment's scored items: the
items (so ``r`` items per hour) and their own inclusion probabilities, the task's π
(so ``E`` expected reviews per hour without the minimum). When ``E`` falls short of the
minimum ``m``, an item of that segment is reviewed with

    π' = π + (1 − π) · q,   q = min(1, (m − E) / (r − E))

(as if it were drawn first with π, then, if not taken, again with q): the segment's
expected reviews per hour are then ``E + (r − E) · q = m`` (all of them, when the segment
has fewer than ``m`` items an hour), items the task's priority reviews more stay reviewed
more, and π ≤ π' ≤ 1. With ``review_priority: uniform`` this is ``π' = m / r``. A segment
whose own rate already gives ``m`` reviews an hour keeps π unchanged, so a large segment's
reviews are not touched.

**Known inclusion probabilities.** π' depends only on the item's ranking (as π does) and
on the counts of the segment's earlier *scored* items, never on which items were drawn or
on a verdict; it is the probability stored with the review item and weighted 1/π' in the
windows, so the task's (marginal) level and every segment's stay unbiased. Since π' ≥ π
≥ ``review_floor``, the window's test weight (1 / ``review_floor``) still bounds every
item's weight.

**The rates** decay with a one-hour time constant on the engine clock: a count
``c ← c·e^(−Δt/τ) + 1`` per item. For a steady segment it tends to ``r·τ``; it is divided
by ``τ·(1 − e^(−t/τ))``, ``t`` the time since the tracker saw its first item (of any
segment, so a segment that appears late is not taken for a busy one), and at least
``min_span_s``, so the first items after a start are not taken for a burst. The counts
are this process's own: with several replicas each sees its share of the traffic and
raises π for it, so the segment gets at least ``m`` reviews an hour in all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SegmentReviewRates", "raised_inclusion_probability"]

HOUR_S = 3600.0


def raised_inclusion_probability(
    pi: float,
    *,
    items_per_hour: float,
    expected_reviews_per_hour: float,
    min_reviews_per_hour: float,
) -> float:
    """The inclusion probability of an item of a segment with ``items_per_hour`` items
    and ``expected_reviews_per_hour`` reviews at the task's own π (``pi`` for this item),
    so that the segment is expected to get ``min_reviews_per_hour`` (see the module).
    Never below ``pi``, never above 1."""
    shortfall = min_reviews_per_hour - expected_reviews_per_hour
    if shortfall <= 0.0 or items_per_hour <= 0.0 or pi >= 1.0:
        return pi
    room = items_per_hour - expected_reviews_per_hour  # items an hour not reviewed
    q = 1.0 if room <= shortfall else shortfall / room
    return min(1.0, max(pi, pi + (1.0 - pi) * q))


@dataclass(slots=True)
class _Rate:
    items: float = 0.0  # decayed count of scored items
    pis: float = 0.0  # decayed sum of their own (task) inclusion probabilities
    at: float = 0.0  # when last updated


class SegmentReviewRates:
    """A task's scored items and expected reviews per segment label, decayed (see the
    module), and the raised inclusion probability of the next item.

    ``max_labels`` bounds the labels kept: beyond it, the quietest are forgotten (a label
    that comes back starts from nothing, which only raises its π for a while).
    """

    def __init__(
        self,
        min_reviews_per_hour: float,
        *,
        time_constant_s: float = HOUR_S,
        min_span_s: float = 60.0,
        max_labels: int = 64,
    ) -> None:
        self.min_reviews_per_hour = min_reviews_per_hour
        self.tau = time_constant_s
        self.min_span_s = min_span_s
        self.max_labels = max_labels
        self._rates: dict[str, _Rate] = {}
        self._since: float | None = None

    def __len__(self) -> int:
        return len(self._rates)

    def inclusion_probability(self, label: str, pi: float, now: float) -> float:
        """Count a scored item of segment ``label`` whose own inclusion probability is
        ``pi``, at ``now`` (engine clock, seconds); its inclusion probability with the
        segment's minimum review rate."""
        if self._since is None:
            self._since = now
        rate = self._rates.get(label)
        if rate is None:
            if len(self._rates) >= self.max_labels:
                self._forget_quietest(now)
            rate = self._rates[label] = _Rate(at=now)
        decay = math.exp(-max(0.0, now - rate.at) / self.tau)
        rate.items = rate.items * decay + 1.0
        rate.pis = rate.pis * decay + pi
        rate.at = max(rate.at, now)
        if self.min_reviews_per_hour <= 0.0:
            return pi
        per_hour = HOUR_S / self._span(now)
        return raised_inclusion_probability(
            pi,
            items_per_hour=rate.items * per_hour,
            expected_reviews_per_hour=rate.pis * per_hour,
            min_reviews_per_hour=self.min_reviews_per_hour,
        )

    def items_per_hour(self, label: str, now: float) -> float:
        """The segment's estimated scored items per hour at ``now`` (0: none seen)."""
        rate = self._rates.get(label)
        if rate is None or self._since is None:
            return 0.0
        decay = math.exp(-max(0.0, now - rate.at) / self.tau)
        return rate.items * decay * HOUR_S / self._span(now)

    def _span(self, now: float) -> float:
        """The seconds a decayed count stands for: τ, less at first (bias-corrected)."""
        elapsed = max(0.0, now - (self._since if self._since is not None else now))
        return max(self.min_span_s, self.tau * -math.expm1(-elapsed / self.tau))

    def _forget_quietest(self, now: float) -> None:
        def weight(label: str) -> float:
            rate = self._rates[label]
            return rate.items * math.exp(-max(0.0, now - rate.at) / self.tau)

        del self._rates[min(self._rates, key=weight)]
