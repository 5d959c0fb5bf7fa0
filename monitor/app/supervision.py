"""Supervision of long-running sources: a source that stops anyway is restarted, with
backoff, counted, and reported down meanwhile (docs/kafka.md, "A bad event")."""

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
    on_down: Callable[[], None] | None = None,
    explain: Callable[[], Awaitable[str | None]] | None = None,
) -> None:
    """Run ``source`` until it is stopped; whenever it stops anyway, restart it.

    A source stops anyway when its :meth:`~Source.run` raises anything (a
    :class:`RelmonError` such as a broker outage, or any other exception: a bug), or
    returns while the source is not :attr:`~Source.stopped`. Each time, the failure is
    logged (``source_failed``), ``on_down`` is called (``/readyz`` reports the source
    down until it runs again), and it is connected again (:meth:`~Source.restart`) after
    1, 2, 4 ... up to ``max_delay_s`` seconds until that works; then ``on_restart`` is
    called (the service counts it in ``relmon_source_restarts_total``) and it runs again.
    A run that failed within ``max_delay_s`` of its restart keeps the backoff growing,
    so a source that crashes at once does not reconnect in a tight loop.

    ``explain`` says why the cluster refuses a connection (a certificate that expired, a
    password that changed): asked once at the first failed restart of an outage, and
    logged as ``source_unreachable``. A :class:`StateError` (a source used out of order:
    run before start, a bug in relmon's wiring that a restart cannot mend) ends the task
    with its traceback, after ``on_down``: the source stays reported down.
    """
    name = type(source).__name__
    loop = asyncio.get_running_loop()
    first_delay = min(1.0, max_delay_s)
    delay = first_delay
    restarted_at: float | None = None
    while True:
        if not await _ran_until_failure(source, name, on_down):
            return
        quick = restarted_at is not None and loop.time() - restarted_at < max_delay_s
        delay = min(2 * delay, max_delay_s) if quick else first_delay
        if not await _restart(source, name, delay, max_delay_s, explain):
            return
        restarted_at = loop.time()
        if on_restart is not None:
            on_restart()
        log.info("source_restarted", source=name)


async def _ran_until_failure(source: Source, name: str, on_down: Callable[[], None] | None) -> bool:
    """Run ``source`` once: False when it ended because it was stopped, True when it
    stopped anyway (logged, ``on_down`` called). Raises :class:`StateError`."""
    try:
        await source.run()
    except StateError as exc:  # used out of order: a bug, not an outage
        if on_down is not None:
            on_down()
        log.error("source_failed", source=name, error=str(exc), restarting=False)
        raise
    except RelmonError as exc:
        if source.stopped:
            return False
        log.error("source_failed", source=name, error=str(exc), restarting=True)
    except Exception as exc:  # a bug: logged with its traceback, and restarted all the same
        if source.stopped:
            return False
        log.error(
            "source_failed", source=name, error=type(exc).__name__, restarting=True, exc_info=exc
        )
    else:
        if source.stopped:
            return False
        log.error("source_failed", source=name, error="run() returned", restarting=True)
    if on_down is not None:
        on_down()
    return True


async def _restart(
    source: Source,
    name: str,
    delay: float,
    max_delay_s: float,
    explain: Callable[[], Awaitable[str | None]] | None,
) -> bool:
    """Try :meth:`Source.restart` after ``delay`` s, then doubling, until it works
    (True) or the source is stopped meanwhile (False)."""
    explained = explain is None
    while True:
        await asyncio.sleep(delay)
        if source.stopped:
            return False
        try:
            await source.restart()
            return True
        except StateError:
            raise  # restart before start: a bug in the wiring (see supervise)
        except Exception as exc:
            error = str(exc) if isinstance(exc, RelmonError) else type(exc).__name__
            log.warning("source_restart_failed", source=name, error=error)
        delay = min(2 * delay, max_delay_s)
        if not explained and explain is not None:
            explained = True
            problem = await explain()
            if problem is not None:
                log.error("source_unreachable", source=name, why=problem)
