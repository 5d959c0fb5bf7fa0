"""Notices of new verdicts: ``LISTEN`` on :data:`~adapters.postgres.schema.VERDICT_CHANNEL`
on a connection of its own, so that a replica's follower reads another replica's verdict
as soon as it is committed instead of at its next poll.

The notice is a hint, never the data: a follower still reads the verdict table (and
polls it every ``store.sync_s``), so a notice lost with a dropped connection delays a
verdict by at most ``sync_s``. A lost connection (a restarted server,
``pg_terminate_backend``, a silent network, found by a ``SELECT 1`` every
``check_s``) is opened again after ``retry_s``; each new connection wakes the follower
once, for what it may have missed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import asyncpg

from adapters.postgres.schema import VERDICT_CHANNEL
from monitor.engine.logs import ThrottledLog

__all__ = ["listen_for_verdicts"]

throttled = ThrottledLog()
"""A server down repeats these lines every ``retry_s``: rate-limited."""

_FAILURES = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


async def listen_for_verdicts(
    dsn: str,
    wake: Callable[[], None],
    *,
    where: str,
    retry_s: float = 1.0,
    check_s: float = 30.0,
) -> None:
    """Call ``wake`` on every verdict notice until cancelled (see the module)."""
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=10)
        except _FAILURES as exc:
            throttled.warning(
                "store_listen_failed", key=where, store=where, error=f"{type(exc).__name__}: {exc}"
            )
            await asyncio.sleep(retry_s)
            continue
        try:
            await _listen(conn, wake, check_s=check_s)
        except _FAILURES as exc:
            throttled.warning(
                "store_listen_lost", key=where, store=where, error=f"{type(exc).__name__}: {exc}"
            )
        finally:
            with contextlib.suppress(*_FAILURES):
                await asyncio.wait_for(conn.close(), 5)
            if not conn.is_closed():
                conn.terminate()
        await asyncio.sleep(retry_s)


async def _listen(conn: Any, wake: Callable[[], None], *, check_s: float) -> None:
    """Listen on ``conn`` until it is lost (returns) or fails a check (raises)."""
    lost = asyncio.Event()
    conn.add_termination_listener(lambda _conn: lost.set())
    await conn.add_listener(VERDICT_CHANNEL, lambda *_args: wake())
    wake()  # whatever was stored while this replica was not listening
    while not lost.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lost.wait(), check_s)
            return
        await conn.fetchval("SELECT 1", timeout=10)  # a silent network shows here
