"""Nonconformity scores of a reviewed item and the prediction sets they induce.

All scores are ``inf`` when no acceptable class is among the candidates: no set
built from observed candidates can cover such an item (paper §9.1, §10.1).

* ``rank``: the smallest rank among acceptable classes (paper Definition 6.1, eq. 9.1).
* ``cumprob``: cumulative frequency up to that rank (paper Definition 6.2).
* ``lac``: 1 - frequency of the best acceptable class (paper §10.7).
* ``aps``: randomized adaptive prediction sets, sum of frequencies ranked above it plus
  ``u`` times its own (Romano et al. 2020). The paper's §10.7 prints the sum up to and
  including the class plus ``u`` times it, which double counts; we use the standard form.

The prediction set at threshold ``t`` is ``{c : score(c) <= t}`` for every score, so an
item is covered exactly when its score is at most the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from monitor.core.canon.base import INVALID
from monitor.core.consensus import Consensus
from monitor.core.errors import ConfigError

__all__ = [
    "SCORE_NAMES",
    "aps_score",
    "cumprob_score",
    "item_score",
    "lac_score",
    "rank_score",
    "score_at_rank",
    "set_size",
]

SCORE_NAMES = ("rank", "cumprob", "lac", "aps")


def _best_rank(consensus: Consensus, acceptable: Iterable[str]) -> float:
    ranks = [consensus.rank(c) for c in set(acceptable) if c != INVALID]
    return min(ranks, default=math.inf)


def score_at_rank(consensus: Consensus, score: str, r: int, u: float = 0.0) -> float:
    """The score a class at rank ``r`` (1-based) gets; one expression for items and sets."""
    counts, k = consensus.counts, consensus.k
    if score == "rank":
        return float(r)
    if score == "cumprob":
        return sum(counts[:r]) / k
    if score == "lac":
        return 1.0 - counts[r - 1] / k
    if score == "aps":
        return (sum(counts[: r - 1]) + u * counts[r - 1]) / k
    raise ConfigError(f"unknown score {score!r}; known: {', '.join(SCORE_NAMES)}")


def item_score(
    consensus: Consensus, acceptable: Iterable[str], score: str, u: float = 0.0
) -> float:
    """``score`` of the best acceptable class, ``inf`` if none is a candidate."""
    r = _best_rank(consensus, acceptable)
    return math.inf if r == math.inf else score_at_rank(consensus, score, int(r), u)


def rank_score(consensus: Consensus, acceptable: Iterable[str]) -> float:
    """Smallest rank among the acceptable classes, ``inf`` if none is a candidate."""
    return _best_rank(consensus, acceptable)


def cumprob_score(consensus: Consensus, acceptable: Iterable[str]) -> float:
    """Sum of frequencies of ranks 1..r, r the best acceptable rank."""
    return item_score(consensus, acceptable, "cumprob")


def lac_score(consensus: Consensus, acceptable: Iterable[str]) -> float:
    """1 - frequency of the most frequent acceptable class."""
    return item_score(consensus, acceptable, "lac")


def aps_score(consensus: Consensus, acceptable: Iterable[str], u: float) -> float:
    """Randomized APS: frequencies ranked above the class plus ``u`` times its own."""
    return item_score(consensus, acceptable, "aps", u)


def set_size(consensus: Consensus, score: str, threshold: float, u: float = 0.0) -> int:
    """Size of the prediction set ``{c : score(c) <= threshold}`` over the candidates.

    Uses :func:`score_at_rank`, so membership agrees with ``item score <= threshold``.
    Every score is non-decreasing in rank, so the set is always a top-M set.
    """
    n = len(consensus.classes)
    if score == "rank":
        return n if threshold == math.inf else min(n, max(0, int(threshold)))
    return sum(1 for r in range(1, n + 1) if score_at_rank(consensus, score, r, u) <= threshold)
