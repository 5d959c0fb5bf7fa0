"""Calibration state and the review queue in one SQLite file (stdlib ``sqlite3``).

:class:`SqliteStore` implements :class:`monitor.engine.ports.CalibrationStore` and
:class:`monitor.engine.ports.ReviewQueue`. The database runs in WAL mode with
``synchronous=FULL``: once a write method has returned, its data survives ``kill -9``
(and a power cut). One connection is used, only ever from one dedicated worker thread,
so every call is serialized and the event loop never waits on the disk.

Schema (version :data:`SCHEMA_VERSION`)::

    review_items(item_id TEXT PRIMARY KEY, model, task, body TEXT (ReviewItem JSON),
                 created REAL (seconds since the epoch), pending INTEGER (1 until scored))
    records(item_id TEXT PRIMARY KEY, model, task,
            score REAL  -- the rank score; NULL means +inf (no accepted candidate)
            inclusion_probability REAL, sampled_at REAL, verdict TEXT (Verdict JSON),
            applied_at REAL,
            seq INTEGER UNIQUE  -- the order verdicts were applied in: 1, 2, 3, ...
            aci_miss INTEGER  -- the verdict's ACI step: 1 miss, 0 covered, NULL none
            served_acceptable INTEGER  -- 1/0: the verdict accepted the served answer
                                       -- or not; NULL: the item had none
            segment TEXT  -- the item's segment value; NULL: its task had no segments)
    leases(item_id TEXT PRIMARY KEY, holder TEXT, expires REAL,
           owner TEXT (the reviewer behind the holder, for the per-reviewer cap))
    held_verdicts(item_id TEXT PRIMARY KEY, verdict TEXT (Verdict JSON), held_at REAL,
                  due REAL, claimed INTEGER (1 once the flusher has taken it),
                  holder TEXT (who may undo it; NULL: nobody))
    schema_version(version INTEGER)

``seq`` is the one order of the calibration window: a verdict's number, given in the
transaction that saves it; the windows hold the verdicts with the highest numbers, live
and when :meth:`load_records` rebuilds them at a restart. (Schema 1 had no ``seq``: opening
such a file numbers its verdicts in the order schema 1 reloaded them, ``sampled_at``
then insertion, and moves it to schema 2.)

``aci_miss`` (schema 3) is what the verdict's ACI step needs: whether its score exceeded
the threshold served at the adaptive alpha_t when the item was scored. The service
restores alpha_t from these at a restart. Schema 1 and 2 files get the column with NULL
for the verdicts they hold (no ACI step: those relmon versions restarted alpha_t at
alpha anyway) and move to schema 3.

``served_acceptable`` (added without changing the schema version, like the held
verdicts' ``holder`` below: an older relmon ignores it) says whether the verdict accepted
the answer production served; a file from before it gets the column with NULL for the
verdicts it holds: no served answer, which those relmon versions never kept.
``segment`` (added the same way) is the item's segment value (``tasks[].segments``); NULL
for the verdicts of an older file, and of tasks without segments.

Leases (:meth:`lease_next`) keep two reviewers from being handed the same item at the
same time: an item leased to another holder and not yet expired is skipped; the holder
keeps it longer with :meth:`renew_lease` while the lease is live. Held verdicts
(:meth:`hold_verdict`) are the review page's undo window: a verdict waits there until it
is due, can be withdrawn (:meth:`undo_held`) by its holder (the session that gave it)
until the flusher claims it (:meth:`claim_due`), and is then applied like any verdict
and dropped (:meth:`drop_held`). A claimed verdict is never undone; one claimed before a
crash is claimed again at the next start and applied again (idempotent by item id). The
two tables, and later the held verdicts' ``holder`` column, were added without changing
the schema version: an older relmon ignores them, and a verdict held by one (holder
NULL) cannot be undone, only applied.

``pending`` is derived data kept for the index that makes :meth:`next_pending` and
:meth:`depth` cheap: an item stops being pending in the same transaction that saves its
record. ``path=":memory:"`` gives a private in-memory database (for tests).

Errors: a file that cannot be opened, or a schema from a newer relmon, raises
:class:`~monitor.core.errors.ConfigError`; a failing read or write raises
:class:`~monitor.core.errors.StoreError` (retriable when SQLite reports a busy or locked
database; also importable from here); a record whose score is not a rank, or a verdict
saved with another item's record, raises :class:`~monitor.core.errors.InputError`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from adapters.sqlite.export import ExportedVerdict, VerdictExport
from adapters.sqlite.leases import ReviewPageTables
from adapters.sqlite.rows import (
    RECORD_COLUMNS,
    aci_column,
    held_elsewhere,
    next_seq,
    record_of,
    score_column,
    verdict_from_json,
)
from adapters.sqlite.schema import SCHEMA_VERSION
from monitor.core.errors import InputError, StoreError
from monitor.core.review import ReviewItem, Verdict
from monitor.engine.ports import CalibrationRecord, CalibrationStore, Judgement, ReviewQueue

__all__ = ["SCHEMA_VERSION", "ExportedVerdict", "SqliteStore", "StoreError"]


class SqliteStore(ReviewPageTables, VerdictExport):
    """Review items, verdicts and scored records in SQLite. Close with :meth:`aclose`.

    The connection is :class:`~adapters.sqlite.connection.SqliteConnection`; the review
    page's tables are :class:`~adapters.sqlite.leases.ReviewPageTables`; export and
    import are :class:`~adapters.sqlite.export.VerdictExport`.
    """

    async def save_review_item(self, item: ReviewItem) -> None:
        """Store an item to review. Idempotent: a second item with the same id is ignored
        (its candidates may differ, and a verdict may already refer to the first)."""
        body = json.dumps(item.to_json(), allow_nan=False, separators=(",", ":"))
        created = self._clock.time()

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR IGNORE INTO review_items (item_id, model, task, body, created, "
                "pending) VALUES (?, ?, ?, ?, ?, "
                "NOT EXISTS (SELECT 1 FROM records WHERE item_id = ?))",
                (item.item_id, item.model, item.task, body, created, item.item_id),
            )

        await self._run(lambda: self._write(insert))

    async def submit(self, item: ReviewItem) -> None:
        """:class:`~monitor.engine.ports.ReviewQueue`: returns once the item is durable."""
        await self.save_review_item(item)

    async def get_review_item(self, item_id: str) -> ReviewItem | None:
        def get() -> str | None:
            row = (
                self._connection()
                .execute("SELECT body FROM review_items WHERE item_id = ?", (item_id,))
                .fetchone()
            )
            return None if row is None else str(row[0])

        body = await self._run(get)
        return None if body is None else ReviewItem.from_json(json.loads(body))

    async def next_pending(self, task: str | None = None) -> ReviewItem | None:
        """The oldest stored item without a verdict (of ``task``, if given)."""

        def get() -> str | None:
            conn = self._connection()
            if task is None:
                row = conn.execute(
                    "SELECT body FROM review_items WHERE pending = 1 ORDER BY rowid LIMIT 1"
                ).fetchone()
            else:
                row = conn.execute(
                    "SELECT body FROM review_items WHERE pending = 1 AND task = ? "
                    "ORDER BY rowid LIMIT 1",
                    (task,),
                ).fetchone()
            return None if row is None else str(row[0])

        body = await self._run(get)
        return None if body is None else ReviewItem.from_json(json.loads(body))

    async def depth(self) -> int:
        """Stored items still waiting for a verdict."""
        return await self._run(
            lambda: int(
                self._connection()
                .execute("SELECT count(*) FROM review_items WHERE pending = 1")
                .fetchone()[0]
            )
        )

    def has_review_item(self, item_id: str) -> bool:
        """Always False: one replica writes this file, and the items it wrote before a
        restart come back through :meth:`recent_item_ids`."""
        return False

    def discard_review_item(self, item_id: str) -> None:
        """Nothing to do: the store is the review queue, so an item whose ``submit``
        failed was never stored."""

    async def recent_item_ids(self, limit: int) -> list[str]:
        """The ids of the last ``limit`` stored review items, oldest first.

        The service remembers them at start, so that an event seen again after a restart
        (a repeated ``X-Request-Id``) is not asked and reviewed a second time.
        """

        def get() -> list[str]:
            rows = (
                self._connection()
                .execute("SELECT item_id FROM review_items ORDER BY rowid DESC LIMIT ?", (limit,))
                .fetchall()
            )
            return [str(r[0]) for r in reversed(rows)]

        return await self._run(get)

    async def pending_counts(self) -> dict[tuple[str, str], int]:
        """Items waiting for a verdict per ``(model, task)`` (for the queue-depth gauge)."""

        def get() -> dict[tuple[str, str], int]:
            rows = (
                self._connection()
                .execute(
                    "SELECT model, task, count(*) FROM review_items WHERE pending = 1 "
                    "GROUP BY model, task"
                )
                .fetchall()
            )
            return {(str(m), str(t)): int(n) for m, t, n in rows}

        return await self._run(get)

    async def save_record(
        self, record: CalibrationRecord, verdict: Verdict
    ) -> tuple[int, ...] | None:
        """Persist a scored verdict; ``None`` if the item already had one (idempotent),
        or if a verdict that judges it otherwise is held for it on the review page: the
        first stored verdict counts, held or applied (the held one itself, applied when
        due, and one that judges alike are stored).

        Returns ``(seq,)``, the verdict's number in the order verdicts were applied.
        ``record.score`` is a rank (>= 1) or ``+inf``; ``+inf`` is stored as NULL.
        """
        if verdict.item_id != record.item_id:
            raise InputError(f"verdict for {verdict.item_id!r} saved with {record.item_id!r}")
        score = score_column(record.score)
        verdict_json = json.dumps(verdict.to_json(), separators=(",", ":"))
        applied_at = self._clock.time()

        def insert(conn: sqlite3.Connection) -> tuple[int, ...] | None:
            if held_elsewhere(conn, verdict):
                return None  # a page verdict held for the item counts first
            seq = next_seq(conn)
            cur = conn.execute(
                "INSERT OR IGNORE INTO records (item_id, model, task, score, "
                "inclusion_probability, sampled_at, verdict, applied_at, seq, aci_miss, "
                "served_acceptable, segment) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.item_id,
                    record.model,
                    record.task,
                    score,
                    record.inclusion_probability,
                    record.sampled_at,
                    verdict_json,
                    applied_at,
                    seq,
                    aci_column(record.aci_miss),
                    aci_column(record.served_acceptable),
                    record.segment,
                ),
            )
            if cur.rowcount == 0:
                return None
            conn.execute("UPDATE review_items SET pending = 0 WHERE item_id = ?", (record.item_id,))
            return (seq,)

        return await self._run(lambda: self._write(insert))

    async def get_verdict(self, item_id: str) -> Verdict | None:
        """The verdict saved for ``item_id``, if any."""

        def get() -> str | None:
            row = (
                self._connection()
                .execute("SELECT verdict FROM records WHERE item_id = ?", (item_id,))
                .fetchone()
            )
            return None if row is None else str(row[0])

        text = await self._run(get)
        return None if text is None else verdict_from_json(text)

    async def get_record(self, item_id: str) -> CalibrationRecord | None:
        """The scored verdict stored for ``item_id``, if any."""

        def get() -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = (
                self._connection()
                .execute(f"SELECT {RECORD_COLUMNS} FROM records WHERE item_id = ?", (item_id,))
                .fetchone()
            )
            return row

        row = await self._run(get)
        return None if row is None else record_of(row)

    async def save_judgement(self, judgement: Judgement) -> int:
        """Persist a judge label once per item id; its ``seq`` (0: it was there)."""
        j = judgement

        def insert(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "INSERT OR IGNORE INTO judgements (item_id, model, task, sampled_at, acceptable) "
                "VALUES (?, ?, ?, ?, ?)",
                (j.item_id, j.model, j.task, j.sampled_at, int(j.acceptable)),
            )
            return int(cur.lastrowid or 0) if cur.rowcount else 0

        return await self._run(lambda: self._write(insert))

    async def load_judgements(self, since: float) -> Sequence[Judgement]:
        """The judge labels of items sampled at or after ``since``, in ``seq`` order."""

        def get() -> list[tuple[Any, ...]]:
            return (
                self._connection()
                .execute(
                    "SELECT item_id, model, task, sampled_at, acceptable, seq FROM judgements "
                    "WHERE sampled_at >= ? ORDER BY seq",
                    (since,),
                )
                .fetchall()
            )

        return [
            Judgement(r[0], r[1], r[2], float(r[3]), bool(r[4]), int(r[5]))
            for r in await self._run(get)
        ]

    async def load_records(self) -> Sequence[CalibrationRecord]:
        """Every scored verdict in the order they were applied (``seq``)."""

        def get() -> list[tuple[Any, ...]]:
            return (
                self._connection()
                .execute(f"SELECT {RECORD_COLUMNS} FROM records ORDER BY seq")
                .fetchall()
            )

        return [record_of(row) for row in await self._run(get)]


if TYPE_CHECKING:

    def _implements(store: SqliteStore) -> tuple[CalibrationStore, ReviewQueue]:
        return store, store  # mypy checks SqliteStore against both protocols here
