"""Several replicas on one PostgreSQL store are one monitor: one review queue, one
calibration. Verdicts given on any replica, in any order and interleaving (the same item
sometimes on two at once), end with every replica exporting the same level, bound,
thresholds and counters once each has followed the others."""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from adapters.postgres.store import PostgresStore
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.events import parse_event
from monitor.core.review import Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.follower import VerdictFollower
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, ManualClock
from tests.postgres import PostgresCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
_databases = itertools.count()


def _model(seed: int):
    rng = np.random.default_rng(seed)

    def answer(query: str, call: int) -> str:
        a, b = map(int, re.findall(r"\d+", query)[:2])
        return str(a + b if rng.random() < 0.8 else a + b + 1)

    return answer


class Replica:
    def __init__(self, store: PostgresStore, seed: int, clock: ManualClock) -> None:
        settings = TaskSettings(
            name="arith",
            canonicalizer="numeric",
            k_max=6,
            k0=3,
            sampling_rate=1.0,
            review_rate=1.0,
            half_life_s=None,
            alphas=[0.1, 0.2, 0.3],
            endpoint={"model": "sim-1"},
        )
        canon = get_canonicalizer("numeric")
        task = TaskRuntime(
            settings=settings,
            canonicalizer=as_async(canon),
            rule=get_stopping_rule(k_max=6, k0=3),
            client=FakeModelClient(_model(seed)),
            sync_canonicalizer=canon,
        )
        self.registry = CollectorRegistry()
        self.store = store
        self.service = MonitorService(
            [task],
            store=store,
            review_queue=store,
            metrics=Metrics(self.registry, k_max=6),
            budget=BudgetSettings(calls_per_minute=100_000, max_in_flight=2, queue_size=200),
            clock=clock,
            seed=seed,
        )
        self.follower = VerdictFollower(store, self.service.calibration, sync_s=0.05)

    async def start(self) -> None:
        await self.service.load()
        self.follower.start(self.service.calibration.loaded_through)
        self.service.start()

    def figures(self) -> tuple[Any, ...]:
        snap = self.service.snapshot("sim-1", "arith")
        labels = {"model": "sim-1", "task": "arith"}
        counters = tuple(
            self.registry.get_sample_value("relmon_top_answers_total", {**labels, "outcome": o})
            for o in ("accepted", "rejected")
        )
        depth = self.registry.get_sample_value("relmon_review_queue_depth", labels)
        return (
            snap.n,
            snap.reliability_level,
            snap.reliability_lower_bound,
            snap.thresholds,
            counters,
            depth,
        )


def _event(i: int) -> Any:
    return parse_event(
        {
            "id": f"req-{i}",
            "model": "sim-1",
            "request": {"messages": [{"role": "user", "content": f"What is {i} plus {i % 7}?"}]},
        }
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_verdicts_on_any_replica_give_every_replica_the_same_calibration(
    pg_cluster: PostgresCluster, seed: int
) -> None:
    rng = random.Random(seed)
    dsn = pg_cluster.create_database(f"relmon_replicas_{next(_databases)}")
    clock = ManualClock()
    stores = [await PostgresStore.open(dsn, max_size=3) for _ in range(3)]
    replicas = [Replica(s, seed * 10 + n, clock) for n, s in enumerate(stores)]
    try:
        for r in replicas:
            await r.start()
        # Traffic split over the replicas; every item goes to the one shared queue.
        for i in range(30):
            assert replicas[i % 3].service.offer(_event(i), "mirror").decision == "sampled"
        for r in replicas:
            await r.service.drain()
        assert await stores[0].depth() == 30
        for r in replicas:
            await r.follower.sync()
            assert r.figures()[5] == 30  # one queue: every replica sees all of it
        # Reviewers on any replica, in a random order; some items twice, on two replicas.
        pending = [f"arith:req-{i}" for i in range(30)]
        rng.shuffle(pending)
        jobs = []
        for item_id in pending:
            item = await stores[0].get_review_item(item_id)
            assert item is not None
            rank = 1 if rng.random() < 0.75 else len(item.candidates)
            verdict = Verdict(item_id, accepted_ranks=(rank,), reviewer="ann")
            targets = rng.sample(replicas, 2 if rng.random() < 0.2 else 1)
            jobs += [t.service.apply_verdict(verdict) for t in targets]
        outcomes = await asyncio.gather(*jobs)
        assert sum(o.status == "applied" for o in outcomes) == 30  # each item once
        assert {o.status for o in outcomes} <= {"applied", "duplicate"}
        for r in replicas:
            await r.follower.sync()
        figures = [r.figures() for r in replicas]
        assert figures[0][0] == 30
        assert all(f == figures[0] for f in figures), figures
        assert sum(r.follower.followed for r in replicas) == 2 * 30  # each saw the others'
        assert await stores[0].depth() == 0
        # A replica that starts now loads the same calibration from the store.
        late = Replica(await PostgresStore.open(dsn, max_size=2), 99, clock)
        stores.append(late.store)
        await late.start()
        assert late.figures()[:4] == figures[0][:4]
    finally:
        for r in replicas:
            await r.service.stop(1)
        for s in stores:
            await s.aclose()


async def test_the_follower_runs_supervised_and_reports_a_lost_store(
    pg_cluster: PostgresCluster,
) -> None:
    dsn = pg_cluster.create_database(f"relmon_follow_{next(_databases)}")
    clock = ManualClock()
    a = Replica(await PostgresStore.open(dsn), 0, clock)
    b = Replica(await PostgresStore.open(dsn), 1, clock)
    try:
        for r in (a, b):
            await r.start()
        task = asyncio.create_task(b.follower.run())
        assert a.service.offer(_event(1), "mirror").decision == "sampled"
        await a.service.drain()
        await a.service.apply_verdict(Verdict("arith:req-1", accepted_ranks=(1,)))
        await wait_until(
            lambda: b.figures()[0] == 1, timeout_s=10, what="replica b to follow a's verdict"
        )
        assert b.follower.connected
        await b.store.aclose()  # the store is gone: reported unreachable, the loop goes on
        await wait_until(
            lambda: not b.follower.connected, timeout_s=10, what="the follower to report it"
        )
        assert b.follower.unreachable is not None and not task.done()
        await b.follower.stop()
        await asyncio.wait_for(task, 10)  # stopped: the loop ends without an error
    finally:
        await b.follower.stop()
        for r in (a, b):
            await r.service.stop(1)
        await a.store.aclose()
