"""Uncertainty-prioritised review vs uniform review, at the same number of reviews.

Synthetic agents: each traffic item has its own accuracy p_i drawn from a mix of
difficulties (``MIXES``); its K answers are the correct one with probability p_i, else
one of ``distractors`` wrong answers (a popular wrong answer takes half of the wrong
mass). Classes are ranked by count with random tie-breaking, and the item's rank
score is the rank of the correct answer (``inf`` if it was never drawn).

Per repetition, N traffic items; ``budget`` reviews in expectation:

* uniform: pi = budget / N for every item;
* prioritised: pi_i = pi_min + (pi_max - pi_min) (1 - margin_i) (:mod:`monitor.priority`),
  pi_min = ``floor_share`` x budget / N, pi_max chosen from the margins alone so that
  sum pi_i = budget.

Reviewed items enter the calibration with weights 1/pi (test weight 1/pi_min).
Reported, against the truth (the traffic's own share of items with score 1):

* ``rmse``: root mean squared error of the weighted reliability estimate;
* ``width``: estimate minus the window's lower bound (Clopper-Pearson at 1 - delta on
  Kish's effective size, as the service computes it);
* ``bound ok``: share of repetitions where the lower bound is below the truth;
* ``coverage``: share of fresh traffic items whose score is within the weighted
  threshold M*(alpha): the conformal guarantee, which must stay >= 1 - alpha.

Repetition ``r`` uses ``default_rng([seed, mix, budget, r])`` for both designs; pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from monitor.conformal import (
    effective_sample_size,
    reliability_lower_bound,
    weighted_threshold,
)
from monitor.simulate.tables import fmt, format_table

__all__ = ["MIXES", "PriorityResult", "PriorityRow", "run_priority", "synthetic_items"]

MIXES: dict[str, tuple[tuple[float, float], ...]] = {
    # (share of traffic, accuracy) pairs
    "mostly easy": ((0.7, 0.95), (0.2, 0.6), (0.1, 0.3)),
    "balanced": ((0.4, 0.9), (0.3, 0.6), (0.3, 0.35)),
    "all hard": ((0.5, 0.45), (0.5, 0.3)),
    "uniform difficulty": ((1.0, 0.7),),
}


def synthetic_items(
    rng: np.random.Generator,
    n: int,
    mix: Sequence[tuple[float, float]],
    *,
    k: int = 10,
    distractors: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    """(rank scores, margins) of ``n`` items: label-free margin, labelled score."""
    shares = np.array([s for s, _ in mix])
    accs = np.array([a for _, a in mix])
    p = accs[rng.choice(len(mix), size=n, p=shares / shares.sum())]
    wrong = np.array([0.5] + [0.5 / (distractors - 1)] * (distractors - 1))
    scores = np.empty(n)
    margins = np.empty(n)
    for i in range(n):
        probs = np.concatenate([[p[i]], (1 - p[i]) * wrong])
        counts = rng.multinomial(k, probs)
        order = np.lexsort((rng.random(counts.size), -counts))  # by count, random ties
        ranked = counts[order]
        margins[i] = (ranked[0] - (ranked[1] if ranked.size > 1 else 0)) / k
        scores[i] = float(np.flatnonzero(order == 0)[0] + 1) if counts[0] > 0 else math.inf
    return scores, margins


def _prioritised(margins: np.ndarray, budget: float, floor: float) -> np.ndarray:
    """pi = floor + (ceil - floor)(1 - margin), ceil found so that sum pi = budget."""
    u = 1.0 - margins
    lo, hi = floor, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.minimum(1.0, floor + (mid - floor) * u).sum() < budget:
            lo = mid
        else:
            hi = mid
    pi: np.ndarray = np.minimum(1.0, floor + (hi - floor) * u)
    return pi


@dataclass(frozen=True, slots=True)
class PriorityRow:
    mix: str
    budget: int
    design: str
    rmse: float
    width: float
    bound_ok: float
    coverage: float
    reviews: float


@dataclass(frozen=True, slots=True)
class PriorityResult:
    n: int
    alpha: float
    delta: float
    reps: int
    floor_share: float
    rows: tuple[PriorityRow, ...]

    def row(self, mix: str, budget: int, design: str) -> PriorityRow:
        return next(r for r in self.rows if (r.mix, r.budget, r.design) == (mix, budget, design))

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "priority",
            "traffic_items": self.n,
            "alpha": self.alpha,
            "delta": self.delta,
            "reps": self.reps,
            "floor_share": self.floor_share,
            "rows": [
                {
                    "mix": r.mix,
                    "budget": r.budget,
                    "design": r.design,
                    "rmse": r.rmse,
                    "width": r.width,
                    "bound_ok": r.bound_ok,
                    "coverage": r.coverage,
                    "reviews": r.reviews,
                }
                for r in self.rows
            ],
        }

    def table(self) -> str:
        head = ["mix", "reviews", "design", "rmse", "bound width", "bound ok", "coverage"]
        rows = [
            [
                r.mix,
                fmt(r.reviews, 0),
                r.design,
                fmt(r.rmse, 4),
                fmt(r.width, 4),
                fmt(r.bound_ok, 3),
                fmt(r.coverage, 4),
            ]
            for r in self.rows
        ]
        title = (
            f"prioritised vs uniform review: {self.n} traffic items, alpha {self.alpha:g} "
            f"(coverage must be >= {1 - self.alpha:g}), bound at 1 - {self.delta:g}, "
            f"pi_min = {self.floor_share:g} x the uniform rate, {self.reps} repetitions"
        )
        return format_table(head, rows, title)


def run_priority(
    *,
    mixes: Sequence[str] = tuple(MIXES),
    budgets: Sequence[int] = (100, 200, 400),
    n: int = 2000,
    alpha: float = 0.1,
    delta: float = 0.05,
    floor_share: float = 0.2,
    reps: int = 100,
    seed: int = 0,
) -> PriorityResult:
    rows = []
    for mi, mix in enumerate(mixes):
        for budget in budgets:
            stats: dict[str, list[tuple[float, float, bool, float, int]]] = {
                "uniform": [],
                "prioritised": [],
            }
            for r in range(reps):
                rng = np.random.default_rng([seed, mi, budget, r])
                scores, margins = synthetic_items(rng, n, MIXES[mix])
                fresh, _ = synthetic_items(rng, 500, MIXES[mix])
                truth = float(np.mean(scores <= 1))
                uniform_rate = budget / n
                designs = {
                    "uniform": np.full(n, uniform_rate),
                    "prioritised": _prioritised(margins, budget, floor_share * uniform_rate),
                }
                draw = rng.random(n)
                for name, pi in designs.items():
                    picked = draw < pi
                    s, w = scores[picked], 1.0 / pi[picked]
                    if s.size == 0:
                        continue
                    estimate = float(w[s <= 1].sum() / w.sum())
                    n_eff = effective_sample_size(w)
                    bound = reliability_lower_bound(estimate * n_eff, n_eff, delta)
                    threshold = weighted_threshold(s, w, alpha, test_weight=1.0 / pi.min())
                    covered = float(np.mean(fresh <= threshold))
                    stats[name].append(
                        (estimate - truth, estimate - bound, bound <= truth, covered, s.size)
                    )
            for name, values in stats.items():
                arr = np.array([(e, wd, ok, c, m) for e, wd, ok, c, m in values], dtype=float)
                rows.append(
                    PriorityRow(
                        mix,
                        budget,
                        name,
                        float(np.sqrt(np.mean(arr[:, 0] ** 2))),
                        float(arr[:, 1].mean()),
                        float(arr[:, 2].mean()),
                        float(arr[:, 3].mean()),
                        float(arr[:, 4].mean()),
                    )
                )
    return PriorityResult(n, alpha, delta, reps, floor_share, tuple(rows))
