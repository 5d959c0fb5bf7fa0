"""Conformal thresholds, reliability level, weights and bounds."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from monitor.core.conformal import (
    aci_update,
    conformal_threshold,
    conformal_thresholds,
    decay_weights,
    effective_sample_size,
    inclusion_weights,
    quantile_index,
    reliability_level,
    reliability_lower_bound,
    weighted_reliability_level,
    weighted_reliability_lower_bound,
    weighted_threshold,
)
from monitor.core.errors import ConfigError, InputError

ALPHAS = (0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
score_lists = st.lists(
    st.one_of(st.integers(1, 12).map(float), st.just(math.inf)), min_size=0, max_size=60
)
alphas = st.floats(0.001, 0.999, allow_nan=False)


def exact_k(n: int, alpha: float) -> int:
    """k = ceil((n+1)(1-alpha)) in exact rational arithmetic on alpha's decimal form."""
    a = Fraction(repr(alpha))
    return math.ceil((n + 1) * (1 - a))


# --- plain threshold ------------------------------------------------------------------


def test_threshold_hand_computed() -> None:
    scores = [1, 1, 2, 1, 3, 1, 1, 2, 1, 5]  # n = 10
    # alpha 0.1: k = ceil(11 * 0.9) = ceil(9.9) = 10 -> largest score = 5
    assert conformal_threshold(scores, 0.1) == 5
    # alpha 0.3: k = ceil(7.7) = 8 -> sorted 1,1,1,1,1,1,2,2,3,5 -> 2
    assert conformal_threshold(scores, 0.3) == 2
    # alpha 0.05: k = ceil(10.45) = 11 > n -> inf, never clamped to the max
    assert conformal_threshold(scores, 0.05) == math.inf


def test_integer_boundary_is_not_pushed_by_float_noise() -> None:
    # (n+1)(1-alpha) = 90 exactly for n = 99, alpha = 0.1; floats give 90.00000000000001.
    assert (99 + 1) * (1 - 0.1) != 90 or True
    assert quantile_index(99, 0.1) == 90
    assert quantile_index(19, 0.05) == 19
    assert quantile_index(9, 0.3) == 7


@given(n=st.integers(0, 5000), alpha=st.sampled_from((*ALPHAS, 0.5, 0.33, 0.125)))
def test_quantile_index_matches_exact_rational(n: int, alpha: float) -> None:
    assert quantile_index(n, alpha) == exact_k(n, alpha)


@given(scores=score_lists, alpha=alphas)
def test_inf_exactly_when_k_exceeds_n(scores: list[float], alpha: float) -> None:
    n = len(scores)
    k = quantile_index(n, alpha)
    m = conformal_threshold(scores, alpha)
    if k > n:
        assert m == math.inf
    else:
        assert m == sorted(scores)[k - 1]


@given(scores=score_lists, a1=alphas, a2=alphas)
def test_threshold_non_increasing_in_alpha(scores: list[float], a1: float, a2: float) -> None:
    lo, hi = sorted((a1, a2))
    assert conformal_threshold(scores, hi) <= conformal_threshold(scores, lo)


def test_small_n_never_clamped() -> None:
    # n < 1/alpha - 1 -> a clamped quantile would return max(scores) and under-cover.
    for n in range(0, 19):
        assert conformal_threshold([1.0] * n, 0.05) == math.inf
    assert conformal_threshold([1.0] * 19, 0.05) == 1.0


def test_thresholds_batch_equals_single() -> None:
    rng = np.random.default_rng(3)
    scores = rng.integers(1, 6, 137).astype(float)
    scores[rng.random(137) < 0.04] = math.inf
    batch = conformal_thresholds(scores, ALPHAS)
    assert batch == {a: conformal_threshold(scores, a) for a in ALPHAS}


def test_nan_scores_rejected() -> None:
    with pytest.raises(InputError, match="NaN"):
        conformal_threshold([1.0, math.nan], 0.1)
    with pytest.raises(ConfigError, match="alpha"):
        conformal_threshold([1.0], 1.0)


# --- golden values against a peer library (crepes) ------------------------------------


def crepes_threshold(scores: np.ndarray, alpha: float) -> float:
    from crepes import ConformalRegressor

    cr = ConformalRegressor()
    cr.fit(residuals=scores)
    with warnings.catch_warnings():
        # crepes warns (and returns an infinite interval) when k > n.
        warnings.simplefilter("ignore")
        interval = cr.predict_int(y_hat=np.zeros(1), confidence=1 - alpha)
    return float(interval[0, 1])


@pytest.mark.parametrize("n", [5, 7, 19, 20, 50, 99, 200, 333, 1000])
def test_matches_crepes(n: int) -> None:
    rng = np.random.default_rng(n)
    # Rank-like scores with many ties and some inf, and continuous scores.
    discrete = rng.integers(1, 5, n).astype(float)
    discrete[rng.random(n) < 0.03] = math.inf
    continuous = rng.exponential(size=n)
    checked = 0
    for scores in (discrete, continuous):
        for alpha in (*ALPHAS, 0.033, 0.123, 0.37):
            product = alpha * (n + 1)
            if abs(product - round(product)) < 1e-6:
                # crepes floors (1-confidence)(n+1) in floating point; on exact integers that
                # can land one below. Those cases are covered by the exact-rational test.
                continue
            assert conformal_threshold(scores, alpha) == crepes_threshold(scores, alpha), (n, alpha)
            checked += 1
    assert checked >= 2


