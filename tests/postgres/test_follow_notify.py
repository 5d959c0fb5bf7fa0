"""Following by notice: a verdict stored on one replica reaches the others at once
(LISTEN/NOTIFY), far sooner than ``store.sync_s``; a killed listener connection is
opened again, and without any listener the followers still poll every ``sync_s``."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from adapters.postgres.store import PostgresStore
from monitor.core.review import Verdict
from monitor.engine.follower import VerdictFollower
from monitor.testing import ManualClock
from tests.postgres import PostgresCluster
from tests.postgres.test_replicas import Replica, _event
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
_databases = itertools.count()
SLOW_POLL_S = 120.0  # far longer than any wait below: only a notice can be this quick


async def _pair(dsn: str, *, sync_s: float) -> tuple[Replica, Replica]:
    clock = ManualClock()
    a = Replica(await PostgresStore.open(dsn), 0, clock)
    b = Replica(await PostgresStore.open(dsn), 1, clock)
    for r in (a, b):
        r.follower = VerdictFollower(r.store, r.service.calibration, sync_s=sync_s)
        await r.start()
    return a, b


async def _verdicts(a: Replica, first: int, n: int) -> None:
    for i in range(first, first + n):
        assert a.service.offer(_event(i), "mirror").decision == "sampled"
    await a.service.drain()


async def _close(*replicas: Replica) -> None:
    for r in replicas:
        await r.follower.stop()
        await r.service.stop(1)
        await r.store.aclose()


async def _applied_on_b(a: Replica, b: Replica, i: int, n: int) -> float:
    """Seconds from a's verdict on item ``i`` until b's window holds it (n verdicts)."""
    start = time.perf_counter()
    outcome = await a.service.apply_verdict(Verdict(f"arith:req-{i}", accepted_ranks=(1,)))
    assert outcome.status == "applied"
    await wait_until(lambda: b.figures()[0] == n, timeout_s=30, what=f"b to apply verdict {n}")
    return time.perf_counter() - start


async def test_a_verdict_reaches_the_other_replica_at_once(pg_cluster: PostgresCluster) -> None:
    dsn = pg_cluster.create_database(f"relmon_notify_{next(_databases)}")
    a, b = await _pair(dsn, sync_s=SLOW_POLL_S)
    task = asyncio.create_task(b.follower.run())
    try:
        await _verdicts(a, 0, 5)
        await wait_until(lambda: b.follower.notices >= 1, timeout_s=10, what="b listening")
        waits = [await _applied_on_b(a, b, i, i + 1) for i in range(5)]
        assert max(waits) < 2.0, waits  # not the 120 s poll
        assert b.figures()[:4] == a.figures()[:4]
    finally:
        await b.follower.stop()
        await asyncio.wait_for(task, 10)
        await _close(a, b)


async def test_a_killed_listener_connection_is_opened_again(
    pg_cluster: PostgresCluster,
) -> None:
    database = f"relmon_notify_{next(_databases)}"
    dsn = pg_cluster.create_database(database)
    a, b = await _pair(dsn, sync_s=SLOW_POLL_S)
    task = asyncio.create_task(b.follower.run())
    listeners = (
        f"SELECT pid FROM pg_stat_activity WHERE datname = '{database}' AND query LIKE 'LISTEN%'"
    )
    try:
        await _verdicts(a, 0, 4)
        await wait_until(lambda: pg_cluster.psql(listeners) != "", timeout_s=10, what="LISTEN")
        assert await _applied_on_b(a, b, 0, 1) < 2.0
        for n in range(2):  # kill it twice: each time a new connection takes over
            old = pg_cluster.psql(listeners)
            woken = b.follower.notices
            killed = pg_cluster.psql(
                f"SELECT count(pg_terminate_backend(pid)) FROM ({listeners}) l"
            )
            assert killed == "1"
            await wait_until(
                lambda old=old: pg_cluster.psql(listeners) not in ("", old),  # type: ignore[misc]
                timeout_s=15,
                what="a new LISTEN connection",
            )
            await wait_until(lambda w=woken: b.follower.notices > w, timeout_s=10, what="wake")
            assert await _applied_on_b(a, b, n + 1, n + 2) < 2.0  # by notice again
        assert b.follower.connected and not task.done()
    finally:
        await b.follower.stop()
        await asyncio.wait_for(task, 10)
        await _close(a, b)


async def test_without_a_listener_the_followers_poll(pg_cluster: PostgresCluster) -> None:
    dsn = pg_cluster.create_database(f"relmon_notify_{next(_databases)}")
    a, b = await _pair(dsn, sync_s=0.5)
    # b's listener cannot connect at all (nothing listens on that port): polling only.
    b.store._dsn = f"postgresql://postgres@127.0.0.1:1/{dsn.rsplit('/', 1)[1]}"
    task = asyncio.create_task(b.follower.run())
    try:
        await _verdicts(a, 0, 3)
        for i in range(3):
            assert await _applied_on_b(a, b, i, i + 1) < 5.0
        assert b.follower.notices == 0  # it was the poll
        assert b.follower.connected and not task.done()
    finally:
        await b.follower.stop()
        await asyncio.wait_for(task, 10)
        await _close(a, b)
