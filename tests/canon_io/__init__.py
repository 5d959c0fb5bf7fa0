"""Tests of the I/O canonicalizers, and the real parts they share.

:class:`JudgeServer` is a real aiohttp server on 127.0.0.1 that speaks the OpenAI
chat-completions shape and plays a deterministic judge; :class:`HttpJudgeClient` is a
minimal :class:`monitor.engine.ports.ModelClient` that POSTs to it over real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from monitor.core.errors import ModelCallError

__all__ = ["JUDGE_TABLE", "HttpJudgeClient", "JudgeServer"]

JUDGE_TABLE: dict[str, str] = {
    "The capital is Paris.": "Paris",
    "It's Paris, of course!": "Core answer: Paris.",
    "Paris": "Paris",
    "Paris, France": "Paris",
    "I think it's Lyon": "Lyon",
    "I cannot answer that.": "NO ANSWER",
    "Hmm.": "",
    "I'd go with B, Paris.": "B",
    "The answer is forty-two.": "42",
}
"""What the judge replies to a response; any other response is echoed back."""

_RESPONSE = re.compile(r"<response>\n(.*)\n</response>", re.DOTALL)


class JudgeServer:
    """A chat-completions endpoint whose judge reads the ``<response>`` block.

    Special responses: ``EXPLODE`` gets HTTP 500; ``NOCHOICES`` gets ``choices: []``;
    ``SLOW ...`` is held until two requests have been in flight at once (30 s at most),
    so a client allowed two concurrent calls shows it without depending on timing. Every
    request body is kept in ``requests``.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.calls: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._together = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        user = body["messages"][-1]["content"]
        match = _RESPONSE.search(user)
        answer = match.group(1) if match else ""
        self.calls[answer] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.in_flight >= 2:
            self._together.set()
        try:
            if answer.startswith("SLOW"):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._together.wait(), 30)
            if answer == "EXPLODE":
                return web.json_response({"error": {"message": "boom"}}, status=500)
            if answer == "NOCHOICES":
                return web.json_response({"choices": []})
            reply = JUDGE_TABLE.get(answer, answer)
            return web.json_response(
                {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}
            )
        finally:
            self.in_flight -= 1


class HttpJudgeClient:
    """POSTs the request as is (temperature included) and returns the choices' texts."""

    def __init__(self, base_url: str, model: str | None = None) -> None:
        self.base_url = base_url
        self.model = model
        self.closed = False
        self._session: aiohttp.ClientSession | None = None

    async def sample(self, request: Mapping[str, Any], n: int) -> list[str]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body = {**request, "n": n}
        try:
            async with self._session.post(f"{self.base_url}/chat/completions", json=body) as resp:
                if resp.status >= 400:
                    raise ModelCallError(
                        f"judge answered HTTP {resp.status}",
                        retriable=resp.status >= 500,
                        status=resp.status,
                    )
                data = await resp.json()
        except aiohttp.ClientError as exc:
            raise ModelCallError(
                f"judge unreachable: {type(exc).__name__}", retriable=True
            ) from exc
        return [str(choice["message"]["content"]) for choice in data["choices"]]

    async def aclose(self) -> None:
        self.closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
