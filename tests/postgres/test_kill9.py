"""Replicas killed with SIGKILL at random moments lose nothing acknowledged.

Three driver processes (:mod:`tests.postgres.kill_driver`) write review items and give
verdicts through the API path and the page's undo window against one real PostgreSQL,
while three in-process replicas follow the store. A seeded schedule kills a random
driver (``kill -9``) every fraction of a second and starts a new one in its place.
Afterwards: every write a driver acknowledged is in the store (a held verdict applied
as it was given), the verdicts' numbers run 1..n without a gap, and every replica, the
three that followed all along and one started afterwards, holds the same calibration.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.postgres.store import PostgresStore
from monitor.core.review import Verdict, same_judgement
from monitor.engine.follower import VerdictFollower
from monitor.testing import ManualClock
from tests.postgres import PostgresCluster
from tests.postgres.kill_driver import HOLD_S, flush
from tests.postgres.test_replicas import Replica
from tests.waiting import hold_still, wait_until

pytestmark = pytest.mark.timeout(300)
_databases = itertools.count()
ROOT = Path(__file__).resolve().parents[2]
RUN_S = 10.0


def _acks(directory: Path) -> list[dict[str, object]]:
    out = []
    for path in sorted(directory.glob("d*")):
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            if line.endswith("\n"):  # a line cut by the kill was never acknowledged
                out.append(json.loads(line))
    return out


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Zygote:
    """The driver processes' parent (:func:`tests.postgres.kill_driver.main`): relmon is
    imported once, every driver is a fork of it, started in milliseconds."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.postgres.kill_driver"],
            cwd=ROOT,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},  # fork-safe
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def _line(self) -> str:
        assert self.proc.stdout is not None
        return str(await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 120))

    async def ready(self) -> None:
        assert (await self._line()).strip() == "ready"

    async def fork(self, *argv: str) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(argv) + "\n")
        self.proc.stdin.flush()
        return int(await self._line())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


async def _kill_at_random(dsn: str, rng: random.Random, acks: Path) -> int:
    """Run three drivers for RUN_S seconds, killing one (SIGKILL) at a random moment
    again and again and starting another in its place; returns the number of kills."""
    zygote = Zygote()
    names = itertools.count()
    writing: list[int] = []
    kills = 0

    async def start() -> int:
        name = f"d{next(names)}"
        return await zygote.fork(dsn, name, str(rng.randrange(1 << 30)), str(acks / name))

    try:
        await zygote.ready()
        writing = [await start() for _ in range(3)]
        loop = asyncio.get_running_loop()
        end = loop.time() + RUN_S
        while loop.time() < end:
            await hold_still(rng.uniform(0.05, 0.6), why="a random moment to kill a replica at")
            k = rng.randrange(3)
            os.kill(writing[k], signal.SIGKILL)
            await wait_until(lambda pid=writing[k]: _gone(pid), timeout_s=10, what="the kill")
            kills += 1
            writing[k] = await start()
    finally:
        for pid in writing:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        zygote.close()
    for pid in writing:
        await wait_until(lambda pid=pid: _gone(pid), timeout_s=10, what="the last kills")
    return kills


@pytest.mark.parametrize("seed", [11])
async def test_kill_9_at_random_points_loses_nothing_acknowledged(
    pg_cluster: PostgresCluster, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    dsn = pg_cluster.create_database(f"relmon_kill9_{next(_databases)}")
    clock = ManualClock()
    replicas = [Replica(await PostgresStore.open(dsn, max_size=3), n, clock) for n in range(3)]
    followers = []
    try:
        for r in replicas:
            r.follower = VerdictFollower(r.store, r.service.calibration, sync_s=0.2)
            await r.start()
            followers.append(asyncio.create_task(r.follower.run()))
        kills = await _kill_at_random(dsn, rng, tmp_path)
        # The page's flusher of some replica applies what is still held, when due.
        await hold_still(HOLD_S, why="the last held verdicts fall due")
        await flush(replicas[0].store)
        acked = _acks(tmp_path)
        store = replicas[0].store
        assert kills >= 10 and sum(a["kind"] != "item" for a in acked) >= 50, (kills, len(acked))
        for a in acked:
            item_id = str(a["item"])
            assert await store.get_review_item(item_id) is not None, a
            if a["kind"] != "item":
                stored = await store.get_verdict(item_id)
                given = Verdict(item_id, accepted_ranks=tuple(a["ranks"]))  # type: ignore[arg-type]
                assert stored is not None and same_judgement(stored, given), (a, stored)
        records = await store.load_records()
        assert [r.order for r in records] == [(n,) for n in range(1, len(records) + 1)]
        assert len({r.item_id for r in records}) == len(records)
        # The calibration window holds the last window_size of them (a fast machine
        # writes more than that in RUN_S: 2,160 here once).
        window = replicas[0].service.tasks["arith"].settings.window_size
        await wait_until(
            lambda: all(r.figures()[0] == min(len(records), window) for r in replicas),
            timeout_s=30,
            what="every replica to follow every verdict",
            detail=lambda: (
                f"{len(records)} verdicts, window {window}: {[r.figures()[0] for r in replicas]}"
            ),
        )
        for r in replicas:
            await r.follower.sync()  # the queue's depth as well
        figures = [r.figures() for r in replicas]
        assert all(f == figures[0] for f in figures), figures
        late = Replica(await PostgresStore.open(dsn, max_size=2), 9, clock)
        replicas.append(late)
        await late.start()
        assert late.figures()[:4] == figures[0][:4]
    finally:
        for r in replicas:
            await r.follower.stop()
        await asyncio.gather(*followers, return_exceptions=True)
        for r in replicas:
            await r.service.stop(1)
            await r.store.aclose()
