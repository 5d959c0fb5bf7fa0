"""Offline certification from cached samples (``relmon certify``), without I/O.

Items are scored once (canonicalize, rank with the item's own generator, score), then
calibrated either on all of them or, with a test fraction, on a random part and
evaluated on the rest: coverage, set sizes, mode accuracy and coverage conditional on
the item being solvable (an acceptable class among the candidates at all).

An item's generator is derived from the run's seed and a hash of its id, so the
result does not depend on the order of the input files.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from monitor.core.canon.base import INVALID, Canonicalizer, QueryContext
from monitor.core.conformal import conformal_thresholds, reliability_level, reliability_lower_bound
from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import CalibrationError, ConfigError
from monitor.core.scores import SCORE_NAMES, item_score, set_size

__all__ = [
    "DEFAULT_ALPHAS",
    "CertifyReport",
    "Sample",
    "ScoredItem",
    "certify",
    "item_rng",
    "score_item",
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
    calibration, test = list(items), None
    if test_fraction is not None:
        if not 0.0 < test_fraction < 1.0:
            raise CalibrationError(f"--test-fraction must be in (0, 1), got {test_fraction}")
        order = np.random.default_rng(seed).permutation(len(items))
        n_test = round(test_fraction * len(items))
        if n_test < 1 or n_test >= len(items):
            raise CalibrationError(
                f"--test-fraction {test_fraction} leaves {len(items) - n_test} calibration "
                f"and {n_test} test items out of {len(items)}; both must be at least 1"
            )
        test = [items[i] for i in order[:n_test]]
        calibration = [items[i] for i in order[n_test:]]
    if not calibration:
        raise CalibrationError("the calibration set is empty")
    scores = np.array([it.score for it in calibration])
    ranks = np.array([it.rank for it in calibration])
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
        mean_samples=k_total / n,
        invalid_answer_rate=(
            sum(it.invalid_answers for it in calibration) / k_total if k_total else 0.0
        ),
        score_counts=_score_counts(scores, score),
        test=evaluate(test, thresholds, score) if test is not None else None,
    )
