"""tests/waiting.py, the one wait helper of the suite: it returns as soon as the condition
holds, fails with what it waited for, fails early when the process it depends on exits,
and counts only the exceptions it is told to as "not yet"."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from aiohttp import web

from tests.waiting import (
    WaitError,
    accepts_tcp,
    answers_http,
    hold_still,
    wait_until,
    wait_until_sync,
)


async def test_returns_once_a_plain_or_async_predicate_holds() -> None:
    calls: list[int] = []

    def third_time() -> bool:
        calls.append(1)
        return len(calls) >= 3

    await wait_until(third_time, what="the third call", interval_s=0)
    assert len(calls) == 3

    async def at_once() -> bool:
        await asyncio.sleep(0)
        return True

    await wait_until(at_once, what="an async predicate")


async def test_times_out_saying_what_it_waited_for() -> None:
    with pytest.raises(WaitError, match=r"^timed out after 0\.05 s waiting for nothing \("):
        await wait_until(lambda: False, timeout_s=0.05, what="nothing", interval_s=0.01)
    assert issubclass(WaitError, AssertionError)  # a failed test, not an error


async def test_ignored_exceptions_are_not_yet_and_named_others_propagate() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("not listening")

    with pytest.raises(WaitError, match="last error: ConnectionRefusedError: not listening"):
        await wait_until(refused, timeout_s=0.05, what="x", interval_s=0.01, ignore=(OSError,))
    with pytest.raises(ConnectionRefusedError):
        await wait_until(refused, what="x")


async def test_detail_is_added_to_the_failure() -> None:
    with pytest.raises(WaitError, match="the log says why"):
        await wait_until(lambda: False, timeout_s=0, what="x", detail=lambda: "the log says why")


async def test_fails_at_once_when_the_process_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])  # noqa: ASYNC220
    try:
        with pytest.raises(WaitError, match="process exited with status 3 while waiting for x"):
            await wait_until(lambda: False, timeout_s=60, what="x", alive=proc)
    finally:
        proc.wait()


def test_sync_variant_uses_the_sleep_it_is_given() -> None:
    slept: list[float] = []
    checks = iter([False, False, True])
    wait_until_sync(lambda: next(checks), what="x", interval_s=0.5, sleep=slept.append)
    assert slept == [0.5, 0.5]
    with pytest.raises(WaitError, match=r"^timed out after 0 s waiting for y"):
        wait_until_sync(lambda: False, timeout_s=0, what="y", sleep=slept.append)


async def test_hold_still_needs_a_reason() -> None:
    await hold_still(0, why="a test of hold_still")
    with pytest.raises(AssertionError, match="needs a reason"):
        await hold_still(0, why="")


async def test_tcp_and_http_predicates() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/ok", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        assert await accepts_tcp(port)()
        assert await answers_http(f"http://127.0.0.1:{port}/ok")()
        assert not await answers_http(f"http://127.0.0.1:{port}/missing")()
    finally:
        await runner.cleanup()
    assert not await accepts_tcp(port)()
    assert not await answers_http(f"http://127.0.0.1:{port}/ok")()
