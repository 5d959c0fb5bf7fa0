"""Offline certification from cached samples (``relmon certify``), without I/O.

Items are scored once (canonicalize, rank with the item's own generator, score), then
calibrated either on all of them or, with a test fraction, on a random part and
evaluated on the rest: coverage, set sizes, mode accuracy and coverage conditional on
the item being solvable (an acceptable class among the candidates at all).

An item's generator is derived from the run's seed and a hash of its id, so the
result does not depend on the order of the input files.

Per segment (``--segment-by``, Mondrian conformal): :func:`certify_segments` makes the
same split, then calibrates each of the busiest segments on its own calibration items
and the rest together as ``other``; a segment with fewer than
:func:`min_calibration_items` items has ``M* = inf`` at that alpha for want of reviews.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from monitor.core.canon.base import INVALID, Canonicalizer, QueryContext
from monitor.core.conformal import (
    conformal_thresholds,
    quantile_index,
    reliability_level,
    reliability_lower_bound,
)
from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import CalibrationError, ConfigError
from monitor.core.scores import SCORE_NAMES, item_score, set_size
from monitor.core.segments.labels import OTHER

__all__ = [
    "DEFAULT_ALPHAS",
    "CertifyReport",
    "Sample",
    "ScoredItem",
    "SegmentReport",
    "busiest_labels",
    "calibrate",
    "certify",
    "certify_segments",
    "item_rng",
    "min_calibration_items",
    "score_item",
    "split",
]

DEFAULT_ALPHAS = (0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)


@dataclass(frozen=True, slots=True)
class Sample:
    """One item's cached answers and what it knows of the query."""

    id: str
    answers: tuple[str, ...]
    context: QueryContext | None = None


@dataclass(frozen=True, slots=True)
class ScoredItem:
    id: str
    consensus: Consensus
    acceptable: frozenset[str]
    rank: float
    score: float
    u: float
    invalid_answers: int

    @property
    def solvable(self) -> bool:
        return self.score != math.inf


def item_rng(seed: int, item_id: str) -> np.random.Generator:
    """The generator of one item: a function of the run seed and the item id only."""
    digest = hashlib.sha256(item_id.encode("utf-8")).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])


