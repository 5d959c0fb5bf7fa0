"""The live self-check and ACI under drift; prioritised review keeps coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.app.simulate.drift import run_drift, simulate_stream
from monitor.app.simulate.priority import (
    MATCH_STEP,
    MIXES,
    PriorityResult,
    _prioritised,
    prioritised_at,
    reference_traffic,
    run_priority,
    synthetic_items,
)
from monitor.core.conformal import aci_update


@pytest.fixture(scope="module")
def drift() -> object:
    return run_drift(reps=3, seed=1)


def test_self_check_holds_on_a_stationary_stream_and_falls_under_drift(drift: object) -> None:
    from monitor.app.simulate.drift import DriftResult

    assert isinstance(drift, DriftResult)
    window = drift.coverage["window"]
    # 3 x 1000 stationary items: a 1 - alpha = 0.9 coverage has SE ~ 0.0055
    assert window["before"] >= 0.9 - 3 * math.sqrt(0.09 / 3000)
    # during the drift the decay window lags: 3 x 500 items, clearly below 0.9
    assert window["during"] <= 0.9 - 3 * math.sqrt(0.09 / 1500)


def test_aci_long_run_coverage_matches_the_promise(drift: object) -> None:
    from monitor.app.simulate.drift import DriftResult

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


PRIORITY_REPS = 80


@pytest.fixture(scope="module")
def priority() -> PriorityResult:
    """Every mix `relmon simulate priority` uses, at 200 reviews of 1500 items."""
    return run_priority(budgets=(200,), n=1500, reps=PRIORITY_REPS, seed=4, match=False)


@pytest.mark.slow
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("design", ["uniform", "prioritised"])
def test_prioritised_review_keeps_coverage_on_every_mix(
    priority: PriorityResult, mix: str, design: str
) -> None:
    row = priority.row(mix, 200, design)
    # The promise is on the mean coverage, E[coverage] >= 1 - alpha. The mean over 80
    # repetitions x 500 fresh items varies mostly between repetitions (each has its own
    # calibration), so its standard error is the spread of the per-repetition coverage.
    assert 0 < row.coverage_se < 0.01, row
    assert row.coverage >= 0.9 - 3 * row.coverage_se, row
    # The lower bound holds with probability >= 1 - delta = 0.95 (binomial over reps).
    assert row.bound_ok >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / PRIORITY_REPS), row


@pytest.mark.slow
def test_prioritised_review_lowers_the_error_when_most_items_are_easy(
    priority: PriorityResult,
) -> None:
    uniform = priority.row("mostly easy", 200, "uniform")
    prio = priority.row("mostly easy", 200, "prioritised")
    assert prio.rmse < uniform.rmse


@pytest.mark.slow
@pytest.mark.parametrize("mix", ["mostly easy", "all hard"])
def test_reviews_needed_for_the_same_width_and_rmse_are_consistent(mix: str) -> None:
    """The reported budgets really reach the uniform design's width and RMSE (and one step
    fewer does not), recomputed from the same seeds."""
    n, reps, seed = 1000, 20, 3
    result = run_priority(mixes=(mix,), budgets=(100,), n=n, reps=reps, seed=seed)
    match = result.match(mix)
    uniform = result.row(mix, 100, "uniform")
    assert match.uniform_width == pytest.approx(uniform.width, rel=1e-12)
    assert match.uniform_rmse == pytest.approx(uniform.rmse, rel=1e-12)
    traffic = [reference_traffic(mix, 100, r, n=n, seed=seed) for r in range(reps)]

    def at(budget: int) -> tuple[float, float]:
        return prioritised_at(traffic, budget, floor_share=result.floor_share, delta=0.05)

    for needed, index, target in (
        (match.reviews_for_width, 1, match.uniform_width),
        (match.reviews_for_rmse, 0, match.uniform_rmse),
    ):
        assert needed is not None and needed % MATCH_STEP == 0
        assert at(needed)[index] <= target
        assert at(needed - MATCH_STEP)[index] > target
    # The 1/pi weights cut Kish's effective size: a wider bound at equal reviews.
    assert match.reviews_for_width is not None and match.reviews_for_width > 100
    if mix == "mostly easy":  # ... but a smaller error of the level
        assert match.reviews_for_rmse is not None and match.reviews_for_rmse < 100
