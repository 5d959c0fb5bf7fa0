"""The exact truncated rule: its boundary, its wrong-mode rate, batching, real-answer saving."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from monitor.app.simulate.real_stopping import load_answer_file, replay
from monitor.app.simulate.sequential import GRID
from monitor.app.simulate.stopping import run_stopping_trials
from monitor.core.errors import ConfigError, InputError
from monitor.core.stopping import TruncatedRule, get_stopping_rule
from monitor.core.stopping_boundary import (
    DEFAULT_POINT_MASS,
    TUNED_TABLES,
    certification_probability,
    tie_level,
    truncated_boundary,
)

DELTA, K0, K_MAX = 0.05, 3, 20
SMOLLM2 = Path(__file__).resolve().parent.parent / "bench" / "data" / "smollm2_answers.json"


def _brute_force_tie_level(rule: TruncatedRule) -> float:
    """P(certification) at a fair two-class tie, by enumerating all 2^K_max sequences."""
    total = 0
    for seq in itertools.product((0, 1), repeat=rule.k_max):
        counts = [0, 0]
        for d in seq:
            counts[d] += 1
            if rule.certified(counts):
                total += 1
                break
    return float(total / 2**rule.k_max)


@pytest.mark.parametrize(("k_max", "delta"), [(8, 0.2), (10, 0.1), (12, 0.05), (12, 0.2)])
def test_boundary_level_matches_brute_force_enumeration(k_max: int, delta: float) -> None:
    rule = TruncatedRule(k0=3, k_max=k_max, delta=delta)
    exact = _brute_force_tie_level(rule)
    assert rule.boundary.level == pytest.approx(exact, abs=1e-12)
    assert exact <= delta
    # The boundary spends what it can: adding any one point (n1, n2) just below it,
    # keeping it monotone, takes the level above delta.
    needed = list(rule.boundary.needed)
    moved = 0
    for y, x in enumerate(needed):
        v = min(x - 1, k_max - y)
        if v >= max(y + 1, K0) and (y == 0 or needed[y - 1] <= v):
            assert tie_level([*needed[:y], v, *needed[y + 1 :]], k_max) > delta, (y, v)
            moved += 1
    assert moved >= 1


def test_boundary_at_the_service_defaults() -> None:
    b = truncated_boundary(K_MAX, K0, DELTA)
    assert b.needed[:3] == TUNED_TABLES[(K_MAX, K0, DELTA)] == (7, 9, 10)
    assert all(n == K_MAX + 1 for n in b.needed[3:])  # runner-up >= 3: never certified
    assert b.level == pytest.approx(0.0498046875, abs=1e-15) and b.level <= DELTA
    assert b.point_mass is None and b.log_threshold is None
    assert truncated_boundary(K_MAX, K0, DELTA) is b  # cached: a lookup at run time
    # The e-value construction (an explicit point mass) at the same settings:
    e = truncated_boundary(K_MAX, K0, DELTA, DEFAULT_POINT_MASS)
    assert e.needed[:4] == (6, 10, 12, 14)
    assert all(n == K_MAX + 1 for n in e.needed[4:])  # 17 + 4 > 20: out of reach
    assert e.level == pytest.approx(0.047027587890625, abs=1e-15)


def test_the_tuned_table_level_by_enumerating_all_two_class_ties() -> None:
    """The shipped table's level, independently of the dynamic programming: all 2^20
    sequences of a fair two-class tie, vectorised."""
    b = truncated_boundary(K_MAX, K0, DELTA)
    seqs = (np.arange(2**K_MAX)[:, None] >> np.arange(K_MAX)) & 1
    x = np.cumsum(seqs, axis=1)
    y = np.arange(1, K_MAX + 1) - x
    n1, n2 = np.maximum(x, y), np.minimum(x, y)
    table = np.asarray([*b.needed, *[K_MAX + 1] * (K_MAX + 1)])
    hit = (n1 > n2) & (n1 >= table[n2])
    exact = float(hit.any(axis=1).mean())
    assert exact == pytest.approx(b.level, abs=1e-15) and exact <= DELTA


def test_other_settings_keep_the_e_value_construction_within_delta() -> None:
    for k0, k_max, delta in ((3, 20, 0.1), (3, 20, 0.01), (2, 20, 0.05), (3, 30, 0.05)):
        b = truncated_boundary(k_max, k0, delta)
        assert b.point_mass == DEFAULT_POINT_MASS and b.log_threshold is not None
        assert b.level == pytest.approx(tie_level(b.needed, k_max), abs=1e-15)
        assert b.level <= delta and b.needed[0] >= k0


def test_unanimous_answers_stop_at_seven_with_the_tuned_table() -> None:
    rule = get_stopping_rule("truncated", k0=K0, k_max=K_MAX, delta=DELTA)
    assert next(k for k in range(1, K_MAX + 1) if rule.certified([k])) == 7
    unanimous = run_stopping_trials(rule, [1.0], 50, np.random.default_rng(0))
    assert unanimous.mean_samples == 7
    # The e-value table stops them at 6, the least any valid rule allows: stopping 5
    # unanimous draws is wrong with probability 2 * 2^-5 > delta at a 50/50 tie.
    evalue = get_stopping_rule("truncated", point_mass=DEFAULT_POINT_MASS)
    assert next(k for k in range(1, K_MAX + 1) if evalue.certified([k])) == 6
    assert 2 * 2.0**-5 > DELTA >= 2 * 2.0**-6


EXTRA_EXACT = (
    (0.45, 0.45, 0.1),
    (0.49, 0.49, 0.02),
    (0.51, 0.49),
    (0.34, 0.33, 0.33),
    (0.3, 0.3, 0.3, 0.1),
    (0.35, 0.35, 0.1, 0.1, 0.1),
)


def test_exact_wrong_mode_rate_at_most_delta_on_grid_and_ties() -> None:
    b = truncated_boundary(K_MAX, K0, DELTA)
    dists = [d for _, d in GRID if len(d) <= 5] + list(EXTRA_EXACT)
    rates = {d: certification_probability(d, b)[1] for d in dists}
    assert max(rates.values()) <= DELTA
    # The least favourable configuration is the two-class tie, spending the level.
    assert rates[(0.5, 0.5)] == pytest.approx(b.level) and b.level > 0.04
    assert max(rates, key=lambda d: rates[d]) == (0.5, 0.5)
    # (tuned table 7, 9, 10: 0.0085 and 0.0025; the e-value table: 0.0064 and 0.0014)
    assert rates[(1 / 3,) * 3] < 0.009 and rates[(0.25,) * 4] < 0.003


def test_exact_computation_agrees_with_simulation() -> None:
    rule = get_stopping_rule("truncated", k0=K0, k_max=K_MAX, delta=DELTA, futility=True)
    assert isinstance(rule, TruncatedRule)
    dist = (0.4, 0.4, 0.2)
    _, exact = certification_probability(dist, rule.boundary)
    sim = run_stopping_trials(rule, dist, 6000, np.random.default_rng(7)).wrong_mode_rate
    assert abs(sim - exact) <= 4 * np.sqrt(exact * (1 - exact) / 6000)


def test_simulated_wrong_mode_rate_at_most_delta_on_long_tails() -> None:
    rule = get_stopping_rule("truncated", k0=K0, k_max=K_MAX, delta=DELTA, futility=True)
    for i, (_, dist) in enumerate(d for d in GRID if len(d[1]) > 5):
        result = run_stopping_trials(rule, dist, 1500, np.random.default_rng([11, i]))
        assert result.wrong_mode_rate <= DELTA, (dist, result)


@pytest.mark.parametrize(
    "dist", [(0.6, 0.4), (0.5, 0.5), (0.4, 0.3, 0.2, 0.1), (0.3, *(0.07,) * 10)]
)
def test_batches_stop_exactly_where_one_draw_at_a_time_stops(dist: tuple[float, ...]) -> None:
    rule = get_stopping_rule("truncated", k0=K0, k_max=K_MAX, delta=DELTA, futility=True)
    b = rule.boundary  # type: ignore[attr-defined]
    rng = np.random.default_rng(3)
    for _ in range(300):
        seq = rng.choice(len(dist), size=K_MAX, p=dist)
        counts = [0] * len(dist)
        single = None
        for k, d in enumerate(seq, start=1):
            counts[d] += 1
            top = sorted(counts, reverse=True)
            if b.certifies(top[0], top[1] if len(top) > 1 else 0) or (
                k >= K0 and b.futile(top[0], top[1] if len(top) > 1 else 0, k)
            ):
                single = k
                break
        counts, used = [0] * len(dist), 0
        decision = rule.decide(counts)
        while not decision.stop:
            for d in seq[used : used + decision.more]:
                counts[d] += 1
            used += decision.more
            decision = rule.decide(counts)
        assert used == (single or K_MAX)


def test_saves_at_least_45_percent_on_real_answers_and_certifies_more() -> None:
    items = load_answer_file(SMOLLM2)
    new = get_stopping_rule("truncated", k0=K0, k_max=K_MAX, delta=DELTA, futility=True)
    old = get_stopping_rule("runner-up", k0=K0, k_max=K_MAX, delta=DELTA, futility=True)
    totals = {"new": [0, 0, 0], "old": [0, 0, 0]}
    for name, rule in (("new", new), ("old", old)):
        for i, item in enumerate(items):
            for r in range(40):
                calls, cert, wrong, _ = replay(rule, item, np.random.default_rng([5, i, r]))
                totals[name][0] += calls
                totals[name][1] += cert
                totals[name][2] += wrong
    n = len(items) * 40
    saving = 1 - totals["new"][0] / n / K_MAX
    assert saving >= 0.45, saving
    assert totals["new"][1] >= totals["old"][1]
    assert totals["new"][2] / n <= DELTA


def test_options_and_errors() -> None:
    rule = get_stopping_rule("truncated", point_mass=0.0)
    assert isinstance(rule, TruncatedRule) and rule.boundary.needed[0] == 7
    with pytest.raises(ConfigError):
        get_stopping_rule("truncated", point_mass=1.0)
    with pytest.raises(ConfigError):
        get_stopping_rule("truncated", c=2.0)
    with pytest.raises(InputError):
        certification_probability([0.2] * 7, rule.boundary)
