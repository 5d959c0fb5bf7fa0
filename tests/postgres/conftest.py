"""A PostgreSQL cluster for the session, and a fresh database for each test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.postgres import PostgresCluster, running_cluster

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    yield from running_cluster()


@pytest.fixture
def pg_dsn(pg_cluster: PostgresCluster) -> str:
    """The DSN of a new, empty database."""
    return pg_cluster.create_database(f"relmon_test_{next(_names)}")
