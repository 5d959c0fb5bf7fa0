"""Fixtures for the model-client tests: a scriptable real HTTP endpoint, fake time.

:class:`Endpoint` is a real aiohttp server on 127.0.0.1 (a free port) that answers
``POST /v1/chat/completions`` with whatever each test scripts (``endpoint.script(...)``),
records every request, and counts how many requests it was serving at once.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from adapters.model.client import HttpModelClient
from tests.model.llama_server import LlamaServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def completion(*texts: str | None) -> dict[str, Any]:
    """A chat-completion body with one choice per text (``None`` → ``content: null``)."""
    return {
        "id": "cmpl-test",
        "object": "chat.completion",
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
            for i, t in enumerate(texts)
        ],
    }


def reply(*texts: str | None, delay_s: float = 0.0) -> Handler:
    """Answer 200 with these texts (after ``delay_s``: a simulated model latency)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if delay_s:
            await asyncio.sleep(delay_s)  # the fake model's latency, not a wait of the test
        return web.json_response(completion(*texts))

    return handle


def echo_n(prefix: str = "answer", *, delay_s: float = 0.0) -> Handler:
    """Answer with as many choices as the request's ``n`` (default 1), after ``delay_s``
    (a simulated model latency)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if delay_s:
            await asyncio.sleep(delay_s)  # the fake model's latency, not a wait of the test
        n = int((await request.json()).get("n", 1))
        return web.json_response(completion(*(f"{prefix} {i}" for i in range(n))))

    return handle


def status(code: int, headers: dict[str, str] | None = None, body: str = "") -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers=headers, text=body)

    return handle


def raw(body: bytes, content_type: str = "application/json") -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type=content_type)

    return handle


def chunked(total_bytes: int, chunk: int = 65536) -> Handler:
    """A 200 body of ``total_bytes`` sent chunked (no Content-Length)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        piece = b'{"choices": [' + b" " * (chunk - 13)
        sent = 0
        try:
            while sent < total_bytes:
                await resp.write(piece)
                sent += len(piece)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client hung up at its limit, as it should
        return resp

    return handle


@dataclass
class Endpoint:
    """A scripted OpenAI-compatible endpoint (see the module docstring)."""

    base_url: str = ""
    default: Handler = field(default_factory=echo_n)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    gate_timeouts: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    _queue: deque[Handler] = field(default_factory=deque)

    def script(self, *handlers: Handler) -> None:
        """Answer the next requests with these handlers, then with ``default``."""
        self._queue.extend(handlers)

    def gate(self, count: int, deadline_s: float = 30.0) -> Handler:
        """Hold requests until ``count`` are in flight at once (or the deadline passes,
        counted in ``gate_timeouts``)."""
        opened = asyncio.Event()

        async def handle(request: web.Request) -> web.StreamResponse:
            if self.in_flight >= count:
                opened.set()
            try:
                await asyncio.wait_for(opened.wait(), deadline_s)
            except TimeoutError:
                self.gate_timeouts += 1
            return web.json_response(completion("gated"))

        return handle

    def hang(self) -> Handler:
        """Never answer (until the fixture stops the server)."""

        async def handle(request: web.Request) -> web.StreamResponse:
            await self.release.wait()
            return web.json_response(completion("too late"))

        return handle

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.read()
            try:
                self.requests.append(json.loads(body))
            except ValueError:
                self.requests.append({"_raw": body.decode("utf-8", "replace")})
            self.headers.append(dict(request.headers))
            handler = self._queue.popleft() if self._queue else self.default
            return await handler(request)
        finally:
            self.in_flight -= 1


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    ep = Endpoint()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", ep.handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    ep.base_url = f"http://{host}:{port}/v1"
    try:
        yield ep
    finally:
        ep.release.set()
        await runner.cleanup()


class FakeSleep:
    """Records the delays asked for and returns at once (after yielding to the loop)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


class FakeClock:
    """A :class:`monitor.engine.ports.Clock` that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_sleep() -> FakeSleep:
    return FakeSleep()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@dataclass
class ClientFactory:
    """Builds clients for ``endpoint`` with fake sleep and recorded outcomes."""

    endpoint: Endpoint
    sleep: FakeSleep
    outcomes: list[str] = field(default_factory=list)
    clients: list[HttpModelClient] = field(default_factory=list)

    def __call__(self, **options: Any) -> HttpModelClient:
        settings: dict[str, Any] = {
            "base_url": self.endpoint.base_url,
            "model": "test-model",
            "temperature": 0.7,
            "max_tokens": 16,
            "timeout_s": 5.0,
            "concurrency": 4,
            "sleep": self.sleep,
            "on_outcome": self.outcomes.append,
        }
        settings.update(options)
        client = HttpModelClient(**settings)
        self.clients.append(client)
        return client


@pytest.fixture
async def make_client(endpoint: Endpoint, fake_sleep: FakeSleep) -> AsyncIterator[ClientFactory]:
    factory = ClientFactory(endpoint, fake_sleep)
    try:
        yield factory
    finally:
        for client in factory.clients:
            await client.aclose()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failed test that used a real LLM server, attach the server's log tail."""
    report = yield
    server = getattr(item, "funcargs", {}).get("llm_server")
    if report.failed and isinstance(server, LlamaServer):
        report.sections.append((f"llama server log {server.log_path}", server.log_tail()))
    return report
