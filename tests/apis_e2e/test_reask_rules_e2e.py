"""A re-ask as the upstream received it, per wire API (docs/apis/; DESIGN §5, §6): the
fields kept, dropped and changed, the key and headers it carries and the path it goes
to; the requests that are never re-asked (a Responses ``conversation``, provider-run
tools) and the one a task allows; a ``generic`` agent endpoint resent as it is. The
production requests go through relmon's proxy, sent by the official SDKs.
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
from structlog.testing import capture_logs

from monitor.core.apis.sse import sse_payloads
from monitor.core.review import ReviewItem
from tests.apis_e2e.conftest import (
    APIS,
    MODELS,
    PROD_KEY,
    TASK_KEYS,
    Relmon,
    api_task,
    gemini_client,
    reask_calls,
    relmon,
    review_item,
    rid,
    value,
)
from tests.apis_e2e.upstream import Received, Upstream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GEMINI_QUERY_KEY = "AIzaSyProductionQueryKey0123456789"
ANTHROPIC_BETA = "prompt-caching-2024-07-31"


@pytest.fixture
async def proxied(tmp_path: Path, upstream: Upstream) -> AsyncIterator[Relmon]:
    """The standard tasks; Anthropic's raises temperatures to 1.5 (capped at 1.0)."""
    tasks = [api_task(name, upstream) for name in APIS if name != "messages"]
    tasks.append(api_task("messages", upstream, reask={"min_temperature": 1.5}))
    async with relmon(tmp_path, upstream, "proxy", tasks) as r:
        yield r


def openai_client(r: Relmon) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=r.url + "/v1", api_key=PROD_KEY, max_retries=0)


async def reasks_of(
    r: Relmon, up: Upstream, task: str, request_id: str
) -> tuple[ReviewItem, list[Received]]:
    """The scored review item of ``request_id`` and the re-asks the upstream got for it
    (every call carrying the task's key; one item a test)."""
    item = await review_item(r.running, task, request_id)
    got = up.received(key=TASK_KEYS[task])
    assert len(got) == reask_calls(item) and item.k >= 3
    return item, got


def overrides(r: Relmon, task: str, field: str) -> float:
    labels = {"model": MODELS[task], "task": task, "field": field, "change": "changed"}
    return value(r.running, "relmon_reask_overrides_total", **labels)


def no_stream(got: Received) -> None:
    assert got.body.get("stream") in (None, False)
    assert "stream_options" not in got.body


async def test_responses_store_false_metadata_user_dropped_previous_id_kept(
    proxied: Relmon, upstream: Upstream
) -> None:
    client = openai_client(proxied)
    try:
        stream = await client.responses.create(
            model="gpt-4.1-mini",
            instructions="Answer with one word.",
            input="What is the capital of France?",
            previous_response_id="resp_earlier_turn_1",
            store=True,
            metadata={"customer": "acme-42"},
            temperature=0,
            max_output_tokens=32,
            stream=True,
            extra_body={"user": "user-77"},
            extra_headers=rid("resp-rules"),
        )
        assert [e.type async for e in stream][-1] == "response.completed"
    finally:
        await client.close()
    production = upstream.received("/v1/responses", key=PROD_KEY)[0].body  # as sent
    assert production["store"] is True and production["stream"] is True
    assert production["metadata"] == {"customer": "acme-42"} and production["user"] == "user-77"
    item, reasks = await reasks_of(proxied, upstream, "responses", "resp-rules")
    for got in reasks:
        assert got.path == "/v1/responses"
        assert got.headers["authorization"] == f"Bearer {TASK_KEYS['responses']}"
        assert got.body["store"] is False
        assert "metadata" not in got.body and "user" not in got.body
        assert got.body["previous_response_id"] == "resp_earlier_turn_1"
        assert got.body["temperature"] == 0.5
        assert got.body["instructions"] == "Answer with one word."
        assert got.body["max_output_tokens"] == 32
        assert got.body["model"] == "gpt-4.1-mini"
        no_stream(got)
    changes = item.reask_changes
    assert changes["store"] == {"from": True, "to": False}
    assert changes["temperature"] == {"from": 0, "to": 0.5}
    assert "to" not in changes["metadata"] and "to" not in changes["user"]
    assert "previous_response_id" not in changes
    assert "acme-42" not in json.dumps(item.to_json()) and "user-77" not in json.dumps(changes)
    assert item.query.startswith("Answer with one word.")
    for field in ("store", "metadata", "user", "temperature"):
        assert overrides(proxied, "responses", field) == 1, field