# --- reliability level ----------------------------------------------------------------


def test_reliability_level_definition() -> None:
    assert reliability_level([1, 1, 2, math.inf]) == pytest.approx(2 / 5)
    assert reliability_level([]) == 0.0
    assert reliability_level([1] * 99) == pytest.approx(99 / 100)


# --- weighted forms --------------------------------------------------------------------


@settings(max_examples=200)
@given(scores=score_lists, alpha=alphas, w=st.floats(1e-3, 1e3))
def test_weighted_equals_unweighted_for_equal_weights(
    scores: list[float], alpha: float, w: float
) -> None:
    weights = [w] * len(scores)
    assert weighted_threshold(scores, weights, alpha, test_weight=w) == conformal_threshold(
        scores, alpha
    )
    assert weighted_reliability_level(scores, weights, test_weight=w) == pytest.approx(
        reliability_level(scores)
    )


def brute_weighted_threshold(
    scores: list[float], weights: list[float], alpha: float, w_test: float
) -> float:
    """Independent form: the (1-alpha) quantile of sum p_i delta_{s_i} + p* delta_inf."""
    total = sum(weights) + w_test
    candidates = [*sorted(set(scores)), math.inf]
    for v in candidates:
        mass = sum(w for s, w in zip(scores, weights, strict=True) if s <= v) / total
        if v == math.inf:
            mass += w_test / total
        if mass >= 1 - alpha - 1e-10:
            return v
    raise AssertionError("unreachable: all mass is <= inf")


@settings(max_examples=200)
@given(
    data=st.lists(
        st.tuples(st.one_of(st.integers(1, 8).map(float), st.just(math.inf)), st.floats(0, 50)),
        max_size=40,
    ),
    alpha=alphas,
    w_test=st.floats(0.01, 50),
)
def test_weighted_matches_brute_force(
    data: list[tuple[float, float]], alpha: float, w_test: float
) -> None:
    scores = [s for s, _ in data]
    weights = [w for _, w in data]
    assert weighted_threshold(scores, weights, alpha, w_test) == brute_weighted_threshold(
        scores, weights, alpha, w_test
    )


def test_weighted_hand_example() -> None:
    # Recent items (weight 1) all score 3, old ones (weight 1/8) score 1: drift upwards.
    scores = [1, 1, 1, 1, 3, 3]
    weights = [0.125] * 4 + [1, 1]
    # total = 0.5 + 2 + 1 (test) = 3.5; mass(<=1) = 0.5/3.5 = 0.143; mass(<=3) = 2.5/3.5 = 0.714
    assert weighted_threshold(scores, weights, 0.30) == 3
    assert weighted_threshold(scores, weights, 0.20) == math.inf
    assert weighted_threshold(scores, weights, 0.90) == 1
    assert weighted_reliability_level(scores, weights) == pytest.approx(0.5 / 3.5)
    # Unweighted, the same scores look far better.
    assert reliability_level(scores) == pytest.approx(4 / 7)


def test_zero_weights_drop_items() -> None:
    # total = 1 + 0 + 1 (test): the weight-0 item adds no mass.
    assert weighted_threshold([1, 9], [1, 0], 0.5) == 1
    assert weighted_threshold([1, 9], [1, 0], 0.4) == math.inf
    with pytest.raises(InputError):
        weighted_threshold([1, 2], [1, -1], 0.1)
    with pytest.raises(InputError):
        weighted_threshold([1, 2], [1], 0.1)


def test_decay_weights_and_n_eff() -> None:
    w = decay_weights([0, 10, 20, 30], half_life=10)
    assert w == pytest.approx([1, 0.5, 0.25, 0.125])
    assert effective_sample_size([1, 1, 1, 1]) == pytest.approx(4)
    assert effective_sample_size(w) == pytest.approx(1.875**2 / (1 + 0.25 + 0.0625 + 0.015625))
    assert effective_sample_size([]) == 0.0
    # A long window with half-life h has n_eff close to 2h/ln 2 * ln2... check numerically:
    ages = np.arange(100_000)
    h = 50.0
    r = 2 ** (-1 / h)
    expected = (1 + r) / (1 - r)  # (sum r^a)^2 / sum r^2a for an infinite window
    assert effective_sample_size(decay_weights(ages, h)) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(InputError):
        decay_weights([-1], 10)


def test_inclusion_weights() -> None:
    assert inclusion_weights([1.0, 0.5, 0.1]) == pytest.approx([1, 2, 10])
    for bad in ([0.0], [1.5], [-0.2]):
        with pytest.raises(InputError):
            inclusion_weights(bad)


