"""A simulated OpenAI-compatible model for the demo: arithmetic questions with ground
truth, a configurable quality, and a drift event that lowers it after a set time.

Each answer is right with probability ``quality`` minus the question's difficulty
(``quality_after_drift`` once the drift has happened). Before the drift, mistakes are
spread over a few plausible values; after it, most mistakes are the same one (an
off-by-one), as in a real regression, so the model's top answer itself goes wrong.
Answers come in several surface forms so that canonicalization has work to do.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field

from aiohttp import web

__all__ = ["QUESTION", "QuestionBank", "SimulatedModel"]

QUESTION = re.compile(r"What is (-?\d+) ([+*-]) (-?\d+)\?")
_FORMS = (
    "{v}",
    "The answer is {v}.",
    "#### {v}",
    "Let me think. {a} {op} {b} = {v}",
    "{v}.0",
    "Answer: {v}",
)


def truth_of(query: str) -> int | None:
    """The right answer of a demo question, None if ``query`` is not one."""
    m = QUESTION.search(query)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a + b if op == "+" else a - b if op == "-" else a * b


@dataclass
class QuestionBank:
    """Questions of varying difficulty: each has its own chance of a right answer."""

    size: int = 400
    seed: int = 7
    questions: list[tuple[str, float]] = field(default_factory=list)
    difficulty: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        for _ in range(self.size):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            op = rng.choice("+-*")
            difficulty = rng.choice((0.0, 0.0, 0.0, 0.05, 0.1, 0.25, 0.45))
            question = f"What is {a} {op} {b}?"
            self.questions.append((question, difficulty))
            self.difficulty[question] = difficulty


class SimulatedModel:
    def __init__(
        self,
        *,
        quality: float = 0.92,
        quality_after_drift: float = 0.45,
        drift_after_s: float | None = 120.0,
        seed: int = 11,
        host: str = "127.0.0.1",
        port: int = 0,
        bank: QuestionBank | None = None,
    ) -> None:
        self.bank = bank
        self.quality = quality
        self.quality_after_drift = quality_after_drift
        self.drift_after_s = drift_after_s
        self.rng = random.Random(seed)
        self.host, self.port = host, port
        self.started = time.monotonic()
        self.calls = 0
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    def difficulty(self, query: str) -> float:
        return self.bank.difficulty.get(query, 0.0) if self.bank is not None else 0.0

    @property
    def drifted(self) -> bool:
        return (
            self.drift_after_s is not None and time.monotonic() - self.started >= self.drift_after_s
        )

    def answer(self, query: str) -> str:
        truth = truth_of(query)
        if truth is None:
            return "I can only do arithmetic."
        m = QUESTION.search(query)
        assert m is not None
        drifted = self.drifted
        quality = (self.quality_after_drift if drifted else self.quality) - self.difficulty(query)
        value = truth
        if self.rng.random() > quality:
            systematic = drifted and self.rng.random() < 0.7
            value = truth + (1 if systematic else self.rng.choice((1, -1, 10, -10, 2)))
        form = self.rng.choice(_FORMS)
        return form.format(v=value, a=m.group(1), op=m.group(2), b=m.group(3))

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = body.get("messages") or []
        query = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        n = int(body.get("n") or 1)
        self.calls += 1
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": self.answer(query)},
                "finish_reason": "stop",
            }
            for i in range(n)
        ]
        return web.json_response(
            {
                "id": f"sim-{self.calls}",
                "object": "chat.completion",
                "model": body.get("model", "sim"),
                "choices": choices,
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "sim-arith-1", "object": "model"}]}
        )

    async def start(self) -> str:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._completions),
                web.get("/v1/models", self._models),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port
        self.started = time.monotonic()
        return f"http://{self.host}:{self.bound_port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
