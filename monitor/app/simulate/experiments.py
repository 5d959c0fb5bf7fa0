"""The paper's synthetic experiments (appendix C), run through the real core.

Each experiment samples answers from synthetic agents (:mod:`monitor.app.simulate.agents`),
ranks them with :func:`monitor.core.consensus.rank_classes`, scores them with
:mod:`monitor.core.scores` and calibrates with :mod:`monitor.core.conformal`. Each is a pure
function of its arguments and a ``numpy.random.Generator`` and returns a frozen result
with ``as_dict()`` (JSON-ready) and ``table()`` (plain text). The experiments are
split over modules to keep each one short and re-exported here:
``variance`` and ``canon`` in :mod:`monitor.app.simulate.mode_error`, ``stopping`` in
:mod:`monitor.app.simulate.sequential`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from monitor.app.simulate.agents import (
    ACCEPTABLE,
    dirichlet_items,
    draw_counts,
    rank_items,
    varied_entropy_items,
)
from monitor.app.simulate.mode_error import CanonResult, VarianceResult, run_canon, run_variance
from monitor.app.simulate.sequential import (
    StoppingGridResult,
    StoppingResult,
    run_stopping,
    run_stopping_grid,
)
from monitor.app.simulate.tables import fmt, format_table, json_number, lower_median, pearson_r
from monitor.core.conformal import conformal_threshold, conformal_thresholds, reliability_level
from monitor.core.consensus import Consensus
from monitor.core.scores import item_score, rank_score, set_size

__all__ = [
    "COVERAGE_ALPHAS",
    "SETSIZE_P_STARS",
    "CanonResult",
    "CoverageCell",
    "CoverageResult",
    "EntropyResult",
    "SetSizeCell",
    "SetSizeResult",
    "StoppingGridResult",
    "StoppingResult",
    "VarianceResult",
    "run_canon",
    "run_coverage",
    "run_entropy",
    "run_setsize",
    "run_stopping",
    "run_stopping_grid",
    "run_variance",
]

COVERAGE_ALPHAS = (0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
DEFAULT_P_STARS = (0.6, 0.7, 0.8)
SETSIZE_P_STARS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

_ACC = frozenset({ACCEPTABLE})


def _scored_batch(
    rng: np.random.Generator, items: np.ndarray, k: int
) -> tuple[list[Consensus], np.ndarray]:
    cons = rank_items(draw_counts(rng, items, k), rng)
    return cons, np.array([rank_score(c, _ACC) for c in cons])


# --------------------------------------------------------------------------- coverage


@dataclass(frozen=True, slots=True)
class CoverageCell:
    p_star: float
    alpha: float
    coverage_mean: float
    coverage_min: float
    coverage_max: float
    set_size_mean: float
    m_star_median: float

    @property
    def target(self) -> float:
        return 1.0 - self.alpha

    @property
    def ok(self) -> bool:
        return self.coverage_mean >= self.target - 1e-12


@dataclass(frozen=True, slots=True)
class CoverageResult:
    """Theorem 6.7 (marginal coverage): mean test coverage over ``reps`` fresh splits."""

    cells: tuple[CoverageCell, ...]
    reliability: tuple[tuple[float, float], ...]  # (p*, mean reliability level 1 - alpha*)
    n_cal: int
    n_test: int
    k: int
    reps: int

    @property
    def all_ok(self) -> bool:
        return all(c.ok for c in self.cells)

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "coverage",
            "n_cal": self.n_cal,
            "n_test": self.n_test,
            "k": self.k,
            "reps": self.reps,
            "all_ok": self.all_ok,
            "reliability_level": {str(p): r for p, r in self.reliability},
            "cells": [
                {
                    "p_star": c.p_star,
                    "alpha": c.alpha,
                    "target": c.target,
                    "coverage_mean": c.coverage_mean,
                    "coverage_min": c.coverage_min,
                    "coverage_max": c.coverage_max,
                    "set_size_mean": c.set_size_mean,
                    "m_star_median": json_number(c.m_star_median),
                    "ok": c.ok,
                }
                for c in self.cells
            ],
        }

    def table(self) -> str:
        rows = [
            [
                fmt(c.p_star, 2),
                fmt(c.alpha, 2),
                fmt(c.target, 2),
                fmt(c.coverage_mean),
                fmt(c.coverage_min),
                fmt(c.coverage_max),
                "yes" if c.ok else "NO",
                fmt(c.set_size_mean, 3),
                fmt(c.m_star_median, 0),
            ]
            for c in self.cells
        ]
        head = ["p*", "alpha", "target", "coverage", "min", "max", "ok", "mean|S|", "M*"]
        title = (
            f"coverage: n_cal={self.n_cal} n_test={self.n_test} K={self.k} reps={self.reps}"
            f" (coverage = mean over reps; M* = median)"
        )
        rel = "  ".join(f"p*={p:g}: {r:.4f}" for p, r in self.reliability)
        verdict = (
            "mean coverage >= target in every cell"
            if self.all_ok
            else "MEAN COVERAGE BELOW TARGET IN SOME CELLS"
        )
        return f"{format_table(head, rows, title)}\nreliability level 1-alpha*: {rel}\n{verdict}"


def run_coverage(
    rng: np.random.Generator,
    *,
    p_stars: Sequence[float] = DEFAULT_P_STARS,
    alphas: Sequence[float] = COVERAGE_ALPHAS,
    n_cal: int = 200,
    n_test: int = 500,
    k: int = 10,
    reps: int = 50,
    wrong_classes: int = 4,
) -> CoverageResult:
    """Coverage of the rank-score prediction set for each (p*, alpha)."""
    cells: list[CoverageCell] = []
    reliability: list[tuple[float, float]] = []
    for p in p_stars:
        cov = np.empty((reps, len(alphas)))
        size = np.empty((reps, len(alphas)))
        m_star: list[list[float]] = [[] for _ in alphas]
        rel = []
        for r in range(reps):
            items = dirichlet_items(rng, n_cal + n_test, p, wrong_classes)
            cons, scores = _scored_batch(rng, items, k)
            cal, test, test_cons = scores[:n_cal], scores[n_cal:], cons[n_cal:]
            rel.append(reliability_level(cal))
            thresholds = conformal_thresholds(cal, alphas)
            for j, a in enumerate(alphas):
                m = thresholds[a]
                cov[r, j] = float(np.mean(np.isfinite(test) & (test <= m)))
                size[r, j] = float(np.mean([set_size(c, "rank", m) for c in test_cons]))
                m_star[j].append(m)
        reliability.append((float(p), float(np.mean(rel))))
        for j, a in enumerate(alphas):
            cells.append(
                CoverageCell(
                    p_star=float(p),
                    alpha=float(a),
                    coverage_mean=float(cov[:, j].mean()),
                    coverage_min=float(cov[:, j].min()),
                    coverage_max=float(cov[:, j].max()),
                    set_size_mean=float(size[:, j].mean()),
                    m_star_median=lower_median(m_star[j]),
                )
            )
    return CoverageResult(tuple(cells), tuple(reliability), n_cal, n_test, k, reps)


# --------------------------------------------------------------------------- set size


@dataclass(frozen=True, slots=True)
class SetSizeCell:
    alpha: float
    p_star: float
    m_star_median: float
    m_star_min: float
    m_star_max: float
    set_size_mean: float
    coverage_mean: float


@dataclass(frozen=True, slots=True)
class SetSizeResult:
    """Theorem 7.5 (bias transparency): M* (and |S|) shrink as the agent gets better."""

    cells: tuple[SetSizeCell, ...]
    n_cal: int
    n_test: int
    k: int
    reps: int

    def monotone(self) -> dict[float, bool]:
        """Per alpha: is the median M* non-increasing in p*?"""
        out: dict[float, bool] = {}
        for a in dict.fromkeys(c.alpha for c in self.cells):
            ms = [
                c.m_star_median for c in sorted(self.cells, key=lambda c: c.p_star) if c.alpha == a
            ]
            out[a] = all(y <= x for x, y in pairwise(ms))
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "setsize",
            "n_cal": self.n_cal,
            "n_test": self.n_test,
            "k": self.k,
            "reps": self.reps,
            "monotone": {str(a): ok for a, ok in self.monotone().items()},
            "cells": [
                {
                    "alpha": c.alpha,
                    "p_star": c.p_star,
                    "m_star_median": json_number(c.m_star_median),
                    "m_star_min": json_number(c.m_star_min),
                    "m_star_max": json_number(c.m_star_max),
                    "set_size_mean": c.set_size_mean,
                    "coverage_mean": c.coverage_mean,
                }
                for c in self.cells
            ],
        }

    def table(self) -> str:
        rows = [
            [
                fmt(c.alpha, 2),
                fmt(c.p_star, 1),
                fmt(c.m_star_median, 0),
                f"{fmt(c.m_star_min, 0)}..{fmt(c.m_star_max, 0)}",
                fmt(c.set_size_mean, 3),
                fmt(c.coverage_mean),
            ]
            for c in self.cells
        ]
        head = ["alpha", "p*", "M*", "M* range", "mean|S|", "coverage"]
        title = (
            f"setsize: n_cal={self.n_cal} n_test={self.n_test} K={self.k} reps={self.reps}"
            " (M* = median over reps)"
        )
        mono = "  ".join(
            f"alpha={a:g}: {'non-increasing' if ok else 'NOT MONOTONE'}"
            for a, ok in self.monotone().items()
        )
        return f"{format_table(head, rows, title)}\nM* in p*: {mono}"


def run_setsize(
    rng: np.random.Generator,
    *,
    p_stars: Sequence[float] = SETSIZE_P_STARS,
    alphas: Sequence[float] = (0.10,),
    n_cal: int = 200,
    n_test: int = 500,
    k: int = 10,
    reps: int = 20,
    wrong_classes: int = 4,
) -> SetSizeResult:
    """M*, mean test set size and coverage for each (alpha, p*)."""
    per: dict[tuple[float, float], tuple[list[float], list[float], list[float]]] = {}
    for p in p_stars:
        for _ in range(reps):
            items = dirichlet_items(rng, n_cal + n_test, p, wrong_classes)
            cons, scores = _scored_batch(rng, items, k)
            test, test_cons = scores[n_cal:], cons[n_cal:]
            for a, m in conformal_thresholds(scores[:n_cal], alphas).items():
                ms, sizes, covs = per.setdefault((a, p), ([], [], []))
                ms.append(m)
                sizes.append(float(np.mean([set_size(c, "rank", m) for c in test_cons])))
                covs.append(float(np.mean(np.isfinite(test) & (test <= m))))
    cells = tuple(
        SetSizeCell(
            alpha=float(a),
            p_star=float(p),
            m_star_median=lower_median(ms),
            m_star_min=min(ms),
            m_star_max=max(ms),
            set_size_mean=float(np.mean(sizes)),
            coverage_mean=float(np.mean(covs)),
        )
        for a in alphas
        for p in p_stars
        for ms, sizes, covs in [per[(a, p)]]
    )
    return SetSizeResult(cells, n_cal, n_test, k, reps)


# --------------------------------------------------------------------------- entropy


@dataclass(frozen=True, slots=True)
class EntropyResult:
    """Hypothesis H3: set size grows with consensus entropy (rank and cumprob scores)."""

    alpha: float
    r_rank: float
    r_cumprob: float
    m_star_median: float
    q_cumprob_median: float
    coverage_rank: float
    coverage_cumprob: float
    entropy: tuple[float, ...]
    size_rank: tuple[int, ...]
    size_cumprob: tuple[int, ...]
    n_cal: int
    n_test: int
    k: int
    reps: int

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "entropy",
            "alpha": self.alpha,
            "n_cal": self.n_cal,
            "n_test": self.n_test,
            "k": self.k,
            "reps": self.reps,
            "n_points": len(self.entropy),
            "scores": {
                "rank": {
                    "pearson_r": json_number(self.r_rank),
                    "threshold_median": json_number(self.m_star_median),
                    "set_size_mean": float(np.mean(self.size_rank)),
                    "coverage": self.coverage_rank,
                },
                "cumprob": {
                    "pearson_r": json_number(self.r_cumprob),
                    "threshold_median": json_number(self.q_cumprob_median),
                    "set_size_mean": float(np.mean(self.size_cumprob)),
                    "coverage": self.coverage_cumprob,
                },
            },
        }

    def table(self) -> str:
        rows = [
            [
                "rank",
                fmt(self.m_star_median, 0),
                fmt(float(np.mean(self.size_rank)), 3),
                fmt(self.coverage_rank),
                fmt(self.r_rank, 3),
            ],
            [
                "cumprob",
                fmt(self.q_cumprob_median, 3),
                fmt(float(np.mean(self.size_cumprob)), 3),
                fmt(self.coverage_cumprob),
                fmt(self.r_cumprob, 3),
            ],
        ]
        head = ["score", "threshold", "mean|S|", "coverage", "r(H, |S|)"]
        title = (
            f"entropy: alpha={self.alpha:g} n_cal={self.n_cal} n_test={self.n_test} K={self.k}"
            f" reps={self.reps} ({len(self.entropy)} test items pooled; paper: r > 0.5)"
        )
        table = format_table(head, rows, title)
        if self.q_cumprob_median >= 1.0:
            table += (
                "\nnote: the cumprob threshold saturates at 1 (a unanimous correct item scores 1),"
                "\nso its sets hold every candidate and r measures H against #candidates"
            )
        return table


def run_entropy(
    rng: np.random.Generator,
    *,
    alpha: float = 0.10,
    n_cal: int = 200,
    n_test: int = 500,
    k: int = 10,
    reps: int = 10,
    wrong_classes: int = 4,
) -> EntropyResult:
    """Pearson r between H(x) and |S(x)| on test items of varying difficulty."""
    ent: list[float] = []
    s_rank: list[int] = []
    s_cp: list[int] = []
    m_stars: list[float] = []
    qs: list[float] = []
    cov_rank: list[float] = []
    cov_cp: list[float] = []
    for _ in range(reps):
        items = varied_entropy_items(rng, n_cal + n_test, wrong_classes)
        cons, ranks = _scored_batch(rng, items, k)
        cumprob = np.array([item_score(c, _ACC, "cumprob") for c in cons])
        m = conformal_threshold(ranks[:n_cal], alpha)
        q = conformal_threshold(cumprob[:n_cal], alpha)
        m_stars.append(m)
        qs.append(q)
        cov_rank.append(float(np.mean(np.isfinite(ranks[n_cal:]) & (ranks[n_cal:] <= m))))
        cov_cp.append(float(np.mean(np.isfinite(cumprob[n_cal:]) & (cumprob[n_cal:] <= q))))
        for c in cons[n_cal:]:
            ent.append(c.entropy)
            s_rank.append(set_size(c, "rank", m))
            s_cp.append(set_size(c, "cumprob", q))
    return EntropyResult(
        alpha=alpha,
        r_rank=pearson_r(ent, s_rank),
        r_cumprob=pearson_r(ent, s_cp),
        m_star_median=lower_median(m_stars),
        q_cumprob_median=lower_median(qs),
        coverage_rank=float(np.mean(cov_rank)),
        coverage_cumprob=float(np.mean(cov_cp)),
        entropy=tuple(ent),
        size_rank=tuple(s_rank),
        size_cumprob=tuple(s_cp),
        n_cal=n_cal,
        n_test=n_test,
        k=k,
        reps=reps,
    )
