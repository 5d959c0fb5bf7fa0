"""An upstream LLM server for the end-to-end tests: every wire API relmon reads, answering
with the documented response shapes (:mod:`.bodies`, built from the SDKs' own types),
JSON or streamed (SSE), on 127.0.0.1. It records every request it receives (method,
path, query, headers, body), so that a test can check what the proxy forwarded and what
relmon's re-asks sent.

Routes: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages``,
``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (``?alt=sse``),
``/v1/completions``, ``/agent/{tail}``; ``GET /v1/models``; any other request gets
``{"object": "other"}``. A body with ``"stream": true`` (Gemini: the streaming method) is
answered as SSE (the agent's: deltas, then a final event with the whole answer).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.apis_e2e import bodies
from tests.ports import free_port

__all__ = ["MODELS_LIST", "Received", "Upstream", "upstream"]

MODELS_LIST = {
    "object": "list",
    "data": [{"id": "gpt-4.1", "object": "model", "created": bodies.CREATED, "owned_by": "up"}],
}


@dataclass(frozen=True)
class Received:
    """One request the upstream received."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    """Lower-case names (the first value of each)."""
    raw: bytes
    body: Any = None
    """The JSON body, when there is one."""
    target: str = ""
    """The request target as it came (``raw_path``: never normalised, query included)."""

    def key(self) -> str | None:
        """The credential the request carried, however the API sends it."""
        auth = self.headers.get("authorization")
        if auth is not None:
            return auth.removeprefix("Bearer ")
        return self.headers.get("x-api-key") or self.headers.get("x-goog-api-key")


@dataclass
class Upstream:
    """The server (see the module): :meth:`start`, :meth:`stop`, :attr:`requests`."""

    port: int = field(default_factory=free_port)
    requests: list[Received] = field(default_factory=list)
    sent: list[tuple[Received, bytes]] = field(default_factory=list)
    """What it answered each request: the whole body (JSON, or the SSE bytes)."""
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Upstream:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._openai(bodies.chat_json, bodies.chat_sse)),
                web.post("/v1/responses", self._responses),
                web.post("/v1/messages", self._openai(bodies.message_json, bodies.message_sse)),
                web.post("/v1/completions", self._completions),
                web.post("/{version}/models/{spec}", self._gemini),
                web.post("/agent/{tail:.*}", self._agent),
                web.get("/v1/models", self._models),
                web.route("*", "/{tail:.*}", self._other),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- what it received ---------------------------------------------------------------

    def received(self, path: str | None = None, *, key: str | None = None) -> list[Received]:
        """The requests to ``path`` (a prefix) carrying credential ``key``, in order."""
        return [
            r
            for r in self.requests
            if (path is None or r.path.startswith(path)) and (key is None or r.key() == key)
        ]

    def answered(self, path: str, *, key: str | None = None) -> list[bytes]:
        """The bodies it sent for the requests to ``path`` (a prefix) carrying credential
        ``key``, in order."""
        return [
            body
            for got, body in self.sent
            if got.path.startswith(path) and (key is None or got.key() == key)
        ]

    async def _record(self, request: web.Request) -> Received:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            headers.setdefault(name.lower(), value)
        got = Received(
            request.method, request.path, request.query_string, headers, raw, body, request.raw_path
        )
        self.requests.append(got)
        return got

    # --- answering ----------------------------------------------------------------------

    async def _json(self, got: Received, doc: dict[str, Any]) -> web.Response:
        raw = json.dumps(doc).encode()
        self.sent.append((got, raw))
        return web.Response(body=raw, content_type="application/json", headers={"X-Up": "1"})

    async def _sse(
        self, request: web.Request, got: Received, frames: Iterator[bytes]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        sent = b""
        for frame in frames:
            await resp.write(frame)
            sent += frame
        await resp.write_eof()
        self.sent.append((got, sent))
        return resp

    def _openai(
        self,
        as_json: Callable[..., dict[str, Any]],
        as_sse: Callable[[str, str], Iterator[bytes]],
    ) -> Callable[[web.Request], Any]:
        """A chat-completions or Messages route: ``n`` choices (chat), or a stream."""

        async def handle(request: web.Request) -> web.StreamResponse:
            got = await self._record(request)
            body = got.body or {}
            answer = bodies.answer_for(json.dumps(body))
            model = str(body.get("model", "unknown"))
            if body.get("stream"):
                return await self._sse(request, got, as_sse(answer, model))
            n = body.get("n")
            extra = {"n": n} if isinstance(n, int) and n > 1 else {}
            return await self._json(got, as_json(answer, model, **extra))

        return handle

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        got = await self._record(request)
        body = got.body or {}
        answer = bodies.answer_for(json.dumps(body))
        model = str(body.get("model", "unknown"))
        if body.get("stream"):
            return await self._sse(request, got, bodies.response_sse(answer, model))
        return await self._json(got, bodies.response_json(answer, model))

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        got = await self._record(request)
        body = got.body or {}
        answer = bodies.answer_for(json.dumps(body))
        model = str(body.get("model", "unknown"))
        if body.get("stream"):
            return await self._sse(request, got, bodies.completion_sse(answer, model))
        n = body.get("n")
        count = n if isinstance(n, int) and n > 1 else 1
        return await self._json(got, bodies.completion_json(answer, model, count))

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        got = await self._record(request)
        model, _, method = request.match_info["spec"].partition(":")
        body = got.body or {}
        answer = bodies.answer_for(json.dumps(body))
        if method == "streamGenerateContent":
            return await self._sse(request, got, bodies.gemini_sse(answer, model))
        if method != "generateContent":  # countTokens, embedContent...
            return await self._json(got, {"object": "other", "path": request.path})
        n = (body.get("generationConfig") or {}).get("candidateCount")
        count = n if isinstance(n, int) and n > 1 else 1
        return await self._json(got, bodies.gemini_json(answer, model, count))

    async def _agent(self, request: web.Request) -> web.StreamResponse:
        got = await self._record(request)
        answer = bodies.answer_for(json.dumps(got.body))
        if isinstance(got.body, dict) and got.body.get("stream") is True:
            return await self._sse(request, got, bodies.agent_sse(answer, request.path))
        return await self._json(got, bodies.agent_json(answer, request.path))

    async def _models(self, request: web.Request) -> web.StreamResponse:
        got = await self._record(request)
        return await self._json(got, MODELS_LIST)

    async def _other(self, request: web.Request) -> web.StreamResponse:
        got = await self._record(request)
        return await self._json(got, {"object": "other", "path": request.path})


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """The server, started and stopped by each test that uses it (a plugin of the suite:
    tests/conftest.py; a directory may define an ``upstream`` of its own)."""
    server = await Upstream().start()
    try:
        yield server
    finally:
        await server.stop()
