"""Uncertainty-prioritised review vs uniform review, at the same number of reviews.

Synthetic agents: each traffic item has its own accuracy p_i drawn from a mix of
difficulties (``MIXES``); its K answers are the correct one with probability p_i, else
one of ``distractors`` wrong answers (a popular wrong answer takes half of the wrong
mass). Classes are ranked by count with random tie-breaking, and the item's rank
score is the rank of the correct answer (``inf`` if it was never drawn).

Per repetition, N traffic items; ``budget`` reviews in expectation:

* uniform: pi = budget / N for every item;
* prioritised: pi_i = pi_min + (pi_max - pi_min) (1 - margin_i) (:mod:`monitor.core.priority`),
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

Reviews needed (``PriorityMatch``, one per mix): at the middle budget B of the run, the
number of reviews the prioritised design needs to match the uniform design's mean bound
width at B, and to match its RMSE. Found on the same traffic and the same review draws
as the uniform design at B (common random numbers: as the budget grows every pi_i
grows, so the reviewed sets are nested), by bisection over budgets in steps of
``MATCH_STEP``: the reported budget b reaches the target and b - MATCH_STEP does not.
``None`` when even reviewing every item would not (never seen).

Repetition ``r`` uses ``default_rng([seed, mix, budget, r])`` for both designs, where
``mix`` is the mix's index in :data:`MIXES` (so a mix gives the same numbers whichever
other mixes are run); pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from monitor.app.simulate.tables import fmt, format_table
from monitor.core.conformal import (
    effective_sample_size,
    reliability_lower_bound,
    weighted_threshold,
)

__all__ = [
    "MATCH_STEP",
    "MIXES",
    "PriorityMatch",
    "PriorityResult",
    "PriorityRow",
    "Traffic",
    "prioritised_at",
    "reference_traffic",
    "run_priority",
    "synthetic_items",
]

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


MATCH_STEP = 5
"""Budget resolution (reviews) of the reviews-needed search."""


@dataclass(frozen=True, slots=True)
class Traffic:
    """One repetition's traffic: scores, margins, fresh scores, truth and review draws."""

    scores: np.ndarray
    margins: np.ndarray
    fresh: np.ndarray
    truth: float
    draw: np.ndarray


def reference_traffic(mix: str, budget: int, r: int, *, n: int, seed: int) -> Traffic:
    """Repetition ``r`` of ``mix`` at ``budget``: the draws both designs see."""
    rng = np.random.default_rng([seed, list(MIXES).index(mix), budget, r])
    scores, margins = synthetic_items(rng, n, MIXES[mix])
    fresh, _ = synthetic_items(rng, 500, MIXES[mix])
    return Traffic(scores, margins, fresh, float(np.mean(scores <= 1)), rng.random(n))


def _estimate(
    t: Traffic, pi: np.ndarray, delta: float
) -> tuple[float, float, bool, np.ndarray, np.ndarray] | None:
    """(estimate - truth, estimate - bound, bound <= truth, reviewed scores, weights)."""
    picked = t.draw < pi
    s, w = t.scores[picked], 1.0 / pi[picked]
    if s.size == 0:
        return None
    estimate = float(w[s <= 1].sum() / w.sum())
    n_eff = effective_sample_size(w)
    bound = reliability_lower_bound(estimate * n_eff, n_eff, delta)
    return estimate - t.truth, estimate - bound, bound <= t.truth, s, w


def prioritised_at(
    traffic: Sequence[Traffic], budget: float, *, floor_share: float, delta: float
) -> tuple[float, float]:
    """(RMSE, mean bound width) of the prioritised design at ``budget`` on ``traffic``.

    A repetition in which nothing is reviewed counts as width 1 and error 1.
    """
    errors, widths = [], []
    for t in traffic:
        n = t.scores.size
        pi = _prioritised(t.margins, budget, floor_share * budget / n)
        got = _estimate(t, pi, delta)
        errors.append(1.0 if got is None else got[0])
        widths.append(1.0 if got is None else got[1])
    return float(np.sqrt(np.mean(np.square(errors)))), float(np.mean(widths))