def score_item(
    sample: Sample,
    acceptable_raw: Sequence[str],
    canonicalizer: Canonicalizer,
    score: str,
    seed: int,
) -> ScoredItem:
    """Canonicalize, rank (random ties) and score one item.

    Acceptable answers that do not parse are dropped; the caller decides whether an
    item left with none is an error.
    """
    classes = [canonicalizer.canonicalize(a, sample.context) for a in sample.answers]
    acceptable = frozenset(
        c for c in (canonicalizer.canonicalize(a, sample.context) for a in acceptable_raw)
    ) - {INVALID}
    rng = item_rng(seed, sample.id)
    consensus = rank_classes(classes, rng)
    u = float(rng.random())
    return ScoredItem(
        id=sample.id,
        consensus=consensus,
        acceptable=acceptable,
        rank=item_score(consensus, acceptable, "rank"),
        score=item_score(consensus, acceptable, score, u),
        u=u,
        invalid_answers=sum(1 for c in classes if c == INVALID),
    )


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Test-part figures, each keyed by alpha."""

    n: int
    coverage: dict[float, float]
    set_size_mean: dict[float, float]
    conditional_coverage: dict[float, float]
    n_solvable: int
    mode_accuracy: float


@dataclass(frozen=True, slots=True)
class CertifyReport:
    score: str
    alphas: tuple[float, ...]
    n: int
    reliability_level: float
    reliability_lower_bound: float
    delta: float
    thresholds: dict[float, float]
    mode_accuracy: float
    mean_samples: float
    invalid_answer_rate: float
    score_counts: dict[str, int]
    test: Evaluation | None = None


def _covered(item: ScoredItem, threshold: float) -> bool:
    # An unsolvable item is never covered: no set of observed candidates holds it.
    return item.solvable and item.score <= threshold


def evaluate(
    items: Sequence[ScoredItem], thresholds: Mapping[float, float], score: str
) -> Evaluation:
    """Coverage, set sizes and mode accuracy of ``items`` at the given thresholds."""
    n = len(items)
    solvable = [it for it in items if it.solvable]
    coverage, sizes, conditional = {}, {}, {}
    for alpha, m in thresholds.items():
        hits = sum(_covered(it, m) for it in items)
        coverage[alpha] = hits / n if n else math.nan
        conditional[alpha] = hits / len(solvable) if solvable else math.nan
        sizes[alpha] = (
            float(np.mean([set_size(it.consensus, score, m, it.u) for it in items]))
            if n
            else math.nan
        )
    mode_hits = sum(1 for it in items if it.rank <= 1.0)
    return Evaluation(
        n=n,
        coverage=coverage,
        set_size_mean=sizes,
        conditional_coverage=conditional,
        n_solvable=len(solvable),
        mode_accuracy=mode_hits / n if n else math.nan,
    )


def _score_counts(scores: np.ndarray, score: str) -> dict[str, int]:
    if score != "rank":
        return {"finite": int(np.isfinite(scores).sum()), "inf": int(np.isinf(scores).sum())}
    values, counts = np.unique(scores, return_counts=True)
    return {
        ("inf" if v == math.inf else str(int(v))): int(c)
        for v, c in zip(values, counts, strict=True)
    }


def split(
    items: Sequence[ScoredItem], test_fraction: float | None, seed: int
) -> tuple[list[ScoredItem], list[ScoredItem] | None]:
    """(calibration, test): all items and None, or a random ``test_fraction`` held out."""
    if test_fraction is None:
        return list(items), None
    if not 0.0 < test_fraction < 1.0:
        raise CalibrationError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    order = np.random.default_rng(seed).permutation(len(items))
    n_test = round(test_fraction * len(items))
    if n_test < 1 or n_test >= len(items):
        raise CalibrationError(
            f"--test-fraction {test_fraction} leaves {len(items) - n_test} calibration "
            f"and {n_test} test items out of {len(items)}; both must be at least 1"
        )
    return [items[i] for i in order[n_test:]], [items[i] for i in order[:n_test]]


def calibrate(
    calibration: Sequence[ScoredItem],
    test: Sequence[ScoredItem] | None,
    alphas: Sequence[float],
    score: str,
    delta: float,
) -> CertifyReport:
    """The report of one calibration set (and its test set); ``calibration`` may be
    empty (a segment with no calibration item): every threshold is then ``inf``."""
    scores = np.array([it.score for it in calibration], dtype=float)
    ranks = np.array([it.rank for it in calibration], dtype=float)
    n = scores.size
    thresholds = conformal_thresholds(scores, alphas)
    successes = int(np.count_nonzero(ranks <= 1.0))
    k_total = sum(it.consensus.k for it in calibration)
    return CertifyReport(
        score=score,
        alphas=tuple(alphas),
        n=n,
        reliability_level=reliability_level(ranks),
        reliability_lower_bound=reliability_lower_bound(successes, n, delta),
        delta=delta,
        thresholds=thresholds,
        mode_accuracy=evaluate(calibration, {}, score).mode_accuracy,
        mean_samples=k_total / n if n else math.nan,
        invalid_answer_rate=(
            sum(it.invalid_answers for it in calibration) / k_total if k_total else 0.0
        ),
        score_counts=_score_counts(scores, score),
        test=evaluate(test, thresholds, score) if test is not None else None,
    )


def certify(
    items: Sequence[ScoredItem],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    *,
    score: str = "rank",
    test_fraction: float | None = None,
    seed: int = 0,
    delta: float = 0.05,
) -> CertifyReport:
    """Calibrate on ``items`` (or on a random ``1 - test_fraction`` of them)."""
    if score not in SCORE_NAMES:
        raise ConfigError(f"unknown score {score!r}")
    calibration, test = split(items, test_fraction, seed)
    if not calibration:
        raise CalibrationError("the calibration set is empty")
    return calibrate(calibration, test, alphas, score, delta)


# -- per segment (Mondrian) -----------------------------------------------------------


def min_calibration_items(alpha: float) -> int:
    """The fewest calibration items with which M*(alpha) can be finite: the least n with
    k = ceil((n + 1)(1 - alpha)) <= n, that is n >= (1 - alpha) / alpha."""
    n = max(0, math.floor((1.0 - alpha) / alpha) - 1)
    while quantile_index(n, alpha) > n:
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """One segment's certification: its label value (or ``other``), its item count
    (calibration and test) and the report of its own calibration items."""

    label: str
    items: int
    report: CertifyReport

    @property
    def too_few(self) -> dict[float, bool]:
        """Per alpha: the segment has too few calibration items for a finite M* (k > n),
        so ``inf`` says "too few reviews to know", not "no answer is good enough"."""
        n = self.report.n
        return {a: quantile_index(n, a) > n for a in self.report.alphas}


def busiest_labels(labels: Iterable[str], max_segments: int) -> list[str]:
    """The ``max_segments`` most frequent labels, busiest first (ties by value), as
    :meth:`SegmentTable.snapshot` orders the service's holders."""
    counts = Counter(labels)
    ranked = sorted(counts, key=lambda label: (-counts[label], label))
    return ranked[:max_segments]


def certify_segments(
    items: Sequence[ScoredItem],
    labels: Mapping[str, str],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    *,
    score: str = "rank",
    test_fraction: float | None = None,
    seed: int = 0,
    delta: float = 0.05,
    max_segments: int = 20,
) -> list[SegmentReport]:
    """Mondrian certification: ``labels`` maps each item id to its segment's label value;
    the ``max_segments`` busiest segments are calibrated each on its own items, the rest
    together as ``other`` (last). The calibration/test split is :func:`certify`'s, so the
    segments partition the marginal report's calibration and test sets."""
    if score not in SCORE_NAMES:
        raise ConfigError(f"unknown score {score!r}")
    own = busiest_labels((labels[it.id] for it in items), max_segments)
    order = {label: i for i, label in enumerate(own)}

    def group(item: ScoredItem) -> str:
        label = labels[item.id]
        return label if label in order else OTHER

    calibration, test = split(items, test_fraction, seed)
    present = own + ([OTHER] if any(labels[it.id] not in order for it in items) else [])
    out = []
    for label in present:
        cal = [it for it in calibration if group(it) == label]
        tst = None if test is None else [it for it in test if group(it) == label]
        size = sum(1 for it in items if group(it) == label)
        out.append(SegmentReport(label, size, calibrate(cal, tst, alphas, score, delta)))
    return out
