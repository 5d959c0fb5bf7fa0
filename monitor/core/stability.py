"""Canonicalization stability diagnostics (paper appendix A.4).

Bootstrap stability: resample an item's K answers with replacement, canonicalize the
resample, and compare its grouping with the grouping the full sample gave the same
answers, by the adjusted Rand index (ARI). The paper asks for ARI >= 0.8 before
reporting. A per-answer canonicalizer (numeric, mcq, ...) groups each answer on its
own and always scores 1; clustering canonicalizers (embedding, llm) need not.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from monitor.core.errors import ConfigError, InputError

__all__ = ["StabilityReport", "adjusted_rand_index", "bootstrap_ari"]

Grouping = Callable[[Sequence[str]], Sequence[Hashable]]


def _pairs(x: np.ndarray) -> float:
    return float((x * (x - 1) / 2).sum())


def _codes(labels: Sequence[Hashable]) -> np.ndarray:
    index: dict[Hashable, int] = {}
    return np.array([index.setdefault(x, len(index)) for x in labels])


def adjusted_rand_index(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Hubert–Arabie ARI of two labelings of the same items (1 = same partition).

    Two identical trivial partitions (one group, or all singletons) score 1.
    """
    if len(a) != len(b):
        raise InputError("labelings differ in length")
    n = len(a)
    if n < 2:
        return 1.0
    ia, ib = _codes(a), _codes(b)
    table = np.zeros((ia.max() + 1, ib.max() + 1))
    np.add.at(table, (ia, ib), 1)
    index = _pairs(table)
    row, col = _pairs(table.sum(axis=1)), _pairs(table.sum(axis=0))
    expected = row * col / (n * (n - 1) / 2)
    denominator = (row + col) / 2 - expected
    if denominator == 0:
        return 1.0 if index == row == col else 0.0
    return (index - expected) / denominator


@dataclass(frozen=True, slots=True)
class StabilityReport:
    mean_ari: float
    min_ari: float
    values: tuple[float, ...]
    threshold: float

    @property
    def stable(self) -> bool:
        return self.mean_ari >= self.threshold


def bootstrap_ari(
    answers: Sequence[str],
    group: Grouping,
    rng: np.random.Generator,
    n_boot: int = 200,
    threshold: float = 0.8,
) -> StabilityReport:
    """ARI between the full-sample grouping and each bootstrap resample's grouping."""
    if not answers:
        raise InputError("no answers")
    if n_boot < 1:
        raise ConfigError("n_boot must be >= 1")
    reference = list(group(answers))
    k = len(answers)
    values = []
    for _ in range(n_boot):
        idx = rng.integers(0, k, size=k)
        regrouped = group([answers[i] for i in idx])
        values.append(adjusted_rand_index([reference[i] for i in idx], regrouped))
    return StabilityReport(
        mean_ari=float(np.mean(values)),
        min_ari=float(np.min(values)),
        values=tuple(values),
        threshold=threshold,
    )
