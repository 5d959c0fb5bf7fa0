"""A restart restores exactly the calibration the live service had (SQLite store).

Property (hypothesis): review items with random sampling times, verdicts applied in a
random order, restarts at random points, a window smaller than the number of verdicts:
after every restart the rebuilt snapshot (level, lower bound, n, n_eff, every M*) is
identical to the live one, and the service goes on from there. With ACI on (items
scored by the live service at the alpha_t of the moment, verdicts interleaved with new
items), alpha_t and the set size served after a restart are the live ones too.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import cast

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapters.sqlite.store import SqliteStore
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.events import TrafficEvent, parse_event
from monitor.core.review import ReviewItem, Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.ports import CalibrationStore, ReviewQueue
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, ManualClock
from tests.sqlite.test_sqlite_store import SCHEMA_2_RECORDS

MODEL, TASK = "sim-1", "arith"
T0 = 1_800_000_000.0
CANDIDATES = (("4", 6), ("5", 3), ("6", 1))
_files = itertools.count()


def service(
    store: CalibrationStore,
    clock: ManualClock,
    window: int,
    review_queue: ReviewQueue | None = None,
    *,
    aci_gamma: float | None = None,
    answer: Callable[[str, int], str] | None = None,
    review_rate: float = 0.5,
    review_min_rate: float = 0.1,
) -> MonitorService:
    """The service of these tests (and of the Kafka backend's), over ``store``."""
    settings = TaskSettings(
        name=TASK,
        canonicalizer="numeric",
        k_max=10,
        k0=3,
        sampling_rate=1.0,
        review_rate=review_rate,
        review_priority="uncertainty",
        review_min_rate=review_min_rate,
        window_size=window,
        half_life_s=900.0,
        alphas=[0.1, 0.2, 0.3],
        reliability_target=0.8,
        endpoint={"model": MODEL},
        aci_gamma=aci_gamma,
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=10, k0=3),
        client=FakeModelClient(answer or (lambda q, i: "4")),
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
        st.sampled_from([1.0, 0.5, 0.25, 0.1]),  # inclusion probability
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


# Answers by query, cycled per query: one-, two-, three- and four-class consensus.
MIXES = (("4",), ("4", "4", "5"), ("4", "5", "6"), ("4", "5", "4", "6", "7", "5"))
PROBE = "probe mix3"


def mixed_answers() -> Callable[[str, int], str]:
    """A fresh model whose answers depend only on the query and how often it was asked."""
    asked: Counter[str] = Counter()

    def answer(query: str, call: int) -> str:
        pattern = MIXES[int(query[-1])]
        asked[query] += 1
        return pattern[(asked[query] - 1) % len(pattern)]

    return answer


def traffic(event_id: str, query: str) -> TrafficEvent:
    return parse_event(
        {
            "id": event_id,
            "model": MODEL,
            "task": TASK,
            "request": {"messages": [{"role": "user", "content": query}]},
        }
    )


def aci_service(
    store: SqliteStore, clock: ManualClock, window: int, gamma: float
) -> MonitorService:
    return service(
        store,
        clock,
        window,
        aci_gamma=gamma,
        answer=mixed_answers(),
        review_rate=1.0,
        review_min_rate=0.5,  # a test weight of 2: finite thresholds after a few verdicts
    )


def set_size_sum(live: MonitorService) -> float:
    """``relmon_set_size_sum{model, task}``: the sizes of every set served so far."""
    labels = {"model": MODEL, "task": TASK}
    return sum(
        sample.value
        for family in live.metrics.set_size.collect()
        for sample in family.samples
        if sample.name == "relmon_set_size_sum" and sample.labels == labels
    )


async def served_set_size(live: MonitorService, event_id: str) -> float:
    """The set size the service serves for the probe query now (``relmon_set_size``)."""
    before = set_size_sum(live)
    assert live.offer(traffic(event_id, PROBE), "test").decision == "sampled"
    await live.drain()
    return set_size_sum(live) - before


@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=st.lists(
        st.tuples(
            st.floats(0, 600),  # seconds before the item is sampled
            st.integers(0, len(MIXES) - 1),  # the model's answers
            st.sampled_from([1, 1, 1, 1, 2, 3, 0]),  # verdict: accepted rank, or none (0)
        ),
        min_size=4,
        max_size=20,
    ),
    window=st.integers(2, 12),
    gamma=st.sampled_from([0.05, 0.3]),
    data=st.data(),
)
async def test_a_restart_restores_aci_alpha_and_the_served_set_size(
    tmp_path: Path,
    plan: list[tuple[float, int, int]],
    window: int,
    gamma: float,
    data: st.DataObject,
) -> None:
    """ACI on: items scored by the live service at the alpha_t of the moment, verdicts
    applied in a random order interleaved with new items, restarts at random points.
    After every restart alpha_t, the served set size and the snapshot are the live ones."""
    path = tmp_path / f"relmon-{next(_files)}.sqlite3"
    clock = ManualClock(T0)
    store = SqliteStore(path, clock=clock)
    live = aci_service(store, clock, window, gamma)
    await live.load()
    live.start()
    waiting: list[tuple[str, int]] = []  # reviewed items without a verdict, their choice
    created = steps = restarts = 0
    try:
        while created < len(plan) or waiting:
            if created < len(plan) and (
                not waiting or data.draw(st.booleans(), label="new item next")
            ):
                gap, mix, choice = plan[created]
                clock.advance(gap)
                event_id = f"e{created}"
                assert live.offer(traffic(event_id, f"q{created} mix{mix}"), "test").decision == (
                    "sampled"
                )
                await live.drain()
                if await store.get_review_item(f"{TASK}:{event_id}") is not None:
                    waiting.append((f"{TASK}:{event_id}", choice))
                created += 1
            else:
                item_id, choice = waiting.pop(data.draw(st.integers(0, len(waiting) - 1)))
                item = await store.get_review_item(item_id)
                assert item is not None and item.aci_threshold is not None
                clock.advance(1.0)
                verdict = as_verdict(item_id, min(choice, len(item.candidates)))
                assert (await live.apply_verdict(verdict)).status == "applied"
                steps += 1
            if data.draw(st.integers(0, 3), label="restart now") == 0:
                alpha_t = live.aci_alpha(MODEL, TASK)
                before = live.snapshot(MODEL, TASK)
                size = await served_set_size(live, f"probe-{restarts}-live")
                await live.stop(30.0)
                await store.aclose()
                store = SqliteStore(path, clock=clock)
                live = aci_service(store, clock, window, gamma)
                await live.load()
                live.start()
                assert live.aci_alpha(MODEL, TASK) == alpha_t
                assert live.snapshot(MODEL, TASK) == before
                assert await served_set_size(live, f"probe-{restarts}-again") == size
                restarts += 1
        # alpha_t is the unrolled ACI recursion over every verdict applied
        records = await store.load_records()
        assert len(records) == steps and all(r.aci_miss is not None for r in records)
        misses = sum(bool(r.aci_miss) for r in records)
        expected = 0.2 + gamma * (steps * 0.2 - misses)
        assert live.aci_alpha(MODEL, TASK) == pytest.approx(expected, abs=1e-12)
    finally:
        await live.stop(30.0)
        await store.aclose()


