"""Mondrian conformal, tested statistically: a threshold calibrated on one segment's
items covers that segment's new items with probability >= 1 - alpha, in *each*
segment, while the pooled (marginal) threshold under-covers the weaker segment, which
is why relmon calibrates per segment (docs/segments.md). The per-segment
Clopper-Pearson lower bound covers the segment's true rate >= 1 - delta too.

Two segments: A (80% of traffic), P(top answer acceptable) = 0.95, and B (20%), 0.70.
When the top answer is not acceptable, the best acceptable candidate is the runner-up
(rank 2) with probability 0.5, third (rank 3) with 0.3, and absent (score inf) with 0.2.
Each trial draws fresh items (fixed seed), calibrates on half, tests on the other half.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.core.canon import get_canonicalizer
from monitor.core.certify import (
    Sample,
    ScoredItem,
    certify_segments,
    min_calibration_items,
    score_item,
)
from monitor.core.conformal import conformal_thresholds, quantile_index, reliability_lower_bound

TRIALS = 2_000
ITEMS = 200  # per trial; half calibration, half test
ALPHA = 0.10
DELTA = 0.05
TOP = {"A": 0.95, "B": 0.70}
SHARE_B = 0.20
NOT_TOP = (np.array([2.0, 3.0, math.inf]), np.array([0.5, 0.3, 0.2]))


def draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(segment is B, score) of n items."""
    is_b = rng.random(n) < SHARE_B
    p_top = np.where(is_b, TOP["B"], TOP["A"])
    other = rng.choice(NOT_TOP[0], size=n, p=NOT_TOP[1])
    return is_b, np.where(rng.random(n) < p_top, 1.0, other)


def coverage_and_se(covered: np.ndarray, tested: np.ndarray) -> tuple[float, float]:
    """Pooled coverage over all (trial, test item) pairs, and its standard error with
    the trials as clusters (items of one trial share a threshold)."""
    cov = covered.sum() / tested.sum()
    resid = covered - cov * tested
    se = resid.std(ddof=1) * math.sqrt(len(tested)) / tested.sum()
    return float(cov), float(se)


def run_trials() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(20260537)
    out = {
        f"{who}/{seg}": {"covered": np.zeros(TRIALS), "tested": np.zeros(TRIALS)}
        for who in ("mondrian", "pooled")
        for seg in ("A", "B")
    }
    lb_holds = {seg: np.zeros(TRIALS, bool) for seg in ("A", "B")}
    half = ITEMS // 2
    for t in range(TRIALS):
        is_b, scores = draw(rng, ITEMS)
        cal_b, cal_s, test_b, test_s = is_b[:half], scores[:half], is_b[half:], scores[half:]
        pooled = conformal_thresholds(cal_s, [ALPHA])[ALPHA]
        for seg, in_cal, in_test in (("A", ~cal_b, ~test_b), ("B", cal_b, test_b)):
            own = conformal_thresholds(cal_s[in_cal], [ALPHA])[ALPHA]
            seg_test = test_s[in_test]
            for who, m in (("mondrian", own), ("pooled", pooled)):
                out[f"{who}/{seg}"]["covered"][t] = np.count_nonzero(seg_test <= m)
                out[f"{who}/{seg}"]["tested"][t] = seg_test.size
            successes = int(np.count_nonzero(cal_s[in_cal] <= 1.0))
            bound = reliability_lower_bound(successes, int(in_cal.sum()), DELTA)
            lb_holds[seg][t] = bound <= TOP[seg]
    out["lower_bound"] = {seg: v.astype(float) for seg, v in lb_holds.items()}
    return out


@pytest.fixture(scope="module")
def trials() -> dict[str, dict[str, np.ndarray]]:
    return run_trials()


