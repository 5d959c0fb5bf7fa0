"""The review page's tables in the SQLite store: leases, held verdicts (the undo
window) and the progress counts (see :mod:`adapters.sqlite.store`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Literal

from adapters.sqlite.connection import SqliteConnection
from adapters.sqlite.rows import pending_filter, verdict_from_json
from monitor.core.errors import LimitError
from monitor.core.review import ReviewItem, Verdict

__all__ = ["ReviewPageTables", "live_leases"]


def live_leases(conn: sqlite3.Connection, owner: str) -> int:
    """The live leases ``owner`` holds on items still waiting (expired ones are deleted
    before this is asked)."""
    return int(
        conn.execute(
            "SELECT count(*) FROM leases l JOIN review_items ri ON ri.item_id = l.item_id "
            "WHERE l.owner = ? AND ri.pending = 1",
            (owner,),
        ).fetchone()[0]
    )


def _renews(conn: sqlite3.Connection, item_id: str, holder: str) -> bool:
    """Whether ``holder`` already leases ``item_id`` (taking it again renews the lease)."""
    row = conn.execute(
        "SELECT 1 FROM leases WHERE item_id = ? AND holder = ?", (item_id, holder)
    ).fetchone()
    return row is not None


class ReviewPageTables(SqliteConnection):
    """Leases, held verdicts and progress: what the review page needs beyond the queue."""

    async def lease_next(
        self,
        task: str | None,
        *,
        holder: str,
        lease_s: float,
        exclude: Sequence[str] = (),
        owner: str | None = None,
        max_leases: int | None = None,
    ) -> ReviewItem | None:
        """The oldest item waiting for a verdict that nobody else holds, leased to
        ``holder`` for ``lease_s`` seconds (renewed if ``holder`` already had it).

        Skipped: items leased to another holder (lease not expired), items with a held
        verdict, and the ids in ``exclude`` (what the caller shows or prefetched).
        ``owner`` (the reviewer behind ``holder``; default ``holder``) holds at most
        ``max_leases`` live leases: one more raises :class:`LimitError` (a renewal of one
        it holds does not count).
        """
        where, params = pending_filter(task)
        skip = tuple(dict.fromkeys(exclude))[:64]
        who = holder if owner is None else owner

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
            if max_leases is not None and not _renews(conn, str(row[0]), holder):
                held = live_leases(conn, who)
                if held >= max_leases:
                    raise LimitError(
                        f"{who!r} holds {held} review leases, the most allowed "
                        f"(review.max_leases_per_reviewer: {max_leases})"
                    )
            conn.execute(
                "INSERT OR REPLACE INTO leases (item_id, holder, expires, owner) "
                "VALUES (?, ?, ?, ?)",
                (row[0], holder, now + lease_s, who),
            )
            return str(row[1])

        body = await self._run(lambda: self._write(take))
        return None if body is None else ReviewItem.from_json(json.loads(body))

    async def lease_item(
        self, item_id: str, *, holder: str, lease_s: float, owner: str | None = None
    ) -> None:
        """Lease one item to ``holder`` (taking it over from anyone else)."""

        def lease(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO leases (item_id, holder, expires, owner) "
                "VALUES (?, ?, ?, ?)",
                (item_id, holder, self._clock.time() + lease_s, holder if owner is None else owner),
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
        held) or if the item's verdict already counts (the same judgement, stored through
        the API meanwhile: the held one is then dropped, it repeats what counts)."""

        def undo(conn: sqlite3.Connection) -> Literal["undone", "other", "none"]:
            row = conn.execute(
                "SELECT holder FROM held_verdicts WHERE item_id = ? AND claimed = 0", (item_id,)
            ).fetchone()
            if row is None:
                return "none"
            if conn.execute("SELECT 1 FROM records WHERE item_id = ?", (item_id,)).fetchone():
                conn.execute("DELETE FROM held_verdicts WHERE item_id = ?", (item_id,))
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
        return [verdict_from_json(t) for t in texts]

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
        return None if found is None else (verdict_from_json(found[0]), found[1])

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
