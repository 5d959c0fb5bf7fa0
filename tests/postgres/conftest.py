"""A PostgreSQL cluster for the session, a fresh database for each test, and a store
opener parametrised over both backends (the contract suites run on SQLite and
PostgreSQL alike)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.postgres.store import PostgresStore
from adapters.sqlite.store import SqliteStore
from tests.postgres import Opener, PostgresCluster, running_cluster

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    yield from running_cluster()


@pytest.fixture
def pg_dsn(pg_cluster: PostgresCluster) -> str:
    """The DSN of a new, empty database."""
    return pg_cluster.create_database(f"relmon_test_{next(_names)}")


@pytest.fixture(params=["sqlite", "postgres"])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens a store on one database (again and again: a restart, another replica)."""
    opened: list[Any] = []
    if request.param == "sqlite":
        path = tmp_path / "state" / "relmon.db"

        async def open_store() -> Any:
            opened.append(await SqliteStore.open(path))
            return opened[-1]
    else:
        dsn = request.getfixturevalue("pg_dsn")

        async def open_store() -> Any:
            opened.append(await PostgresStore.open(dsn))
            return opened[-1]

    try:
        yield open_store
    finally:
        for s in opened:
            await s.aclose()


@pytest.fixture
async def store(opener: Opener) -> Any:
    return await opener()
