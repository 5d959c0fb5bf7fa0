"""Ranked consensus over an item's canonical answers (paper §3.6).

Classes are ranked by decreasing count. Ties are broken uniformly at random with the
item's own generator, never alphabetically or by arrival order: a fixed tie order can
correlate with correctness and bias the scores.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from monitor.core.errors import InputError

__all__ = ["Consensus", "count_classes", "rank_classes"]


@dataclass(frozen=True, slots=True)
class Consensus:
    """Classes in rank order (``classes[0]`` is the mode) with their counts."""

    classes: tuple[str, ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.classes) != len(self.counts):
            raise InputError("classes and counts differ in length")
        if any(c <= 0 for c in self.counts):
            raise InputError("counts must be positive")
        if any(a < b for a, b in zip(self.counts, self.counts[1:], strict=False)):
            raise InputError("counts must be in non-increasing order")
        if len(set(self.classes)) != len(self.classes):
            raise InputError("classes must be distinct")

    @property
    def k(self) -> int:
        """Number of samples behind the consensus."""
        return sum(self.counts)

    @property
    def frequencies(self) -> np.ndarray:
        """Empirical probabilities in rank order."""
        k = self.k
        return np.asarray(self.counts, dtype=float) / k if k else np.zeros(0)

    @property
    def mode(self) -> str | None:
        """The top-ranked class, ``None`` for an empty consensus."""
        return self.classes[0] if self.classes else None

    @property
    def strength(self) -> float:
        """phi(x): the mode's frequency."""
        return self.counts[0] / self.k if self.classes else 0.0

    @property
    def margin(self) -> float:
        """Delta(x): frequency of rank 1 minus frequency of rank 2 (0 if absent)."""
        if not self.classes:
            return 0.0
        second = self.counts[1] if len(self.counts) > 1 else 0
        return (self.counts[0] - second) / self.k

    @property
    def entropy(self) -> float:
        """Shannon entropy (nats) of the empirical class distribution."""
        p = self.frequencies
        return float(-(p * np.log(p)).sum()) if p.size else 0.0

    def rank(self, cls: str) -> float:
        """1-based rank of ``cls``; ``inf`` when it is not among the candidates."""
        try:
            return float(self.classes.index(cls) + 1)
        except ValueError:
            return math.inf

    def top(self, m: float) -> tuple[str, ...]:
        """The prediction set S_M: the ``m`` top-ranked classes (all of them if m is inf)."""
        if m == math.inf:
            return self.classes
        return self.classes[: max(0, int(m))]


def count_classes(classes: Iterable[str]) -> dict[str, int]:
    """Counts of each class, in order of first appearance."""
    return dict(Counter(classes))


def rank_classes(classes: Sequence[str] | Mapping[str, int], rng: np.random.Generator) -> Consensus:
    """Rank canonical classes by count, ties broken at random with ``rng``.

    ``classes`` is either the K canonical answers or a mapping class → count.
    The generator is always advanced by one permutation draw, so an item's later
    random draws do not depend on whether it had ties.
    """
    counts = dict(classes) if isinstance(classes, Mapping) else count_classes(classes)
    names = list(counts)
    order = rng.permutation(len(names))
    shuffled = [names[i] for i in order]
    # sorted() is stable: equal counts keep their random relative order.
    ranked = sorted(shuffled, key=lambda c: -counts[c])
    return Consensus(tuple(ranked), tuple(counts[c] for c in ranked))
