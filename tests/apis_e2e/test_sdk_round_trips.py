"""The official SDKs (``openai``: chat, ``responses``, ``completions``; ``anthropic``;
``google-genai``) through relmon's proxy to an upstream that answers in each API's
documented shapes, JSON and SSE: each SDK parses what the upstream sent (the proxy is
transparent), relmon samples the request, re-asks it in the same API with the task's
key, scores it (a review item naming the API), and counts it by API. Then the mirror:
each API's request body posted as a mirrored copy, re-asked in its API.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from google.genai import types as gtypes

from adapters.traffic.messages import answer_text
from monitor.core.apis.registry import get_api
from monitor.core.apis.sse import sse_payloads
from monitor.core.review import ReviewItem
from tests.apis_e2e import bodies
from tests.apis_e2e.conftest import (
    APIS,
    MODELS,
    PROD_KEY,
    TASK_KEYS,
    Relmon,
    gemini_client,
    reask_calls,
    relmon,
    review_item,
    rid,
    value,
)
from tests.apis_e2e.upstream import MODELS_LIST, Upstream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REASK_PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "gemini": "/v1beta/models/gemini-2.0-flash:generateContent",
    "completions": "/v1/completions",
}


@pytest.fixture
async def proxied(tmp_path: Path, upstream: Upstream) -> AsyncIterator[Relmon]:
    async with relmon(tmp_path, upstream, "proxy") as r:
        yield r


async def scored(r: Relmon, up: Upstream, task: str, rids: dict[str, str]) -> list[ReviewItem]:
    """Each request ``rids`` (id -> expected answer) was sampled, re-asked in its own API
    with the task's key (never streamed, never production's key), and scored with the
    expected answer on top; the proxy counted the requests under the API."""
    api = APIS[task]
    ks = 0
    items = []
    for request_id, answer in rids.items():
        item = await review_item(r.running, task, request_id)
        items.append(item)
        assert item.api == api
        assert item.candidates[0][0].lower() == answer.lower(), item.candidates
        assert item.candidates[0][1] == item.k >= 3
        ks += reask_calls(item)
    reasks = up.received(REASK_PATHS[task], key=TASK_KEYS[task])
    assert len(reasks) == ks
    for got in reasks:
        assert got.query == ""
        assert PROD_KEY not in json.dumps(got.headers)
        assert not got.body.get("stream")
    sampled = value(r.running, "relmon_traffic_events_total", source="proxy", decision="sampled")
    assert sampled == len(rids)
    counted = value(r.running, "relmon_traffic_requests_total", source="proxy", api=api)
    assert counted == len(rids)
    return items


def production(up: Upstream, path: str) -> list[bytes]:
    """The bodies the upstream answered the production requests to ``path`` with."""
    return up.answered(path, key=PROD_KEY)


def served(up: Upstream, path: str, task: str) -> list[str | None]:
    """What relmon reads as the served answer of each body the upstream sent to ``path``
    (the bytes the client got through the proxy)."""
    out = []
    for body in up.answered(path, key=PROD_KEY):
        sse = body.startswith((b"data:", b"event:"))
        kind = "text/event-stream" if sse else "application/json"
        out.append(answer_text(body, {"Content-Type": kind}, get_api(APIS[task])))
    return out


async def test_openai_chat_json_and_stream(proxied: Relmon, upstream: Upstream) -> None:
    client = openai.AsyncOpenAI(base_url=proxied.url + "/v1", api_key=PROD_KEY, max_retries=0)
    try:
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4.1", messages=ask, temperature=0, extra_headers=rid("chat-json")
        )
        completion = raw.parse()
        assert completion.choices[0].message.content == "Paris"
        assert raw.http_response.content == production(upstream, "/v1/chat/completions")[0]
        assert raw.http_response.headers["x-up"] == "1"  # the upstream's own header
        ask = [{"role": "user", "content": "And the capital of Italy?"}]
        stream = await client.chat.completions.create(
            model="gpt-4.1", messages=ask, stream=True, extra_headers=rid("chat-sse")
        )
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Rome"
    sent = sse_payloads(production(upstream, "/v1/chat/completions")[1])
    assert [c.to_dict() for c in chunks] == sent
    assert served(upstream, "/v1/chat/completions", "chat") == ["Paris", "Rome"]
    await scored(proxied, upstream, "chat", {"chat-json": "Paris", "chat-sse": "Rome"})


async def test_openai_responses_json_and_stream(proxied: Relmon, upstream: Upstream) -> None:
    client = openai.AsyncOpenAI(base_url=proxied.url + "/v1", api_key=PROD_KEY, max_retries=0)
    try:
        raw = await client.responses.with_raw_response.create(
            model="gpt-4.1-mini",
            instructions="Answer with one word.",
            input="What is the capital of Japan?",
            extra_headers=rid("resp-json"),
        )
        assert raw.parse().output_text == "Tokyo"
        assert raw.http_response.content == production(upstream, "/v1/responses")[0]
        stream = await client.responses.create(
            model="gpt-4.1-mini",
            input=[{"role": "user", "content": "What is the capital of Spain?"}],
            stream=True,
            extra_headers=rid("resp-sse"),
        )
        events = [event async for event in stream]
    finally:
        await client.close()
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Madrid"
    assert events[-1].response.output_text == "Madrid"  # type: ignore[union-attr]
    assert [e.to_dict() for e in events] == sse_payloads(production(upstream, "/v1/responses")[1])
    assert served(upstream, "/v1/responses", "responses") == ["Tokyo", "Madrid"]
    items = await scored(
        proxied, upstream, "responses", {"resp-json": "Tokyo", "resp-sse": "Madrid"}
    )
    for item in items:  # production left store to its default, true
        assert item.reask_changes["store"]["to"] is False


async def test_openai_completions_json_and_stream(proxied: Relmon, upstream: Upstream) -> None:
    client = openai.AsyncOpenAI(base_url=proxied.url + "/v1", api_key=PROD_KEY, max_retries=0)
    try:
        raw = await client.completions.with_raw_response.create(
            model="gpt-3.5-turbo-instruct",
            prompt="Q: What is the capital of Peru?\nA:",
            max_tokens=8,
            extra_headers=rid("cmpl-json"),
        )
        assert raw.parse().choices[0].text == "Lima"
        assert raw.http_response.content == production(upstream, "/v1/completions")[0]
        stream = await client.completions.create(
            model="gpt-3.5-turbo-instruct",
            prompt="Q: What is the capital of Egypt?\nA:",
            stream=True,
            extra_headers=rid("cmpl-sse"),
        )
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    assert "".join(c.choices[0].text for c in chunks) == "Cairo"
    assert [c.to_dict() for c in chunks] == sse_payloads(production(upstream, "/v1/completions")[1])
    assert served(upstream, "/v1/completions", "completions") == ["Lima", "Cairo"]
    await scored(proxied, upstream, "completions", {"cmpl-json": "Lima", "cmpl-sse": "Cairo"})


async def test_anthropic_messages_json_and_stream(proxied: Relmon, upstream: Upstream) -> None:
    client = anthropic.AsyncAnthropic(base_url=proxied.url, api_key=PROD_KEY, max_retries=0)
    try:
        raw = await client.messages.with_raw_response.create(
            model="claude-haiku-4-5",
            max_tokens=64,
            system="Answer with one word.",
            messages=[{"role": "user", "content": "What is the capital of Kenya?"}],
            extra_headers=rid("anth-json"),
        )
        message = await raw.parse()
        assert [b.type for b in message.content] == ["text"]
        assert message.content[0].text == "Nairobi"  # type: ignore[union-attr]
        assert raw.http_response.content == production(upstream, "/v1/messages")[0]
        async with client.messages.stream(
            model="claude-haiku-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "What is the capital of Germany?"}],
            extra_headers=rid("anth-sse"),
        ) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
    finally:
        await client.close()
    assert "".join(texts) == "Berlin"
    assert final.content[0].text == "Berlin"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    sent = sse_payloads(production(upstream, "/v1/messages")[1])
    assert [e["type"] for e in sent][:3] == ["message_start", "content_block_start", "ping"]
    assert sent[-1]["type"] == "message_stop"
    assert served(upstream, "/v1/messages", "messages") == ["Nairobi", "Berlin"]
    await scored(proxied, upstream, "messages", {"anth-json": "Nairobi", "anth-sse": "Berlin"})


async def test_gemini_json_and_stream(proxied: Relmon, upstream: Upstream) -> None:
    async with gemini_client(proxied.url) as client:
        config = gtypes.GenerateContentConfig(
            system_instruction="Answer with one word.",
            http_options=gtypes.HttpOptions(headers=rid("gem-json")),
        )
        response = await client.aio.models.generate_content(
            model="gemini-2.0-flash", contents="What is the capital of France?", config=config
        )
        assert response.text == "Paris"
        sent = json.loads(production(upstream, "/v1beta/models/")[0])
        parsed = response.model_dump(mode="json", by_alias=True, exclude_none=True)
        for added in ("sdkHttpResponse", "automaticFunctionCallingHistory"):  # the SDK's own
            parsed.pop(added, None)
        assert parsed == sent
        assert response.candidates[0].finish_reason == gtypes.FinishReason.STOP  # type: ignore[index]
        assert sent["candidates"][0]["content"]["parts"] == [{"text": "Paris"}]
        config = gtypes.GenerateContentConfig(
            http_options=gtypes.HttpOptions(headers=rid("gem-sse"))
        )
        stream = await client.aio.models.generate_content_stream(
            model="gemini-2.0-flash", contents="What is the capital of Italy?", config=config
        )
        chunks = [chunk async for chunk in stream]
    assert "".join(c.text or "" for c in chunks) == "Rome"
    assert len(chunks) == len(sse_payloads(production(upstream, "/v1beta/models/")[1])) == 2
    asked = upstream.received("/v1beta/models/", key=PROD_KEY)
    assert [(p.path.rsplit(":", 1)[1], p.query) for p in asked] == [
        ("generateContent", ""),
        ("streamGenerateContent", "alt=sse"),
    ]
    assert served(upstream, "/v1beta/models/", "gemini") == ["Paris", "Rome"]
    await scored(proxied, upstream, "gemini", {"gem-json": "Paris", "gem-sse": "Rome"})


async def test_gemini_sdk_default_version_is_re_asked_under_that_version(
    proxied: Relmon, upstream: Upstream
) -> None:
    async with gemini_client(proxied.url, api_version=None) as client:
        config = gtypes.GenerateContentConfig(
            http_options=gtypes.HttpOptions(headers=rid("gem-v1"))
        )
        response = await client.aio.models.generate_content(
            model="gemini-2.0-flash", contents="What is the capital of Peru?", config=config
        )
    assert response.text == "Lima"
    path = "/v1/models/gemini-2.0-flash:generateContent"  # google-genai 3.x's default
    assert [g.path for g in upstream.received(key=PROD_KEY)] == [path]
    item = await review_item(proxied.running, "gemini", "gem-v1")
    reasks = upstream.received(key=TASK_KEYS["gemini"])
    assert [g.path for g in reasks] == [path] * reask_calls(item)


async def test_a_get_of_models_is_relayed_and_counted_unmonitored(
    proxied: Relmon, upstream: Upstream
) -> None:
    client = openai.AsyncOpenAI(base_url=proxied.url + "/v1", api_key=PROD_KEY, max_retries=0)
    try:
        models = await client.models.list()
    finally:
        await client.close()
    assert [m.id for m in models.data] == [m["id"] for m in MODELS_LIST["data"]]
    assert [(g.method, g.path) for g in upstream.requests] == [("GET", "/v1/models")]
    running = proxied.running
    assert value(running, "relmon_traffic_requests_total", source="proxy", api="unmonitored") == 1
    events = value(running, "relmon_traffic_events_total", source="proxy", decision="unmonitored")
    assert events == 1
    for api in APIS.values():
        assert value(running, "relmon_traffic_requests_total", source="proxy", api=api) == 0


NOT_MODEL_CALLS = (
    ("POST", "/v1/embeddings", {"model": "text-embedding-3-small", "input": "France"}),
    ("POST", "/v1/threads/thread_1/messages", {"role": "user", "content": "Capital of France?"}),
    ("POST", "/v1/messages/count_tokens", {"model": "claude-haiku-4-5", "messages": []}),
    ("POST", "/v1beta/models/gemini-2.0-flash:countTokens", {"contents": []}),
    ("POST", "/v1/responses/input_tokens", {"model": "gpt-4.1-mini", "input": "France?"}),
    ("GET", "/v1/responses/resp_1", None),
)


async def test_other_endpoints_of_the_apis_are_relayed_and_counted_unmonitored(
    proxied: Relmon, upstream: Upstream
) -> None:
    async with aiohttp.ClientSession() as session:
        for method, path, body in NOT_MODEL_CALLS:
            async with session.request(
                method, proxied.url + path, json=body, headers=rid(f"other-{path}")
            ) as resp:
                assert resp.status == 200 and (await resp.json())["path"] == path
    assert [(g.method, g.path) for g in upstream.requests] == [
        (method, path) for method, path, _ in NOT_MODEL_CALLS
    ]
    await proxied.running.sync_traffic()
    running = proxied.running
    requests = {
        api: value(running, "relmon_traffic_requests_total", source="proxy", api=api)
        for api in (*APIS.values(), "unmonitored")
    }
    assert requests == dict.fromkeys(APIS.values(), 0) | {"unmonitored": len(NOT_MODEL_CALLS)}
    events = {
        d: value(running, "relmon_traffic_events_total", source="proxy", decision=d)
        for d in ("unmonitored", "rejected", "sampled")
    }
    assert events == {"unmonitored": len(NOT_MODEL_CALLS), "rejected": 0, "sampled": 0}


# --- the mirror -------------------------------------------------------------------------

MIRRORED: dict[str, tuple[str, dict[str, Any], Any]] = {
    "chat": (
        "/v1/chat/completions",
        {"model": "gpt-4.1", "messages": [{"role": "user", "content": "Capital of Peru?"}]},
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Lima"}}]},
    ),
    "responses": (
        "/v1/responses",
        {"model": "gpt-4.1-mini", "input": "Capital of Egypt?", "store": True},
        {
            "object": "response",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Cairo", "annotations": []}],
                }
            ],
        },
    ),
    "messages": (
        "/v1/messages",
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 32,
            "messages": [{"role": "user", "content": "Capital of Kenya?"}],
            "stream": True,
        },
        b"".join(bodies.message_sse("Nairobi", "claude-haiku-4-5")).decode(),
    ),
    "gemini": (
        "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
        {"contents": [{"role": "user", "parts": [{"text": "Capital of Japan?"}]}]},
        'data: {"candidates": [{"content": {"role": "model", "parts": [{"text": "Tokyo"}]}, '
        '"finishReason": "STOP", "index": 0}]}\r\n\r\n',
    ),
    "completions": (
        "/v1/completions",
        {"model": "gpt-3.5-turbo-instruct", "prompt": "Capital of Spain?", "seed": 3},
        {"object": "text_completion", "choices": [{"index": 0, "text": "Madrid"}]},
    ),
}
EXPECTED = {"chat": "Lima", "responses": "Cairo", "messages": "Nairobi", "gemini": "Tokyo"}
EXPECTED["completions"] = "Madrid"


async def test_the_mirror_re_asks_each_api_in_that_api(tmp_path: Path, upstream: Upstream) -> None:
    async with relmon(tmp_path, upstream, "mirror") as r:
        async with aiohttp.ClientSession() as session:
            for task, (path, body, logged) in MIRRORED.items():
                doc = body if logged is None else body | {"response": logged}
                headers = rid(f"mirror-{task}") | {"Authorization": f"Bearer {PROD_KEY}"}
                async with session.post(r.url + path, json=doc, headers=headers) as resp:
                    assert resp.status == 202, await resp.text()
        for task in MIRRORED:
            item = await review_item(r.running, task, f"mirror-{task}")
            assert item.api == APIS[task]
            assert item.candidates[0][0].lower() == EXPECTED[task].lower()
            reasks = upstream.received(REASK_PATHS[task], key=TASK_KEYS[task])
            assert len(reasks) == reask_calls(item), task
            counted = value(
                r.running, "relmon_traffic_requests_total", source="mirror", api=APIS[task]
            )
            assert counted == 1, task
        assert upstream.received(key=PROD_KEY) == []  # the mirror forwards nothing
        assert {g.key() for g in upstream.requests} <= set(TASK_KEYS.values())
        seen = json.dumps([(g.path, g.body) for g in upstream.requests])
        assert all(model in seen for model in MODELS.values())
