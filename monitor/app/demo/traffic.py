"""Demo traffic: questions from the bank, mirrored to relmon at a steady rate."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random

import aiohttp

from monitor.app.demo.model import QuestionBank

__all__ = ["generate_traffic"]


async def generate_traffic(
    mirror_url: str,
    bank: QuestionBank,
    *,
    rate_per_s: float = 5.0,
    task: str = "arithmetic",
    model: str = "sim-arith-1",
    stop: asyncio.Event,
    seed: int = 3,
) -> int:
    """POST chat requests to the mirror endpoint until ``stop``; returns how many were sent."""
    rng = random.Random(seed)
    sent = 0
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i in itertools.count():
            if stop.is_set():
                break
            question, _ = rng.choice(bank.questions)
            body = {"model": model, "messages": [{"role": "user", "content": question}]}
            headers = {"X-Relmon-Task": task, "X-Request-Id": f"demo-{seed}-{i}"}
            try:
                async with session.post(mirror_url, json=body, headers=headers) as resp:
                    await resp.read()
                    sent += resp.status == 202
            except (aiohttp.ClientError, TimeoutError):
                pass  # relmon restarting; the live path would not notice either
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate_per_s)
    return sent
