"""A minimum review rate per segment (``segments.min_reviews_per_hour``, DESIGN.md §6):
with a big segment (95% of the traffic) and a small one (5%) at a small review rate, the
small one reaches the minimum while the big one's reviews are unchanged; the raised
inclusion probabilities are the ones stored and weighted 1/π, so the task's (marginal)
level stays unbiased; π is never above 1 nor below the task's own."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.events import parse_event
from monitor.core.segments import SegmentTable
from monitor.core.stopping import get_stopping_rule
from monitor.core.window import CalibrationWindow
from monitor.engine.metrics import Metrics
from monitor.engine.review_minimum import SegmentReviewRates, raised_inclusion_probability
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock

ITEMS_PER_HOUR = 1000.0
SMALL_SHARE = 0.05
REVIEW_RATE = 0.02
MINIMUM = 10.0  # reviews an hour; the small segment gets 50 x 0.02 = 1 without it
TRUTH = {"big": 0.9, "small": 0.6}  # acceptance per segment
MARGINAL = (1 - SMALL_SHARE) * TRUTH["big"] + SMALL_SHARE * TRUTH["small"]


def _traffic(hours: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (Poisson, ``ITEMS_PER_HOUR``) and whether each item is small."""
    rng = np.random.default_rng(seed)
    n = int(hours * ITEMS_PER_HOUR)
    times = np.cumsum(rng.exponential(3600.0 / ITEMS_PER_HOUR, n))
    return times, rng.random(n) < SMALL_SHARE


def _run(hours: float, seed: int, minimum: float) -> dict[str, Any]:
    """Every item through :class:`SegmentReviewRates` and a review draw with its π."""
    times, small = _traffic(hours, seed)
    rates = SegmentReviewRates(minimum)
    rng = np.random.default_rng(seed + 1)
    pis = np.array(
        [
            rates.inclusion_probability("small" if s else "big", REVIEW_RATE, float(t))
            for t, s in zip(times, small, strict=True)
        ]
    )
    reviewed = rng.random(len(pis)) < pis
    accepted = np.where(
        small, rng.random(len(pis)) < TRUTH["small"], rng.random(len(pis)) < TRUTH["big"]
    )
    return {"times": times, "small": small, "pis": pis, "reviewed": reviewed, "accepted": accepted}


def test_the_raised_probability_stays_between_the_tasks_and_one() -> None:
    grid = np.linspace(0.0, 1.0, 11)
    for pi, r, share, m in itertools.product(
        grid[1:], [0.5, 1, 10, 100, 1e4], grid, [0, 0.5, 2, 50, 1e5]
    ):
        e = float(pi) * r * float(share)  # some items of the segment reviewed more
        raised = raised_inclusion_probability(
            float(pi), items_per_hour=r, expected_reviews_per_hour=e, min_reviews_per_hour=m
        )
        assert float(pi) <= raised <= 1.0
        if e >= m:
            assert raised == pi
    # uniform review: m / r, so the segment is expected to get exactly m reviews an hour
    assert raised_inclusion_probability(
        0.02, items_per_hour=50, expected_reviews_per_hour=1, min_reviews_per_hour=10
    ) == pytest.approx(0.2)
    # fewer items than the minimum: every one reviewed
    assert raised_inclusion_probability(
        0.02, items_per_hour=5, expected_reviews_per_hour=0.1, min_reviews_per_hour=10
    ) == pytest.approx(1.0)
    # by uncertainty: π + (1 − π) q fills the shortfall, keeping the order of the items
    low, high = (
        raised_inclusion_probability(
            p, items_per_hour=100, expected_reviews_per_hour=4, min_reviews_per_hour=10
        )
        for p in (0.02, 0.1)
    )
    q = 6 / 96
    assert (low, high) == pytest.approx((0.02 + 0.98 * q, 0.1 + 0.9 * q))


def test_the_small_segment_reaches_the_minimum_and_the_big_one_is_unchanged() -> None:
    hours = 24.0
    before, after = _run(hours, seed=7, minimum=0.0), _run(hours, seed=7, minimum=MINIMUM)
    for run in (before, after):
        assert np.all(run["pis"] >= REVIEW_RATE) and np.all(run["pis"] <= 1.0)
    big = ~after["small"]
    late = after["times"] > 120.0  # after the first two minutes
    assert np.all(before["pis"] == REVIEW_RATE)
    assert np.all(after["pis"][big & late] == REVIEW_RATE)  # the big segment: untouched
    per_hour = {
        (name, label): float(np.sum(run["reviewed"] & mask)) / hours
        for name, run in (("before", before), ("after", after))
        for label, mask in (("small", run["small"]), ("big", ~run["small"]))
    }
    # expected: small 1/h before, 10/h after; big 19/h both (Poisson noise over a day:
    # 240 small reviews, sd 15)
    assert per_hour["before", "small"] < 2
    assert per_hour["after", "small"] >= MINIMUM * 0.85
    assert abs(per_hour["after", "big"] - per_hour["before", "big"]) <= 0.5
    # the expected reviews (Σπ) per hour of the small segment after the first hour
    first_hour = after["times"] < 3600.0
    expected = float(np.sum(after["pis"][after["small"] & ~first_hour])) / (hours - 1)
    assert expected == pytest.approx(MINIMUM, rel=0.15)


