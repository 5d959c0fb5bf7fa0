"""``relmon verdicts export|import`` on the shared PostgreSQL store: the applied verdicts
of every replica with their review items, as data (the same rows as the SQLite store's,
:mod:`adapters.sqlite.export`).

An import is one transaction under the verdicts' numbering lock: the imported verdicts
are numbered after those present, in the order of the file, and announced like any
verdict, so the running replicas follow them at once (with SQLite they count from the
next start).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from adapters.postgres.leases import verdict_of
from adapters.postgres.schema import SEQ_LOCK, VERDICT_CHANNEL
from monitor.core.errors import InputError
from monitor.core.review import ReviewItem, served_acceptable
from monitor.engine.ports import ExportedVerdict

__all__ = ["VerdictExport"]

_T = TypeVar("_T")


def _exported(row: Any) -> ExportedVerdict:
    item = ReviewItem.from_json(json.loads(str(row["body"])))
    # The record's own fields are what the windows load; keep them authoritative.
    item = ReviewItem(
        item_id=item.item_id,
        model=str(row["model"]),
        task=str(row["task"]),
        query=item.query,
        candidates=item.candidates,
        k=item.k,
        inclusion_probability=float(row["inclusion_probability"]),
        sampled_at=float(row["sampled_at"]),
        served_rank=item.served_rank,
        segment=item.segment,
    )
    return ExportedVerdict(
        item=item,
        verdict=verdict_of(str(row["verdict"])),
        score=math.inf if row["score"] is None else float(row["score"]),
        applied_at=float(row["applied_at"]),
        aci_miss=None if row["aci_miss"] is None else bool(row["aci_miss"]),
    )


def _prepared(row: ExportedVerdict) -> tuple[Any, ...]:
    item = row.item
    if row.verdict.item_id != item.item_id:
        raise InputError(f"verdict for {row.verdict.item_id!r} with {item.item_id!r}")
    if math.isnan(row.score) or row.score < 1:
        raise InputError(f"a rank score is >= 1 or +inf, not {row.score!r}")
    return (
        item.item_id,
        item.model,
        item.task,
        None if math.isinf(row.score) else row.score,
        item.inclusion_probability,
        item.sampled_at,
        json.dumps(row.verdict.to_json(), separators=(",", ":")),
        row.applied_at,
        row.aci_miss,
        json.dumps(item.to_json(), allow_nan=False, separators=(",", ":")),
        served_acceptable(item, row.verdict, row.score),
        item.segment,
    )


class VerdictExport(ABC):
    """Export and import of applied verdicts (the store's ``_run``)."""

    @abstractmethod
    async def _run(self, fn: Callable[[Any], Awaitable[_T]]) -> _T:
        """Run ``fn`` with a pooled connection (:class:`PostgresStore` provides it)."""

    async def export_verdicts(self) -> list[ExportedVerdict]:
        """Every applied verdict with its review item, in the order the windows load
        them (``seq``)."""
        rows = await self._run(
            lambda conn: conn.fetch(
                "SELECT ri.body, r.verdict, r.score, r.applied_at, r.model, r.task, "
                "r.inclusion_probability, r.sampled_at, r.aci_miss FROM records r "
                "JOIN review_items ri ON ri.item_id = r.item_id ORDER BY r.seq"
            )
        )
        return [_exported(r) for r in rows]

    async def import_verdicts(self, rows: Sequence[ExportedVerdict]) -> tuple[int, int]:
        """Store exported verdicts with their items in one transaction; returns
        ``(imported, already present)``. An item that already has a verdict keeps it."""
        prepared = [_prepared(row) for row in rows]

        async def insert(conn: Any) -> tuple[int, int]:
            new = 0
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", SEQ_LOCK)
                last = 0
                for values in prepared:
                    seq = await _import_one(conn, values)
                    if seq is not None:
                        new, last = new + 1, seq
                if last:
                    await conn.execute("SELECT pg_notify($1, $2)", VERDICT_CHANNEL, str(last))
            return new, len(prepared) - new

        return await self._run(insert)


async def _import_one(conn: Any, values: tuple[Any, ...]) -> int | None:
    """One verdict and its item; its number, or None if the item had a verdict."""
    item_id, model, task = values[:3]
    seq = await conn.fetchval(
        "INSERT INTO records (item_id, model, task, score, inclusion_probability, "
        "sampled_at, verdict, applied_at, seq, aci_miss, served_acceptable, segment) "
        "SELECT $1, $2, $3, $4, $5, $6, $7, $8, coalesce(max(seq), 0) + 1, $9, $10, $11 "
        "FROM records ON CONFLICT (item_id) DO NOTHING RETURNING seq",
        *values[:9],
        values[10],
        values[11],
    )
    if seq is None:
        return None
    await conn.execute(
        "INSERT INTO review_items (item_id, model, task, body, created, pending) "
        "VALUES ($1, $2, $3, $4, $5, FALSE) ON CONFLICT (item_id) DO NOTHING",
        item_id,
        model,
        task,
        values[9],
        values[7],
    )
    await conn.execute("UPDATE review_items SET pending = FALSE WHERE item_id = $1", item_id)
    await conn.execute("DELETE FROM held_verdicts WHERE item_id = $1", item_id)
    return int(seq)
