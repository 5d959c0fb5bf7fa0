"""Synthetic multinomial agents (paper appendix C).

An *item* is a probability vector over canonical classes ``c0, c1, ...``; class ``c0``
is the acceptable one. An agent answering the item K times draws K classes from that
vector. Everything here is pure: the generator is passed in and nothing is printed.

Sampling is vectorised (one multinomial draw for a whole batch of items); ranking
goes through the real core, :func:`monitor.core.consensus.rank_classes`, item by item, so
ties are broken exactly as in the service.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import ConfigError

__all__ = [
    "ACCEPTABLE",
    "class_name",
    "counts_to_mapping",
    "dirichlet_items",
    "draw_answers",
    "draw_counts",
    "rank_items",
    "varied_entropy_items",
]

ACCEPTABLE = "c0"
"""The acceptable class of every synthetic item."""


def class_name(index: int) -> str:
    """``0`` → ``"c0"``."""
    return f"c{index}"


def dirichlet_items(
    rng: np.random.Generator,
    n: int,
    p_star: float | ArrayLike,
    wrong_classes: int = 4,
    concentration: float | ArrayLike = 1.0,
) -> np.ndarray:
    """``n`` items, shape ``(n, 1 + wrong_classes)``: class 0 gets ``p_star``.

    The remaining ``1 - p_star`` is spread over the wrong classes by a fresh
    Dirichlet(concentration, ..., concentration) draw per item. ``p_star`` and
    ``concentration`` are scalars or one value per item.
    """
    if wrong_classes < 1:
        raise ConfigError("need at least one wrong class")
    p = np.broadcast_to(np.asarray(p_star, dtype=float), (n,))
    if ((p < 0) | (p > 1)).any():
        raise ConfigError("p_star must be in [0, 1]")
    conc = np.broadcast_to(np.asarray(concentration, dtype=float), (n,))
    # Dirichlet via normalised gammas, so the concentration can differ per item.
    g = rng.standard_gamma(np.repeat(conc[:, None], wrong_classes, axis=1))
    total = g.sum(axis=1, keepdims=True)
    # A tiny concentration can underflow every gamma to 0: put the mass on one class.
    empty = total[:, 0] <= 0
    if empty.any():
        g[empty, 0], total[empty] = 1.0, 1.0
    wrong = g / total
    return np.column_stack([p, (1.0 - p)[:, None] * wrong])


def varied_entropy_items(
    rng: np.random.Generator,
    n: int,
    wrong_classes: int = 4,
    p_star_range: tuple[float, float] = (0.2, 1.0),
    concentration_range: tuple[float, float] = (0.05, 20.0),
) -> np.ndarray:
    """Items of varying difficulty and entropy: ``p_star`` uniform in ``p_star_range``,
    the Dirichlet concentration of the wrong mass log-uniform in ``concentration_range``
    (small: one dominant wrong answer; large: the wrong mass spread evenly)."""
    lo, hi = p_star_range
    p = rng.uniform(lo, hi, size=n)
    clo, chi = np.log(concentration_range[0]), np.log(concentration_range[1])
    conc = np.exp(rng.uniform(clo, chi, size=n))
    return dirichlet_items(rng, n, p, wrong_classes, conc)


def draw_counts(rng: np.random.Generator, items: ArrayLike, k: int) -> np.ndarray:
    """Class counts of ``k`` answers per item: shape ``(n, L)`` for items ``(n, L)``."""
    probs = np.asarray(items, dtype=float)
    if k < 1:
        raise ConfigError("k must be >= 1")
    # Guard against rounding: the multinomial insists the probabilities sum to <= 1.
    probs = probs / probs.sum(axis=-1, keepdims=True)
    return rng.multinomial(k, probs)


def draw_answers(rng: np.random.Generator, item: Sequence[float], k: int) -> list[str]:
    """``k`` answers to one item, as class names in the order they were drawn."""
    p = np.asarray(item, dtype=float)
    drawn = rng.choice(p.size, size=k, p=p / p.sum())
    return [class_name(int(i)) for i in drawn]


def counts_to_mapping(
    counts: Sequence[int] | np.ndarray, names: Sequence[str] = ()
) -> dict[str, int]:
    """Non-zero counts as ``{class name: count}``; ``names`` defaults to ``c0, c1, ...``."""
    return {(names[j] if names else class_name(j)): int(c) for j, c in enumerate(counts) if c > 0}


def rank_items(counts: np.ndarray, rng: np.random.Generator) -> list[Consensus]:
    """Ranked consensus of every row of ``counts``, ties broken with ``rng``."""
    return [rank_classes(counts_to_mapping(row.tolist()), rng) for row in counts]
