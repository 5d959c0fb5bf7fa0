"""The prediction-powered level: a hand-computed example, the Agresti-Coull bound of
statsmodels for a constant judge, coverage over many seeds with biased and good judges
(equal and unequal inclusion probabilities, drift weights), and how much tighter than
the human-only bound it is at the same number of reviews."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.proportion import proportion_confint

from monitor.core.conformal import reliability_lower_bound
from monitor.core.errors import ConfigError, InputError
from monitor.core.ppi import MIN_REVIEWS, ppi_reliability

DELTA = 0.05


def labelled(rng: np.random.Generator, n: int, p: float, sens: float, fpr: float):
    """n items: human labels Y ~ Bernoulli(p); judge J = 1 w.p. sens if Y else fpr."""
    y = (rng.random(n) < p).astype(float)
    j = np.where(y == 1, rng.random(n) < sens, rng.random(n) < fpr).astype(float)
    return y, j


def test_a_hand_computed_example() -> None:
    # 10 judged items, 6 called acceptable. Reviewed: 4 the judge accepted (3 right),
    # 2 it rejected (1 actually acceptable): level = 0.6 * 3/4 + 0.4 * 1/2 = 0.65.
    judged = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 0], dtype=float)
    human, judge = np.array([1, 1, 1, 0, 1, 0.0]), np.array([1, 1, 1, 1, 0, 0.0])
    est = ppi_reliability(judged, np.ones(10), human, judge, np.ones(6), delta=DELTA, min_reviews=0)
    assert est is not None
    assert est.level == pytest.approx(0.65, abs=1e-12)
    assert est.judge_positive == pytest.approx(0.6) and est.agreement == pytest.approx(4 / 6)
    assert est.lower_bound < est.level


@pytest.mark.parametrize(("successes", "n"), [(37, 40), (40, 40), (12, 50), (180, 200)])
def test_a_constant_judge_gives_the_agresti_coull_bound_of_statsmodels(
    successes: int, n: int
) -> None:
    human = np.r_[np.ones(successes), np.zeros(n - successes)]
    est = ppi_reliability(
        np.ones(500), np.ones(500), human, np.ones(n), np.ones(n), delta=DELTA, min_reviews=0
    )
    assert est is not None
    lower, _ = proportion_confint(successes, n, alpha=2 * DELTA, method="agresti_coull")
    assert est.lower_bound == pytest.approx(min(max(lower, 0.0), successes / n), abs=1e-12)
    assert est.level == pytest.approx(successes / n)


def _coverage(
    p: float, sens: float, fpr: float, *, seeds: int, unequal: bool
) -> tuple[float, float]:
    """Share of seeds whose bound is at most the true p, and the mean bound."""
    rng = np.random.default_rng(20261125)
    n_items, covered, bounds = 2000, 0, []
    for _ in range(seeds):
        y, j = labelled(rng, n_items, p, sens, fpr)
        # Unequal inclusion: items the judge rejects go to review more often (priority).
        pi = np.where(j == 0, 0.3, 0.05) if unequal else np.full(n_items, 0.1)
        decay = np.exp2(-rng.random(n_items))  # drift weights of ages up to a half-life
        reviewed = rng.random(n_items) < pi
        est = ppi_reliability(
            j,
            decay,
            y[reviewed],
            j[reviewed],
            decay[reviewed] / pi[reviewed],
            delta=DELTA,
        )
        assert est is not None
        covered += est.lower_bound <= p
        bounds.append(est.lower_bound)
    return covered / seeds, float(np.mean(bounds))


@pytest.mark.parametrize(
    ("name", "p", "sens", "fpr"),
    [
        ("judge says yes to most wrong answers", 0.8, 0.95, 0.7),
        ("judge always says yes", 0.7, 1.0, 1.0),
        ("judge too strict", 0.85, 0.6, 0.02),
        ("good judge", 0.8, 0.98, 0.04),
    ],
)
@pytest.mark.parametrize("unequal", [False, True])
def test_the_bound_covers_at_its_nominal_rate_whatever_the_judge(
    name: str, p: float, sens: float, fpr: float, unequal: bool
) -> None:
    seeds = 1500
    coverage, _ = _coverage(p, sens, fpr, seeds=seeds, unequal=unequal)
    slack = 3 * math.sqrt(DELTA * (1 - DELTA) / seeds)
    assert coverage >= 1 - DELTA - slack, (name, coverage)


def test_a_good_judge_gives_a_tighter_bound_than_humans_alone() -> None:
    rng = np.random.default_rng(11)
    p, n_items, pi = 0.8, 2000, 0.1
    gap_ppi, gap_human = [], []
    for _ in range(300):
        y, j = labelled(rng, n_items, p, 0.97, 0.08)
        reviewed = rng.random(n_items) < pi
        ones = np.ones(reviewed.sum())
        est = ppi_reliability(j, np.ones(n_items), y[reviewed], j[reviewed], ones / pi, delta=DELTA)
        assert est is not None
        gap_ppi.append(p - est.lower_bound)
        gap_human.append(
            p - reliability_lower_bound(float(y[reviewed].sum()), float(reviewed.sum()), DELTA)
        )
    # The human-only Clopper-Pearson bound sits about 0.05 under p with ~200 reviews;
    # with a judge that is right ~96% of the time the PPI bound sits about 0.03 under.
    assert np.mean(gap_ppi) < 0.7 * np.mean(gap_human), (np.mean(gap_ppi), np.mean(gap_human))


def test_too_few_reviews_give_no_estimate_and_bad_input_is_refused() -> None:
    few = MIN_REVIEWS - 1
    ones = np.ones(few)
    assert ppi_reliability(np.ones(100), np.ones(100), ones, ones, ones, delta=DELTA) is None
    with pytest.raises(InputError):
        ppi_reliability([0.5], [1.0], [1.0], [1.0], [1.0], delta=DELTA, min_reviews=0)
    with pytest.raises(InputError):
        ppi_reliability([1.0], [1.0, 2.0], [1.0], [1.0], [1.0], delta=DELTA, min_reviews=0)
    with pytest.raises(ConfigError):
        ppi_reliability([1.0], [1.0], [1.0], [1.0], [1.0], delta=1.5, min_reviews=0)


def test_no_disagreement_in_a_small_sample_does_not_claim_an_exact_judge() -> None:
    n = 40
    ones = np.ones(n)
    est = ppi_reliability(np.ones(5000), np.ones(5000), ones, ones, ones, delta=DELTA)
    assert est is not None
    # A normal interval would say 1.0 (no variance seen); the rule of three says that
    # 40 agreements rule out disagreement rates above about 3/40 only.
    assert est.lower_bound < 0.97 and est.agreement == 1.0


def test_a_long_pause_lowers_the_estimate_with_the_test_weight() -> None:
    rng = np.random.default_rng(5)
    y, j = labelled(rng, 400, 0.9, 0.95, 0.1)
    args = (j, np.ones(400), y[:100], j[:100], np.ones(100))
    fresh = ppi_reliability(*args, delta=DELTA, test_weight=1.0)
    paused = ppi_reliability(*args, delta=DELTA, test_weight=100.0)
    assert fresh is not None and paused is not None
    assert paused.level == pytest.approx(fresh.level * (101 / 200), rel=1e-9)
    assert paused.lower_bound <= paused.level
