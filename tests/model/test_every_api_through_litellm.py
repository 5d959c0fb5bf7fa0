"""Every wire API, end to end, against real servers nobody here wrote: the official SDKs
(``openai`` chat, Responses and legacy completions, ``anthropic``, ``google-genai``) send
production requests through relmon's proxy to the LiteLLM proxy in front of the
llama.cpp SmolLM2 server; relmon samples each, re-asks it K times **in the same API**
through LiteLLM, and scores it. The mirror gets the same requests as mirrored copies
(with the answer a log shipper adds, as JSON or as the SSE text). The table the
issue measured (relayed, sampled, re-asked, scored) is asserted per API and form, and
printed (``-s``)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
import pytest
from anthropic import AsyncAnthropic
from google import genai
from google.genai import types as gtypes
from openai import AsyncOpenAI

from monitor.app.runner import Running, start_service
from monitor.config import load_settings
from tests.model.litellm_server import MASTER_KEY, MODEL, LiteLLM, litellm_proxy
from tests.model.llama_server import llama_server
from tests.ports import free_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

QUESTIONS = ["What is the capital of France? One word.", "What is 2+3? Answer with a number."]
APIS = (
    "openai.chat",
    "openai.responses",
    "anthropic.messages",
    "gemini.generate_content",
    "openai.completions",
)
# Where each API's production path lives under LiteLLM, and its task's base URL suffix
# (OpenAI-style base URLs carry the version; Anthropic's and Gemini's do not).
PATHS = {
    "openai.chat": ("/v1/chat/completions", "/v1"),
    "openai.responses": ("/v1/responses", "/v1"),
    "anthropic.messages": ("/v1/messages", ""),
    "gemini.generate_content": (f"/v1beta/models/{MODEL}:generateContent", ""),
    "openai.completions": ("/v1/completions", "/v1"),
}


@pytest.fixture(scope="module")
def litellm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiteLLM]:
    logs = tmp_path_factory.mktemp("servers")
    # Re-asks come in while a production stream is answered: they wait, never cut it.
    with (
        llama_server(log_dir=logs, interrupt_requests=False) as llama,
        litellm_proxy(llama.base_url, log_dir=logs) as lite,
    ):
        yield lite


def _settings(tmp_path: Path, mode: str, upstream: str) -> Any:
    tasks = "".join(
        f"""
  - name: {api.replace(".", "-")}
    match: {{api: {api}}}
    k_max: 4
    k0: 2
    sampling_rate: 1.0
    review_rate: 1.0
    endpoint:
      api: {api}
      base_url: "{upstream}{PATHS[api][1]}"
      model: {MODEL}
      api_key: {MASTER_KEY}
      timeout_s: 60
      concurrency: 1
"""
        for api in APIS
    )
    upstream_line = f', upstream_url: "{upstream}"' if mode == "proxy" else ""
    path = tmp_path / f"relmon-{mode}.yaml"
    path.write_text(
        f"""tasks:{tasks}
