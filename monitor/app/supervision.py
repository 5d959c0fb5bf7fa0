"""Supervision of long-running sources: restart after a failure, with backoff, counted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from monitor.core.errors import RelmonError, StateError
from monitor.engine.ports import Source

__all__ = ["supervise"]

log = structlog.get_logger("relmon")


async def supervise(
    source: Source,
    *,
    max_delay_s: float = 30.0,
    on_restart: Callable[[], None] | None = None,
    explain: Callable[[], Awaitable[str | None]] | None = None,
) -> None:
    """Run ``source`` until it stops; after a failure, restart it.

    After a :class:`RelmonError` the source is connected again after 1, 2, 4 ... up to
    ``max_delay_s`` seconds until that works, then run again; meanwhile ``/readyz``
    reports it not connected. ``on_restart`` is called after each successful restart
    (the service counts them in ``relmon_source_restarts_total``). ``explain`` says why
    the cluster refuses a connection (a certificate that expired, a password that
    changed): asked once at the first failed restart of an outage, and logged as
    ``source_unreachable``. Any other exception, and a :class:`StateError` (a source used
    out of order: a bug, not an outage), ends the task.
    """
    name = type(source).__name__
    while True:
        try:
            await source.run()
            return
        except StateError:
            raise  # used out of order: a bug, not an outage
        except RelmonError as exc:
            log.error("source_failed", source=name, error=str(exc), restarting=True)
        delay = 1.0
        explained = explain is None
        while True:
            await asyncio.sleep(delay)
            if source.stopped:
                return
            try:
                await source.restart()
                break
            except RelmonError as exc:
                log.warning("source_restart_failed", source=name, error=str(exc))
                delay = min(2 * delay, max_delay_s)
                if not explained and explain is not None:
                    explained = True
                    problem = await explain()
                    if problem is not None:
                        log.error("source_unreachable", source=name, why=problem)
        if on_restart is not None:
            on_restart()
        log.info("source_restarted", source=name)