@pytest.mark.parametrize("segment", ["A", "B"])
def test_mondrian_threshold_covers_each_segment(
    trials: dict[str, dict[str, np.ndarray]], segment: str
) -> None:
    cov, se = coverage_and_se(**trials[f"mondrian/{segment}"])
    assert cov >= 1 - ALPHA - 3 * se, (segment, cov, se)
    # Not vacuous: the segment's threshold is finite and the sets are not everything.
    assert cov < 0.99


def test_pooled_threshold_under_covers_the_weak_segment(
    trials: dict[str, dict[str, np.ndarray]],
) -> None:
    cov_b, se_b = coverage_and_se(**trials["pooled/B"])
    cov_a, _ = coverage_and_se(**trials["pooled/A"])
    # Pooled P(top acceptable) = 0.8 * 0.95 + 0.2 * 0.70 = 0.90: the pooled M* is mostly 1,
    # which covers B only 70% (85% with M* = 2), far under 1 - alpha = 0.90.
    assert cov_b + 3 * se_b < 1 - ALPHA, (cov_b, se_b)
    assert cov_a >= 1 - ALPHA  # marginal coverage is carried by the strong segment


@pytest.mark.parametrize("segment", ["A", "B"])
def test_per_segment_lower_bound_covers_the_true_rate(
    trials: dict[str, dict[str, np.ndarray]], segment: str
) -> None:
    holds = trials["lower_bound"][segment]
    rate = float(holds.mean())
    slack = 3 * math.sqrt(DELTA * (1 - DELTA) / TRIALS)
    assert rate >= 1 - DELTA - slack, (segment, rate)


def test_thresholds_by_hand() -> None:
    """n = 5 scores 1 1 2 3 inf. alpha 0.5: k = ceil(6 * 0.5) = 3 -> 2; alpha 0.34:
    k = ceil(3.96) = 4 -> 3; alpha 0.2: k = ceil(4.8) = 5 -> inf (the 5th is inf);
    alpha 0.1: k = ceil(5.4) = 6 > 5 -> inf for want of items."""
    scores = [3.0, 1.0, math.inf, 2.0, 1.0]
    got = conformal_thresholds(scores, [0.5, 0.34, 0.2, 0.1])
    assert got == {0.5: 2.0, 0.34: 3.0, 0.2: math.inf, 0.1: math.inf}
    assert quantile_index(5, 0.2) == 5 and quantile_index(5, 0.1) == 6
    assert min_calibration_items(0.1) == 9  # ceil(10 * 0.9) = 9 <= 9; ceil(9 * 0.9) = 9 > 8


def scored_items(scores: list[float]) -> list[ScoredItem]:
    """Items whose rank score is given: candidates 1 (x3), 2 (x2), 3 (x1), no ties."""
    canon = get_canonicalizer("numeric")
    answers = ("1", "1", "1", "2", "2", "3")
    acceptable = {1.0: "1", 2.0: "2", 3.0: "3", math.inf: "9"}
    return [
        score_item(Sample(f"q{i}", answers), [acceptable[s]], canon, "rank", 0)
        for i, s in enumerate(scores)
    ]


def test_certify_segments_uses_each_segments_own_scores() -> None:
    """The same hand example through certify_segments: segment x holds the five scores
    above, segment y five 1s. Pooled (n = 10: 1 x7, 2, 3, inf), M*(0.34) has
    k = ceil(11 * 0.66) = 8 -> 2: too small for x (3), larger than y needs (1)."""
    items = scored_items([3.0, 1.0, math.inf, 2.0, 1.0] + [1.0] * 5)
    labels = {it.id: ("x" if i < 5 else "y") for i, it in enumerate(items)}
    reports = {r.label: r.report for r in certify_segments(items, labels, [0.34, 0.5])}
    assert reports["x"].thresholds == {0.34: 3.0, 0.5: 2.0}
    assert reports["y"].thresholds == {0.34: 1.0, 0.5: 1.0}
    assert conformal_thresholds([it.score for it in items], [0.34])[0.34] == 2.0