def _estimates(run: dict[str, Any]) -> tuple[float, float]:
    """The task window's level (weights 1/π, no decay) with the conformal test point's
    mass (1/``review_floor`` at +∞) taken back out, and the unweighted share."""
    window = CalibrationWindow(
        alphas=(0.1,), max_items=100_000, half_life_s=None, min_inclusion_probability=REVIEW_RATE
    )
    picked = np.flatnonzero(run["reviewed"])
    for i in picked:
        score = 1.0 if run["accepted"][i] else float("inf")
        window.add(f"i{i}", score, float(run["pis"][i]), float(run["times"][i]))
    level = window.snapshot(float(run["times"][-1])).reliability_level
    weights = 1.0 / run["pis"][picked]
    total = float(np.sum(weights))
    ipw = level * (total + window.test_weight) / total
    hajek = float(np.sum(weights * run["accepted"][picked])) / total
    assert ipw == pytest.approx(hajek, abs=1e-9)  # the window weights the stored π
    return ipw, float(np.mean(run["accepted"][picked]))


def test_the_task_level_stays_unbiased_under_the_raised_probabilities() -> None:
    errors, naive, small_reviews, small_errors = [], [], [], []
    for seed in range(100):
        run = _run(4.0, seed=100 + seed, minimum=MINIMUM)
        ipw, share = _estimates(run)
        errors.append(ipw - MARGINAL)
        naive.append(share - MARGINAL)
        small = run["reviewed"] & run["small"]
        small_reviews.append(int(np.sum(small)))
        weights = 1.0 / run["pis"][small]  # the small segment's own window: 1/π too
        small_errors.append(
            float(np.sum(weights * run["accepted"][small]) / np.sum(weights)) - TRUTH["small"]
        )
    # IPW: no bias beyond noise (3 standard errors of the mean of 100 runs, ~0.01), for
    # the task (marginal) and within the small segment
    for errs in (errors, small_errors):
        assert abs(float(np.mean(errs))) < 3 * float(np.std(errs)) / np.sqrt(len(errs))
    # unweighted, the over-reviewed small segment would pull the level down by ~0.08
    assert float(np.mean(naive)) < MARGINAL - 0.05
    # and the small segment has many more reviews: ~40 in 4 hours, against ~4
    assert float(np.mean(small_reviews)) > 30


def test_no_minimum_or_no_traffic_leaves_pi_alone() -> None:
    rates = SegmentReviewRates(0.0)
    assert rates.inclusion_probability("a", 0.3, 0.0) == 0.3
    rates = SegmentReviewRates(5.0, max_labels=2)
    for i, label in enumerate(["a", "b", "c", "a"]):
        assert 0.3 <= rates.inclusion_probability(label, 0.3, 10.0 * i) <= 1.0
        assert len(rates) <= 2
    assert rates.items_per_hour("zzz", 100.0) == 0.0


# Through the service: the worker raises π of the small tenant's items and stores it.

K_MAX = 6
MODEL = "sim-1"
TASK = "arith"


def _service(store: InMemoryStore, clock: ManualClock, minimum: float) -> MonitorService:
    canon = get_canonicalizer("numeric")
    settings = TaskSettings(
        name=TASK,
        canonicalizer="numeric",
        k_max=K_MAX,
        k0=3,
        sampling_rate=1.0,
        review_rate=0.05,
        half_life_s=3600,
        endpoint={"model": MODEL},
        segments={"by": {"field": "metadata.tenant"}, "min_reviews_per_hour": minimum},
    )
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=K_MAX, k0=3),
        client=FakeModelClient(lambda q, i: "8"),
        sync_canonicalizer=canon,
    )
    return MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(CollectorRegistry(), k_max=K_MAX),
        budget=BudgetSettings(calls_per_minute=1_000_000, max_in_flight=1, queue_size=1000),
        clock=clock,
    )


def _tenant(i: int) -> str:
    return "small" if i % 20 == 7 else "big"


def _event(i: int) -> Any:
    tenant = _tenant(i)
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"What is {i} + 7?"}],
        "metadata": {"tenant": tenant},
    }
    return parse_event({"id": f"req-{i}", "model": MODEL, "task": TASK, "request": request})


@pytest.mark.parametrize("minimum", [0.0, 6.0])
async def test_the_worker_stores_the_raised_probability(minimum: float) -> None:
    """200 items an hour for two hours (small: 10 an hour, 0.5 reviews at π = 0.05)."""
    store, clock = InMemoryStore(), ManualClock()
    service = _service(store, clock, minimum)
    await service.load()
    service.start()
    for i in range(400):
        assert service.offer(_event(i), "test").decision == "sampled"
        await service.drain()
        clock.advance(18.0)
    items = store.pending()
    await service.stop(5.0)
    # An item carries its tenant; its review rate is its tenant's once the task's table
    # gives the tenant a label of its own, "other"'s before (a table of our own, fed the
    # same values in the same order, tells which).
    table = SegmentTable(20)
    rate_label = [table.observe(_tenant(i)) for i in range(400)]
    by_tenant: dict[str, list[float]] = {"small": [], "big": [], "other": []}
    for item in items:
        i = int(item.item_id.rsplit("-", 1)[1])
        assert item.segment == _tenant(i)
        if i >= 40 or rate_label[i] != "big":  # big: after 12 minutes
            by_tenant[rate_label[i]].append(item.inclusion_probability)
    assert len(by_tenant["big"]) >= 10
    assert all(p == 0.05 for p in by_tenant["big"])
    if minimum == 0.0:
        assert all(p == 0.05 for p in by_tenant["small"])
        assert len(by_tenant["small"]) <= 4
    else:  # π about 6 / 10 for the small tenant: some 12 reviews in two hours
        assert all(0.5 <= p <= 1.0 for p in by_tenant["small"])
        assert len(by_tenant["small"]) >= 7
