"""The e-detector reliability alarm: validity (statistically, fixed seeds) and power."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.app.simulate.alarm import StreamEDetector, first_alarms, run_alarm
from monitor.core.alarm import DEFAULT_BETS, EDetector, bet_grid
from monitor.core.errors import ConfigError, InputError

TAU = 0.9


def test_statistic_matches_a_hand_computation() -> None:
    det = EDetector(tau=TAU, alpha=0.01)
    outcomes = [False, False, True, False]
    expected = []
    for lam in (f / (1 - TAU) for f in DEFAULT_BETS):
        m = 1.0
        for x in outcomes:
            m = max(m, 1.0) * (1 + lam * (TAU - x))
        expected.append(m)
    for x in outcomes:
        det.update(x)
    assert det.value == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert det.n == 4 and not det.alarm


def test_vectorised_detector_matches_the_service_detector() -> None:
    """`relmon simulate alarm`'s vectorised e-detector and the service's EDetector, fed the
    same random streams (below, at and above the target): the same statistic at every
    step and the same first alarm."""
    alpha, horizon = 0.01, 400
    probs = np.repeat([0.7, 0.8, 0.85, 0.9, 0.95], 8)
    streams = probs.size
    x = (np.random.default_rng(21).random((horizon, streams)) < probs).astype(float)
    vector = StreamEDetector(TAU, alpha)
    scalar = [EDetector(tau=TAU, alpha=alpha) for _ in range(streams)]
    first_v = np.full(streams, horizon + 1)
    first_s = np.full(streams, horizon + 1)
    for t in range(horizon):
        flags = vector(x[t])
        values = vector.value
        assert values.max() < 1e150  # far below the simulation's cap
        for i, det in enumerate(scalar):
            det.update(bool(x[t, i]))
            assert values[i] == pytest.approx(det.value, rel=1e-9, abs=0)
            if det.alarm and first_s[i] > horizon:
                first_s[i] = t + 1
        first_v[flags & (first_v > horizon)] = t + 1
    assert (first_v == first_s).all()
    assert (first_s <= horizon).sum() >= 8  # the drops are caught: alarm times compared
    assert (first_s > horizon).sum() >= 8  # and streams at or above the target are quiet
    # first_alarms (what the simulation reports) draws the same streams from its rng
    probs_t = np.broadcast_to(probs, (horizon, streams))
    rng = np.random.default_rng(22)
    draws = np.random.default_rng(22).random((horizon, streams)) < probs
    expected = np.full(streams, horizon + 1)
    for i in range(streams):
        det = EDetector(tau=TAU, alpha=alpha)
        for t in range(horizon):
            if det.update(bool(draws[t, i])) >= det.threshold:
                expected[i] = t + 1
                break
    got = first_alarms(
        "e-detector", probs_t, streams, tau=TAU, alpha=alpha, window=100, delta=0.05, rng=rng
    )
    assert (got == expected).all()


def test_bets_stay_in_the_allowed_range() -> None:
    assert max(bet_grid(0.8)) <= 1 / (1 - 0.8)
    with pytest.raises(ConfigError):
        bet_grid(1.0)
    with pytest.raises(InputError):
        EDetector(tau=TAU, pi_min=0.2).update(True, 0.1)  # below the floor


@given(
    steps=st.lists(st.tuples(st.booleans(), st.floats(0.05, 1.0)), max_size=60),
    tau=st.floats(0.5, 0.99),
)
def test_statistic_never_negative(steps: list[tuple[bool, float]], tau: float) -> None:
    det = EDetector(tau=tau, pi_min=0.05)
    for accepted, pi in steps:
        det.update(accepted, pi)
        assert all(m >= 0 for m in det.stats)


def test_ipw_factor_has_mean_at_most_one_under_prioritised_review() -> None:
    """Hard items (low acceptance) are reviewed more often. The traffic reliability is
    exactly tau. Weighted by pi_min/pi the factor's mean over reviewed items is 1 (the
    closed form 1 + lambda pi_min (tau - E[X]) / E[pi]); unweighted it is above 1."""
    rng = np.random.default_rng(11)
    n = 400_000
    hard = rng.random(n) < 0.3
    r = np.where(hard, 0.7, (TAU - 0.3 * 0.7) / 0.7)  # E[r] = tau exactly
    assert 0.3 * 0.7 + 0.7 * r[~hard][0] == pytest.approx(TAU)
    pi = np.where(hard, 0.8, 0.1)
    x = rng.random(n) < r
    reviewed = rng.random(n) < pi
    lam = 0.8 / (1 - TAU)
    u = 0.1 / pi[reviewed]
    weighted = 1 + lam * u * (TAU - x[reviewed])
    plain = 1 + lam * (TAU - x[reviewed])
    se = weighted.std() / math.sqrt(weighted.size)
    assert abs(weighted.mean() - 1.0) < 4 * se
    assert plain.mean() > 1.0 + 10 * (plain.std() / math.sqrt(plain.size))


def test_average_run_length_at_target_is_at_least_one_over_alpha() -> None:
    alpha = 0.05
    first = first_alarms(
        "e-detector",
        np.full(3000, TAU),
        400,
        tau=TAU,
        alpha=alpha,
        window=100,
        delta=0.05,
        rng=np.random.default_rng(5),
    )
    # censored at 3001: the censored mean is a lower bound of the true mean
    assert first.mean() >= 1 / alpha
    assert first.mean() >= 5 / alpha  # in practice far above the promise


def test_average_run_length_with_prioritised_review() -> None:
    """Per-stream EDetector with inclusion probabilities that depend on hardness."""
    rng = np.random.default_rng(8)
    alpha, runs, horizon = 0.05, 150, 1500
    lengths = []
    for _ in range(runs):
        det = EDetector(tau=TAU, alpha=alpha, pi_min=0.1)
        t = horizon + 1
        for i in range(1, horizon + 1):
            hard = rng.random() < 0.3 / (0.3 + 0.7 * 0.1 / 0.8)  # tilted by review
            pi = 0.8 if hard else 0.1
            p = 0.7 if hard else (TAU - 0.21) / 0.7
            if det.update(bool(rng.random() < p), pi) >= det.threshold:
                t = i
                break
        lengths.append(t)
    assert np.mean(lengths) >= 1 / alpha


def test_detects_a_twenty_point_drop_quickly_and_rarely_fires_before() -> None:
    result = run_alarm(
        tau=TAU, alpha=0.001, above=(0.05,), drops=(0.2,), streams=300, horizon=600, pre=200
    )
    e_rows = [d for d in result.delays if d.rule == "e-detector"]
    assert e_rows[0].detected >= 0.99
    assert e_rows[0].mean_delay <= 80
    assert e_rows[0].early <= 0.05  # 200 items exactly at the target before the drop
    naive = next(r for r in result.false_alarms if r.rule == "lower bound")
    e_false = next(r for r in result.false_alarms if r.rule == "e-detector")
    # at 5 points above the target the naive rule pages on noise, the e-detector does not
    assert naive.alarmed >= 0.9 and e_false.alarmed <= 0.1


def test_lower_bound_rule_on_a_full_window_still_fires_above_the_target() -> None:
    """Checked only once the window is full, the naive rule waits for 100 items, then
    fires anyway: at n = 100 its 95% bound is below 0.9 unless >= 96 were accepted."""
    kwargs: dict[str, Any] = {"tau": TAU, "alpha": 0.01, "window": 100, "delta": 0.05}
    probs = np.full(300, 0.95)
    early = first_alarms("lower bound", probs, 200, rng=np.random.default_rng(3), **kwargs)
    full = first_alarms(
        "lower bound, full window", probs, 200, rng=np.random.default_rng(3), **kwargs
    )
    assert (early == 1).all()  # one item: the bound is 0.05
    assert full.min() == 100 and (full <= 300).mean() >= 0.9