async def test_anthropic_task_key_production_headers_capped_temperature(
    proxied: Relmon, upstream: Upstream
) -> None:
    prod_headers = {"x-api-key": PROD_KEY, "anthropic-beta": ANTHROPIC_BETA}
    client = anthropic.AsyncAnthropic(
        base_url=proxied.url, api_key=PROD_KEY, max_retries=0, default_headers=prod_headers
    )
    try:
        async with client.messages.stream(
            model="claude-haiku-4-5",
            max_tokens=64,
            system="Answer with one word.",
            messages=[{"role": "user", "content": "What is the capital of Italy?"}],
            metadata={"user_id": "customer-4711"},
            extra_body={"temperature": 0.2, "top_k": 5},  # this SDK has no such arguments
            extra_headers=rid("anth-rules"),
        ) as stream:
            assert (await stream.get_final_text()) == "Rome"
    finally:
        await client.close()
    production = upstream.received("/v1/messages", key=PROD_KEY)
    assert len(production) == 1 and production[0].headers["anthropic-beta"] == ANTHROPIC_BETA
    version = production[0].headers["anthropic-version"]
    item, reasks = await reasks_of(proxied, upstream, "messages", "anth-rules")
    for got in reasks:
        assert got.path == "/v1/messages" and got.query == ""
        assert got.headers["x-api-key"] == TASK_KEYS["messages"]
        assert PROD_KEY not in json.dumps(got.headers)
        assert got.headers["anthropic-version"] == version
        assert got.headers["anthropic-beta"] == ANTHROPIC_BETA
        assert got.body["temperature"] == 1.0  # min_temperature 1.5, the API's most: 1.0
        assert "metadata" not in got.body
        assert got.body["top_k"] == 5 and got.body["max_tokens"] == 64
        assert got.body["system"] == "Answer with one word."
        no_stream(got)
    assert item.reask_changes["temperature"] == {"from": 0.2, "to": 1.0}
    assert "to" not in item.reask_changes["metadata"]
    assert "customer-4711" not in json.dumps(item.to_json())


async def test_anthropic_version_defaults_when_production_sent_none(
    proxied: Relmon, upstream: Upstream
) -> None:
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Capital of Peru?"}],
    }
    headers = rid("anth-noversion") | {"x-api-key": PROD_KEY}
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxied.url + "/v1/messages", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["content"][0]["text"] == "Lima"
    _, reasks = await reasks_of(proxied, upstream, "messages", "anth-noversion")
    for got in reasks:
        assert got.headers["anthropic-version"] == "2023-06-01"
        assert "anthropic-beta" not in got.headers
        assert got.headers["x-api-key"] == TASK_KEYS["messages"]
        assert got.body.pop("stream", False) is False
        assert got.body == body  # nothing else to change: sent as production sent it


