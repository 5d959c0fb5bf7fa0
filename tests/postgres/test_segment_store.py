"""The segment label is stored with each verdict's record, on SQLite and on a real
PostgreSQL alike: another replica that reads the records (at its start, or following
them as they are stored) holds the same windows per segment and exports the same
``relmon_segment_*`` figures; a database from before the column migrates and reads
"no segment"."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from adapters.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from adapters.postgres.store import PostgresStore
from adapters.sqlite.store import SqliteStore
from monitor.core.review import Verdict
from monitor.testing import ManualClock
from tests.engine.test_segments_engine import (
    SEGMENT_GAUGES,
    TASK_GAUGES,
    _run_mix,
    _samples,
    _service,
)
from tests.postgres import Opener, PostgresCluster
from tests.sqlite.test_sqlite_store import item, record

pytestmark = pytest.mark.timeout(300)

SPEC = {"by": {"field": "metadata.tenant"}, "max": 5}


async def test_the_segment_round_trips_and_replicas_read_it(opener: Opener) -> None:
    store, other = await opener(), await opener()
    labels = {"a": "gold", "b": "other", "c": None}
    for item_id, label in labels.items():
        await store.submit(item(item_id))
        saved = await store.save_record(
            replace(record(item_id), segment=label), Verdict(item_id, (1,))
        )
        assert saved is not None
    for s in (store, other):
        assert {r.item_id: r.segment for r in await s.load_records()} == labels
        got = await s.get_record("a")
        assert got is not None and got.segment == "gold"


async def test_another_replica_computes_the_same_segment_windows(opener: Opener) -> None:
    clock = ManualClock()
    store, other = await opener(), await opener()
    one, one_registry = _service(store, clock, SPEC)
    # The second replica starts before the verdicts and has no segments configured: it
    # keys its windows by the labels stored with the records, not by a table of its own.
    two, two_registry = _service(other, clock, None)
    await two.load()
    await _run_mix(one, store, clock, n=60)
    figures = _samples(one_registry, (*SEGMENT_GAUGES, *TASK_GAUGES))
    assert any(k[0] == "relmon_segment_reliability_level" for k in figures)
    if isinstance(other, PostgresStore):  # followed as they are stored
        for r in await other.records_after(two.calibration.loaded_through):
            assert await two.calibration.follow(r, other)
        two.publish()
        assert _samples(two_registry, (*SEGMENT_GAUGES, *TASK_GAUGES)) == figures
    three, three_registry = _service(other, clock, SPEC)  # a replica started now
    assert await three.load() == 60
    assert _samples(three_registry, (*SEGMENT_GAUGES, *TASK_GAUGES)) == figures
    await one.stop(5.0)


async def test_a_schema_5_database_migrates_and_its_records_have_none(
    pg_cluster: PostgresCluster,
) -> None:
    assert SCHEMA_VERSION == 6
    dsn = pg_cluster.create_database("relmon_segment_migrate")
    conn: Any = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE relmon_schema (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for version, sql in MIGRATIONS[:5]:
            await conn.execute(sql)
            await conn.execute("INSERT INTO relmon_schema (version) VALUES ($1)", version)
        await conn.execute(
            "INSERT INTO records (item_id, model, task, score, inclusion_probability, "
            "sampled_at, verdict, applied_at, seq) VALUES ('old', 'm1', 'qa', 1, 0.25, 0, "
            '\'{"item_id":"old","accepted_ranks":[1]}\', 0, 1)'
        )
    finally:
        await conn.close()
    store = await PostgresStore.open(dsn)
    try:
        (old,) = await store.load_records()
        assert (old.item_id, old.segment) == ("old", None)
        await store.submit(item("new"))
        await store.save_record(replace(record("new"), segment="gold"), Verdict("new", (1,)))
        assert [r.segment for r in await store.load_records()] == [None, "gold"]
    finally:
        await store.aclose()


async def test_an_export_and_an_import_keep_the_segment(opener: Opener, tmp_path: Path) -> None:
    store = await opener()
    for item_id, label in (("a", "gold"), ("b", None)):
        await store.submit(replace(item(item_id), segment=label))
        await store.save_record(replace(record(item_id), segment=label), Verdict(item_id, (1,)))
    rows = await store.export_verdicts()
    assert [r.item.segment for r in rows] == ["gold", None]
    fresh = await SqliteStore.open(tmp_path / "fresh" / "relmon.db")
    try:
        assert await fresh.import_verdicts(rows) == (2, 0)
        assert [r.segment for r in await fresh.load_records()] == ["gold", None]
    finally:
        await fresh.aclose()