def _reviews_needed(value: Callable[[int], float], target: float, n: int) -> int | None:
    """A budget b on the MATCH_STEP grid with value(b) <= target < value(b - MATCH_STEP),
    by bisection (the smallest such b when ``value`` falls as the budget grows); ``None``
    when even reviewing all ``n`` items does not reach the target."""
    hi = (n // MATCH_STEP) * MATCH_STEP
    if value(hi) > target:
        return None
    lo = 0  # no review at all: nothing is known (value > target)
    while hi - lo > MATCH_STEP:
        mid = lo + ((hi - lo) // (2 * MATCH_STEP)) * MATCH_STEP
        if value(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, slots=True)
class PriorityMatch:
    """Reviews the prioritised design needs to match the uniform design at ``budget``."""

    mix: str
    budget: int
    uniform_width: float
    reviews_for_width: int | None
    uniform_rmse: float
    reviews_for_rmse: int | None


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
    coverage_se: float = 0.0
    """Standard error of ``coverage``: the spread of the per-repetition coverage."""


@dataclass(frozen=True, slots=True)
class PriorityResult:
    n: int
    alpha: float
    delta: float
    reps: int
    floor_share: float
    rows: tuple[PriorityRow, ...]
    matches: tuple[PriorityMatch, ...] = ()

    def row(self, mix: str, budget: int, design: str) -> PriorityRow:
        return next(r for r in self.rows if (r.mix, r.budget, r.design) == (mix, budget, design))

    def match(self, mix: str) -> PriorityMatch:
        return next(m for m in self.matches if m.mix == mix)

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
                    "coverage_se": r.coverage_se,
                    "reviews": r.reviews,
                }
                for r in self.rows
            ],
            "reviews_needed": [
                {
                    "mix": m.mix,
                    "uniform_reviews": m.budget,
                    "uniform_width": m.uniform_width,
                    "prioritised_reviews_for_width": m.reviews_for_width,
                    "uniform_rmse": m.uniform_rmse,
                    "prioritised_reviews_for_rmse": m.reviews_for_rmse,
                    "step": MATCH_STEP,
                }
                for m in self.matches
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
        table = format_table(head, rows, title)
        if not self.matches:
            return table

        def needed(b: int | None, ref: int) -> str:
            return "> all traffic" if b is None else f"{b} ({b / ref:.2f}x)"

        head2 = [
            "mix",
            "uniform reviews",
            "bound width",
            "prioritised reviews, same width",
            "rmse",
            "prioritised reviews, same rmse",
        ]
        rows2 = [
            [
                m.mix,
                str(m.budget),
                fmt(m.uniform_width, 4),
                needed(m.reviews_for_width, m.budget),
                fmt(m.uniform_rmse, 4),
                needed(m.reviews_for_rmse, m.budget),
            ]
            for m in self.matches
        ]
        title2 = (
            "reviews the prioritised design needs to match the uniform one "
            f"(same traffic and draws, budgets in steps of {MATCH_STEP})"
        )
        return f"{table}\n\n{format_table(head2, rows2, title2)}"


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
    match: bool = True,
) -> PriorityResult:
    """The table of the module docstring; with ``match``, the reviews needed at the
    middle budget (the median of ``budgets``)."""
    rows = []
    matches = []
    match_budget = sorted(budgets)[len(budgets) // 2]
    for mix in mixes:
        for budget in budgets:
            stats: dict[str, list[tuple[float, float, bool, float, int]]] = {
                "uniform": [],
                "prioritised": [],
            }
            kept: list[Traffic] = []
            for r in range(reps):
                t = reference_traffic(mix, budget, r, n=n, seed=seed)
                uniform_rate = budget / n
                designs = {
                    "uniform": np.full(n, uniform_rate),
                    "prioritised": _prioritised(t.margins, budget, floor_share * uniform_rate),
                }
                for name, pi in designs.items():
                    got = _estimate(t, pi, delta)
                    if got is None:
                        continue
                    error, width, ok, s, w = got
                    threshold = weighted_threshold(s, w, alpha, test_weight=1.0 / pi.min())
                    covered = float(np.mean(t.fresh <= threshold))
                    stats[name].append((error, width, ok, covered, s.size))
                if match and budget == match_budget:
                    kept.append(t)
            for name, values in stats.items():
                arr = np.array(values, dtype=float)
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
                        float(arr[:, 3].std(ddof=1) / np.sqrt(len(arr))) if len(arr) > 1 else 0.0,
                    )
                )
            if kept:
                matches.append(
                    _match(
                        mix,
                        budget,
                        traffic=kept,
                        uniform=stats["uniform"],
                        floor_share=floor_share,
                        delta=delta,
                    )
                )
    return PriorityResult(n, alpha, delta, reps, floor_share, tuple(rows), tuple(matches))


def _match(
    mix: str,
    budget: int,
    *,
    traffic: Sequence[Traffic],
    uniform: Sequence[tuple[float, float, bool, float, int]],
    floor_share: float,
    delta: float,
) -> PriorityMatch:
    """Reviews the prioritised design needs for the uniform design's width and RMSE."""
    arr = np.array(uniform, dtype=float)
    rmse, width = float(np.sqrt(np.mean(arr[:, 0] ** 2))), float(arr[:, 1].mean())
    cache: dict[int, tuple[float, float]] = {}

    def at(b: int) -> tuple[float, float]:
        if b not in cache:
            cache[b] = prioritised_at(traffic, b, floor_share=floor_share, delta=delta)
        return cache[b]

    n = traffic[0].scores.size
    return PriorityMatch(
        mix,
        budget,
        width,
        _reviews_needed(lambda b: at(b)[1], width, n),
        rmse,
        _reviews_needed(lambda b: at(b)[0], rmse, n),
    )
