"""The incremental calibration window agrees with the batch weighted formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.conformal import (
    conformal_threshold,
    decay_weights,
    effective_sample_size,
    reliability_level,
    weighted_reliability_level,
    weighted_reliability_lower_bound,
    weighted_threshold,
)
from monitor.core.errors import InputError
from monitor.core.window import CalibrationWindow

ALPHAS = (0.01, 0.05, 0.1, 0.2, 0.3)

records = st.lists(
    st.tuples(
        st.one_of(st.integers(1, 6).map(float), st.just(math.inf)),
        st.sampled_from([1.0, 0.5, 0.25, 0.1]),
        st.floats(0, 10_000),
    ),
    min_size=0,
    max_size=80,
)


def batch(
    recs: list[tuple[float, float, float]],
    now: float,
    h: float | None,
    max_items: int,
    pi_min: float,
):
    kept = recs[-max_items:] if recs else []
    scores = [s for s, _, _ in kept]
    ages = [now - t for _, _, t in kept]
    decay = np.exp2(-np.asarray(ages, float) / h) if h else np.ones(len(kept))
    w = decay / np.asarray([p for _, p, _ in kept] or [1.0])[: len(kept)]
    return scores, w, 1.0 / pi_min


@settings(max_examples=150)
@given(recs=records, h=st.one_of(st.none(), st.floats(10, 5000)), max_items=st.integers(1, 50))
def test_matches_batch_weighted_formulas(recs, h, max_items) -> None:
    recs = sorted(recs, key=lambda r: r[2])
    now = (recs[-1][2] if recs else 0.0) + 17.0
    window = CalibrationWindow(
        alphas=ALPHAS, max_items=max_items, half_life_s=h, min_inclusion_probability=0.1
    )
    for i, (s, p, t) in enumerate(recs):
        assert window.add(f"id{i}", s, p, t)
    snap = window.snapshot(now)
    scores, w, w_test = batch(recs, now, h, max_items, 0.1)
    assert snap.n == len(scores)
    for a in ALPHAS:
        assert snap.thresholds[a] == weighted_threshold(scores, w, a, test_weight=w_test)
    assert snap.reliability_level == pytest.approx(
        weighted_reliability_level(scores, w, test_weight=w_test), rel=1e-9, abs=1e-12
    )
    assert snap.n_eff == pytest.approx(effective_sample_size(w), rel=1e-9, abs=1e-9)
    if len(scores):
        assert snap.reliability_lower_bound == pytest.approx(
            weighted_reliability_lower_bound(scores, w, 0.05, test_weight=w_test),
            rel=1e-6,
            abs=1e-9,
        )


def test_unweighted_window_is_the_plain_conformal_form() -> None:
    rng = np.random.default_rng(0)
    scores = rng.choice([1.0, 2.0, 3.0, math.inf], p=[0.8, 0.1, 0.07, 0.03], size=500)
    window = CalibrationWindow(alphas=ALPHAS, max_items=10_000, half_life_s=None)
    for i, s in enumerate(scores):
        window.add(str(i), float(s), 1.0, float(i))
    snap = window.snapshot(1e9)
    assert snap.reliability_level == pytest.approx(reliability_level(scores))
    for a in ALPHAS:
        assert snap.thresholds[a] == conformal_threshold(scores, a)


def test_idempotent_by_item_id() -> None:
    window = CalibrationWindow(alphas=ALPHAS)
    assert window.add("a", 1.0, 1.0, 0.0)
    assert not window.add("a", 5.0, 1.0, 1.0)
    assert len(window) == 1 and "a" in window


def test_drift_lowers_the_level_within_about_a_half_life() -> None:
    """1000 good items, then the model degrades: the level falls once new items weigh in."""
    h = 600.0
    window = CalibrationWindow(alphas=ALPHAS, max_items=5000, half_life_s=h)
    t = 0.0
    for i in range(1000):
        window.add(f"g{i}", 1.0, 1.0, t)
        t += 3.0
    before = window.snapshot(t).reliability_level
    for i in range(200):  # one half-life of bad items (3 s apart)
        window.add(f"b{i}", 2.0, 1.0, t)
        t += 3.0
    after = window.snapshot(t).reliability_level
    assert before > 0.99
    assert after < 0.55  # the old half of the mass is now weighted by 1/2 or less
    unweighted = reliability_level([1.0] * 1000 + [2.0] * 200)
    assert unweighted > 0.8  # without decay the drop would hardly show


def test_eviction_and_rebase_keep_sums_exact() -> None:
    window = CalibrationWindow(alphas=ALPHAS, max_items=100, half_life_s=1.0)
    rng = np.random.default_rng(1)
    t = 0.0
    kept = []
    for i in range(5000):
        t += float(rng.exponential(2.0))  # far more than 512 half-lives in total: rebases
        s = float(rng.choice([1.0, 2.0, math.inf]))
        window.add(str(i), s, 1.0, t)
        kept.append((s, t))
    kept = kept[-100:]
    w = decay_weights([t - tt for _, tt in kept], 1.0)
    snap = window.snapshot(t)
    assert snap.reliability_level == pytest.approx(
        weighted_reliability_level([s for s, _ in kept], w), rel=1e-9
    )
    assert snap.n == 100 and math.isfinite(snap.n_eff)


def test_snapshot_of_an_empty_window() -> None:
    snap = CalibrationWindow(alphas=ALPHAS).snapshot(0.0)
    assert snap.n == 0 and snap.reliability_level == 0.0
    assert all(m == math.inf for m in snap.thresholds.values())
    with pytest.raises(InputError):
        CalibrationWindow(alphas=ALPHAS).add("x", 0.0, 1.0, 0.0)


# --- one order, whatever order the verdicts arrive in -----------------------------------


keyed = st.lists(
    st.tuples(
        st.one_of(st.integers(1, 4).map(float), st.just(math.inf)),
        st.sampled_from([1.0, 0.5, 0.2]),
        st.floats(0, 50_000),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, derandomize=True)
@given(
    recs=keyed,
    h=st.one_of(st.none(), st.floats(1, 5000)),
    max_items=st.integers(1, 20),
    data=st.data(),
)
def test_the_same_verdicts_in_any_order_give_the_same_snapshot(recs, h, max_items, data) -> None:
    """The window holds the verdicts latest in order whatever order they are added in,
    and its state depends only on what it holds: bit-for-bit the same snapshot."""
    shuffled = data.draw(st.permutations(list(enumerate(recs))))

    def build(order):
        w = CalibrationWindow(
            alphas=ALPHAS, max_items=max_items, half_life_s=h, min_inclusion_probability=0.2
        )
        for key, (s, p, t) in order:
            assert w.add(f"id{key}", s, p, t, order=(key,))
        return w

    in_order, any_order = build(list(enumerate(recs))), build(shuffled)
    now = max(t for _, _, t in recs) + data.draw(st.floats(0, 20_000))
    assert any_order.snapshot(now) == in_order.snapshot(now)
    kept = {f"id{k}" for k in range(len(recs))[-max_items:]}
    assert {i for i in kept if i in any_order} == kept and len(any_order) == len(kept)
    # And the held items give the batch formulas.
    held = recs[-max_items:]
    scores, w, w_test = batch(held, now, h, max_items, 0.2)
    snap = any_order.snapshot(now)
    for a in ALPHAS:
        assert snap.thresholds[a] == weighted_threshold(scores, w, a, test_weight=w_test)


def test_level_and_bound_fall_together_after_a_long_pause() -> None:
    """No verdicts for many half-lives: the test point's weight dominates and the level
    falls; the lower bound never stays above it. n_eff = (Σw)²/Σw² does not change while
    every item ages alike (the documented Kish size of the items' weights)."""
    h = 600.0
    window = CalibrationWindow(alphas=ALPHAS, max_items=1000, half_life_s=h)
    for i in range(300):
        window.add(f"g{i}", 1.0, 1.0, float(i))
    fresh = window.snapshot(300.0)
    assert fresh.reliability_level > 0.99 and fresh.reliability_lower_bound > 0.97
    assert fresh.n_eff > 250
    previous = fresh
    for pause_half_lives in (1, 4, 8, 16, 64, 2000):
        snap = window.snapshot(300.0 + pause_half_lives * h)
        assert snap.n == 300  # the items are still held, but they weigh less and less
        assert snap.reliability_level < previous.reliability_level
        assert snap.n_eff == pytest.approx(fresh.n_eff, rel=1e-9)
        assert snap.reliability_lower_bound <= previous.reliability_lower_bound
        assert snap.reliability_lower_bound <= snap.reliability_level
        previous = snap
    assert previous.reliability_level == 0.0
    assert previous.reliability_lower_bound == 0.0
    assert all(m == math.inf for m in previous.thresholds.values())
    # Batch reference at one point of the pause.
    now = 300.0 + 8 * h
    w = decay_weights([now - i for i in range(300)], h)
    snap = window.snapshot(now)
    assert snap.n_eff == pytest.approx(effective_sample_size(w))
    scores = np.ones(300)
    assert snap.reliability_lower_bound == pytest.approx(
        min(
            weighted_reliability_lower_bound(scores, w, 0.05),
            weighted_reliability_level(scores, w, test_weight=1.0),
        )
    )


def test_a_verdict_sampled_after_now_counts_as_fresh_not_fresher() -> None:
    """Replicas' clocks differ: an item sampled 52 days "in the future" of this replica's
    clock (it once overflowed 2**1250) weighs what a fresh item weighs."""
    ahead = 1_800_000_000.0
    now = ahead - 52 * 86_400
    window = CalibrationWindow(alphas=(0.1, 0.2), max_items=100, half_life_s=3600.0)
    window.add("a", 1.0, 1.0, ahead)
    window.add("b", 3.0, 1.0, ahead - 60.0)
    skewed = window.snapshot(now)
    assert skewed == window.snapshot(ahead)
    assert skewed.n == 2 and 0.0 < skewed.reliability_level < 1.0


def test_a_window_whose_test_point_weighs_what_its_items_weighed() -> None:
    """test_weight_seen (a segment reviewed above the task's floor): w* is the largest
    1/pi held, not 1/min_inclusion_probability. 10 items at pi 0.2 (weight 5 each), 8
    accepted: level 8*5 / (10*5 + 5) with w* = 5; with the floor 0.01, w* = 100."""
    seen = CalibrationWindow(
        alphas=(0.1,), half_life_s=None, min_inclusion_probability=0.01, test_weight_seen=True
    )
    floor = CalibrationWindow(alphas=(0.1,), half_life_s=None, min_inclusion_probability=0.01)
    for i in range(10):
        for w in (seen, floor):
            w.add(f"i{i}", 1.0 if i < 8 else math.inf, 0.2, float(i))
    assert seen.snapshot(10.0).reliability_level == pytest.approx(40 / 55)
    assert floor.snapshot(10.0).reliability_level == pytest.approx(40 / 150)
    seen.add("low", 1.0, 0.1, 11.0)  # an item reviewed at 0.1 weighs 10: w* follows it
    assert seen.snapshot(12.0).reliability_level == pytest.approx(50 / (60 + 10))
