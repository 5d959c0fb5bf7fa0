"""Bad bytes are counted rejections, never errors (docs/security.md): through relmon's
real proxy, a burst of requests whose bodies are not UTF-8 is relayed, rejected as "not
valid Unicode", and logs no error line and only a few rate-limited warnings, each with
the count it held back; a response that is not UTF-8 loses only the served answer (the
event is still monitored), as a response cut short does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from adapters.traffic.intake import NOT_UNICODE
from tests.apis_e2e import bodies
from tests.apis_e2e.conftest import (
    PROD_KEY,
    TASK_KEYS,
    api_task,
    relmon,
    review_item,
    rid,
    value,
)
from tests.apis_e2e.upstream import Upstream
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BURST = 2000
NOT_UTF8 = b'{"model":"gpt-4.1","messages":[{"role":"user","content":"Capital of Per\xfa?"}]}'
"""A chat request whose text is Latin-1, not UTF-8 (``\\xfa``: "ú")."""


async def test_a_burst_of_requests_that_are_not_utf8_is_counted_not_logged(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with relmon(tmp_path, upstream, "proxy", [api_task("chat", upstream)]) as r:
        url = r.url + "/v1/chat/completions"
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {PROD_KEY}"}
        statuses: list[int] = []
        with capture_logs() as logs:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as s:

                async def send(i: int) -> None:
                    async with s.post(url, data=NOT_UTF8, headers=headers | rid(f"b-{i}")) as resp:
                        await resp.read()
                        statuses.append(resp.status)

                for start in range(0, BURST, 200):
                    await asyncio.gather(*(send(i) for i in range(start, start + 200)))
            await r.running.sync_traffic()
            rejected = value(
                r.running, "relmon_traffic_events_total", source="proxy", decision="rejected"
            )
    assert statuses == [200] * BURST  # relayed: the upstream's own answer, every time
    assert len(upstream.received(key=PROD_KEY)) == BURST
    assert upstream.received(key=TASK_KEYS["chat"]) == []  # nothing re-asked
    assert rejected == BURST
    errors = [e for e in logs if e.get("log_level") in ("error", "critical", "exception")]
    assert errors == []
    assert not [e for e in logs if "internal error" in json.dumps(e, default=str)]
    warnings = [e for e in logs if e.get("log_level") == "warning"]
    assert warnings and all(e["event"] == "event_rejected" for e in warnings)
    assert all(e["reason"] == NOT_UNICODE for e in warnings)
    assert len(warnings) <= 5  # one per reason per 10 s, not one per request
    held = sum(e.get("suppressed", 0) for e in warnings)
    assert all("suppressed" in e for e in warnings[1:])
    assert len(warnings) + held <= BURST


# --- a response that is not UTF-8 -------------------------------------------------------


@pytest.fixture
async def latin1_upstream() -> AsyncIterator[str]:
    """A chat upstream that answers production (its key) in Latin-1 bytes, JSON or SSE,
    and relmon's re-asks (the task's key) in proper UTF-8 JSON."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if request.headers.get("Authorization") == f"Bearer {TASK_KEYS['chat']}":
            doc = bodies.chat_json("Lima", body.get("model", "gpt-4.1"))
            return web.json_response(doc)
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            delta = b'{"choices":[{"index":0,"delta":{"content":"Lim\xe1"}}]}'
            await resp.write(b"data: " + delta + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        raw = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"Lim\xe1"}}]}'
        return web.Response(body=raw, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_response_that_is_not_utf8_loses_only_the_served_answer(
    tmp_path: Path, latin1_upstream: str, stream: bool
) -> None:
    port = int(latin1_upstream.rsplit(":", 1)[1])
    up = Upstream(port=port)  # not started: its url is the Latin-1 upstream's
    task = api_task("chat", up)  # re-asks go to the same server, with the task's key
    body: dict[str, Any] = {
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": "Capital of Peru?"}],
    }
    if stream:
        body["stream"] = True
    with capture_logs() as logs:
        async with relmon(tmp_path, up, "proxy", [task]) as r:
            headers = rid("latin1") | {"Authorization": f"Bearer {PROD_KEY}"}
            async with (
                aiohttp.ClientSession() as session,
                session.post(r.url + "/v1/chat/completions", json=body, headers=headers) as resp,
            ):
                assert resp.status == 200
                assert b"Lim\xe1" in await resp.read()  # relayed as the upstream sent it
            item = await review_item(r.running, "chat", "latin1")
            rejected = value(
                r.running, "relmon_traffic_events_total", source="proxy", decision="rejected"
            )
    assert rejected == 0
    assert item.served_rank is None  # no served answer: only that is lost
    assert item.candidates[0][0] == "lima"  # the item itself was re-asked and scored
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")]
