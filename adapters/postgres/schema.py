"""The PostgreSQL store's schema as versioned migrations, applied at start under an
advisory lock, so that replicas starting at once migrate it once.

Each migration runs in its own transaction with its version row; a replica that finds
the database newer than it knows refuses to start (it would misread the tables).
"""

from __future__ import annotations

from typing import Any, Final

from monitor.core.errors import ConfigError

__all__ = [
    "JUDGE_LOCK",
    "LEASE_LOCK",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SEQ_LOCK",
    "VERDICT_CHANNEL",
    "migrate",
    "pending_migrations",
]

_LOCK_KEY: Final = 0x72656C6D6F6E  # "relmon": one advisory lock for migrations
SEQ_LOCK: Final = 0x72656C736571
"""The transaction-level advisory lock that numbers the verdicts; review items, held
verdicts and their undo take it too, so that which verdict of an item counts first is
decided in one order."""
LEASE_LOCK: Final = 0x726C
JUDGE_LOCK: Final = 0x726C6A75646765
"""Advisory lock that numbers judge labels (gapless, in commit order, like verdicts)."""
"""With a reviewer's hash, the advisory lock that serializes that reviewer's leasing
(the per-reviewer cap is counted and kept under it)."""
VERDICT_CHANNEL: Final = "relmon_verdicts"
"""The NOTIFY channel: a verdict's number, sent in the transaction that stores it."""

MIGRATIONS: Final[tuple[tuple[int, str], ...]] = (
    (
        1,
        """
CREATE TABLE review_items (
    id BIGSERIAL UNIQUE,
    item_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    task TEXT NOT NULL,
    body TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    pending BOOLEAN NOT NULL DEFAULT TRUE
);
CREATE INDEX review_items_pending ON review_items (task, id) WHERE pending;
CREATE TABLE records (
    item_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    task TEXT NOT NULL,
    score DOUBLE PRECISION,
    inclusion_probability DOUBLE PRECISION NOT NULL,
    sampled_at DOUBLE PRECISION NOT NULL,
    verdict TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    seq BIGINT NOT NULL UNIQUE,
    aci_miss BOOLEAN
);
""",
    ),
    (
        2,
        """
ALTER TABLE review_items ADD COLUMN lease_holder TEXT;
ALTER TABLE review_items ADD COLUMN lease_expires DOUBLE PRECISION;
CREATE TABLE held_verdicts (
    id BIGSERIAL UNIQUE,
    item_id TEXT PRIMARY KEY,
    verdict TEXT NOT NULL,
    held_at DOUBLE PRECISION NOT NULL,
    due DOUBLE PRECISION NOT NULL,
    claimed BOOLEAN NOT NULL DEFAULT FALSE,
    holder TEXT
);
""",
    ),
    (
        3,
        """
ALTER TABLE review_items ADD COLUMN lease_owner TEXT;
CREATE INDEX review_items_lease_owner ON review_items (lease_owner) WHERE pending;
""",
    ),
    (
        4,
        """
CREATE TABLE judgements (
    seq BIGINT PRIMARY KEY,
    item_id TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    task TEXT NOT NULL,
    sampled_at DOUBLE PRECISION NOT NULL,
    acceptable BOOLEAN NOT NULL
);
CREATE INDEX judgements_by_age ON judgements (sampled_at);
""",
    ),
    (
        5,
        """
ALTER TABLE records ADD COLUMN served_acceptable BOOLEAN;
""",
    ),
    (
        6,
        """
ALTER TABLE records ADD COLUMN segment TEXT;
""",
    ),
)
"""(version, SQL): applied in order; never edit one that has shipped, add the next."""
SCHEMA_VERSION: Final = MIGRATIONS[-1][0]


async def _current(conn: Any) -> int:
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS relmon_schema (version INTEGER PRIMARY KEY, "
        "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    )
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM relmon_schema"))


async def pending_migrations(conn: Any) -> list[int]:
    """The versions this relmon would apply (without applying them)."""
    exists = await conn.fetchval("SELECT to_regclass('relmon_schema') IS NOT NULL")
    found = 0
    if exists:
        found = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM relmon_schema"))
    return [v for v, _ in MIGRATIONS if v > found]


async def migrate(conn: Any, where: str) -> int:
    """Apply the pending migrations under the advisory lock; the version now."""
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        found = await _current(conn)
        if found > SCHEMA_VERSION:
            raise ConfigError(
                f"the store {where} has schema {found}, newer than this relmon's "
                f"{SCHEMA_VERSION}: upgrade relmon"
            )
        for version, sql in MIGRATIONS:
            if version <= found:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO relmon_schema (version) VALUES ($1)", version)
        return SCHEMA_VERSION
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