def test_inclusion_weighting_corrects_biased_review() -> None:
    # Easy items (score 1) are reviewed with probability 0.9, hard (score 2) with 0.1.
    # The population is half easy, half hard: the weighted level recovers ~0.5, the
    # unweighted level of the reviewed items does not.
    rng = np.random.default_rng(11)
    hard = rng.random(200_000) < 0.5
    pi = np.where(hard, 0.1, 0.9)
    reviewed = rng.random(hard.size) < pi
    scores = np.where(hard, 2.0, 1.0)[reviewed]
    weights = inclusion_weights(pi[reviewed])
    level = weighted_reliability_level(scores, weights, test_weight=10.0)
    assert level == pytest.approx(0.5, abs=0.01)
    assert reliability_level(scores) == pytest.approx(0.9, abs=0.01)


# --- ACI --------------------------------------------------------------------------------


def test_aci_update_direction_and_long_run_error() -> None:
    assert aci_update(0.1, 0.1, True, 0.01) == pytest.approx(0.1 - 0.009)
    assert aci_update(0.1, 0.1, False, 0.01) == pytest.approx(0.1 + 0.001)
    # Long-run miscoverage tracks alpha even when scores drift (Gibbs & Candès, Prop. 4.1).
    rng = np.random.default_rng(5)
    alpha, gamma, a_t = 0.1, 0.01, 0.1
    history: list[float] = list(rng.normal(size=200))
    errors = []
    for t in range(6000):
        shift = t / 1000.0  # steady upward drift
        s = rng.normal(loc=shift)
        window = history[-200:]
        q = (
            math.inf
            if a_t <= 0
            else (-math.inf if a_t >= 1 else float(np.quantile(window, 1 - a_t)))
        )
        err = s > q
        errors.append(err)
        a_t = aci_update(a_t, alpha, err, gamma)
        history.append(s)
    assert abs(np.mean(errors) - alpha) < 0.02


# --- lower bound --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "n", "delta"),
    [(0, 10, 0.05), (7, 10, 0.05), (10, 10, 0.1), (180, 200, 0.01), (1, 1, 0.05)],
)
def test_lower_bound_matches_scipy_exact_interval(x: int, n: int, delta: float) -> None:
    # A one-sided 1-delta bound is the lower end of the two-sided 1-2*delta exact interval.
    ci = stats.binomtest(x, n).proportion_ci(confidence_level=1 - 2 * delta, method="exact")
    assert reliability_lower_bound(x, n, delta) == pytest.approx(ci.low, abs=1e-12)


def test_lower_bound_covers_at_its_confidence() -> None:
    rng = np.random.default_rng(2)
    p, n, delta = 0.83, 120, 0.05
    x = rng.binomial(n, p, size=20_000)
    bounds = np.array([reliability_lower_bound(int(v), n, delta) for v in np.unique(x)])
    lookup = dict(zip(np.unique(x), bounds, strict=True))
    miss = np.mean([lookup[v] > p for v in x])
    assert miss <= delta + 3 * math.sqrt(delta * (1 - delta) / x.size)


def test_weighted_lower_bound_reduces_to_plain_and_widens_with_decay() -> None:
    scores = np.array([1.0] * 80 + [2.0] * 20)
    plain = weighted_reliability_lower_bound(scores, np.ones(100), 0.05)
    assert plain == pytest.approx(reliability_lower_bound(80, 100, 0.05))
    decayed = weighted_reliability_lower_bound(
        scores, decay_weights(np.arange(100)[::-1], 20), 0.05
    )
    assert decayed < plain


# --- the coverage guarantee, tested statistically -------------------------------------------


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_mean_coverage_over_random_splits(alpha: float) -> None:
    """Over 400 random splits of a fixed data set, mean coverage lies in
    [1-alpha, 1-alpha+1/(n+1)] up to sampling error (continuous scores: no ties)."""
    rng = np.random.default_rng(20261122)
    data = rng.gamma(2.0, size=1200)
    n_cal = 199
    covs = []
    for _ in range(400):
        perm = rng.permutation(data.size)
        cal, test = data[perm[:n_cal]], data[perm[n_cal:]]
        m = conformal_threshold(cal, alpha)
        covs.append(np.mean(test <= m))
    mean, se = float(np.mean(covs)), float(np.std(covs, ddof=1) / math.sqrt(len(covs)))
    lo, hi = 1 - alpha, 1 - alpha + 1 / (n_cal + 1)
    assert lo - 4 * se <= mean <= hi + 4 * se, (mean, se, lo, hi)
    # And the exact expectation k/(n+1) for exchangeable, tie-free scores:
    assert mean == pytest.approx(quantile_index(n_cal, alpha) / (n_cal + 1), abs=4 * se)


def test_rank_scores_with_ties_never_under_cover() -> None:
    """Discrete rank scores: only the lower bound holds (ties push coverage up)."""
    rng = np.random.default_rng(8)
    n_cal, covs = 200, []
    for _ in range(300):
        scores = rng.choice([1.0, 2.0, 3.0, math.inf], p=[0.7, 0.2, 0.07, 0.03], size=n_cal + 500)
        m = conformal_threshold(scores[:n_cal], 0.1)
        covs.append(np.mean(scores[n_cal:] <= m))
    assert np.mean(covs) >= 0.9
