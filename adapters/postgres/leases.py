"""The review page's tables in PostgreSQL: leases, held verdicts (the undo window) and
the progress counts. The same semantics as the SQLite store's
(:mod:`adapters.sqlite.leases`), checked by the same contract tests.

A lease is two columns of the item's own row (``lease_holder``, ``lease_expires``),
taken with ``UPDATE … WHERE item_id = (SELECT … FOR UPDATE SKIP LOCKED)``: a replica
skips the rows another is leasing right now, and a row leased by a transaction that
committed meanwhile fails PostgreSQL's recheck of the lease condition on its new
version, so two reviewers on two replicas are never handed the same item. (A lease in a
table of its own would not be rechecked: the item row itself would not have changed.)
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

from adapters.postgres.schema import LEASE_LOCK, SEQ_LOCK
from monitor.core.errors import LimitError
from monitor.core.review import ReviewItem, Verdict
from monitor.engine.ports import Clock

__all__ = ["ReviewPageTables", "verdict_of"]

_T = TypeVar("_T")
_LEASE_ATTEMPTS = 20
_FREE = (
    "ri.pending AND ($1::text IS NULL OR ri.task = $1) AND NOT (ri.item_id = ANY($2)) "
    "AND NOT EXISTS (SELECT 1 FROM held_verdicts h WHERE h.item_id = ri.item_id) "
    "AND (ri.lease_holder IS NULL OR ri.lease_holder = $3 OR ri.lease_expires <= $4)"
)
"""An item ``holder`` ($3) may lease at time $4: waiting, of task $1, not in $2, without
a held verdict, and leased by nobody else (or the lease expired)."""


async def _live_leases(conn: Any, owner: str, now: float) -> int:
    """The live leases ``owner`` holds on items still waiting, on every replica."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM review_items WHERE pending AND lease_owner = $1 "
            "AND lease_expires > $2",
            owner,
            now,
        )
    )


async def _free(conn: Any, task: str | None, skip: list[str], holder: str, *, now: float) -> bool:
    """Whether an item is free for ``holder`` to lease at ``now``."""
    return bool(
        await conn.fetchval(
            f"SELECT EXISTS (SELECT 1 FROM review_items ri WHERE {_FREE})",
            task,
            skip,
            holder,
            now,
        )
    )


def verdict_of(text: str) -> Verdict:
    d = json.loads(text)
    return Verdict(
        item_id=str(d["item_id"]),
        accepted_ranks=tuple(int(r) for r in d.get("accepted_ranks", [])),
        none_of_these=bool(d.get("none_of_these", False)),
        correct_answer=d.get("correct_answer"),
        reviewer=str(d.get("reviewer", "unknown")),
    )


