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
            aci_miss INTEGER  -- the verdict's ACI step: 1 miss, 0 covered, NULL none)
    leases(item_id TEXT PRIMARY KEY, holder TEXT, expires REAL)
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
:class:`~monitor.core.errors.ConfigError`; a failing read or write raises :class:`StoreError`
(retriable when SQLite reports a busy or locked database).
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from monitor.core.errors import ConfigError, RelmonError
from monitor.core.review import ReviewItem, Verdict
from monitor.engine.ports import (
    CalibrationRecord,
    CalibrationStore,
    Clock,
    ReviewQueue,
    SystemClock,
)

__all__ = ["SCHEMA_VERSION", "ExportedVerdict", "SqliteStore", "StoreError"]

SCHEMA_VERSION = 3
_T = TypeVar("_T")

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
    aci_miss INTEGER
);
CREATE INDEX IF NOT EXISTS records_by_age ON records (sampled_at);
CREATE UNIQUE INDEX IF NOT EXISTS records_by_seq ON records (seq);
CREATE TABLE IF NOT EXISTS leases (
    item_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS held_verdicts (
    item_id TEXT PRIMARY KEY,
    verdict TEXT NOT NULL,
    held_at REAL NOT NULL,
    due REAL NOT NULL,
    claimed INTEGER NOT NULL DEFAULT 0,
    holder TEXT
);
"""


class StoreError(RelmonError):
    """A read or write of the calibration store failed."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


def _store_error(exc: sqlite3.Error) -> StoreError:
    busy = isinstance(exc, sqlite3.OperationalError) and any(
        word in str(exc).lower() for word in ("locked", "busy")
    )
    return StoreError(f"calibration store: {exc}", retriable=busy)


def _score_column(score: float) -> float | None:
    if math.isnan(score) or score < 1:
        raise ValueError(f"a rank score is >= 1 or +inf, not {score!r}")
    return None if math.isinf(score) else score


def _verdict_from_json(text: str) -> Verdict:
    d = json.loads(text)
    return Verdict(
        item_id=str(d["item_id"]),
        accepted_ranks=tuple(int(r) for r in d.get("accepted_ranks", [])),
        none_of_these=bool(d.get("none_of_these", False)),
        correct_answer=d.get("correct_answer"),
        reviewer=str(d.get("reviewer", "unknown")),
    )


@dataclass(frozen=True, slots=True)
class ExportedVerdict:
    """One applied verdict with its review item, as ``relmon verdicts export`` writes it."""

    item: ReviewItem
    verdict: Verdict
    score: float
    applied_at: float
    aci_miss: bool | None = None
    """The verdict's ACI step (:attr:`monitor.engine.ports.CalibrationRecord.aci_miss`)."""


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


def _add_held_holder(conn: sqlite3.Connection) -> None:
    """Give an older file's held verdicts the ``holder`` column (NULL: nobody may undo)."""
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(held_verdicts)")}
    if columns and "holder" not in columns:
        conn.execute("ALTER TABLE held_verdicts ADD COLUMN holder TEXT")


def _aci_column(miss: bool | None) -> int | None:
    return None if miss is None else int(miss)


def _record(row: Sequence[Any]) -> CalibrationRecord:
    model, task, item_id, score, prob, sampled_at, seq, miss = row
    return CalibrationRecord(
        model=str(model),
        task=str(task),
        item_id=str(item_id),
        score=math.inf if score is None else float(score),
        inclusion_probability=float(prob),
        sampled_at=float(sampled_at),
        order=(int(seq),),
        aci_miss=None if miss is None else bool(miss),
    )


_RECORD_COLUMNS = "model, task, item_id, score, inclusion_probability, sampled_at, seq, aci_miss"


def _next_seq(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM records").fetchone()[0])


def _pending_filter(task: str | None) -> tuple[str, tuple[Any, ...]]:
    return ("", ()) if task is None else (" AND ri.task = ?", (task,))


class SqliteStore:
    """Review items, verdicts and scored records in SQLite. Close with :meth:`aclose`."""

    def __init__(self, path: str | Path, *, clock: Clock | None = None) -> None:
        self._path = str(path)
        self._clock = clock or SystemClock()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relmon-sqlite")
        self._conn: sqlite3.Connection | None = None
        try:
            executor.submit(self._open).result()
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=True)
            raise ConfigError(f"cannot open the calibration store {self._path}: {exc}") from None
        except BaseException:
            executor.shutdown(wait=True)
            raise
        self._executor: ThreadPoolExecutor | None = executor

    @classmethod
    async def open(cls, path: str | Path, *, clock: Clock | None = None) -> SqliteStore:
        """Open without blocking the event loop (the constructor waits for the disk)."""
        return await asyncio.to_thread(cls, path, clock=clock)

    # -- worker-thread side -------------------------------------------------------------

    def _open(self) -> None:
        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, isolation_level=None, timeout=30.0)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            found = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
            if found is not None and int(found) > SCHEMA_VERSION:
                raise ConfigError(
                    f"the calibration store {self._path} has schema {found}, "
                    f"newer than this relmon's {SCHEMA_VERSION}"
                )
            _number_schema_1_records(conn)
            _add_aci_miss(conn)
            _add_held_holder(conn)
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
        self._conn = conn

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("calibration store is closed")
        return self._conn

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def _run(self, fn: Callable[[], _T]) -> _T:
        executor = self._executor
        if executor is None:
            raise StoreError("calibration store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, fn)
        except sqlite3.Error as exc:
            raise _store_error(exc) from None
        except RuntimeError as exc:  # executor shut down while we were queued
            raise StoreError(f"calibration store is closed ({exc})") from None

    # -- CalibrationStore / ReviewQueue -------------------------------------------------

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
        """Persist a scored verdict; ``None`` if the item already had one (idempotent).

        Returns ``(seq,)``, the verdict's number in the order verdicts were applied.
        ``record.score`` is a rank (>= 1) or ``+inf``; ``+inf`` is stored as NULL.
        """
        if verdict.item_id != record.item_id:
            raise ValueError(f"verdict for {verdict.item_id!r} saved with {record.item_id!r}")
        score = _score_column(record.score)
        verdict_json = json.dumps(verdict.to_json(), separators=(",", ":"))
        applied_at = self._clock.time()

        def insert(conn: sqlite3.Connection) -> tuple[int, ...] | None:
            seq = _next_seq(conn)
            cur = conn.execute(
                "INSERT OR IGNORE INTO records (item_id, model, task, score, "
                "inclusion_probability, sampled_at, verdict, applied_at, seq, aci_miss) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    _aci_column(record.aci_miss),
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
        return None if text is None else _verdict_from_json(text)

    async def get_record(self, item_id: str) -> CalibrationRecord | None:
        """The scored verdict stored for ``item_id``, if any."""

        def get() -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = (
                self._connection()
                .execute(f"SELECT {_RECORD_COLUMNS} FROM records WHERE item_id = ?", (item_id,))
                .fetchone()
            )
            return row

        row = await self._run(get)
        return None if row is None else _record(row)

    async def load_records(self) -> Sequence[CalibrationRecord]:
        """Every scored verdict in the order they were applied (``seq``)."""

        def get() -> list[tuple[Any, ...]]:
            return (
                self._connection()
                .execute(f"SELECT {_RECORD_COLUMNS} FROM records ORDER BY seq")
                .fetchall()
            )

        return [_record(row) for row in await self._run(get)]

    # -- leases, held verdicts, progress (the review page) --------------------------------

    async def lease_next(
        self,
        task: str | None,
        *,
        holder: str,
        lease_s: float,
        exclude: Sequence[str] = (),
    ) -> ReviewItem | None:
        """The oldest item waiting for a verdict that nobody else holds, leased to
        ``holder`` for ``lease_s`` seconds (renewed if ``holder`` already had it).

        Skipped: items leased to another holder (lease not expired), items with a held
        verdict, and the ids in ``exclude`` (what the caller shows or prefetched).
        """
        where, params = _pending_filter(task)
        skip = tuple(dict.fromkeys(exclude))[:64]

        def take(conn: sqlite3.Connection) -> str | None:
            now = self._clock.time()
            conn.execute("DELETE FROM leases WHERE expires <= ?", (now,))
            marks = ",".join("?" * len(skip))
            not_in = f" AND ri.item_id NOT IN ({marks})" if skip else ""
            row = conn.execute(
                "SELECT ri.item_id, ri.body FROM review_items ri WHERE ri.pending = 1"
                + where
                + not_in
                + " AND NOT EXISTS (SELECT 1 FROM held_verdicts h WHERE h.item_id = ri.item_id)"
                " AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.item_id = ri.item_id"
                " AND l.holder != ?) ORDER BY ri.rowid LIMIT 1",
                (*params, *skip, holder),
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "INSERT OR REPLACE INTO leases (item_id, holder, expires) VALUES (?, ?, ?)",
                (row[0], holder, now + lease_s),
            )
            return str(row[1])

        body = await self._run(lambda: self._write(take))
        return None if body is None else ReviewItem.from_json(json.loads(body))

    async def lease_item(self, item_id: str, *, holder: str, lease_s: float) -> None:
        """Lease one item to ``holder`` (taking it over from anyone else)."""

        def lease(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO leases (item_id, holder, expires) VALUES (?, ?, ?)",
                (item_id, holder, self._clock.time() + lease_s),
            )

        await self._run(lambda: self._write(lease))

    async def renew_lease(self, item_id: str, *, holder: str, lease_s: float) -> bool:
        """Extend ``holder``'s lease on an item to ``lease_s`` seconds from now; False
        (nothing changed) if ``holder`` holds no live lease on it: expired, released,
        another holder's, or no such item."""

        def renew(conn: sqlite3.Connection) -> bool:
            now = self._clock.time()
            cur = conn.execute(
                "UPDATE leases SET expires = ? WHERE item_id = ? AND holder = ? AND expires > ?",
                (now + lease_s, item_id, holder, now),
            )
            return cur.rowcount > 0

        return await self._run(lambda: self._write(renew))

    async def release_lease(self, item_id: str, holder: str) -> bool:
        """Give an item back before its lease expires; False if ``holder`` had no lease."""

        def release(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM leases WHERE item_id = ? AND holder = ?", (item_id, holder)
            )
            return cur.rowcount > 0

        return await self._run(lambda: self._write(release))

    async def hold_verdict(
        self, verdict: Verdict, hold_s: float, *, holder: str | None = None
    ) -> Literal["held", "duplicate"]:
        """Keep ``verdict`` for ``hold_s`` seconds before it is applied (undo window);
        only ``holder`` may undo it (None: nobody).

        ``"duplicate"`` (nothing stored) if the item already has a verdict, applied or
        held: an item keeps one verdict, the first.
        """
        text = json.dumps(verdict.to_json(), separators=(",", ":"))

        def hold(conn: sqlite3.Connection) -> Literal["held", "duplicate"]:
            now = self._clock.time()
            if conn.execute(
                "SELECT 1 FROM records WHERE item_id = ?", (verdict.item_id,)
            ).fetchone():
                return "duplicate"
            cur = conn.execute(
                "INSERT OR IGNORE INTO held_verdicts (item_id, verdict, held_at, due, holder) "
                "VALUES (?, ?, ?, ?, ?)",
                (verdict.item_id, text, now, now + hold_s, holder),
            )
            if cur.rowcount == 0:
                return "duplicate"
            conn.execute("DELETE FROM leases WHERE item_id = ?", (verdict.item_id,))
            return "held"

        return await self._run(lambda: self._write(hold))

    async def undo_held(self, item_id: str, holder: str) -> Literal["undone", "other", "none"]:
        """Withdraw a held verdict not yet claimed, if ``holder`` gave it: ``"undone"``
        (the item waits for review again); ``"other"`` if it was held for another holder
        (it stands); ``"none"`` if there is none (applied, claimed for applying, or never
        held)."""

        def undo(conn: sqlite3.Connection) -> Literal["undone", "other", "none"]:
            row = conn.execute(
                "SELECT holder FROM held_verdicts WHERE item_id = ? AND claimed = 0", (item_id,)
            ).fetchone()
            if row is None:
                return "none"
            if row[0] != holder:
                return "other"
            conn.execute("DELETE FROM held_verdicts WHERE item_id = ?", (item_id,))
            return "undone"

        return await self._run(lambda: self._write(undo))

    async def claim_due(self) -> list[Verdict]:
        """Claim the held verdicts that are due (and any claimed before a crash), oldest
        first: from now on they cannot be undone. Apply each, then :meth:`drop_held`."""

        def claim(conn: sqlite3.Connection) -> list[str]:
            conn.execute(
                "UPDATE held_verdicts SET claimed = 1 WHERE claimed = 0 AND due <= ?",
                (self._clock.time(),),
            )
            rows = conn.execute(
                "SELECT verdict FROM held_verdicts WHERE claimed = 1 ORDER BY due, rowid"
            ).fetchall()
            return [str(r[0]) for r in rows]

        texts = await self._run(lambda: self._write(claim))
        return [_verdict_from_json(t) for t in texts]

    async def drop_held(self, item_id: str) -> None:
        """Forget a claimed verdict once it has been applied."""
        await self._run(
            lambda: self._write(
                lambda conn: conn.execute(
                    "DELETE FROM held_verdicts WHERE item_id = ? AND claimed = 1", (item_id,)
                )
            )
        )

    async def held_verdict(self, item_id: str) -> tuple[Verdict, float] | None:
        """The verdict held for ``item_id`` and when it is due, if any."""

        def get() -> tuple[str, float] | None:
            row = (
                self._connection()
                .execute("SELECT verdict, due FROM held_verdicts WHERE item_id = ?", (item_id,))
                .fetchone()
            )
            return None if row is None else (str(row[0]), float(row[1]))

        found = await self._run(get)
        return None if found is None else (_verdict_from_json(found[0]), found[1])

    async def review_counts(self, since: float) -> dict[tuple[str, str], tuple[int, int, int]]:
        """Per ``(model, task)``: verdicts applied since ``since`` (seconds since the
        epoch), items waiting (no verdict, none held), and verdicts held in the undo
        window (given, not applied yet)."""

        def get() -> dict[tuple[str, str], tuple[int, int, int]]:
            conn = self._connection()
            out: dict[tuple[str, str], list[int]] = {}
            queries = (
                (
                    "SELECT model, task, count(*) FROM records WHERE applied_at >= ? "
                    "GROUP BY model, task",
                    (since,),
                ),
                (
                    "SELECT ri.model, ri.task, count(*) FROM review_items ri WHERE ri.pending = 1 "
                    "AND NOT EXISTS (SELECT 1 FROM held_verdicts h WHERE h.item_id = ri.item_id) "
                    "GROUP BY ri.model, ri.task",
                    (),
                ),
                (  # held and not yet saved as a record (between the two it counts once)
                    "SELECT ri.model, ri.task, count(*) FROM held_verdicts h "
                    "JOIN review_items ri ON ri.item_id = h.item_id "
                    "WHERE NOT EXISTS (SELECT 1 FROM records r WHERE r.item_id = h.item_id) "
                    "GROUP BY ri.model, ri.task",
                    (),
                ),
            )
            for column, (sql, args) in enumerate(queries):
                for m, t, n in conn.execute(sql, args):
                    out.setdefault((str(m), str(t)), [0, 0, 0])[column] = int(n)
            return {key: (a, w, h) for key, (a, w, h) in out.items()}

        return await self._run(get)

    # -- export and import (relmon verdicts) --------------------------------------------

    async def export_verdicts(self) -> list[ExportedVerdict]:
        """Every applied verdict with its review item, in the order the windows load them
        (``seq``, the order they were applied in)."""

        def get() -> list[tuple[Any, ...]]:
            return (
                self._connection()
                .execute(
                    "SELECT ri.body, r.verdict, r.score, r.applied_at, r.model, r.task, "
                    "r.inclusion_probability, r.sampled_at, r.aci_miss FROM records r "
                    "JOIN review_items ri ON ri.item_id = r.item_id "
                    "ORDER BY r.seq"
                )
                .fetchall()
            )

        out = []
        for (
            body,
            verdict,
            score,
            applied_at,
            model,
            task,
            prob,
            sampled_at,
            miss,
        ) in await self._run(get):
            item = ReviewItem.from_json(json.loads(body))
            # The record's own fields are what the window loads; keep them authoritative.
            item = ReviewItem(
                item_id=item.item_id,
                model=str(model),
                task=str(task),
                query=item.query,
                candidates=item.candidates,
                k=item.k,
                inclusion_probability=float(prob),
                sampled_at=float(sampled_at),
            )
            out.append(
                ExportedVerdict(
                    item=item,
                    verdict=_verdict_from_json(verdict),
                    score=math.inf if score is None else float(score),
                    applied_at=float(applied_at),
                    aci_miss=None if miss is None else bool(miss),
                )
            )
        return out

    async def import_verdicts(self, rows: Sequence[ExportedVerdict]) -> tuple[int, int]:
        """Store exported verdicts with their items in one transaction; returns
        ``(imported, already present)``. An item that already has a verdict keeps it.
        Imported verdicts are numbered after those present, in the order of ``rows``."""
        prepared = []
        for row in rows:
            if row.verdict.item_id != row.item.item_id:
                raise ValueError(f"verdict for {row.verdict.item_id!r} with {row.item.item_id!r}")
            prepared.append(
                (
                    row,
                    json.dumps(row.item.to_json(), allow_nan=False, separators=(",", ":")),
                    json.dumps(row.verdict.to_json(), separators=(",", ":")),
                    _score_column(row.score),
                )
            )

        def insert(conn: sqlite3.Connection) -> tuple[int, int]:
            new = old = 0
            for row, body, verdict, score in prepared:
                item = row.item
                cur = conn.execute(
                    "INSERT OR IGNORE INTO records (item_id, model, task, score, "
                    "inclusion_probability, sampled_at, verdict, applied_at, seq, aci_miss) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        item.item_id,
                        item.model,
                        item.task,
                        score,
                        item.inclusion_probability,
                        item.sampled_at,
                        verdict,
                        row.applied_at,
                        _next_seq(conn),
                        _aci_column(row.aci_miss),
                    ),
                )
                if cur.rowcount == 0:
                    old += 1
                    continue
                new += 1
                conn.execute(
                    "INSERT OR IGNORE INTO review_items (item_id, model, task, body, created, "
                    "pending) VALUES (?, ?, ?, ?, ?, 0)",
                    (item.item_id, item.model, item.task, body, row.applied_at),
                )
                conn.execute(
                    "UPDATE review_items SET pending = 0 WHERE item_id = ?", (item.item_id,)
                )
                conn.execute("DELETE FROM held_verdicts WHERE item_id = ?", (item.item_id,))
            return new, old

        return await self._run(lambda: self._write(insert))

    async def aclose(self) -> None:
        """Close the connection (checkpointing the WAL) and stop the worker thread."""
        executor = self._executor
        if executor is None:
            return

        def close() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(executor, close)
        except sqlite3.Error as exc:
            raise _store_error(exc) from None
        finally:
            self._executor = None
            executor.shutdown(wait=True)


if TYPE_CHECKING:

    def _implements(store: SqliteStore) -> tuple[CalibrationStore, ReviewQueue]:
        return store, store  # mypy checks SqliteStore against both protocols here
