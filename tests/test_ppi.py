"""The prediction-powered level: a hand-computed example, the Clopper-Pearson bound of
statsmodels for a constant judge, coverage over 2,000 seeds a cell whatever the judge
(lenient, strict, constant, anti-correlated, random, good; equal and unequal inclusion
probabilities; drift weights; 30-300 reviews), the fall-back to the human-only bound
when the judge adds nothing, and a good judge's bound about as tight as the previous one."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from statsmodels.stats.proportion import proportion_confint

from monitor.core import ppi
from monitor.core.conformal import reliability_lower_bound
from monitor.core.errors import ConfigError, InputError
from monitor.core.ppi import MIN_REVIEWS, ppi_reliability


def _bench() -> ModuleType:
    """bench/ppi_bench.py, for the previous release's bound it keeps verbatim."""
    path = Path(__file__).resolve().parents[1] / "bench" / "ppi_bench.py"
    spec = importlib.util.spec_from_file_location("ppi_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()

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
def test_a_constant_judge_gives_exactly_the_human_only_clopper_pearson_bound(
    successes: int, n: int
) -> None:
    human = np.r_[np.ones(successes), np.zeros(n - successes)]
    est = ppi_reliability(
        np.ones(500), np.ones(500), human, np.ones(n), np.ones(n), delta=DELTA, min_reviews=0
    )
    assert est is not None
    lower, _ = proportion_confint(successes, n, alpha=2 * DELTA, method="beta")
    assert est.lower_bound == pytest.approx(lower, abs=1e-9)
    assert est.lower_bound == reliability_lower_bound(successes, n, DELTA)
    assert est.level == pytest.approx(successes / n)


def _simulate(
    p: float, judge: tuple[float, float], *, reviews: int, unequal: bool, seeds: int, items: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per seed: relmon's bound, the human-only bound on the same reviews, and the
    previous release's bound. Judge = (P(J=1 | Y=1), P(J=1 | Y=0)); with ``unequal``,
    items the judge rejects are reviewed three times as often; drift weights of ages up
    to a half-life on every item."""
    sens, fpr = judge
    rng = np.random.default_rng([int(p * 100), reviews, int(unequal), items])
    ours, human, previous = [], [], []
    for _ in range(seeds):
        y, j = labelled(rng, items, p, sens, fpr)
        pi = np.where(j == 0, 3.0, 1.0) if unequal else np.ones(items)
        pi = np.minimum(pi * reviews / pi.sum(), 1.0)
        seen = rng.random(items) < pi
        decay = np.exp2(-rng.random(items))
        w = decay[seen] / pi[seen]
        est = ppi_reliability(j, decay, y[seen], j[seen], w, delta=DELTA, min_reviews=0)
        assert est is not None
        ours.append(est.lower_bound)
        n = float(w.sum() ** 2 / (w * w).sum())
        human.append(reliability_lower_bound(float(w @ y[seen]) / float(w.sum()) * n, n, DELTA))
        previous.append(BENCH.previous_bound(j, y[seen], j[seen], w))
    return np.array(ours), np.array(human), np.array(previous)


# At least as hard as the measurements that found the previous bound under-covering
# (0.920 with a lenient judge, 2,000 items, 40 reviews; 0.927 with 5,000 and 250).
HARD_CELLS = [
    ("lenient, yes to every right answer", 0.6, (1.0, 0.8), 40, False, 2000),
    ("lenient, yes to every right answer", 0.85, (1.0, 0.8), 250, False, 5000),
    ("lenient", 0.6, (0.95, 0.8), 30, True, 2000),
    ("strict", 0.85, (0.6, 0.02), 100, True, 2000),
    ("constant", 0.85, (1.0, 1.0), 30, False, 2000),
    ("anti-correlated", 0.6, (0.2, 0.8), 100, True, 2000),
    ("random", 0.97, (0.5, 0.5), 300, False, 3000),
    # the cell the shared pseudo-failure's extra weight is there for: a small stratum (the
    # judge's yes, right 89% of the time) shows no failure in its ~25 reviews in 6% of
    # windows; bounds with less of that weight covered 0.932-0.941 in these draws
    ("anti-correlated", 0.97, (0.2, 0.8), 300, True, 3000),
    # a random judge, reviews three times as likely where it says no (held out)
    ("random", 0.97, (0.5, 0.5), 40, True, 2000),
    ("good", 0.6, (0.98, 0.04), 300, False, 3000),
    ("good", 0.85, (0.98, 0.04), 100, True, 2000),
]


@pytest.mark.slow
@pytest.mark.parametrize("cell", HARD_CELLS, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in HARD_CELLS])
def test_the_bound_covers_whatever_the_judge(
    cell: tuple[str, float, tuple[float, float], int, bool, int],
) -> None:
    name, p, judge, reviews, unequal, items = cell
    seeds = 2000
    ours, _, _ = _simulate(p, judge, reviews=reviews, unequal=unequal, seeds=seeds, items=items)
    coverage = float(np.mean(ours <= p))
    slack = 2 * math.sqrt(DELTA * (1 - DELTA) / seeds)
    assert coverage >= 1 - DELTA - slack, (name, coverage)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "p", "judge"),
    [("random", 0.85, (0.5, 0.5)), ("random", 0.6, (0.5, 0.5)), ("strict", 0.97, (0.6, 0.02))],
)
def test_a_judge_that_adds_nothing_falls_back_to_the_human_bound(
    name: str, p: float, judge: tuple[float, float]
) -> None:
    ours, human, _ = _simulate(p, judge, reviews=100, unequal=False, seeds=600, items=2000)
    # distance under the truth, as the issue measured it (previous: x1.13-1.44 looser)
    assert np.mean(p - ours) <= 1.04 * np.mean(p - human), (name, np.mean(p - ours))


@pytest.mark.slow
@pytest.mark.parametrize(("p", "reviews"), [(0.6, 100), (0.85, 300), (0.97, 300)])
def test_a_good_judge_is_about_as_tight_as_before_and_tighter_than_humans_alone(
    p: float, reviews: int
) -> None:
    ours, human, previous = _simulate(
        p, (0.98, 0.04), reviews=reviews, unequal=False, seeds=600, items=3000
    )
    # Clopper-Pearson is conservative where a good judge's disagreements are rare, the
    # previous Agresti-Coull bound was not (and it under-covered with lenient judges):
    # measured x0.90-1.06 of the previous bound's distance (bench/RESULTS.md, section 9)
    assert np.mean(p - ours) <= 1.07 * np.mean(p - previous)
    assert np.mean(p - ours) <= 0.8 * np.mean(p - human)


def test_the_bound_is_a_function_of_the_labels_and_its_monte_carlo_error_is_small() -> None:
    rng = np.random.default_rng(3)
    y, j = labelled(rng, 2000, 0.85, 0.95, 0.3)
    seen = rng.random(2000) < 0.05
    args = (j, np.ones(2000), y[seen], j[seen], np.full(int(seen.sum()), 20.0))
    first = ppi_reliability(*args, delta=DELTA)
    assert first is not None
    assert ppi_reliability(*args, delta=DELTA) == first
    bounds = []
    for seed in range(20):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ppi, "SEED", seed)
            est = ppi_reliability(*args, delta=DELTA)
            assert est is not None
            bounds.append(est.lower_bound)
    assert np.std(bounds) < 0.01 * (first.level - np.mean(bounds))


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
