"""``check-config --probe`` speaks each task's own wire API: the API's path under the
task's base URL, its auth header, a small request of its shape, its answer reader; and a
404 names the path relmon added and what that API's base URL must be."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from monitor.app.probe import PROBE_QUERY, probe_endpoints
from monitor.config import Settings, load_settings
from tests.apis_e2e.upstream import Upstream

KEYS = {
    "openai.chat": "key-chat-1",
    "openai.responses": "key-resp-2",
    "anthropic.messages": "key-anth-3",
    "gemini.generate_content": "key-gem-4",
    "openai.completions": "key-cmpl-5",
}
MODELS = {
    "openai.chat": "gpt-4.1",
    "openai.responses": "gpt-4.1-mini",
    "anthropic.messages": "claude-haiku-4-5",
    "gemini.generate_content": "gemini-2.0-flash",
    "openai.completions": "gpt-3.5-turbo-instruct",
}
PATHS = {
    "openai.chat": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
    "gemini.generate_content": "/v1beta/models/gemini-2.0-flash:generateContent",
    "openai.completions": "/v1/completions",
}
_VERSIONED = ("openai.chat", "openai.responses", "openai.completions")


def _task(api: str, base_url: str, **extra: Any) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"api": api, "base_url": base_url}
    endpoint["model"] = MODELS.get(api, "agent-1")
    endpoint |= {"api_key": KEYS.get(api, "key-agent-6"), "timeout_s": 10}
    return {"name": api.replace(".", "-"), "canonicalizer": "text", "endpoint": endpoint} | extra


def _settings(tmp_path: Path, tasks: list[dict[str, Any]]) -> Settings:
    path = tmp_path / "relmon.yaml"
    config = {"tasks": tasks, "state_dir": str(tmp_path / "state")}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return load_settings(path)


def _right_base(api: str, url: str) -> str:
    """The base URL as the API's SDK takes it: OpenAI's with /v1, the others' without."""
    return url + "/v1" if api in _VERSIONED else url


@pytest.fixture
async def nothing_here() -> AsyncIterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 that answers 404 to every request: its URL and the paths
    it was asked for."""
    paths: list[str] = []

    async def missing(request: web.Request) -> web.Response:
        paths.append(request.path)
        return web.json_response({"error": "not found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", missing)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", paths
    finally:
        await runner.cleanup()


async def test_the_probe_asks_each_api_its_own_way(tmp_path: Path, upstream: Upstream) -> None:
    settings = _settings(tmp_path, [_task(a, _right_base(a, upstream.url)) for a in KEYS])
    lines = await probe_endpoints(settings)
    assert len(lines) == len(KEYS)
    for index, api in enumerate(KEYS):
        label = f"tasks[{index}] ({api.replace('.', '-')}).endpoint"
        expected = f"{label}: ok: {upstream.url}{PATHS[api]} ({api}, model {MODELS[api]})"
        assert lines[index] == f"{expected} gave an answer"
        [got] = upstream.received(PATHS[api])
        assert got.key() == KEYS[api]
    chat, responses, messages, gemini, completions = (upstream.received(PATHS[a])[0] for a in KEYS)
    for bearer in (chat, responses, completions):
        assert bearer.headers["authorization"] == f"Bearer {bearer.key()}"
        assert "x-api-key" not in bearer.headers and "x-goog-api-key" not in bearer.headers
    assert messages.headers["x-api-key"] == KEYS["anthropic.messages"]
    assert messages.headers["anthropic-version"] == "2023-06-01"
    assert gemini.headers["x-goog-api-key"] == KEYS["gemini.generate_content"]
    assert "authorization" not in messages.headers and "authorization" not in gemini.headers
    # A request of each API's shape, as a re-ask sends it (no stream; Responses unstored).
    assert chat.body["messages"] == [{"role": "user", "content": PROBE_QUERY}]
    assert chat.body["model"] == "gpt-4.1" and chat.body["stream"] is False
    assert responses.body["input"] == PROBE_QUERY and responses.body["store"] is False
    assert messages.body["messages"] == [{"role": "user", "content": PROBE_QUERY}]
    assert messages.body["max_tokens"] == 16 and messages.body["model"] == "claude-haiku-4-5"
    assert gemini.body["contents"] == [{"role": "user", "parts": [{"text": PROBE_QUERY}]}]
    assert gemini.body["generationConfig"]["maxOutputTokens"] == 16
    assert completions.body["prompt"] == PROBE_QUERY
    assert all("key-" not in line for line in lines)


async def test_a_generic_task_is_probed_through_its_query_path(
    tmp_path: Path, upstream: Upstream
) -> None:
    task = _task(
        "generic",
        upstream.url,
        query_path="input.text",
        answer_path="result.answer",
        match={"path_prefix": "/agent/run"},
    )
    task["endpoint"]["repeatable"] = True
    unbuildable = _task("generic", upstream.url, query_path="messages[-1].content")
    unbuildable |= {"name": "agent-2", "match": {"path_prefix": "/agent/other"}}
    unbuildable["endpoint"]["repeatable"] = True
    lines = await probe_endpoints(_settings(tmp_path, [task, unbuildable]))
    assert lines[0] == (
        f"tasks[0] (generic).endpoint: ok: {upstream.url}/agent/run (generic, model agent-1) "
        "gave an answer"
    )
    [got] = upstream.requests
    assert got.path == "/agent/run" and got.body == {"input": {"text": PROBE_QUERY}}
    assert got.headers["authorization"] == "Bearer key-agent-6"
    assert lines[1].startswith("tasks[1] (agent-2).endpoint: not probed: generic, query_path")
    assert "'messages[-1].content' is not a plain field path" in lines[1]


@pytest.mark.parametrize(
    ("api", "wrong", "hint"),
    [
        ("openai.chat", "", "most servers want base_url to end in /v1"),
        ("openai.responses", "", "most servers want base_url to end in /v1"),
        ("openai.completions", "", "most servers want base_url to end in /v1"),
        ("anthropic.messages", "/v1", "so base_url is the origin without /v1, as https://api."),
        ("gemini.generate_content", "/v1beta", "the origin without /v1beta, as https://gen"),
    ],
)
async def test_a_wrong_base_url_gets_the_hint_of_its_api(
    tmp_path: Path, nothing_here: tuple[str, list[str]], api: str, wrong: str, hint: str
) -> None:
    url, paths = nothing_here
    [line] = await probe_endpoints(_settings(tmp_path, [_task(api, url + wrong)]))
    added = PATHS[api].removeprefix("/v1") if api in _VERSIONED else PATHS[api]
    assert paths == [wrong + added]
    assert line.startswith(f"tasks[0] ({api.replace('.', '-')}).endpoint: FAILED: {api}, model")
    assert f"model call to {url}{wrong}{added} failed: HTTP 404" in line
    assert f"relmon posts {api} to base_url + {added}; " in line and hint in line
    assert KEYS[api] not in line
