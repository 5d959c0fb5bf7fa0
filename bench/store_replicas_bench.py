"""Three replicas on one PostgreSQL against one replica on SQLite: verdicts applied per
second, and the time until every replica exports the same level after a verdict.

Each replica is a ``MonitorService`` with its store and, on PostgreSQL, its
``VerdictFollower`` running (LISTEN/NOTIFY, polling every ``store.sync_s`` as the
fallback); the replicas share this one process and its event loop, and the database runs
on the same 2 cores (a local cluster started for the run, ``fsync=off`` as in the tests).
The baseline is the one SQLite replica, measured in the same run.

- **Throughput**: N review items in the store, then N verdicts given with 8 at a time
  (spread round-robin over the replicas); the clock stops when every replica's window
  holds all N. SQLite: when the one replica's does.
- **Convergence**: verdicts one at a time on a random replica; the time from the call
  until every replica exports the same level with the new verdict in its window (median
  and p99). SQLite: the call itself. Also with notices off (polling every 2 s, the
  default ``sync_s``), a few verdicts, to show what the notices buy.

    .venv/bin/python bench/store_replicas_bench.py [--verdicts N] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib
from pgcluster import running_cluster

from adapters.postgres.store import PostgresStore
from adapters.sqlite.store import SqliteStore
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.review import ReviewItem, Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.follower import VerdictFollower
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient

MODEL, TASK = "sim-1", "arith"


class Replica:
    def __init__(self, store: Any, seed: int, *, sync_s: float | None) -> None:
        settings = TaskSettings(
            name=TASK,
            canonicalizer="numeric",
            k_max=6,
            k0=3,
            sampling_rate=1.0,
            review_rate=1.0,
            half_life_s=None,
            alphas=[0.1, 0.2, 0.3],
            endpoint={"model": MODEL},
        )
        canon = get_canonicalizer("numeric")
        task = TaskRuntime(
            settings=settings,
            canonicalizer=as_async(canon),
            rule=get_stopping_rule(k_max=6, k0=3),
            client=FakeModelClient(lambda query, call: "1"),
            sync_canonicalizer=canon,
        )
        self.store = store
        self.service = MonitorService(
            [task],
            store=store,
            review_queue=store,
            metrics=Metrics(CollectorRegistry(), k_max=6),
            budget=BudgetSettings(calls_per_minute=100_000, max_in_flight=2, queue_size=200),
            seed=seed,
        )
        self.follower = (
            None
            if sync_s is None
            else VerdictFollower(store, self.service.calibration, sync_s=sync_s)
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.service.load()
        if self.follower is not None:
            self.follower.start(self.service.calibration.loaded_through)
            self._task = asyncio.create_task(self.follower.run())
        self.service.start()

    def n(self) -> int:
        return int(self.service.snapshot(MODEL, TASK).n)

    def level(self) -> float:
        return float(self.service.snapshot(MODEL, TASK).reliability_level)

    async def stop(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self.service.stop(1)
        await self.store.aclose()


def _items(n: int, rng: random.Random, prefix: str) -> list[ReviewItem]:
    return [
        ReviewItem(
            item_id=f"{TASK}:{prefix}{i}",
            model=MODEL,
            task=TASK,
            query=f"What is {i} plus 1?",
            candidates=((str(i + 1), 4), (str(i + 2), 2)),
            k=6,
            inclusion_probability=rng.choice((0.25, 0.5, 1.0)),
            sampled_at=1.8e9 + i,
        )
        for i in range(n)
    ]


def _verdict(item: ReviewItem, rng: random.Random) -> Verdict:
    return Verdict(item.item_id, accepted_ranks=(1 if rng.random() < 0.8 else 2,), reviewer="b")


async def _until(check: Any, timeout_s: float = 120.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError("replicas did not converge")
        await asyncio.sleep(0.0005)


async def _throughput(replicas: list[Replica], n: int, rng: random.Random) -> float:
    """Verdicts per second until every replica's window holds all ``n``."""
    items = _items(n, rng, "t")
    for item in items:
        await replicas[0].store.submit(item)
    base = replicas[0].n()
    queue = list(enumerate(items))
    start = time.perf_counter()

    async def client() -> None:
        while queue:
            i, item = queue.pop()
            await replicas[i % len(replicas)].service.apply_verdict(_verdict(item, rng))

    await asyncio.gather(*(client() for _ in range(8)))
    await _until(lambda: all(r.n() == base + n for r in replicas))
    return n / (time.perf_counter() - start)