async def test_gemini_reask_path_key_seed_and_no_query_key_anywhere(
    proxied: Relmon, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    with capture_logs() as logs:
        async with gemini_client(proxied.url) as client:
            config = gtypes.GenerateContentConfig(
                temperature=0.0,
                seed=7,
                top_k=20,
                candidate_count=2,
                max_output_tokens=16,
                http_options=gtypes.HttpOptions(headers=rid("gem-rules")),
            )
            stream = await client.aio.models.generate_content_stream(
                model="gemini-2.0-flash", contents="What is the capital of Japan?", config=config
            )
            assert "".join([c.text or "" async for c in stream]) == "Tokyo"
        item, reasks = await reasks_of(proxied, upstream, "gemini", "gem-rules")
        target = "/v1beta/models/gemini-2.0-flash:streamGenerateContent"
        body = {"contents": [{"role": "user", "parts": [{"text": "Capital of Kenya?"}]}]}
        url = f"{proxied.url}{target}?alt=sse&key={GEMINI_QUERY_KEY}"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=body, headers=rid("gem-query-key")) as resp,
        ):
            assert resp.status == 200
            chunks = sse_payloads(await resp.read())
        assert (
            "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks) == "Nairobi"
        )
        keyed = await review_item(proxied.running, "gemini", "gem-query-key")
    for got in reasks:
        assert got.path == "/v1beta/models/gemini-2.0-flash:generateContent"
        assert got.query == ""
        assert got.headers["x-goog-api-key"] == TASK_KEYS["gemini"]
        config_sent = got.body["generationConfig"]
        assert "seed" not in config_sent
        assert config_sent["temperature"] == 0.5
        assert config_sent["topK"] == 20 and config_sent["maxOutputTokens"] == 16
        assert config_sent.get("candidateCount", 1) == 1
    assert item.reask_changes["generationConfig.seed"] == {"from": 7}
    assert item.reask_changes["generationConfig.temperature"] == {"from": 0, "to": 0.5}
    # The production ?key= reached the upstream (the proxy is transparent), nothing else.
    assert [g.query for g in upstream.received(key=None) if GEMINI_QUERY_KEY in g.query] == [
        f"alt=sse&key={GEMINI_QUERY_KEY}"
    ]
    for got in upstream.received(key=TASK_KEYS["gemini"]):
        assert GEMINI_QUERY_KEY not in got.query + json.dumps(got.headers)
    assert keyed.api == "gemini.generate_content" and keyed.candidates[0][0].lower() == "nairobi"
    assert any(e.get("event") == "item" for e in logs), "no log line captured"
    assert GEMINI_QUERY_KEY not in repr(logs) + caplog.text
    for item_ in (item, keyed):
        assert GEMINI_QUERY_KEY not in json.dumps(item_.to_json())
    for stored in proxied.state_dir.rglob("*"):  # the SQLite file and its WAL
        if stored.is_file():
            assert GEMINI_QUERY_KEY.encode() not in stored.read_bytes(), stored


async def test_completions_seed_and_user_dropped(proxied: Relmon, upstream: Upstream) -> None:
    client = openai_client(proxied)
    try:
        completion = await client.completions.create(
            model="gpt-3.5-turbo-instruct",
            prompt="Q: What is the capital of Egypt?\nA:",
            seed=7,
            user="user-88",
            temperature=0,
            max_tokens=8,
            stop=["\n"],
            n=2,
            best_of=3,
            logprobs=2,
            extra_headers=rid("cmpl-rules"),
        )
    finally:
        await client.close()
    assert completion.choices[0].text == "Cairo"
    item, reasks = await reasks_of(proxied, upstream, "completions", "cmpl-rules")
    for got in reasks:
        assert got.path == "/v1/completions"
        assert "seed" not in got.body and "user" not in got.body
        assert got.body["temperature"] == 0.5
        assert got.body["max_tokens"] == 8 and got.body["stop"] == ["\n"]
        assert got.body["prompt"] == "Q: What is the capital of Egypt?\nA:"
        assert not {"best_of", "logprobs", "echo"} & set(got.body)
        assert got.body.get("n", 1) == 1
        no_stream(got)
    assert set(item.reask_changes) == {"seed", "user", "temperature"}
    assert "to" not in item.reask_changes["seed"] and "to" not in item.reask_changes["user"]


