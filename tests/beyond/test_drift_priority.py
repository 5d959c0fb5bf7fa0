"""The live self-check and ACI under drift; prioritised review keeps coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.conformal import aci_update
from monitor.simulate.drift import run_drift, simulate_stream
from monitor.simulate.priority import _prioritised, run_priority, synthetic_items


@pytest.fixture(scope="module")
def drift() -> object:
    return run_drift(reps=3, seed=1)


def test_self_check_holds_on_a_stationary_stream_and_falls_under_drift(drift: object) -> None:
    from monitor.simulate.drift import DriftResult

    assert isinstance(drift, DriftResult)
    window = drift.coverage["window"]
    # 3 x 1000 stationary items: a 1 - alpha = 0.9 coverage has SE ~ 0.0055
    assert window["before"] >= 0.9 - 3 * math.sqrt(0.09 / 3000)
    # during the drift the decay window lags: 3 x 500 items, clearly below 0.9
    assert window["during"] <= 0.9 - 3 * math.sqrt(0.09 / 1500)


def test_aci_long_run_coverage_matches_the_promise(drift: object) -> None:
    from monitor.simulate.drift import DriftResult

    assert isinstance(drift, DriftResult)
    aci = drift.coverage["window + ACI"]
    # Gibbs & Candes: |miss rate - alpha| <= (max(alpha, 1 - alpha) + gamma) / (gamma T)
    bound = (0.9 + drift.gamma) / (drift.gamma * drift.steps)
    assert abs((1 - aci["overall"]) - drift.alpha) <= bound
    assert aci["during"] > drift.coverage["window"]["during"]


def test_aci_bound_holds_for_every_single_stream() -> None:
    """The ACI bound is deterministic: check it per stream, with a hand recursion."""
    gamma, alpha, steps = 0.02, 0.1, 2000
    for seed in range(3):
        misses, _, _ = simulate_stream(
            np.random.default_rng(seed),
            alpha=alpha,
            gamma=gamma,
            steps=steps,
            drift_start=500,
            drift_end=900,
            half_life=800,
            window=2000,
        )
        a = alpha
        for m in misses:
            a = aci_update(a, alpha, bool(m), gamma)
        assert a == pytest.approx(alpha + gamma * (steps * alpha - misses.sum()))
        assert abs(misses.mean() - alpha) <= (max(alpha, 1 - alpha) + gamma) / (gamma * steps)


def test_prioritised_probabilities_spend_the_budget_and_respect_the_floor() -> None:
    _, margins = synthetic_items(np.random.default_rng(0), 1000, ((0.5, 0.9), (0.5, 0.4)))
    pi = _prioritised(margins, 100, 0.02)
    assert pi.sum() == pytest.approx(100, rel=1e-6)
    assert pi.min() >= 0.02 - 1e-12
    assert np.corrcoef(pi, margins)[0, 1] < -0.9  # the uncertain get reviewed more


@pytest.mark.slow
def test_prioritised_review_keeps_coverage_and_lowers_the_error() -> None:
    result = run_priority(mixes=("mostly easy",), budgets=(200,), n=1500, reps=60, seed=4)
    uniform = result.row("mostly easy", 200, "uniform")
    prio = result.row("mostly easy", 200, "prioritised")
    for row in (uniform, prio):
        # mean coverage over 60 x 500 fresh items (clustered by repetition)
        assert row.coverage >= 0.9 - 0.01, row
        assert row.bound_ok >= 0.9, row
    assert prio.rmse < uniform.rmse
