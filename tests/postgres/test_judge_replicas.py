"""Judge labels on a shared PostgreSQL store: each replica judges its own items, every
replica follows the others' labels and verdicts, and all export the same
prediction-powered level, bound and agreement; a replica started later loads them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from adapters.postgres.store import PostgresStore
from monitor.core.events import parse_event
from monitor.core.review import Verdict
from monitor.engine.follower import VerdictFollower
from monitor.testing import ManualClock
from tests.engine.test_judge import LABELS, judge_answers, make
from tests.test_service import event

pytestmark = pytest.mark.timeout(300)

GAUGES = (
    "relmon_reliability_level_ppi",
    "relmon_reliability_lower_bound_ppi",
    "relmon_judge_agreement",
)


async def _replica(dsn: str, clock: ManualClock, seed: int) -> tuple[Any, Any, VerdictFollower]:
    store = await PostgresStore.open(dsn)
    service, registry = make(store, clock, judge_answers(seed))  # type: ignore[arg-type]
    await service.load()
    follower = VerdictFollower(store, service.calibration, sync_s=0.05)
    follower.start(service.calibration.loaded_through)
    service.start()
    return service, registry, follower


async def test_replicas_follow_each_others_judge_labels(pg_dsn: str) -> None:
    clock = ManualClock()
    a, reg_a, follow_a = await _replica(pg_dsn, clock, seed=1)
    b, reg_b, follow_b = await _replica(pg_dsn, clock, seed=2)
    try:
        for i in range(160):  # each replica scores (and judges) its own half
            clock.advance(1.0)
            replica = a if i % 2 else b
            replica.offer(parse_event(event(i, i % 13, 5)), "test")
        await a.drain()
        await b.drain()
        ids = await a.store.recent_item_ids(1000)  # every replica's review items
        items = [await a.store.get_review_item(i) for i in ids]
        assert len(ids) > 40
        for n, item in enumerate(x for x in items if x is not None):
            a_, b_ = map(int, re.findall(r"\d+", item.query)[:2])
            ranks = tuple(k + 1 for k, (c, _) in enumerate(item.candidates) if c == str(a_ + b_))
            verdict = (
                Verdict(item.item_id, ranks) if ranks else Verdict(item.item_id, none_of_these=True)
            )
            await (a if n % 2 else b).apply_verdict(verdict)
        await follow_a.sync()
        await follow_b.sync()
        clock.advance(2.0)
        a.publish()
        b.publish()
        got_a = [reg_a.get_sample_value(g, LABELS) for g in GAUGES]
        got_b = [reg_b.get_sample_value(g, LABELS) for g in GAUGES]
        assert None not in got_a
        assert got_a == pytest.approx(got_b, abs=1e-12)
        # A replica started afterwards loads the same labels and verdicts.
        c, reg_c, _ = await _replica(pg_dsn, clock, seed=3)
        c.publish()
        assert [reg_c.get_sample_value(g, LABELS) for g in GAUGES] == pytest.approx(
            got_a, abs=1e-12
        )
        await c.stop(5)
        await c.store.aclose()
    finally:
        for service in (a, b):
            await service.stop(5)
            await service.store.aclose()
