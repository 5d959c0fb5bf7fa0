"""The one way a test waits: poll an observable condition until it holds, or fail.

A fixed sleep is either too short on a loaded machine (a flaky test) or too long
everywhere else (a slow suite). Every wait in the tests goes through here instead:

- :func:`wait_until` (async) and :func:`wait_until_sync` poll ``predicate`` until it is
  true; after ``timeout_s`` they raise :class:`WaitError` (an ``AssertionError``) that
  says what was awaited. ``alive=proc`` fails at once, with the exit status, when the
  process the condition depends on has exited; ``ignore=(OSError,)`` counts those
  exceptions as "not yet" (the last one is named if the wait fails); ``detail`` adds
  text to the failure (a log's tail).
- :func:`accepts_tcp` and :func:`answers_http` build the predicates most waits need.
- :func:`hold_still` lets real time pass when time passing *is* the behaviour under
  test and no event can mark it. Each use says why; keep them rare.

A check that something does NOT happen needs no sleep either: send a later marker (an
event, a verdict) through the same path, wait until it has been handled, then assert.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

__all__ = [
    "WaitError",
    "accepts_tcp",
    "answers_http",
    "hold_still",
    "wait_until",
    "wait_until_sync",
]

Predicate = Callable[[], bool | Awaitable[bool]]
"""A condition: a plain callable returning a bool, or one returning an awaitable bool."""
SyncPredicate = Callable[[], bool]


class WaitError(AssertionError):
    """A wait failed: its condition did not hold in time, or its process exited."""


def _detail_text(
    last_error: BaseException | None, polls: int, detail: Callable[[], str] | None
) -> str:
    parts = [f"{polls} checks"]
    if last_error is not None:
        parts.append(f"last error: {type(last_error).__name__}: {last_error}")
    text = "(" + "; ".join(parts) + ")"
    if detail is not None:
        try:
            extra = detail()
        except Exception as exc:  # the failure message must not fail
            extra = f"(detail unavailable: {type(exc).__name__}: {exc})"
        if extra:
            text += "\n" + extra
    return text


def _check_alive(
    alive: subprocess.Popen[Any] | None,
    what: str,
    last_error: BaseException | None,
    polls: int,
    detail: Callable[[], str] | None,
) -> None:
    if alive is not None and alive.poll() is not None:
        raise WaitError(
            f"process exited with status {alive.returncode} while waiting for {what}: "
            f"{str(alive.args)[:200]} {_detail_text(last_error, polls, detail)}"
        )


def _timed_out(
    timeout_s: float,
    what: str,
    last_error: BaseException | None,
    polls: int,
    detail: Callable[[], str] | None,
) -> WaitError:
    return WaitError(
        f"timed out after {timeout_s} s waiting for {what} "
        f"{_detail_text(last_error, polls, detail)}"
    )


async def wait_until(
    predicate: Predicate,
    *,
    timeout_s: float = 30.0,
    what: str,
    interval_s: float = 0.02,
    alive: subprocess.Popen[Any] | None = None,
    ignore: tuple[type[Exception], ...] = (),
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate()`` (a bool, or an awaitable of one) every ``interval_s`` until
    it is true.

    Raises :class:`WaitError` after ``timeout_s`` ("timed out after ... waiting for
    <what>"), and as soon as ``alive`` has exited (with its exit status). Exceptions of the
    types in ``ignore`` count as false; any other exception propagates at once (an
    assertion inside the predicate fails the test then and there).
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    polls = 0
    while True:
        _check_alive(alive, what, last_error, polls, detail)
        polls += 1
        try:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
        except ignore as exc:
            last_error, result = exc, False
        if result:
            return
        if time.monotonic() >= deadline:
            raise _timed_out(timeout_s, what, last_error, polls, detail) from last_error
        await asyncio.sleep(interval_s)


def wait_until_sync(
    predicate: SyncPredicate,
    *,
    timeout_s: float = 30.0,
    what: str,
    interval_s: float = 0.05,
    alive: subprocess.Popen[Any] | None = None,
    ignore: tuple[type[Exception], ...] = (),
    detail: Callable[[], str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """:func:`wait_until` for synchronous tests (subprocess helpers, browser tests).

    ``sleep`` passes the time between checks: Playwright's sync API delivers a page's
    events (``page.on("request", ...)``) only inside its own calls, so a predicate over
    them needs ``sleep=lambda s: page.wait_for_timeout(s * 1000)``.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    polls = 0
    while True:
        _check_alive(alive, what, last_error, polls, detail)
        polls += 1
        try:
            result = predicate()
        except ignore as exc:
            last_error, result = exc, False
        if result:
            return
        if time.monotonic() >= deadline:
            raise _timed_out(timeout_s, what, last_error, polls, detail) from last_error
        sleep(interval_s)


def accepts_tcp(port: int, host: str = "127.0.0.1") -> Callable[[], Awaitable[bool]]:
    """A predicate: ``host:port`` accepts a TCP connection now."""

    async def check() -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    return check


def answers_http(
    url: str, status: int = 200, *, timeout_s: float = 10.0
) -> Callable[[], Awaitable[bool]]:
    """A predicate: ``GET url`` answers ``status`` now (no answer at all counts as false)."""

    async def check() -> bool:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
                session.get(url) as resp,
            ):
                return resp.status == status
        except (aiohttp.ClientError, TimeoutError):
            return False

    return check


async def hold_still(seconds: float, *, why: str) -> None:
    """Let ``seconds`` of real time pass: only where time passing is itself what a test
    checks and no event marks it. ``why`` says so at the call site (and in tracebacks)."""
    assert why, "hold_still needs a reason"
    await asyncio.sleep(seconds)