async def test_a_schema_2_file_restarts_alpha_t_at_alpha_and_counts_later_steps(
    tmp_path: Path,
) -> None:
    """A state file from before ``aci_miss`` (schema 2): its verdicts carry no ACI step
    (alpha_t starts at alpha, as that relmon restarted it); verdicts applied after the
    upgrade are steps, and a second restart keeps them."""
    path = tmp_path / "relmon.sqlite3"
    scored = replace(review_item(0, T0, 0.5), aci_threshold=1.0)
    waiting = replace(review_item(1, T0, 0.5), aci_threshold=1.0)
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL);"
            "INSERT INTO schema_version VALUES (2);"
            "CREATE TABLE review_items (item_id TEXT PRIMARY KEY, model TEXT NOT NULL, "
            "task TEXT NOT NULL, body TEXT NOT NULL, created REAL NOT NULL, "
            "pending INTEGER NOT NULL DEFAULT 1);" + SCHEMA_2_RECORDS
        )
        for it, pending in [(scored, 0), (waiting, 1)]:
            conn.execute(
                "INSERT INTO review_items VALUES (?, ?, ?, ?, ?, ?)",
                (it.item_id, MODEL, TASK, json.dumps(it.to_json()), T0, pending),
            )
        conn.execute(  # a "none of these": a miss against 1.0, but not a step here
            "INSERT INTO records VALUES (?, ?, ?, NULL, 0.5, ?, '{}', ?, 1)",
            (scored.item_id, MODEL, TASK, T0, T0),
        )
    conn.close()
    clock = ManualClock(T0 + 100.0)
    store = SqliteStore(path, clock=clock)
    try:
        live = service(store, clock, 8, aci_gamma=0.1)
        assert await live.load() == 1
        assert live.snapshot(MODEL, TASK).n == 1
        assert live.aci_alpha(MODEL, TASK) == 0.2
        assert (await live.apply_verdict(as_verdict(waiting.item_id, 0))).status == "applied"
        alpha_t = live.aci_alpha(MODEL, TASK)
        assert alpha_t == pytest.approx(0.2 + 0.1 * (0.2 - 1.0))
        await store.aclose()
        store = SqliteStore(path, clock=clock)
        again = service(store, clock, 8, aci_gamma=0.1)
        await again.load()
        assert again.aci_alpha(MODEL, TASK) == alpha_t
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
    409 with the stored verdict and its score, not its own; the same one ``duplicate``."""
    from adapters.review.review import ReviewServer

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
                    assert resp.status == 409
                    body = await resp.json()
                    assert (body["score"], body["verdict"]["accepted_ranks"]) == (2.0, [2])
            async with http.post(url, json={"accepted_ranks": [2]}) as resp:
                assert await resp.json() == {"status": "duplicate", "score": 2.0}
        assert live.snapshot(MODEL, TASK).n == 1
    finally:
        await server.stop()
        await store.aclose()