async def test_chat_reask_as_before(proxied: Relmon, upstream: Upstream) -> None:
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    client = openai_client(proxied)
    try:
        stream = await client.chat.completions.create(
            model="gpt-4.1",
            messages=[{"role": "user", "content": "What is the capital of Spain?"}],
            seed=1,
            store=True,
            metadata={"team": "search"},
            temperature=0.1,
            tools=[tool],  # type: ignore[list-item]
            tool_choice="auto",
            max_completion_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"user": "user-99"},
            extra_headers=rid("chat-rules"),
        )
        assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "Madrid"
    finally:
        await client.close()
    item, reasks = await reasks_of(proxied, upstream, "chat", "chat-rules")
    for got in reasks:
        assert not {"seed", "store", "metadata", "user"} & set(got.body)
        assert got.body["temperature"] == 0.5
        assert got.body["tools"] == [tool] and got.body["tool_choice"] == "auto"
        assert got.body["max_completion_tokens"] == 20
        assert got.body.get("n", 1) == 1
        no_stream(got)
    assert {"seed", "store", "metadata", "user", "temperature"} <= set(item.reask_changes)


# --- never re-asked: a conversation, provider-run tools; one allowed by the task ---------


async def test_conversation_and_server_tools_are_not_reasked_unless_allowed(
    tmp_path: Path, upstream: Upstream
) -> None:
    allowed = api_task("responses", upstream) | {
        "name": "search-ok",
        "match": {"header": "search-ok"},
    }
    allowed["endpoint"]["api_key"] = "task-key-search-ok-0007"
    allowed["reask"] = {"server_tools": ["web_search"]}
    tasks = [*(api_task(n, upstream) for n in ("responses", "messages", "gemini")), allowed]
    async with relmon(tmp_path, upstream, "proxy", tasks) as r:
        await _send_not_reasked(r, upstream)
        client = openai_client(r)
        try:  # the same tool, allowed by the task its header names
            await client.responses.create(
                model="gpt-4.1-mini",
                input="What is the capital of Peru?",
                tools=[{"type": "web_search"}],
                extra_headers=rid("ok-web") | {"X-Relmon-Task": "search-ok"},
            )
        finally:
            await client.close()
        item = await review_item(r.running, "search-ok", "ok-web")
        await r.running.sync_traffic()
        reasks = upstream.received(key="task-key-search-ok-0007")
        assert len(reasks) == reask_calls(item) and item.k >= 3
        assert all(g.body["tools"] == [{"type": "web_search"}] for g in reasks)
        for task in ("responses", "messages", "gemini"):
            assert upstream.received(key=TASK_KEYS[task]) == [], f"{task} was re-asked"
        not_reasked = {
            (task, reason): value(
                r.running,
                "relmon_not_reasked_total",
                model=MODELS[task],
                task=task,
                reason=reason,
            )
            for task in ("responses", "messages", "gemini")
            for reason in ("conversation", "server_tool")
        }
        assert not_reasked == {
            ("responses", "conversation"): 1,
            ("responses", "server_tool"): 1,
            ("messages", "conversation"): 0,
            ("messages", "server_tool"): 1,
            ("gemini", "conversation"): 0,
            ("gemini", "server_tool"): 1,
        }
        events = {
            d: value(r.running, "relmon_traffic_events_total", source="proxy", decision=d)
            for d in ("not_reasked", "sampled", "rejected")
        }
        assert events == {"not_reasked": 4, "sampled": 1, "rejected": 0}
        assert await r.running.store.get_review_item("responses:nr-conversation") is None


