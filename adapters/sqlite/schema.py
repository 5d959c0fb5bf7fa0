"""The SQLite store's schema and its migrations (see :mod:`adapters.sqlite.store`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from monitor.core.errors import ConfigError

__all__ = ["SCHEMA_VERSION", "open_database"]

SCHEMA_VERSION = 4

_SCHEMA = """
CREATE TABLE IF NOT EXISTS review_items (
    item_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    task TEXT NOT NULL,
    body TEXT NOT NULL,
    created REAL NOT NULL,
    pending INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS review_items_pending ON review_items (pending) WHERE pending = 1;
CREATE INDEX IF NOT EXISTS review_items_pending_task ON review_items (task, pending)
    WHERE pending = 1;
CREATE TABLE IF NOT EXISTS records (
    item_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    task TEXT NOT NULL,
    score REAL,
    inclusion_probability REAL NOT NULL,
    sampled_at REAL NOT NULL,
    verdict TEXT NOT NULL,
    applied_at REAL NOT NULL,
    seq INTEGER,
    aci_miss INTEGER,
    served_acceptable INTEGER,
    segment TEXT
);
CREATE INDEX IF NOT EXISTS records_by_age ON records (sampled_at);
CREATE UNIQUE INDEX IF NOT EXISTS records_by_seq ON records (seq);
CREATE TABLE IF NOT EXISTS leases (
    item_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires REAL NOT NULL,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS judgements (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    task TEXT NOT NULL,
    sampled_at REAL NOT NULL,
    acceptable INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS judgements_by_age ON judgements (sampled_at);
CREATE TABLE IF NOT EXISTS held_verdicts (
    item_id TEXT PRIMARY KEY,
    verdict TEXT NOT NULL,
    held_at REAL NOT NULL,
    due REAL NOT NULL,
    claimed INTEGER NOT NULL DEFAULT 0,
    holder TEXT
);
"""


def _number_schema_1_records(conn: sqlite3.Connection) -> None:
    """Give a schema-1 file's verdicts their ``seq``, in the order schema 1 reloaded them."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(records)")}
    if not columns or "seq" in columns:
        return  # a new file, or already numbered
    conn.execute("ALTER TABLE records ADD COLUMN seq INTEGER")
    conn.execute(
        "UPDATE records SET seq = (SELECT n FROM (SELECT item_id AS id, row_number() OVER "
        "(ORDER BY sampled_at, rowid) AS n FROM records) WHERE id = records.item_id)"
    )


def _add_aci_miss(conn: sqlite3.Connection) -> None:
    """Give a schema-1 or -2 file's records the ``aci_miss`` column (NULL: no ACI step)."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(records)")}
    if columns and "aci_miss" not in columns:
        conn.execute("ALTER TABLE records ADD COLUMN aci_miss INTEGER")


def _add_served_acceptable(conn: sqlite3.Connection) -> None:
    """Give an older file's records the ``served_acceptable`` column (NULL: no served
    answer known, which is what those relmon versions kept)."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(records)")}
    if columns and "served_acceptable" not in columns:
        conn.execute("ALTER TABLE records ADD COLUMN served_acceptable INTEGER")


def _add_segment(conn: sqlite3.Connection) -> None:
    """Give an older file's records the ``segment`` column (NULL: no segment, which is
    what those relmon versions kept)."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(records)")}
    if columns and "segment" not in columns:
        conn.execute("ALTER TABLE records ADD COLUMN segment TEXT")


def _add_held_holder(conn: sqlite3.Connection) -> None:
    """Give an older file's held verdicts the ``holder`` column (NULL: nobody may undo)."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(held_verdicts)")}
    if columns and "holder" not in columns:
        conn.execute("ALTER TABLE held_verdicts ADD COLUMN holder TEXT")


def _add_lease_owner(conn: sqlite3.Connection) -> None:
    """Give an older file's leases the ``owner`` column (NULL: counted for nobody)."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(leases)")}
    if columns and "owner" not in columns:
        conn.execute("ALTER TABLE leases ADD COLUMN owner TEXT")


def open_database(path: str) -> sqlite3.Connection:
    """Open (creating or migrating) the store at ``path``; ConfigError for a newer schema."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        found = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        if found is not None and int(found) > SCHEMA_VERSION:
            raise ConfigError(
                f"the calibration store {path} has schema {found}, "
                f"newer than this relmon's {SCHEMA_VERSION}"
            )
        _number_schema_1_records(conn)
        _add_aci_miss(conn)
        _add_served_acceptable(conn)
        _add_segment(conn)
        _add_held_holder(conn)
        _add_lease_owner(conn)
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        if found is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        elif int(found) < SCHEMA_VERSION:
            conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return conn
