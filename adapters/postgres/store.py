"""Calibration state and the review queue in PostgreSQL, shared by every replica
(asyncpg).

:class:`PostgresStore` implements :class:`monitor.engine.ports.CalibrationStore` and
:class:`monitor.engine.ports.ReviewQueue`, the same ports as the SQLite store, and
passes the same contract tests (``tests/postgres/test_store_contract.py``). A write
method returns once its transaction committed.

Verdicts are numbered: ``seq`` is taken under a transaction-level advisory lock (which
review items are written under too, so that an item and its verdict written at once by
two replicas never leave the item pending), so numbers are given in commit order with
no gaps, and a replica that has read every
verdict up to ``seq`` = n can follow the others with :meth:`records_after` (n) without
missing one that commits later with a smaller number. The first stored verdict of an
item counts (``ON CONFLICT DO NOTHING``): whichever replica or path stored it first.

Errors: a DSN that cannot be used or a database newer than this relmon raises
:class:`~monitor.core.errors.ConfigError` at :meth:`PostgresStore.open`; a failing read
or write raises :class:`~monitor.core.errors.StoreError` (retriable for connection
losses and serialization failures).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from adapters.postgres.export import VerdictExport
from adapters.postgres.leases import ReviewPageTables, verdict_of
from adapters.postgres.notify import listen_for_verdicts
from adapters.postgres.schema import (
    JUDGE_LOCK,
    SEQ_LOCK,
    VERDICT_CHANNEL,
    migrate,
    pending_migrations,
)
from monitor.core.errors import ConfigError, InputError, StoreError
from monitor.core.review import ReviewItem, Verdict, same_judgement
from monitor.engine.ports import (
    CalibrationRecord,
    CalibrationStore,
    Clock,
    Judgement,
    ReviewQueue,
    SharedStore,
    SystemClock,
)

__all__ = ["PostgresStore", "diagnose"]

_T = TypeVar("_T")
_RECORD_COLUMNS: Final = (
    "model, task, item_id, score, inclusion_probability, sampled_at, seq, aci_miss, "
    "served_acceptable, segment"
)


_JUDGEMENT_COLUMNS: Final = "item_id, model, task, sampled_at, acceptable, seq"


def _judgement(row: Any) -> Judgement:
    return Judgement(
        item_id=str(row["item_id"]),
        model=str(row["model"]),
        task=str(row["task"]),
        sampled_at=float(row["sampled_at"]),
        acceptable=bool(row["acceptable"]),
        seq=int(row["seq"]),
    )


def _record(row: Any) -> CalibrationRecord:
    return CalibrationRecord(
        model=str(row["model"]),
        task=str(row["task"]),
        item_id=str(row["item_id"]),
        score=math.inf if row["score"] is None else float(row["score"]),
        inclusion_probability=float(row["inclusion_probability"]),
        sampled_at=float(row["sampled_at"]),
        order=(int(row["seq"]),),
        aci_miss=None if row["aci_miss"] is None else bool(row["aci_miss"]),
        served_acceptable=(
            None if row["served_acceptable"] is None else bool(row["served_acceptable"])
        ),
        segment=None if row["segment"] is None else str(row["segment"]),
    )


def _store_error(exc: Exception) -> StoreError:
    retriable = isinstance(
        exc,
        asyncpg.exceptions.SerializationError
        | asyncpg.exceptions.DeadlockDetectedError
        | asyncpg.exceptions.ConnectionDoesNotExistError
        | asyncpg.exceptions.CannotConnectNowError
        | asyncpg.exceptions.TooManyConnectionsError
        | asyncpg.exceptions.InternalClientError
        | ConnectionError
        | OSError,
    )
    return StoreError(
        f"calibration store (PostgreSQL): {type(exc).__name__}: {exc}", retriable=retriable
    )


class PostgresStore(ReviewPageTables, VerdictExport):
    """Review items, verdicts and scored records in PostgreSQL. Close with :meth:`aclose`."""

    def __init__(self, pool: Any, *, clock: Clock | None = None, dsn: str | None = None) -> None:
        self._pool = pool
        self._clock = clock or SystemClock()
        self._dsn = dsn
        """Where :meth:`listen` connects (None: no notices, the followers poll)."""

    @classmethod
    async def open(
        cls, dsn: str, *, clock: Clock | None = None, min_size: int = 1, max_size: int = 8
    ) -> PostgresStore:
        """Connect, migrate the schema (once, whatever the number of replicas starting),
        and return the store."""
        where = _shown(dsn)
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, command_timeout=30
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ConfigError(f"store.dsn: cannot connect to {where}: {exc}") from None
        try:
            async with pool.acquire() as conn:
                await migrate(conn, where)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, clock=clock, dsn=dsn)

    async def _run(self, fn: Callable[[Any], Awaitable[_T]]) -> _T:
        try:
            async with self._pool.acquire() as conn:
                return await fn(conn)
        except (
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.exceptions.InternalClientError,  # a connection the server cut mid-call
            OSError,
        ) as exc:
            raise _store_error(exc) from None

    # -- ReviewQueue ------------------------------------------------------------------

    async def save_review_item(self, item: ReviewItem) -> None:
        """Store an item to review. Idempotent: a second item with the same id is ignored."""
        body = json.dumps(item.to_json(), allow_nan=False, separators=(",", ":"))
        created = self._clock.time()

        async def insert(conn: Any) -> None:
            # Under the verdicts' lock: a verdict stored at the same moment by another
            # replica is seen (the item is then not pending), never missed.
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", SEQ_LOCK)
                await _insert_item(conn)

        async def _insert_item(conn: Any) -> None:
            await conn.execute(
                "INSERT INTO review_items (item_id, model, task, body, created, pending) "
                "VALUES ($1, $2, $3, $4, $5, "
                "NOT EXISTS (SELECT 1 FROM records WHERE item_id = $1)) "
                "ON CONFLICT (item_id) DO NOTHING",
                item.item_id,
                item.model,
                item.task,
                body,
                created,
            )

        await self._run(insert)

    async def submit(self, item: ReviewItem) -> None:
        """:class:`~monitor.engine.ports.ReviewQueue`: returns once the item is durable."""
        await self.save_review_item(item)

    async def depth(self) -> int:
        """Stored items still waiting for a verdict (every replica's)."""
        return int(
            await self._run(
                lambda conn: conn.fetchval("SELECT count(*) FROM review_items WHERE pending")
            )
        )

    async def get_review_item(self, item_id: str) -> ReviewItem | None:
        body = await self._run(
            lambda conn: conn.fetchval("SELECT body FROM review_items WHERE item_id = $1", item_id)
        )
        return None if body is None else ReviewItem.from_json(json.loads(body))

    async def next_pending(self, task: str | None = None) -> ReviewItem | None:
        """The oldest stored item without a verdict (of ``task``, if given)."""
        body = await self._run(
            lambda conn: conn.fetchval(
                "SELECT body FROM review_items WHERE pending AND ($1::text IS NULL OR task = $1) "
                "ORDER BY id LIMIT 1",
                task,
            )
        )
        return None if body is None else ReviewItem.from_json(json.loads(body))

    # -- CalibrationStore -------------------------------------------------------------

    def has_review_item(self, item_id: str) -> bool:
        """Always False (never blocks): the items written before this process started
        come back through :meth:`recent_item_ids`."""
        return False

    def discard_review_item(self, item_id: str) -> None:
        """Nothing to do: the store is the review queue, so an item whose ``submit``
        failed was never stored."""

    async def recent_item_ids(self, limit: int) -> list[str]:
        """The ids of the last ``limit`` stored review items, oldest first."""
        rows = await self._run(
            lambda conn: conn.fetch(
                "SELECT item_id FROM (SELECT item_id, id FROM review_items ORDER BY id DESC "
                "LIMIT $1) recent ORDER BY id",
                limit,
            )
        )
        return [str(r["item_id"]) for r in rows]

    async def pending_counts(self) -> dict[tuple[str, str], int]:
        """Items waiting for a verdict per ``(model, task)`` (for the queue-depth gauge)."""
        rows = await self._run(
            lambda conn: conn.fetch(
                "SELECT model, task, count(*) AS n FROM review_items WHERE pending "
                "GROUP BY model, task"
            )
        )
        return {(str(r["model"]), str(r["task"])): int(r["n"]) for r in rows}

    async def save_record(
        self, record: CalibrationRecord, verdict: Verdict
    ) -> tuple[int, ...] | None:
        """Persist a scored verdict; ``None`` if the item already had one, or if a
        verdict that judges it otherwise is held for it on the review page (the first
        stored verdict counts, held or applied). Returns ``(seq,)``, the verdict's
        number, announced on :data:`~adapters.postgres.schema.VERDICT_CHANNEL`."""
        if verdict.item_id != record.item_id:
            raise InputError(f"verdict for {verdict.item_id!r} saved with {record.item_id!r}")
        if math.isnan(record.score) or record.score < 1:
            raise InputError(f"a rank score is >= 1 or +inf, not {record.score!r}")
        score = None if math.isinf(record.score) else record.score
        verdict_json = json.dumps(verdict.to_json(), separators=(",", ":"))
        applied_at = self._clock.time()

        async def insert(conn: Any) -> tuple[int, ...] | None:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", SEQ_LOCK)
                held = await conn.fetchval(
                    "SELECT verdict FROM held_verdicts WHERE item_id = $1", record.item_id
                )
                if held is not None and not same_judgement(verdict_of(str(held)), verdict):
                    return None  # a page verdict held for the item counts first
                seq = await conn.fetchval(
                    "INSERT INTO records (item_id, model, task, score, inclusion_probability, "
                    "sampled_at, verdict, applied_at, seq, aci_miss, served_acceptable, segment) "
                    "SELECT $1, $2, $3, $4, $5, $6, $7, $8, coalesce(max(seq), 0) + 1, $9, $10, "
                    "$11 "
                    "FROM records ON CONFLICT (item_id) DO NOTHING RETURNING seq",
                    record.item_id,
                    record.model,
                    record.task,
                    score,
                    record.inclusion_probability,
                    record.sampled_at,
                    verdict_json,
                    applied_at,
                    record.aci_miss,
                    record.served_acceptable,
                    record.segment,
                )
                if seq is None:
                    return None
                await conn.execute(
                    "UPDATE review_items SET pending = FALSE WHERE item_id = $1", record.item_id
                )
                # Delivered at commit: the other replicas' followers wake at once.
                await conn.execute("SELECT pg_notify($1, $2)", VERDICT_CHANNEL, str(seq))
                return (int(seq),)

        return await self._run(insert)

    async def get_verdict(self, item_id: str) -> Verdict | None:
        """The verdict stored for ``item_id``, if any."""
        text = await self._run(
            lambda conn: conn.fetchval("SELECT verdict FROM records WHERE item_id = $1", item_id)
        )
        return None if text is None else verdict_of(text)

    async def get_record(self, item_id: str) -> CalibrationRecord | None:
        row = await self._run(
            lambda conn: conn.fetchrow(
                f"SELECT {_RECORD_COLUMNS} FROM records WHERE item_id = $1", item_id
            )
        )
        return None if row is None else _record(row)

    async def save_judgement(self, judgement: Judgement) -> int:
        """Persist a judge label once per item id; its ``seq`` (0: it was there). Numbered
        under a lock, so followers reading ``seq > n`` never miss one committed later."""
        j = judgement

        async def insert(conn: Any) -> int:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", JUDGE_LOCK)
                seq = await conn.fetchval(
                    "INSERT INTO judgements (seq, item_id, model, task, sampled_at, acceptable) "
                    "SELECT coalesce(max(seq), 0) + 1, $1, $2, $3, $4, $5 FROM judgements "
                    "ON CONFLICT (item_id) DO NOTHING RETURNING seq",
                    j.item_id,
                    j.model,
                    j.task,
                    j.sampled_at,
                    j.acceptable,
                )
                return 0 if seq is None else int(seq)

        return await self._run(insert)

    async def load_judgements(self, since: float) -> Sequence[Judgement]:
        """The judge labels of items sampled at or after ``since``, in ``seq`` order."""
        rows = await self._run(
            lambda conn: conn.fetch(
                f"SELECT {_JUDGEMENT_COLUMNS} FROM judgements WHERE sampled_at >= $1 ORDER BY seq",
                since,
            )
        )
        return [_judgement(r) for r in rows]

    async def judgements_after(self, seq: int) -> list[Judgement]:
        """The judge labels numbered after ``seq``, in order (every replica's)."""
        rows = await self._run(
            lambda conn: conn.fetch(
                f"SELECT {_JUDGEMENT_COLUMNS} FROM judgements WHERE seq > $1 ORDER BY seq", seq
            )
        )
        return [_judgement(r) for r in rows]

    async def load_records(self) -> Sequence[CalibrationRecord]:
        """Every scored verdict in the order they were numbered (``seq``)."""
        return await self.records_after(0)

    async def records_after(self, seq: int) -> list[CalibrationRecord]:
        """The scored verdicts numbered after ``seq``, in order: what the other replicas
        stored since this one last read (numbers have no gaps and follow commit order)."""
        rows = await self._run(
            lambda conn: conn.fetch(
                f"SELECT {_RECORD_COLUMNS} FROM records WHERE seq > $1 ORDER BY seq", seq
            )
        )
        return [_record(r) for r in rows]

    async def listen(self, wake: Callable[[], None], *, retry_s: float = 1.0) -> None:
        """:class:`~monitor.engine.ports.SharedStore`: call ``wake`` on every stored
        verdict's notice (``LISTEN`` on a connection of its own, opened again after a
        loss), until cancelled (:mod:`adapters.postgres.notify`)."""
        if self._dsn is None:
            return
        await listen_for_verdicts(self._dsn, wake, where=_shown(self._dsn), retry_s=retry_s)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._pool.close()


def _shown(dsn: str) -> str:
    """The DSN without its password, query or fragment, for messages."""
    parts = urlsplit(dsn)
    if not parts.scheme:
        return "(the configured DSN)"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}{host}", parts.path, "", ""))


if TYPE_CHECKING:

    def _implements(store: PostgresStore) -> tuple[CalibrationStore, ReviewQueue, SharedStore]:
        return store, store, store  # mypy checks PostgresStore against the protocols here


async def diagnose(dsn: str) -> tuple[str | None, list[int]]:
    """What ``relmon check-config`` says of a DSN: why it cannot be used (wrong password,
    host unreachable, no such database) or None, and the migrations a start would apply."""
    where = _shown(dsn)
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except asyncpg.InvalidPasswordError:
        return f"{where}: authentication failed (check the user and password)", []
    except asyncpg.InvalidCatalogNameError:
        return f"{where}: no such database (create it, or fix the DSN's path)", []
    except (OSError, TimeoutError) as exc:
        return f"{where}: cannot reach the server ({type(exc).__name__}: {exc})", []
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return f"{where}: {type(exc).__name__}: {exc}", []
    try:
        return None, await pending_migrations(conn)
    finally:
        await conn.close()