async def _send_not_reasked(r: Relmon, up: Upstream) -> None:
    """A Responses request in a conversation, and one with a provider tool in each of
    Responses, Anthropic and Gemini; each answered through the proxy as usual."""
    client = openai_client(r)
    try:
        answer = await client.responses.create(
            model="gpt-4.1-mini",
            input="What is the capital of France?",
            conversation="conv_user_thread_1",
            extra_headers=rid("nr-conversation"),
        )
        assert answer.output_text == "Paris"
        answer = await client.responses.create(
            model="gpt-4.1-mini",
            input="What is the capital of Italy?",
            tools=[{"type": "web_search"}],
            extra_headers=rid("nr-web-search"),
        )
        assert answer.output_text == "Rome"
    finally:
        await client.close()
    claude = anthropic.AsyncAnthropic(base_url=r.url, api_key=PROD_KEY, max_retries=0)
    try:
        message = await claude.messages.create(
            model="claude-haiku-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "What is the capital of Japan?"}],
            tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
            extra_headers=rid("nr-anthropic-search"),
        )
        assert message.content[0].text == "Tokyo"  # type: ignore[union-attr]
    finally:
        await claude.close()
    async with gemini_client(r.url) as gemini:
        config = gtypes.GenerateContentConfig(
            tools=[gtypes.Tool(google_search=gtypes.GoogleSearch())],
            http_options=gtypes.HttpOptions(headers=rid("nr-google-search")),
        )
        response = await gemini.aio.models.generate_content(
            model="gemini-2.0-flash", contents="What is the capital of Spain?", config=config
        )
        assert response.text == "Madrid"
    sent = [g.body for g in up.received(key=PROD_KEY) if g.path.startswith("/v1beta/")]
    assert sent[0]["tools"] == [{"googleSearch": {}}]


# --- a generic agent endpoint -----------------------------------------------------------


def agent_task(up: Upstream) -> dict[str, Any]:
    return {
        "name": "agent",
        "match": {"path_prefix": "/agent/"},
        "canonicalizer": "text",
        "query_path": "question",
        "answer_path": "result.answer",
        "endpoint": {
            "api": "generic",
            "base_url": up.url,
            "model": "support-agent-v3",
            "api_key": TASK_KEYS["agent"],
            "repeatable": True,
        },
        "sampling_rate": 1.0,
        "review_rate": 1.0,
        "k_max": 4,
        "k0": 3,
    }


@pytest.mark.parametrize("data_plane", ["inline", "process"])
async def test_a_generic_agent_request_is_resent_as_it_is(
    tmp_path: Path, upstream: Upstream, data_plane: str
) -> None:
    body = {
        "question": "What is the capital of Egypt?",
        "context": {"user": "u-1", "locale": "en"},
        "temperature": 0,
        "seed": 5,
        "stream": False,
        "metadata": {"ticket": "T-1"},
    }
    headers = rid("agent-1") | {"Authorization": f"Bearer {PROD_KEY}", "Cookie": "sid=prod"}
    async with relmon(
        tmp_path, upstream, "proxy", [agent_task(upstream)], data_plane=data_plane
    ) as r:
        async with aiohttp.ClientSession() as session:
            url = r.url + "/agent/ask?session=prod-session"
            async with session.post(url, json=body, headers=headers) as resp:
                assert resp.status == 200
                assert await resp.read() == upstream.answered("/agent/ask", key=PROD_KEY)[0]
            async with session.get(r.url + "/agent/status") as resp:
                assert resp.status == 200 and (await resp.json())["object"] == "other"
        item = await review_item(r.running, "agent", "agent-1")
        await r.running.sync_traffic()
        running = r.running
        requests = {
            api: value(running, "relmon_traffic_requests_total", source="proxy", api=api)
            for api in ("generic", "unmonitored", "openai.chat")
        }
        events = value(running, "relmon_traffic_events_total", source="proxy", decision="sampled")
    assert requests == {"generic": 1, "unmonitored": 1, "openai.chat": 0}
    assert events == 1
    assert item.api == "generic"
    assert item.query == "What is the capital of Egypt?"
    assert item.candidates[0] == ("cairo", item.k)  # the text canonicalizer's class
    assert item.reask_changes == {}
    reasks = upstream.received(key=TASK_KEYS["agent"])
    assert item.served_rank == 1  # the agent's answer, one of the draws: one re-ask fewer
    assert len(reasks) == reask_calls(item) == item.k - 1 and item.k >= 3
    for got in reasks:
        assert (got.method, got.path, got.query) == ("POST", "/agent/ask", "")
        assert got.body == body  # as it is: no field dropped, raised or added
        assert got.headers["authorization"] == f"Bearer {TASK_KEYS['agent']}"
        assert "cookie" not in got.headers
