"""Mode-error experiments: variance reduction by consensus and by canonicalization.

``variance`` checks Theorem 4.4 (the mode of K answers is wrong with probability at
most exp(-2K(p* - 1/2)^2)); ``canon`` checks Proposition 4.6 (merging surface variants
of the correct answer raises its mass from p_raw to p_canon). Both rank with the real
:func:`monitor.core.consensus.rank_classes`, ties broken at random. Pure: the generator is
passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from monitor.app.simulate.agents import (
    ACCEPTABLE,
    counts_to_mapping,
    dirichlet_items,
    draw_counts,
    rank_items,
)
from monitor.app.simulate.tables import fmt, format_table
from monitor.core.canon import get_canonicalizer
from monitor.core.consensus import rank_classes

__all__ = [
    "CANON_CORRECT",
    "CANON_KS",
    "CANON_VARIANTS",
    "CANON_WRONG",
    "VARIANCE_KS",
    "CanonResult",
    "VarianceCell",
    "VarianceResult",
    "hoeffding_mode_bound",
    "run_canon",
    "run_variance",
]

DEFAULT_P_STARS = (0.6, 0.7, 0.8)
VARIANCE_KS = (1, 2, 3, 5, 10, 20, 50)
CANON_KS = (1, 3, 5, 10, 20)
CANON_CORRECT = "42"
CANON_VARIANTS = ("42", "42.0", "The answer is 42.", "$42", "#### 42", "\\boxed{42}")
"""Six surface forms of the correct answer, 0.1 each (total 0.6)."""
CANON_WRONG = (("41", 0.25), ("The answer is 43", 0.15))
"""Wrong answers and their probabilities (total 0.4); ``41`` beats every raw variant."""


def hoeffding_mode_bound(k: int, p: float) -> float:
    """Theorem 4.4: P(mode wrong) <= exp(-2K(p - 1/2)^2), meaningful for p > 1/2."""
    return math.exp(-2.0 * k * (p - 0.5) ** 2)


# --------------------------------------------------------------------------- variance


@dataclass(frozen=True, slots=True)
class VarianceCell:
    p_star: float
    k: int
    mode_error: float
    standard_error: float
    bound: float

    @property
    def exceeds(self) -> bool:
        """Empirical error above the Hoeffding bound by more than 3 standard errors."""
        return self.mode_error > self.bound + 3.0 * self.standard_error


@dataclass(frozen=True, slots=True)
class VarianceResult:
    """Theorem 4.4: mode error vs K against exp(-2K(p* - 1/2)^2)."""

    cells: tuple[VarianceCell, ...]
    trials: int

    @property
    def all_within_bound(self) -> bool:
        return not any(c.exceeds for c in self.cells)

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "variance",
            "trials": self.trials,
            "all_within_bound": self.all_within_bound,
            "cells": [
                {
                    "p_star": c.p_star,
                    "k": c.k,
                    "mode_error": c.mode_error,
                    "standard_error": c.standard_error,
                    "hoeffding_bound": c.bound,
                    "exceeds_bound": c.exceeds,
                }
                for c in self.cells
            ],
        }

    def table(self) -> str:
        rows = [
            [
                fmt(c.p_star, 2),
                str(c.k),
                fmt(c.mode_error, 5),
                fmt(c.standard_error, 5),
                f"{c.bound:.3g}",
                "EXCEEDS" if c.exceeds else "ok",
            ]
            for c in self.cells
        ]
        head = ["p*", "K", "mode error", "SE", "bound", "vs bound"]
        title = f"variance: mode error vs K, {self.trials} trials per cell (bound: Hoeffding)"
        verdict = (
            "every cell within bound + 3 SE"
            if self.all_within_bound
            else "SOME CELLS EXCEED THE BOUND BY > 3 SE"
        )
        return f"{format_table(head, rows, title)}\n{verdict}"


def _binomial_se(rate: float, null: float, trials: int) -> float:
    """The larger of the SE at the observed rate and at the bound (capped at 1)."""
    b = min(max(null, 0.0), 1.0)
    return max(math.sqrt(rate * (1 - rate) / trials), math.sqrt(b * (1 - b) / trials))


def run_variance(
    rng: np.random.Generator,
    *,
    p_stars: Sequence[float] = DEFAULT_P_STARS,
    ks: Sequence[int] = VARIANCE_KS,
    trials: int = 5000,
    wrong_classes: int = 4,
) -> VarianceResult:
    """Mode error P(rank-1 class after random tie-breaking != c0) for each (p*, K)."""
    cells = []
    for p in p_stars:
        for k in ks:
            items = dirichlet_items(rng, trials, p, wrong_classes)
            cons = rank_items(draw_counts(rng, items, k), rng)
            err = sum(c.mode != ACCEPTABLE for c in cons) / trials
            bound = hoeffding_mode_bound(k, p)
            se = _binomial_se(err, bound, trials)
            cells.append(VarianceCell(float(p), int(k), err, se, bound))
    return VarianceResult(tuple(cells), trials)


# --------------------------------------------------------------------------- canon


@dataclass(frozen=True, slots=True)
class CanonResult:
    """Proposition 4.6: canonicalization consolidates fragmented mass."""

    ks: tuple[int, ...]
    raw_error: tuple[float, ...]
    canon_error: tuple[float, ...]
    p_raw: float  # most likely acceptable raw answer
    p_raw_top: float  # most likely raw answer overall (a wrong one)
    p_canon: float  # mass of the acceptable canonical class
    mapping: tuple[tuple[str, str, float], ...]  # raw answer, canonical class, probability
    trials: int

    def bounds(self) -> tuple[float, ...]:
        return tuple(hoeffding_mode_bound(k, self.p_canon) for k in self.ks)

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "canon",
            "trials": self.trials,
            "p_raw": self.p_raw,
            "p_raw_top": self.p_raw_top,
            "p_canon": self.p_canon,
            "mapping": [{"raw": r, "canonical": c, "p": p} for r, c, p in self.mapping],
            "rows": [
                {"k": k, "raw_mode_error": r, "canon_mode_error": c, "canon_bound": b}
                for k, r, c, b in zip(
                    self.ks, self.raw_error, self.canon_error, self.bounds(), strict=True
                )
            ],
        }

    def table(self) -> str:
        rows = [
            [str(k), fmt(r), fmt(c), f"{b:.3g}"]
            for k, r, c, b in zip(
                self.ks, self.raw_error, self.canon_error, self.bounds(), strict=True
            )
        ]
        head = ["K", "raw error", "canon error", "bound(p_canon)"]
        title = (
            f"canon: {self.trials} trials per K; p_raw={self.p_raw:g} (top raw answer, wrong:"
            f" {self.p_raw_top:g}) -> p_canon={self.p_canon:g}"
        )
        maps = "\n".join(f"  {p:.2f}  {r!r} -> {c!r}" for r, c, p in self.mapping)
        return f"{format_table(head, rows, title)}\nnumeric canonicalization:\n{maps}"


def _numeric_canonicalizer() -> Callable[[str], str]:

    return get_canonicalizer("numeric").canonicalize


def run_canon(
    rng: np.random.Generator,
    *,
    ks: Sequence[int] = CANON_KS,
    trials: int = 5000,
    canonicalize: Callable[[str], str] | None = None,
) -> CanonResult:
    """Mode error with raw strings vs after ``canonicalize`` (default: ``numeric``)."""
    canon = canonicalize or _numeric_canonicalizer()
    raw = [*CANON_VARIANTS, *(a for a, _ in CANON_WRONG)]
    probs = np.array([0.1] * len(CANON_VARIANTS) + [p for _, p in CANON_WRONG])
    classes = [canon(a) for a in raw]
    correct = canon(CANON_CORRECT)
    names = list(dict.fromkeys(classes))
    merge = np.zeros((len(raw), len(names)), dtype=int)  # raw answer -> canonical class
    for i, c in enumerate(classes):
        merge[i, names.index(c)] = 1
    variants = set(CANON_VARIANTS)
    raw_err, canon_err = [], []
    for k in ks:
        counts = rng.multinomial(k, probs, size=trials)
        merged = counts @ merge
        raw_wrong = canon_wrong = 0
        for row, mrow in zip(counts.tolist(), merged.tolist(), strict=True):
            raw_wrong += rank_classes(counts_to_mapping(row, raw), rng).mode not in variants
            canon_wrong += rank_classes(counts_to_mapping(mrow, names), rng).mode != correct
        raw_err.append(raw_wrong / trials)
        canon_err.append(canon_wrong / trials)
    return CanonResult(
        ks=tuple(int(k) for k in ks),
        raw_error=tuple(raw_err),
        canon_error=tuple(canon_err),
        p_raw=float(probs[: len(CANON_VARIANTS)].max()),
        p_raw_top=float(probs.max()),
        p_canon=float(sum(p for p, c in zip(probs, classes, strict=True) if c == correct)),
        mapping=tuple((a, c, float(p)) for a, c, p in zip(raw, classes, probs, strict=True)),
        trials=trials,
    )
