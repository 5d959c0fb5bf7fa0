"""The proxy facing a hostile or broken upstream: an answer nested too deeply for
``json`` and a gzip bomb are relayed unchanged to the client and still sampled (without
an answer text), with no exception escaping the handler."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from adapters.traffic.messages import decoded as _decoded
from adapters.traffic.traffic import TrafficServer
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission
from tests.waiting import wait_until

DEEP = b'{"choices": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
BOMB = gzip.compress(b"0" * (64 * 1_048_576), compresslevel=9)  # 64 MiB of zeros, ~64 KiB


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    async def deep(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=DEEP, content_type="application/json")

    async def bomb(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(
            body=BOMB, content_type="application/json", headers={"Content-Encoding": "gzip"}
        )

    app = web.Application()
    app.router.add_post("/deep/v1/chat/completions", deep)
    app.router.add_post("/bomb/v1/chat/completions", bomb)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("prefix", "body"), [("/deep", DEEP), ("/bomb", BOMB)])
async def test_hostile_answers_are_relayed_and_sampled_without_text(
    upstream: str, prefix: str, body: bytes
) -> None:
    events: list[TrafficEvent] = []
    rejects: list[tuple[str, str]] = []

    def sink(event: TrafficEvent, source: str) -> Admission:
        events.append(event)
        return Admission("skipped")

    server = TrafficServer(
        sink=sink,
        reject=lambda source, reason: rejects.append((source, reason)),
        task_resolver=lambda h, p, b: None,
        mode="proxy",
        port=0,
        upstream_url=upstream,
        max_body_bytes=1_048_576,
    )
    await server.start()
    try:
        request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.post(
                f"http://127.0.0.1:{server.bound_port}{prefix}/v1/chat/completions",
                data=json.dumps(request),
                headers={"X-Request-Id": f"up{prefix[1:]}"},
            ) as resp,
        ):
            assert resp.status == 200
            assert await resp.read() == body  # unchanged
        await wait_until(lambda: bool(events or rejects), what="the event or its rejection")
    finally:
        await server.stop()
    assert rejects == []
    [event] = events
    assert event.id == f"up{prefix[1:]}" and event.response_text is None


def test_inflating_stops_at_the_cap() -> None:
    assert _decoded(BOMB, "gzip") is None
    small = zlib.compress(b'{"ok": 1}')
    assert _decoded(small, "deflate") == b'{"ok": 1}'
    assert _decoded(gzip.compress(b"x" * 1000)[:-8], "gzip") is None  # truncated
