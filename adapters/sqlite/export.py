"""``relmon verdicts export|import`` in the SQLite store: applied verdicts with their
review items, as data (see :mod:`adapters.sqlite.store`)."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from adapters.sqlite.connection import SqliteConnection
from adapters.sqlite.rows import aci_column, next_seq, score_column, verdict_from_json
from monitor.core.errors import InputError
from monitor.core.review import ReviewItem, served_acceptable
from monitor.engine.ports import ExportedVerdict

__all__ = ["ExportedVerdict", "VerdictExport"]


class VerdictExport(SqliteConnection):
    """Export and import of applied verdicts."""

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
                served_rank=item.served_rank,
                segment=item.segment,
            )
            out.append(
                ExportedVerdict(
                    item=item,
                    verdict=verdict_from_json(verdict),
                    score=math.inf if score is None else float(score),
                    applied_at=float(applied_at),
                    aci_miss=None if miss is None else bool(miss),
                )
            )
        return out

    async def import_verdicts(self, rows: Sequence[ExportedVerdict]) -> tuple[int, int]:
        """Store exported verdicts with their items in one transaction; returns
        ``(imported, already present)``. An item that already has a verdict keeps it.
        Imported verdicts are numbered after those present, in the order of ``rows``.
        Whether a verdict accepted the served answer is read from it and its item
        (:func:`~monitor.core.review.served_acceptable`, without a canonicalizer)."""
        prepared = []
        for row in rows:
            if row.verdict.item_id != row.item.item_id:
                raise InputError(f"verdict for {row.verdict.item_id!r} with {row.item.item_id!r}")
            prepared.append(
                (
                    row,
                    json.dumps(row.item.to_json(), allow_nan=False, separators=(",", ":")),
                    json.dumps(row.verdict.to_json(), separators=(",", ":")),
                    score_column(row.score),
                    aci_column(served_acceptable(row.item, row.verdict, row.score)),
                    row.item.segment,
                )
            )

        def insert(conn: sqlite3.Connection) -> tuple[int, int]:
            new = old = 0
            for row, body, verdict, score, served, segment in prepared:
                item = row.item
                cur = conn.execute(
                    "INSERT OR IGNORE INTO records (item_id, model, task, score, "
                    "inclusion_probability, sampled_at, verdict, applied_at, seq, aci_miss, "
                    "served_acceptable, segment) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        item.item_id,
                        item.model,
                        item.task,
                        score,
                        item.inclusion_probability,
                        item.sampled_at,
                        verdict,
                        row.applied_at,
                        next_seq(conn),
                        aci_column(row.aci_miss),
                        served,
                        segment,
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
