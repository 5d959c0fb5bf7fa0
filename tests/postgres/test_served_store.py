"""Whether a verdict accepted the served answer is stored with its record, on SQLite and
on a real PostgreSQL alike, so that every replica and every restart compute the same
served-answer share; a database from before it migrates and reads "no served answer"."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import asyncpg
import pytest

from adapters.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from adapters.postgres.store import PostgresStore
from monitor.core.review import Verdict
from tests.postgres import Opener, PostgresCluster
from tests.sqlite.test_sqlite_store import item, record

pytestmark = pytest.mark.timeout(300)


async def test_the_served_flag_round_trips_and_replicas_read_it(opener: Opener) -> None:
    store, other = await opener(), await opener()
    flags = {"a": True, "b": False, "c": None}
    for item_id, flag in flags.items():
        await store.submit(item(item_id))
        saved = await store.save_record(
            replace(record(item_id), served_acceptable=flag), Verdict(item_id, (1,))
        )
        assert saved is not None
    for s in (store, other):  # another replica (or a restart) reads the same
        loaded = {r.item_id: r.served_acceptable for r in await s.load_records()}
        assert loaded == flags
        got = await s.get_record("b")
        assert got is not None and got.served_acceptable is False
    if isinstance(other, PostgresStore):
        assert [r.served_acceptable for r in await other.records_after(0)] == [True, False, None]


async def test_a_schema_4_database_migrates_and_its_records_have_none(
    pg_cluster: PostgresCluster,
) -> None:
    assert SCHEMA_VERSION >= 5
    dsn = pg_cluster.create_database("relmon_served_migrate")
    conn: Any = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE relmon_schema (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for version, sql in MIGRATIONS[:4]:
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
        assert (old.item_id, old.served_acceptable) == ("old", None)
        await store.submit(item("new"))
        await store.save_record(
            replace(record("new"), served_acceptable=True), Verdict("new", (1,))
        )
        assert [r.served_acceptable for r in await store.load_records()] == [None, True]
    finally:
        await store.aclose()