metrics: {{port: {free_port()}}}
review: {{port: {free_port()}, token: tok-every-api-123456}}
traffic: {{mode: {mode}, port: {free_port()}{upstream_line}}}
budget: {{calls_per_minute: 6000, pace: false}}
state_dir: "{tmp_path / mode}"
query_hash_key: "0123456789abcdef0123456789abcdef"
""",
        encoding="utf-8",
    )
    return load_settings(path)


def _value(running: Running, name: str, **labels: str) -> float:
    return running.registry.get_sample_value(name, labels) or 0.0


def _task(api: str) -> str:
    return api.replace(".", "-")


async def _scored(running: Running, expected: dict[str, int]) -> None:
    def done() -> bool:
        return all(
            _value(running, "relmon_items_total", model=MODEL, task=_task(api), outcome=o) >= n
            for api, n in expected.items()
            for o in ("scored",)
        )

    await wait_until(done, timeout_s=600, interval_s=0.5, what="every item scored")


def _calls_by_path(lite: LiteLLM) -> dict[str, int]:
    """LiteLLM's access log: POSTs by path (production requests and relmon's re-asks)."""
    counts: dict[str, int] = {}
    for match in re.finditer(r'"POST (/[^ ?"]*)[^"]* HTTP/1.1" 200', lite.log_path.read_text()):
        path = unquote(match.group(1))  # uvicorn logs a ':' as %3A
        counts[path] = counts.get(path, 0) + 1
    return counts


# -- the production calls, one per SDK and form ---------------------------------------


async def _chat(base: str, q: str, stream: bool) -> str:
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key=MASTER_KEY, max_retries=0)
    try:
        messages: Any = [{"role": "user", "content": q}]
        if not stream:
            r = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
            return r.choices[0].message.content or ""
        s = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])
    finally:
        await client.close()


async def _responses(base: str, q: str, stream: bool) -> str:
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key=MASTER_KEY, max_retries=0)
    try:
        if not stream:
            r = await client.responses.create(model=MODEL, input=q, max_output_tokens=16)
            return r.output_text
        s = await client.responses.create(model=MODEL, input=q, max_output_tokens=16, stream=True)
        return "".join([e.delta async for e in s if e.type == "response.output_text.delta"])
    finally:
        await client.close()


async def _completions(base: str, q: str, stream: bool) -> str:
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key=MASTER_KEY, max_retries=0)
    try:
        if not stream:
            r = await client.completions.create(model=MODEL, prompt=q, max_tokens=8)
            return r.choices[0].text
        s = await client.completions.create(model=MODEL, prompt=q, max_tokens=8, stream=True)
        return "".join([c.choices[0].text or "" async for c in s if c.choices])
    finally:
        await client.close()


async def _anthropic(base: str, q: str, stream: bool) -> str:
    client = AsyncAnthropic(base_url=base, api_key=MASTER_KEY, max_retries=0)
    try:
        messages: Any = [{"role": "user", "content": q}]
        if not stream:
            r = await client.messages.create(model=MODEL, max_tokens=8, messages=messages)
            return "".join(b.text for b in r.content if b.type == "text")
        async with client.messages.stream(model=MODEL, max_tokens=8, messages=messages) as s:
            return "".join([t async for t in s.text_stream])
    finally:
        await client.close()


async def _gemini(base: str, q: str, stream: bool) -> str:
    config = gtypes.GenerateContentConfig(max_output_tokens=8)
    # A session of the test's own on the SDK's aiohttp transport (its own session warns).
    async with aiohttp.ClientSession() as session:
        options = gtypes.HttpOptions(base_url=base, api_version="v1beta", aiohttp_client=session)
        client = genai.Client(api_key=MASTER_KEY, http_options=options)
        try:
            models = client.aio.models
            if not stream:
                r = await models.generate_content(model=MODEL, contents=q, config=config)
                return r.text or ""
            s = await models.generate_content_stream(model=MODEL, contents=q, config=config)
            return "".join([c.text or "" async for c in s])
        finally:
            await client.aio.aclose()
            client.close()


SENDERS: dict[str, Callable[[str, str, bool], Awaitable[str]]] = {
    "openai.chat": _chat,
    "openai.responses": _responses,
    "anthropic.messages": _anthropic,
    "gemini.generate_content": _gemini,
    "openai.completions": _completions,
}


async def test_the_proxy_watches_every_api_and_re_asks_it_in_the_same_api(
    litellm: LiteLLM, tmp_path: Path
) -> None:
    running = await start_service(_settings(tmp_path, "proxy", litellm.url))
    base = f"http://127.0.0.1:{running.traffic_server.bound_port}"  # type: ignore[union-attr]
    before = _calls_by_path(litellm)
    try:
        relayed: dict[str, int] = {}
        for api in APIS:
            for stream in (False, True):
                for q in QUESTIONS:
                    answer = await SENDERS[api](base, q, stream)
                    assert isinstance(answer, str)  # parsed by the SDK through the proxy
                    relayed[api] = relayed.get(api, 0) + 1
        await _scored(running, dict.fromkeys(APIS, 4))
        table = _table(running, "proxy", relayed, litellm, before)
    finally:
        await running.close(5)
    print("\n" + "\n".join(table))
    assert _value(running, "relmon_traffic_events_total", source="proxy", decision="rejected") == 0


def _table(
    running: Running, source: str, relayed: dict[str, int], lite: LiteLLM, before: dict[str, int]
) -> list[str]:
    """The issue's table for ``source``, asserted: every request relayed, sampled,
    re-asked in its own API (LiteLLM saw the re-asks on the API's path), scored."""
    after = _calls_by_path(lite)
    rows = [
        "| API | relayed | sampled | re-asked (calls, same API) | scored |",
        "|---|---|---|---|---|",
    ]
    for api in APIS:
        task = _task(api)
        seen = _value(running, "relmon_traffic_requests_total", source=source, api=api)
        ok = _value(running, "relmon_model_calls_total", model=MODEL, task=task, outcome="ok")
        failed = sum(
            _value(running, "relmon_model_calls_total", model=MODEL, task=task, outcome=o)
            for o in ("timeout", "server_error", "client_error", "invalid_response")
        )
        scored = _value(running, "relmon_items_total", model=MODEL, task=task, outcome="scored")
        path = PATHS[api][0]
        on_path = after.get(path, 0) - before.get(path, 0)
        production = relayed[api] if source == "proxy" else 0
        rows.append(f"| {api} | {relayed[api]} | {seen:g} | {ok:g} | {scored:g} |")
        assert seen == relayed[api], (api, seen)
        assert scored == relayed[api], (api, scored)
        assert failed == 0, (api, failed)
        draws = _value(running, "relmon_samples_per_item_sum", model=MODEL, task=task)
        assert draws >= 2 * relayed[api], (api, draws)  # k0 = 2 at least per item
        # the served answer is a draw when the re-ask is the request unchanged: at most
        # one call saved an item
        assert draws - relayed[api] <= ok <= draws, (api, ok, draws)
        # Every re-ask went to this API's own path (Gemini: the non-streaming method).
        streaming = sum(
            after.get(p, 0) - before.get(p, 0)
            for p in after
            if p.endswith(":streamGenerateContent")
        )
        if api == "gemini.generate_content" and source == "proxy":
            production -= streaming
        assert on_path == production + ok, (api, on_path, production, ok)
    sampled = _value(running, "relmon_traffic_events_total", source=source, decision="sampled")
    assert sampled == sum(relayed.values())
    return rows


def _mirrored(api: str, q: str) -> dict[str, Any]:
    """A production body of ``api`` as a mirror receives it."""
    if api == "openai.responses":
        return {"model": MODEL, "input": q, "max_output_tokens": 16}
    if api == "anthropic.messages":
        return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": q}]}
    if api == "gemini.generate_content":
        return {"contents": [{"role": "user", "parts": [{"text": q}]}],
                "generationConfig": {"maxOutputTokens": 8}}  # fmt: skip
    if api == "openai.completions":
        return {"model": MODEL, "prompt": q, "max_tokens": 8}
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": q}]}


async def test_the_mirror_watches_every_api_and_re_asks_it_in_the_same_api(
    litellm: LiteLLM, tmp_path: Path
) -> None:
    running = await start_service(_settings(tmp_path, "mirror", litellm.url))
    base = f"http://127.0.0.1:{running.traffic_server.bound_port}"  # type: ignore[union-attr]
    before = _calls_by_path(litellm)
    relayed: dict[str, int] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for api in APIS:
                for n, q in enumerate(QUESTIONS * 2):
                    body = _mirrored(api, q) | (
                        {"response": "data: {}\n\n"} if n >= len(QUESTIONS) else {}
                    )
                    headers = {"X-Request-Id": f"{api}-{n}", "anthropic-version": "2023-06-01"}
                    async with session.post(base + PATHS[api][0], json=body, headers=headers) as r:
                        assert r.status == 202, await r.text()
                    relayed[api] = relayed.get(api, 0) + 1
        await _scored(running, dict.fromkeys(APIS, 4))
        table = _table(running, "mirror", relayed, litellm, before)
    finally:
        await running.close(5)
    print("\n" + "\n".join(table))
    await asyncio.sleep(0)
    assert json.dumps(relayed)  # every API was mirrored
