"""A segment's window holds all its items on a shared PostgreSQL too: two replicas that
each apply half of the verdicts (and follow the other's) and a third started afterwards
export the same per-segment figures, those of windows fed only each label's verdicts,
whatever order each replica applied them in, for a tenant that starts small."""

from __future__ import annotations

import pytest

from adapters.postgres.store import PostgresStore
from monitor.core.review import ReviewItem, Verdict
from monitor.core.segments import OTHER
from monitor.engine.ports import CalibrationRecord
from monitor.engine.service import MonitorService
from monitor.testing import ManualClock
from tests.engine.test_segment_history import (
    TENANTS,
    independent,
    segment_figures,
    snapshot_figures,
    start_small_verdict,
)
from tests.engine.test_segments_engine import (
    SEGMENT_GAUGES,
    TASK,
    TASK_GAUGES,
    _event,
    _samples,
    _service,
)

pytestmark = pytest.mark.timeout(300)

SPEC = {"by": {"field": "metadata.tenant"}, "max": 5}


async def _follow(service: MonitorService, store: PostgresStore) -> None:
    for record in await store.records_after(0):
        await service.calibration.follow(record, store)  # False: applied here already
    service.publish()


async def test_two_replicas_and_a_late_one_export_the_same_segments(pg_dsn: str) -> None:
    clock = ManualClock()
    stores = [await PostgresStore.open(pg_dsn) for _ in range(3)]
    try:
        await _replicas(clock, *stores)
    finally:
        for store in stores:
            await store.aclose()


async def _replicas(
    clock: ManualClock,
    one_store: PostgresStore,
    two_store: PostgresStore,
    three_store: PostgresStore,
) -> None:
    one, one_registry = _service(one_store, clock, SPEC)
    two, two_registry = _service(two_store, clock, SPEC)
    await one.load()
    await two.load()
    one.start()
    applied: list[tuple[ReviewItem, Verdict, CalibrationRecord]] = []
    for batch in range(4):
        ids = range(batch * 32, (batch + 1) * 32)
        for i in ids:
            assert one.offer(_event(i, TENANTS[i]), "test").decision == "sampled"
        await one.drain()
        for i in ids:
            item = await one_store.get_review_item(f"{TASK}:req-{i}")
            assert item is not None
            verdict = start_small_verdict(item, i)
            replica = one if i % 2 == 0 else two  # each applies half, in its own order
            assert (await replica.apply_verdict(verdict)).status == "applied"
            stored = await one_store.get_record(item.item_id)
            assert stored is not None
            applied.append((item, verdict, stored))
        await _follow(one, one_store)
        await _follow(two, two_store)
        clock.advance(300.0)
    one.publish()
    two.publish()
    gauges = (*SEGMENT_GAUGES, *TASK_GAUGES)
    figures = _samples(one_registry, gauges)
    assert _samples(two_registry, gauges) == figures
    alphas = one.tasks[TASK].alphas
    for label, tenants in (("de", {"de"}), ("en", {"en"}), (OTHER, {"fr"})):
        want = snapshot_figures(independent(applied, tenants, alphas, clock.time()), alphas)
        assert segment_figures(one_registry, label, alphas) == want
    assert segment_figures(one_registry, "de", alphas)[2] == 25.0

    three, three_registry = _service(three_store, clock, SPEC)  # a replica started now
    assert await three.load() == 128
    three.publish()
    assert _samples(three_registry, gauges) == figures
    await one.stop(5.0)