class ReviewPageTables(ABC):
    """Leases, held verdicts and progress (the store's ``_run`` and ``_clock``)."""

    _clock: Clock

    @abstractmethod
    async def _run(self, fn: Callable[[Any], Awaitable[_T]]) -> _T:
        """Run ``fn`` with a pooled connection (:class:`PostgresStore` provides it)."""

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
        Skipped: items leased to another holder, items with a held verdict, ``exclude``.
        ``owner`` (the reviewer behind ``holder``; default ``holder``) holds at most
        ``max_leases`` live leases, on every replica together: one more raises
        :class:`LimitError` (a renewal of one it holds does not count)."""
        skip = list(dict.fromkeys(exclude))[:64]
        who = holder if owner is None else owner

        async def take(conn: Any) -> str | None:
            async with conn.transaction():
                at_cap, held = False, 0
                if max_leases is not None:
                    # One reviewer's leasing in one order, whichever replica serves it.
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock($1, hashtext($2))", LEASE_LOCK, who
                    )
                    held = await _live_leases(conn, who, self._clock.time())
                    at_cap = held >= max_leases
                body = await self._take(
                    conn, task, skip=skip, holder=holder, owner=who, lease_s=lease_s, at_cap=at_cap
                )
                free = body is None and at_cap
                if free and await _free(conn, task, skip, holder, now=self._clock.time()):
                    raise LimitError(
                        f"{who!r} holds {held} review leases, the most allowed "
                        f"(review.max_leases_per_reviewer: {max_leases})"
                    )
                return body

        body = await self._run(take)
        return None if body is None else ReviewItem.from_json(json.loads(body))

    async def _take(
        self,
        conn: Any,
        task: str | None,
        *,
        skip: list[str],
        holder: str,
        owner: str,
        lease_s: float,
        at_cap: bool,
    ) -> str | None:
        """Lease the first free item (at the cap: only one ``holder`` leases already)."""
        for _ in range(_LEASE_ATTEMPTS):
            now = self._clock.time()
            body = await conn.fetchval(
                "UPDATE review_items SET lease_holder = $3, lease_expires = $5, "
                f"lease_owner = $6 WHERE item_id = (SELECT ri.item_id FROM review_items ri "
                f"WHERE {_FREE} AND (NOT $7 OR (ri.lease_holder = $3 AND ri.lease_expires > $4)) "
                "ORDER BY ri.id LIMIT 1 FOR UPDATE OF ri SKIP LOCKED) RETURNING body",
                task,
                skip,
                holder,
                now,
                now + lease_s,
                owner,
                at_cap,
            )
            if body is not None:
                return str(body)
            # None: nothing free, or the row chosen was leased by another replica
            # in the meantime (it failed the recheck): look again.
            if at_cap or not await _free(conn, task, skip, holder, now=now):
                return None
        return None

    async def lease_item(
        self, item_id: str, *, holder: str, lease_s: float, owner: str | None = None
    ) -> None:
        """Lease one item to ``holder`` (taking it over from anyone else)."""
        expires = self._clock.time() + lease_s
        await self._run(
            lambda conn: conn.execute(
                "UPDATE review_items SET lease_holder = $2, lease_expires = $3, "
                "lease_owner = $4 WHERE item_id = $1",
                item_id,
                holder,
                expires,
                holder if owner is None else owner,
            )
        )

    async def renew_lease(self, item_id: str, *, holder: str, lease_s: float) -> bool:
        """Extend ``holder``'s live lease on an item; False if it holds none."""
        now = self._clock.time()
        status = await self._run(
            lambda conn: conn.execute(
                "UPDATE review_items SET lease_expires = $1 WHERE item_id = $2 "
                "AND lease_holder = $3 AND lease_expires > $4",
                now + lease_s,
                item_id,
                holder,
                now,
            )
        )
        return str(status).endswith(" 1")

    async def release_lease(self, item_id: str, holder: str) -> bool:
        """Give an item back before its lease expires; False if ``holder`` had no lease."""
        status = await self._run(
            lambda conn: conn.execute(
                "UPDATE review_items SET lease_holder = NULL, lease_expires = NULL "
                "WHERE item_id = $1 AND lease_holder = $2",
                item_id,
                holder,
            )
        )
        return str(status).endswith(" 1")

    async def hold_verdict(
        self, verdict: Verdict, hold_s: float, *, holder: str | None = None
    ) -> Literal["held", "duplicate"]:
        """Keep ``verdict`` for ``hold_s`` seconds before it is applied (undo window);
        ``"duplicate"`` if the item already has a verdict, applied or held."""
        text = json.dumps(verdict.to_json(), separators=(",", ":"))

        async def hold(conn: Any) -> Literal["held", "duplicate"]:
            now = self._clock.time()
            async with conn.transaction():
                # In one order with the verdicts stored through the API (save_record).
                await conn.execute("SELECT pg_advisory_xact_lock($1)", SEQ_LOCK)
                if await conn.fetchval("SELECT 1 FROM records WHERE item_id = $1", verdict.item_id):
                    return "duplicate"
                inserted = await conn.fetchval(
                    "INSERT INTO held_verdicts (item_id, verdict, held_at, due, holder) "
                    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (item_id) DO NOTHING "
                    "RETURNING item_id",
                    verdict.item_id,
                    text,
                    now,
                    now + hold_s,
                    holder,
                )
                if inserted is None:
                    return "duplicate"
                await conn.execute(
                    "UPDATE review_items SET lease_holder = NULL, lease_expires = NULL "
                    "WHERE item_id = $1",
                    verdict.item_id,
                )
                return "held"

        return await self._run(hold)

    async def undo_held(self, item_id: str, holder: str) -> Literal["undone", "other", "none"]:
        """Withdraw a held verdict not yet claimed, if ``holder`` gave it; ``"none"`` as
        well once the item's verdict counts (the same judgement stored through the API
        meanwhile: the held one, which repeats it, is dropped)."""

        async def undo(conn: Any) -> Literal["undone", "other", "none"]:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", SEQ_LOCK)
                row = await conn.fetchrow(
                    "SELECT holder FROM held_verdicts WHERE item_id = $1 AND NOT claimed "
                    "FOR UPDATE",
                    item_id,
                )
                if row is None:
                    return "none"
                if await conn.fetchval("SELECT 1 FROM records WHERE item_id = $1", item_id):
                    await conn.execute("DELETE FROM held_verdicts WHERE item_id = $1", item_id)
                    return "none"
                if row["holder"] != holder:
                    return "other"
                await conn.execute("DELETE FROM held_verdicts WHERE item_id = $1", item_id)
                return "undone"

        return await self._run(undo)

    async def claim_due(self) -> list[Verdict]:
        """Claim the held verdicts that are due (and any claimed before a crash), oldest
        first: from now on they cannot be undone."""

        async def claim(conn: Any) -> list[str]:
            async with conn.transaction():
                await conn.execute(
                    "UPDATE held_verdicts SET claimed = TRUE WHERE NOT claimed AND due <= $1",
                    self._clock.time(),
                )
                rows = await conn.fetch(
                    "SELECT verdict FROM held_verdicts WHERE claimed ORDER BY due, id"
                )
                return [str(r["verdict"]) for r in rows]

        return [verdict_of(t) for t in await self._run(claim)]

    async def drop_held(self, item_id: str) -> None:
        """Forget a claimed verdict once it has been applied."""
        await self._run(
            lambda conn: conn.execute(
                "DELETE FROM held_verdicts WHERE item_id = $1 AND claimed", item_id
            )
        )

    async def held_verdict(self, item_id: str) -> tuple[Verdict, float] | None:
        """The verdict held for ``item_id`` and when it is due, if any."""
        row = await self._run(
            lambda conn: conn.fetchrow(
                "SELECT verdict, due FROM held_verdicts WHERE item_id = $1", item_id
            )
        )
        return None if row is None else (verdict_of(str(row["verdict"])), float(row["due"]))

    async def review_counts(self, since: float) -> dict[tuple[str, str], tuple[int, int, int]]:
        """Per ``(model, task)``: verdicts applied since ``since``, items waiting (no
        verdict, none held), and verdicts held in the undo window."""
        queries = (
            (
                "SELECT model, task, count(*) AS n FROM records WHERE applied_at >= $1 "
                "GROUP BY model, task",
                (since,),
            ),
            (
                "SELECT ri.model, ri.task, count(*) AS n FROM review_items ri WHERE ri.pending "
                "AND NOT EXISTS (SELECT 1 FROM held_verdicts h WHERE h.item_id = ri.item_id) "
                "GROUP BY ri.model, ri.task",
                (),
            ),
            (
                "SELECT ri.model, ri.task, count(*) AS n FROM held_verdicts h "
                "JOIN review_items ri ON ri.item_id = h.item_id "
                "WHERE NOT EXISTS (SELECT 1 FROM records r WHERE r.item_id = h.item_id) "
                "GROUP BY ri.model, ri.task",
                (),
            ),
        )

        async def get(conn: Any) -> dict[tuple[str, str], tuple[int, int, int]]:
            out: dict[tuple[str, str], list[int]] = {}
            for column, (sql, args) in enumerate(queries):
                for r in await conn.fetch(sql, *args):
                    out.setdefault((str(r["model"]), str(r["task"])), [0, 0, 0])[column] = int(
                        r["n"]
                    )
            return {key: (a, w, h) for key, (a, w, h) in out.items()}

        return await self._run(get)
