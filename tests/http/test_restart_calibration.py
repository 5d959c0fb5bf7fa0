"""A restart restores exactly the calibration the live service had (SQLite store).

Property (hypothesis): review items with random sampling times, verdicts applied in a
random order, restarts at random points, a window smaller than the number of verdicts:
after every restart the rebuilt snapshot (level, lower bound, n, n_eff, every M*) is
identical to the live one, and the service goes on from there.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import cast

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapters.sqlite_store import SqliteStore
from monitor.canon import as_async, get_canonicalizer
from monitor.config import BudgetSettings, TaskSettings
from monitor.metrics import Metrics
from monitor.ports import CalibrationStore, ReviewQueue
from monitor.review import ReviewItem, Verdict
from monitor.service import MonitorService, TaskRuntime
from monitor.stopping import get_stopping_rule
from monitor.testing import FakeModelClient, ManualClock

MODEL, TASK = "sim-1", "arith"
T0 = 1_800_000_000.0
CANDIDATES = (("4", 6), ("5", 3), ("6", 1))
_files = itertools.count()


def service(
    store: CalibrationStore,
    clock: ManualClock,
    window: int,
    review_queue: ReviewQueue | None = None,
) -> MonitorService:
    """The service of these tests (and of the Kafka backend's), over ``store``."""
    settings = TaskSettings(
        name=TASK,
        canonicalizer="numeric",
        k_max=10,
        k0=3,
        sampling_rate=1.0,
        review_rate=0.5,
        review_priority="uncertainty",
        review_min_rate=0.1,
        window_size=window,
        half_life_s=900.0,
        alphas=[0.1, 0.2, 0.3],
        reliability_target=0.8,
        endpoint={"model": MODEL},
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=10, k0=3),
        client=FakeModelClient(lambda q, i: "4"),
        sync_canonicalizer=canon,
    )
    return MonitorService(
        [task],
        store=store,
        review_queue=review_queue if review_queue is not None else cast(ReviewQueue, store),
        metrics=Metrics(CollectorRegistry(), k_max=10),
        budget=BudgetSettings(calls_per_minute=10_000),
        clock=clock,
    )


def review_item(n: int, sampled_at: float, pi: float) -> ReviewItem:
    return ReviewItem(
        item_id=f"{TASK}:e{n}",
        model=MODEL,
        task=TASK,
        query="q",
        candidates=CANDIDATES,
        k=10,
        inclusion_probability=pi,
        sampled_at=sampled_at,
    )


def as_verdict(item_id: str, choice: int) -> Verdict:
    if choice == 0:
        return Verdict(item_id, none_of_these=True)
    return Verdict(item_id, accepted_ranks=(choice,))


items = st.lists(
    st.tuples(
        st.floats(0, 20_000),  # sampling time after T0
        st.sampled_from([1.0, 0.5, 0.25, 0.1]),  # review probability
        st.integers(0, 3),  # verdict: none of these, or the accepted rank
    ),
    min_size=4,
    max_size=30,
)


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=items, window=st.integers(1, 8), data=st.data())
async def test_a_restart_restores_exactly_the_live_snapshot(
    tmp_path: Path, plan: list[tuple[float, float, int]], window: int, data: st.DataObject
) -> None:
    path = tmp_path / f"relmon-{next(_files)}.sqlite3"  # a fresh file per example
    order = data.draw(st.permutations(range(len(plan))), label="verdict order")
    restarts = set(data.draw(st.lists(st.integers(0, len(plan)), max_size=4), label="restarts"))
    restarts.add(len(plan))
    clock = ManualClock(T0 + 25_000.0)
    store = SqliteStore(path, clock=clock)
    live = service(store, clock, window)
    await live.load()
    for n, (at, pi, _) in enumerate(plan):
        await store.save_review_item(review_item(n, T0 + at, pi))
    try:
        for done, n in enumerate([*order, None]):
            if done in restarts:
                clock.advance(data.draw(st.floats(0, 3_000), label="time before the restart"))
                before = live.snapshot(MODEL, TASK)
                await store.aclose()
                store = SqliteStore(path, clock=clock)
                live = service(store, clock, window)
                await live.load()
                after = live.snapshot(MODEL, TASK)
                assert after == before
                assert after.n == min(done, window)
            if n is None:
                break
            clock.advance(1.0)
            outcome = await live.apply_verdict(as_verdict(f"{TASK}:e{n}", plan[n][2]))
            assert outcome.status == "applied"
        assert live.snapshot(MODEL, TASK).n == min(len(plan), window)
    finally:
        await store.aclose()


async def test_reviewers_answering_out_of_order_keep_the_level_over_a_restart(
    tmp_path: Path,
) -> None:
    """The tester's case: window 20, 60 verdicts answered newest-sampled first, all good
    but the last 20 applied. Reloading by sampling time kept the wrong 20 (level 0)."""
    path = tmp_path / "relmon.sqlite3"
    clock = ManualClock(T0 + 400.0)
    store = SqliteStore(path, clock=clock)
    live = service(store, clock, 20)
    try:
        await live.load()
        for n in range(60):
            await store.save_review_item(review_item(n, T0 + 6.0 * n, 0.1))
        for n in reversed(range(60)):  # newest-sampled first: the oldest are applied last
            await live.apply_verdict(as_verdict(f"{TASK}:e{n}", 1 if n < 20 else 0))
        before = live.snapshot(MODEL, TASK)
        assert before.reliability_level > 0.9 and math.isfinite(before.thresholds[0.2])
        await store.aclose()
        store = SqliteStore(path, clock=clock)
        again = service(store, clock, 20)
        await again.load()
        assert again.snapshot(MODEL, TASK) == before
    finally:
        await store.aclose()


async def test_a_different_verdict_for_a_reviewed_item_answers_the_stored_score(
    tmp_path: Path,
) -> None:
    """The HTTP review API: the first verdict wins, and a second, different one answers
    ``duplicate`` with the score of the stored verdict, not its own."""
    from adapters.http_review import ReviewServer

    clock = ManualClock(T0 + 100.0)
    store = SqliteStore(tmp_path / "relmon.sqlite3", clock=clock)
    live = service(store, clock, 20)
    await live.load()
    await store.save_review_item(review_item(1, T0, 0.5))
    server = ReviewServer(store=store, handler=live.apply_verdict, token="tok", port=0)
    await server.start()
    url = f"http://127.0.0.1:{server.bound_port}/api/reviews/{TASK}:e1"
    auth = {"Authorization": "Bearer tok"}
    try:
        async with aiohttp.ClientSession(headers=auth) as http:
            async with http.post(url, json={"accepted_ranks": [2]}) as resp:
                assert resp.status == 200
                assert await resp.json() == {"status": "applied", "score": 2.0}
            for other, _ in [({"none_of_these": True}, "inf"), ({"accepted_ranks": [1]}, 1.0)]:
                async with http.post(url, json=other) as resp:
                    assert resp.status == 200
                    assert await resp.json() == {"status": "duplicate", "score": 2.0}
            async with http.post(url, json={"accepted_ranks": [2]}) as resp:
                assert await resp.json() == {"status": "duplicate", "score": 2.0}
        assert live.snapshot(MODEL, TASK).n == 1
    finally:
        await server.stop()
        await store.aclose()
