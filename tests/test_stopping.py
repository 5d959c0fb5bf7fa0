"""Sequential stopping rules: the e-value, validity, efficiency and batching."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from monitor.app.simulate.stopping import run_stopping_trials
from monitor.core.errors import ConfigError
from monitor.core.stopping import (
    DEFAULT_RULE,
    HoeffdingRule,
    MixtureRule,
    RunnerUpRule,
    TruncatedRule,
    available_rules,
    fewest_samples,
    get_stopping_rule,
    mixture_log_e_value,
)

DELTA, K_MAX = 0.05, 20

GRID = {
    "unanimous": [1.0],
    "clear 0.9/0.1": [0.9, 0.1],
    "clear 0.7/0.2/0.1": [0.7, 0.2, 0.1],
    "near 0.6/0.4": [0.6, 0.4],
    "near 0.55/0.45": [0.55, 0.45],
    "near 0.52/0.48": [0.52, 0.48],
    "tie 0.5/0.5": [0.5, 0.5],
    "tie 0.4/0.4/0.2": [0.4, 0.4, 0.2],
    "tie 3-way": [1 / 3] * 3,
    "tail 0.5+10x0.05": [0.5] + [0.05] * 10,
    "tail 0.6+20x0.02": [0.6] + [0.02] * 20,
    "tie+tail": [0.35, 0.35] + [0.03] * 10,
}


@pytest.mark.parametrize(("x", "y"), [(0, 0), (5, 0), (7, 0), (6, 2), (10, 9), (3, 12), (30, 4)])
@pytest.mark.parametrize("w1", [0.0, 0.3])
def test_e_value_matches_numerical_integral(x: int, y: int, w1: float) -> None:
    def lr(theta: float) -> float:
        return float(theta**x * (1 - theta) ** y / 0.5 ** (x + y))

    uniform = 2 * integrate.quad(lr, 0.5, 1.0, epsabs=1e-13)[0]
    expected = (1 - w1) * uniform + (w1 * 2.0 ** (x + y) if y == 0 else 0.0)
    assert math.exp(mixture_log_e_value(x, y, w1)) == pytest.approx(expected, rel=1e-8)


@pytest.mark.parametrize("n", [1, 5, 12, 30])
@pytest.mark.parametrize("w1", [0.0, 0.3])
def test_e_value_has_mean_one_under_the_boundary_null(n: int, w1: float) -> None:
    """At theta = 1/2 the mixture is a martingale: E[E_n] = 1 exactly."""
    x = np.arange(n + 1)
    mean = sum(
        stats.binom.pmf(k, n, 0.5) * math.exp(mixture_log_e_value(int(k), n - int(k), w1))
        for k in x
    )
    assert mean == pytest.approx(1.0, rel=1e-9)


def test_default_rule_is_the_truncated_rule_and_runner_up_stays_selectable() -> None:
    assert DEFAULT_RULE == "truncated"
    assert isinstance(get_stopping_rule(k_max=K_MAX, delta=DELTA), TruncatedRule)
    rule = get_stopping_rule("runner-up", k_max=K_MAX, delta=DELTA)
    assert isinstance(rule, RunnerUpRule) and rule.c == 2.0


def test_unanimous_answers_stop_by_seven() -> None:
    rule = MixtureRule(k0=1, k_max=K_MAX, delta=DELTA)
    first = next(k for k in range(1, K_MAX + 1) if rule.certified([k]))
    assert first == 7
    # No rule can certify before 5 at this delta: 2^-4 > 0.05 >= 2^-5.
    assert 2.0**-4 > DELTA >= 2.0**-5
    # A point mass at theta' = 1 stops unanimous runs sooner (option, not the default).
    assert next(k for k in range(1, 21) if MixtureRule(k0=1, point_mass=0.5).certified([k])) == 5


def test_paper_rule_cannot_stop_before_k_max() -> None:
    rule = HoeffdingRule(k0=1, k_max=K_MAX, delta=DELTA)
    assert [k for k in range(1, K_MAX + 1) if rule.certified([k])] == [20]
    # ... because sqrt(2 ln(2 k^2/delta)/k) >= 1 for every k < 20 (unanimous, |C| = 1).
    assert all(math.sqrt(2 * math.log(2 * k * k / DELTA) / k) >= 1 for k in range(1, 20))


def test_strict_mode_allows_for_k_max_minus_one_rivals() -> None:
    strict = MixtureRule(k0=1, strict=True)
    first = next(k for k in range(1, 40) if strict.certified([k]))
    # (2^(n+1) - 1)/(n + 1) >= 19/0.05 first at n = 12.
    assert first == 12
    assert strict.rivals([5]) == 19


@pytest.mark.slow
def test_wrong_mode_rate_at_most_delta_on_the_grid() -> None:
    # The truncated default spends delta at the 50/50 tie, so a simulation of it scatters
    # around delta there: its grid is checked exactly in test_stopping_truncated.py.
    rule = get_stopping_rule("runner-up", k_max=K_MAX, delta=DELTA)
    for i, (name, dist) in enumerate(GRID.items()):
        result = run_stopping_trials(rule, dist, 4000, np.random.default_rng([2026, i]))
        assert result.wrong_mode_rate <= DELTA, (name, result)
        assert 1 <= result.mean_samples <= K_MAX


def test_stream_saves_at_least_55_percent() -> None:
    rule = get_stopping_rule("mixture", k_max=K_MAX, delta=DELTA)
    unanimous = run_stopping_trials(rule, [1.0], 500, np.random.default_rng(1))
    split = run_stopping_trials(rule, [0.6, 0.4], 3000, np.random.default_rng(2))
    mean = 0.9 * unanimous.mean_samples + 0.1 * split.mean_samples
    assert unanimous.mean_samples <= 7
    assert 1 - mean / K_MAX >= 0.55, mean
    paper = get_stopping_rule("hoeffding", k_max=K_MAX, delta=DELTA)
    assert run_stopping_trials(paper, [1.0], 200, np.random.default_rng(3)).mean_samples == 20


def _stop_one_at_a_time(rule: MixtureRule | HoeffdingRule, draws: list[int]) -> int:
    counts = [0] * 8
    for k, d in enumerate(draws, start=1):
        counts[d] += 1
        if k >= rule.k0 and rule.certified(counts):
            return k
    return len(draws)


@settings(max_examples=150)
@given(
    draws=st.lists(st.sampled_from([0, 0, 0, 0, 1, 2, 3]), min_size=20, max_size=20),
    k0=st.integers(1, 6),
    which=st.sampled_from(["mixture", "hoeffding"]),
)
def test_batches_never_overshoot(draws: list[int], k0: int, which: str) -> None:
    """Asking for decide().more samples at a time stops exactly where sampling one at a
    time would: the batch is the fewest samples that could possibly certify."""
    rule = MixtureRule(k0=k0) if which == "mixture" else HoeffdingRule(k0=k0, delta=0.5)
    counts, used = [0] * 8, 0
    decision = rule.decide(counts)
    while not decision.stop:
        assert decision.more >= 1
        for d in draws[used : used + decision.more]:
            counts[d] += 1
        used += decision.more
        decision = rule.decide(counts)
    assert used == _stop_one_at_a_time(rule, draws)
    assert used <= rule.k_max


@settings(max_examples=200, deadline=None)
@given(
    draws=st.lists(st.integers(0, 7), min_size=40, max_size=40),
    which=st.sampled_from(sorted(available_rules())),
    sizes=st.tuples(st.integers(1, 6), st.integers(6, 40)),
    delta=st.sampled_from([0.01, 0.05, 0.2]),
    futility=st.booleans(),
)
def test_no_item_stops_before_the_fewest_samples(
    draws: list[int], which: str, sizes: tuple[int, int], delta: float, futility: bool
) -> None:
    """fewest_samples is a floor on the calls of every item, answers however they come
    (driven in batches as the workers drive it): the workers pace item starts by it."""
    k0, k_max = sizes
    rule = get_stopping_rule(which, k0=k0, k_max=k_max, delta=delta, futility=futility)
    fewest = fewest_samples(rule)
    counts, used = [0] * 8, 0
    decision = rule.decide([])
    while not decision.stop:
        for d in draws[used : used + decision.more]:
            counts[d] += 1
        used += decision.more
        decision = rule.decide(counts)
    assert used >= fewest >= k0


def test_fewest_samples_is_reached_by_some_answers() -> None:
    """The floor is tight: unanimous answers stop at it without the futility stop, and
    with it the futility stop can come first (a 2-2 split at k0 = 3, K_max = 12: the
    truncated rule gives up after 4, where unanimous answers need 6)."""
    for which in sorted(available_rules()):
        rule = get_stopping_rule(which, futility=False)
        unanimous = rule.decide([]).more
        while not rule.decide([unanimous]).stop:
            unanimous += rule.decide([unanimous]).more
        assert fewest_samples(rule) == unanimous
    truncated = TruncatedRule(k_max=12, futility=True)
    assert fewest_samples(truncated) == 4
    assert truncated.decide([2, 2]).stop and not truncated.decide([4]).stop


def test_decide_reports_certification_and_budget() -> None:
    rule = MixtureRule()
    assert rule.decide([]).more == 3  # k0 first
    assert rule.decide([7]).certified
    exhausted = rule.decide([10, 10])
    assert exhausted.stop and not exhausted.certified and exhausted.more == 0
    # The batch is the fewest further samples that could certify (all for the leader) ...
    assert rule.decide([3, 3]).more == 11
    assert rule.certified([14, 3]) and not rule.certified([13, 3])
    # ... and a near-tie that cannot certify within the budget gets all that is left.
    assert not rule.certified([12, 8])
    assert rule.decide([8, 8]).more == 4


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown stopping rule"):
        get_stopping_rule("magic")
    with pytest.raises(ConfigError, match="k0"):
        get_stopping_rule(k0=30, k_max=20)
    with pytest.raises(ConfigError, match="delta"):
        get_stopping_rule(delta=1.5)
    with pytest.raises(ConfigError, match="bad options"):
        get_stopping_rule("hoeffding", point_mass=0.3)
