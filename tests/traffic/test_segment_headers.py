"""A task that segments by a header (``tasks[].segments.by.header``) sees that header on
the events of the mirror and of the inline proxy, real servers on 127.0.0.1: the event
keeps it (and no other header, never a credential); the proxy relays the request as
before."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from monitor.core.apis.registry import capture_headers
from tests.waiting import wait_until

from .conftest import COMPLETION_BYTES, Recorder, StartTraffic, Upstream

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "What is 6*7?"}]}
HEADERS = {"X-Tenant": "acme", "Authorization": "Bearer sk-test", "X-Other": "no"}


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def test_the_mirror_and_the_proxy_keep_a_segment_header_on_the_event(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    capture_headers(["X-Tenant"])  # what the service does for such a task at start
    for mode in ("mirror", "proxy"):
        recorder = Recorder()
        server = await start_traffic(mode, recorder, upstream_url=upstream.url)
        url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
        async with client.post(url, json=CHAT, headers=HEADERS) as r:
            assert r.status == (202 if mode == "mirror" else 200)
            if mode == "proxy":
                assert await r.read() == COMPLETION_BYTES
        events = recorder.events
        await wait_until(lambda: len(events) == 1, what="the event at the sink")  # noqa: B023
        event, source = events[0]
        assert source == mode
        assert event.headers == (("x-tenant", "acme"),)