async def _convergence(
    replicas: list[Replica], n: int, rng: random.Random, tag: str
) -> list[float]:
    """Seconds from a verdict until every replica exports the same level with it."""
    items = _items(n, rng, tag)
    for item in items:
        await replicas[0].store.submit(item)
    waits = []
    for item in items:
        target = rng.choice(replicas).service
        expected = replicas[0].n() + 1
        start = time.perf_counter()
        await target.apply_verdict(_verdict(item, rng))
        await _until(
            lambda e=expected: (
                all(r.n() == e for r in replicas) and len({r.level() for r in replicas}) == 1
            )
        )
        waits.append(time.perf_counter() - start)
    return waits


def _summary(waits: list[float]) -> dict[str, float]:
    ms = np.array(waits) * 1000
    return {
        "count": len(waits),
        "median_ms": float(np.median(ms)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


async def _sqlite(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    replica = Replica(await SqliteStore.open(path), 0, sync_s=None)
    await replica.start()
    try:
        rate = await _throughput([replica], args.verdicts, rng)
        waits = await _convergence([replica], args.latency, rng, "c")
    finally:
        await replica.stop()
    return {"verdicts_per_s": rate, "convergence": _summary(waits)}


async def _replicas(dsn: str, *, notices: bool) -> list[Replica]:
    replicas = []
    for n in range(3):
        store = await PostgresStore.open(dsn)
        if not notices:
            store._dsn = None  # no LISTEN: the followers poll every 2 s only
        replicas.append(Replica(store, n, sync_s=2.0))
        await replicas[-1].start()
    return replicas


async def _postgres(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    replicas = await _replicas(dsn, notices=True)
    try:
        rate = await _throughput(replicas, args.verdicts, rng)
        waits = await _convergence(replicas, args.latency, rng, "c")
    finally:
        for r in replicas:
            await r.stop()
    replicas = await _replicas(dsn, notices=False)
    try:
        polled = await _convergence(replicas, args.polled, rng, "p")
    finally:
        for r in replicas:
            await r.stop()
    return {
        "verdicts_per_s": rate,
        "convergence": _summary(waits),
        "convergence_polling": _summary(polled),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verdicts", type=int, default=1000)
    parser.add_argument("--latency", type=int, default=300)
    parser.add_argument("--polled", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="few verdicts (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.quick:
        args.verdicts, args.latency, args.polled = 100, 20, 2
    start_machine = benchlib.machine()
    with running_cluster() as cluster:  # stopped and removed on the way out
        dsn = cluster.create_database("relmon_bench")
        with tempfile.TemporaryDirectory() as tmp:
            sqlite = asyncio.run(_sqlite(Path(tmp) / "relmon.sqlite3", args))
        postgres = asyncio.run(_postgres(dsn, args))
    doc = {
        "machine": start_machine,
        "quick": args.quick,
        "verdicts": args.verdicts,
        "sqlite_1": sqlite,
        "postgres_3": postgres,
        "throughput_ratio": postgres["verdicts_per_s"] / sqlite["verdicts_per_s"],
    }
    print(
        f"verdicts/s: SQLite x1 {sqlite['verdicts_per_s']:.0f}, PostgreSQL x3 "
        f"{postgres['verdicts_per_s']:.0f} (x{doc['throughput_ratio']:.2f}); same level "
        f"after a verdict: SQLite median {sqlite['convergence']['median_ms']:.2f} ms p99 "
        f"{sqlite['convergence']['p99_ms']:.2f} ms; PostgreSQL x3 median "
        f"{postgres['convergence']['median_ms']:.2f} ms p99 "
        f"{postgres['convergence']['p99_ms']:.2f} ms; polling only (sync_s 2 s) median "
        f"{postgres['convergence_polling']['median_ms']:.0f} ms"
    )
    benchlib.write_json(doc, args.json)


if __name__ == "__main__":
    main()
