"""One relmon proxy in front of two upstreams (``traffic.routes``): the official OpenAI SDK
reaches the default upstream, the official Anthropic SDK the one its route names; each
SDK parses its own upstream's answer, relmon samples and scores both, and its metrics
count each request under its route. With routes only (no ``upstream_url``), a request
no route takes is answered 404 and counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest

from tests.apis_e2e.conftest import PROD_KEY, TASK_KEYS, api_task, relmon, review_item, rid, value
from tests.apis_e2e.upstream import Upstream
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
async def anthropic_upstream() -> AsyncIterator[Upstream]:
    server = await Upstream().start()
    try:
        yield server
    finally:
        await server.stop()


def routes(up: Upstream) -> list[dict[str, object]]:
    return [{"name": "anthropic", "match": {"path_prefix": "/v1/messages"}, "upstream_url": up.url}]


@pytest.mark.parametrize("data_plane", ["inline", "process"])
async def test_two_sdks_through_one_proxy_reach_their_own_upstreams(
    tmp_path: Path, upstream: Upstream, anthropic_upstream: Upstream, data_plane: str
) -> None:
    tasks = [api_task("chat", upstream), api_task("messages", anthropic_upstream)]
    async with relmon(
        tmp_path,
        upstream,
        "proxy",
        tasks,
        routes=routes(anthropic_upstream),
        data_plane=data_plane,
    ) as r:
        oa = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key=PROD_KEY, max_retries=0)
        an = anthropic.AsyncAnthropic(base_url=r.url, api_key=PROD_KEY, max_retries=0)
        try:
            chat = await oa.chat.completions.create(
                model="gpt-4.1",
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                extra_headers=rid("route-chat"),
            )
            message = await an.messages.create(
                model="claude-haiku-4-5",
                max_tokens=64,
                messages=[{"role": "user", "content": "What is the capital of Kenya?"}],
                extra_headers=rid("route-anth"),
            )
            models = await oa.models.list()  # no route: the default upstream's
        finally:
            await oa.close()
            await an.close()
        assert chat.choices[0].message.content == "Paris"
        assert message.content[0].text == "Nairobi"  # type: ignore[union-attr]
        assert [m.id for m in models.data]
        # Each production request reached its own upstream only.
        assert len(upstream.received("/v1/chat/completions", key=PROD_KEY)) == 1
        assert upstream.received("/v1/messages", key=PROD_KEY) == []
        assert len(anthropic_upstream.received("/v1/messages", key=PROD_KEY)) == 1
        assert anthropic_upstream.received("/v1/chat/completions") == []
        assert anthropic_upstream.received("/v1/models") == []
        # Both sampled and scored; each re-ask went to its task's endpoint, never a route.
        assert (await review_item(r.running, "chat", "route-chat")).candidates[0][0] == "paris"
        item = await review_item(r.running, "messages", "route-anth")
        assert item.candidates[0][0] == "nairobi"  # the text canonicalizer
        assert anthropic_upstream.received("/v1/messages", key=TASK_KEYS["messages"])
        assert upstream.received("/v1/messages", key=TASK_KEYS["messages"]) == []

        def by_route(route: str) -> float:
            name = "relmon_proxy_requests_total"
            return value(r.running, name, route=route, status_class="2xx")

        async def counted() -> bool:
            return by_route("default") == 2 and by_route("anthropic") == 1

        await wait_until(counted, timeout_s=10, what="the proxy counted every request by route")
        assert (by_route("default"), by_route("anthropic")) == (2, 1)
        for api in ("openai.chat", "anthropic.messages"):
            assert value(r.running, "relmon_traffic_requests_total", source="proxy", api=api) == 1


async def test_with_routes_only_a_request_no_route_takes_is_refused(
    tmp_path: Path, upstream: Upstream, anthropic_upstream: Upstream
) -> None:
    tasks = [api_task("messages", anthropic_upstream)]
    async with relmon(
        tmp_path, upstream, "proxy", tasks, routes=routes(anthropic_upstream), upstream_url=None
    ) as r:
        async with aiohttp.ClientSession() as http:
            async with http.post(r.url + "/v1/chat/completions", json={"model": "m"}) as resp:
                assert resp.status == 404
                body = await resp.json()
            async with http.post(
                r.url + "/v1/messages",
                json={"model": "claude-haiku-4-5", "max_tokens": 8, "messages": []},
                headers={"x-api-key": PROD_KEY, "anthropic-version": "2023-06-01"},
            ) as resp:
                assert resp.status == 200
        assert "traffic.routes" in body["error"]["message"]
        assert upstream.received("/v1/chat/completions") == []
        assert value(r.running, "relmon_proxy_unrouted_requests_total") == 1
        assert (
            value(r.running, "relmon_proxy_requests_total", route="anthropic", status_class="2xx")
            == 1
        )
