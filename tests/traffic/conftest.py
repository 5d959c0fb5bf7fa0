"""Real aiohttp servers on 127.0.0.1 for the HTTP adapter tests.

``upstream`` is a small OpenAI-like server the proxy forwards to: JSON completions, an
SSE stream that holds back its tail until the test releases it, a gzip body, an error
and a slow route. ``traffic`` starts a :class:`TrafficServer` (mirror or proxy) with a
recording sink; every server is stopped by the fixture that started it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from adapters.traffic import exchange
from adapters.traffic.traffic import TrafficServer, header_task_resolver
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission

COMPILED = not exchange.__file__.endswith(".py")
"""The data plane runs compiled (``make compile``): a test cannot patch a function a
compiled module calls; ``test_plain_python.py`` runs such tests on plain Python."""

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer is 42."}}],
}
COMPLETION_BYTES = json.dumps(COMPLETION, separators=(",", ":")).encode()
BIG_ANSWER = "".join(f"line {i}: lorem ipsum dolor sit amet\n" for i in range(8000))
BIG_COMPLETION_BYTES = json.dumps(
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": BIG_ANSWER}}]}
).encode()
SSE_DELTAS = ["Hel", "lo ", "wor", "ld"]


def sse_chunks() -> list[bytes]:
    """The SSE events the upstream streams, one write each."""
    chunks = [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n',
        *(
            f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': d}}]})}\n\n".encode()
            for d in SSE_DELTAS
        ),
        b"data: [DONE]\n\n",
    ]
    return chunks


@dataclass
class Upstream:
    """The test upstream's state: what it received and the SSE stream's progress."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    sent_chunks: int = 0
    stream_done: bool = False


def _upstream_app(state: Upstream) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        state.requests.append(
            {"method": request.method, "path_qs": request.raw_path, "headers": request.headers}
            | {"body": raw}
        )
        if json.loads(raw).get("stream"):
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "X-Upstream": "sse"}
            )
            await resp.prepare(request)
            chunks = sse_chunks()
            await resp.write(chunks[0])
            state.sent_chunks = 1
            await asyncio.wait_for(state.release.wait(), timeout=60)
            for chunk in chunks[1:]:
                await asyncio.sleep(0.02)  # fake upstream: the stream's pace, chunk by chunk
                await resp.write(chunk)
                state.sent_chunks += 1
            await resp.write_eof()
            state.stream_done = True
            return resp
        return web.Response(
            body=COMPLETION_BYTES,
            content_type="application/json",
            headers={"X-Upstream": "yes", "Set-Cookie": "a=1"},
        )

    async def echo(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        state.requests.append(
            {"method": request.method, "path_qs": request.raw_path, "headers": request.headers}
            | {"body": raw}
        )
        return web.json_response(
            {"method": request.method, "path_qs": request.raw_path, "size": len(raw)},
            status=201,
            reason="Made It",
        )

    async def gzipped(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(
            body=gzip.compress(COMPLETION_BYTES),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    async def bad_request(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.json_response({"error": {"message": "no such model"}}, status=400)

    async def big(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=BIG_COMPLETION_BYTES, content_type="application/json")

    async def stalled_body(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = 100
        await resp.prepare(request)
        await resp.write(b'{"choices": ')
        await asyncio.sleep(60)  # fake stall: far past the proxy's timeout, however slow
        return resp

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(60)  # fake slow upstream: answers long after the proxy's timeout
        return web.Response(text="late")

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/gz/v1/chat/completions", gzipped)
    app.router.add_post("/bad/v1/chat/completions", bad_request)
    app.router.add_post("/slow/v1/chat/completions", slow)
    app.router.add_post("/big/v1/chat/completions", big)
    app.router.add_post("/stalled/v1/chat/completions", stalled_body)
    app.router.add_route("*", "/echo/{tail:.*}", echo)
    return app


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    state = Upstream()
    runner = web.AppRunner(_upstream_app(state), shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


@dataclass
class Recorder:
    """A sink and a reject callback that remember what they were given."""

    events: list[tuple[TrafficEvent, str]] = field(default_factory=list)
    rejects: list[tuple[str, str]] = field(default_factory=list)
    raise_in_sink: bool = False

    def sink(self, event: TrafficEvent, source: str) -> Admission:
        self.events.append((event, source))
        if self.raise_in_sink:
            raise RuntimeError("sink exploded")
        return Admission("sampled")

    def reject(self, source: str, reason: str) -> None:
        self.rejects.append((source, reason))


StartTraffic = Callable[..., Awaitable[TrafficServer]]


@pytest.fixture
async def start_traffic() -> AsyncIterator[StartTraffic]:
    """``await start_traffic(mode, recorder, **kwargs)`` -> a started TrafficServer."""
    servers: list[TrafficServer] = []

    async def start(mode: str, recorder: Recorder, **kwargs: Any) -> TrafficServer:
        kwargs.setdefault("sink", recorder.sink)
        server = TrafficServer(
            reject=recorder.reject,
            task_resolver=header_task_resolver("X-Relmon-Task"),
            mode=mode,  # type: ignore[arg-type]
            port=0,
            **kwargs,
        )
        await server.start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            await server.stop()
