"""Statistical claims of the synthetic experiments, with fixed seeds and small sizes."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from monitor.app.simulate.agents import (
    ACCEPTABLE,
    counts_to_mapping,
    dirichlet_items,
    draw_answers,
    draw_counts,
    rank_items,
)
from monitor.app.simulate.experiments import (
    run_canon,
    run_coverage,
    run_entropy,
    run_setsize,
    run_variance,
)
from monitor.app.simulate.mode_error import hoeffding_mode_bound
from monitor.app.simulate.sequential import GRID, describe_distribution, run_stopping


def _json(result: Any) -> Any:
    """``as_dict()`` through a strict JSON round trip (no NaN, no infinities)."""
    return json.loads(json.dumps(result.as_dict(), allow_nan=False))


# --------------------------------------------------------------------------- agents


def test_dirichlet_items_put_p_star_on_class_0() -> None:
    items = dirichlet_items(np.random.default_rng(0), 100, 0.7, wrong_classes=4)
    assert items.shape == (100, 5)
    np.testing.assert_allclose(items[:, 0], 0.7)
    np.testing.assert_allclose(items.sum(axis=1), 1.0)
    assert (items >= 0).all()


def test_tiny_concentration_does_not_produce_nan() -> None:
    items = dirichlet_items(np.random.default_rng(0), 200, 0.5, concentration=1e-4)
    assert np.isfinite(items).all()
    np.testing.assert_allclose(items.sum(axis=1), 1.0)


def test_draws_are_reproducible_and_named() -> None:
    a = draw_answers(np.random.default_rng(3), [0.5, 0.3, 0.2], 10)
    b = draw_answers(np.random.default_rng(3), [0.5, 0.3, 0.2], 10)
    assert a == b and len(a) == 10 and set(a) <= {"c0", "c1", "c2"}
    counts = draw_counts(np.random.default_rng(0), np.full((4, 3), 1 / 3), 10)
    assert counts.shape == (4, 3) and (counts.sum(axis=1) == 10).all()
    assert counts_to_mapping([2, 0, 1]) == {"c0": 2, "c2": 1}


def test_rank_items_uses_the_real_ranking() -> None:
    cons = rank_items(np.array([[5, 3, 0], [0, 0, 7]]), np.random.default_rng(0))
    assert cons[0].classes == ("c0", "c1") and cons[0].counts == (5, 3)
    assert cons[1].mode == "c2" and cons[1].rank(ACCEPTABLE) == math.inf


# --------------------------------------------------------------------------- coverage


def test_coverage_at_least_target_in_every_cell() -> None:
    result = run_coverage(np.random.default_rng(1), reps=20)
    assert len(result.cells) == 3 * 7
    for cell in result.cells:
        assert cell.coverage_mean >= cell.target, cell
    assert result.all_ok
    data = _json(result)
    assert data["all_ok"] is True
    assert "ok" in result.table()


def test_coverage_with_infinite_threshold_is_reported_as_inf() -> None:
    # n_cal = 5 and alpha = 0.1: k = ceil(6 * 0.9) = 6 > 5, so M* = inf.
    result = run_coverage(
        np.random.default_rng(0), p_stars=(0.7,), alphas=(0.1,), n_cal=5, n_test=50, reps=3
    )
    cell = result.cells[0]
    assert cell.m_star_median == math.inf
    assert _json(result)["cells"][0]["m_star_median"] == "inf"
    assert "inf" in result.table()


# --------------------------------------------------------------------------- variance


def test_mode_error_within_hoeffding_bound() -> None:
    result = run_variance(np.random.default_rng(2), ks=(1, 3, 10, 20), trials=2000)
    assert result.all_within_bound
    for cell in result.cells:
        assert cell.mode_error <= cell.bound + 3 * cell.standard_error
    # The error decreases with K for every p*.
    for p in (0.6, 0.7, 0.8):
        errs = [c.mode_error for c in result.cells if c.p_star == p]
        assert errs[-1] < errs[0]


def test_hoeffding_bound_values() -> None:
    assert hoeffding_mode_bound(10, 0.7) == pytest.approx(math.exp(-0.8))
    assert hoeffding_mode_bound(5, 0.5) == 1.0


# --------------------------------------------------------------------------- set size


def test_m_star_non_increasing_in_p_star() -> None:
    result = run_setsize(np.random.default_rng(4), alphas=(0.1, 0.2), reps=8)
    assert all(result.monotone().values())
    cells = [c for c in result.cells if c.alpha == 0.1]
    assert cells[-1].p_star == 1.0 and cells[-1].m_star_median == 1.0
    assert cells[0].m_star_median > 1.0
    assert _json(result)["monotone"] == {"0.1": True, "0.2": True}


# --------------------------------------------------------------------------- entropy


def test_set_size_grows_with_entropy() -> None:
    result = run_entropy(np.random.default_rng(5), reps=2)
    assert result.r_cumprob > 0.3
    assert result.r_rank > 0.3
    scores = _json(result)["scores"]
    assert set(scores) == {"rank", "cumprob"}


# --------------------------------------------------------------------------- canon


def _toy_numeric(answer: str) -> str:
    """First integer in the answer: enough to merge the experiment's variants."""
    digits = "".join(ch if ch.isdigit() else " " for ch in answer).split()
    return digits[0] if digits else "<INVALID>"


def test_canonicalization_reduces_mode_error_with_injected_canonicalizer() -> None:
    result = run_canon(np.random.default_rng(6), trials=2000, canonicalize=_toy_numeric)
    assert result.p_canon == pytest.approx(0.6)
    assert result.p_raw == pytest.approx(0.1) and result.p_raw_top == pytest.approx(0.25)
    k10 = result.ks.index(10)
    assert result.canon_error[k10] < result.raw_error[k10]
    # Raw: the wrong "41" (0.25) out-votes every 0.1 variant, more so as K grows.
    assert result.raw_error[-1] > result.raw_error[0]


def test_canonicalization_with_the_numeric_canonicalizer() -> None:
    pytest.importorskip("monitor.core.canon.registry")
    result = run_canon(np.random.default_rng(7), ks=(10,), trials=2000)
    assert result.p_canon == pytest.approx(0.6), result.mapping
    assert result.canon_error[0] < result.raw_error[0]


# --------------------------------------------------------------------------- stopping


def test_stopping_stream_mix_and_compare() -> None:
    result = run_stopping(
        [[1.0], [0.6, 0.4]], weights=[0.9, 0.1], trials=1000, seed=0, compare=True
    )
    assert result.per_dist[0].mean_samples == 7  # the default truncated rule's tuned table
    expected = 0.9 * result.per_dist[0].mean_samples + 0.1 * result.per_dist[1].mean_samples
    assert result.mean_samples == pytest.approx(expected)
    assert result.compare is not None and result.compare.mean_samples == 20
    data = _json(result)
    assert len(data["per_dist"]) == 2
    assert data["compare"]["rule"] == "hoeffding"


def test_stopping_is_reproducible() -> None:
    a = run_stopping([[0.7, 0.2, 0.1]], trials=300, seed=9)
    b = run_stopping([[0.7, 0.2, 0.1]], trials=300, seed=9)
    assert a.as_dict() == b.as_dict()


def test_grid_matches_the_brief() -> None:
    assert len(GRID) == 17
    for _, dist in GRID:
        assert sum(dist) == pytest.approx(1.0)
    assert describe_distribution((0.5, *(0.05,) * 10)) == "0.5+0.05x10"
