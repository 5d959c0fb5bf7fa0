"""Demo traffic: questions from the bank, sent through relmon's proxy at a steady rate.

Through the proxy relmon sees the answer each request got (the served answer). The
requests name their ``temperature`` and ``max_tokens``, as clients usually do, so the
re-ask is the request unchanged: the served answer is one of the K draws (one call
fewer an item), and its class is judged with the rest.

Each request carries the ``X-Tenant`` header of one of three tenants with unequal
shares (:data:`TENANTS`); the demo's task segments by it. ``initech`` asks only the
bank's hard questions, so its segment's level sits under the others' while the task's
level (over all tenants) looks fine: what the dashboard's Segments row is for."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random

import aiohttp

from monitor.app.demo.model import QuestionBank

__all__ = ["TENANTS", "TENANT_HEADER", "generate_traffic"]


TEMPERATURE = 0.7
"""The demo clients' temperature (at least the task's ``reask.min_temperature``)."""
MAX_TOKENS = 64
TENANT_HEADER = "X-Tenant"
TENANTS = (("acme", 0.6, 0.0), ("globex", 0.3, 0.0), ("initech", 0.1, 0.25))
"""(tenant, share of the requests, least difficulty of its questions)."""


async def generate_traffic(
    url: str,
    bank: QuestionBank,
    *,
    rate_per_s: float = 5.0,
    task: str = "arithmetic",
    model: str = "sim-arith-1",
    stop: asyncio.Event,
    seed: int = 3,
) -> int:
    """POST chat requests to relmon's traffic port (``url``) until ``stop``; returns how
    many were answered (202 from a mirror, 2xx from the proxy)."""
    rng = random.Random(seed)
    names = [name for name, _, _ in TENANTS]
    shares = [share for _, share, _ in TENANTS]
    asked = {
        name: [q for q, difficulty in bank.questions if difficulty >= least] or bank.questions
        for name, _, least in TENANTS
    }
    sent = 0
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i in itertools.count():
            if stop.is_set():
                break
            tenant = rng.choices(names, shares)[0]
            question = rng.choice(asked[tenant])
            body = {
                "model": model,
                "messages": [{"role": "user", "content": question}],
                "temperature": TEMPERATURE,
                "max_tokens": MAX_TOKENS,
            }
            headers = {
                "X-Relmon-Task": task,
                "X-Request-Id": f"demo-{seed}-{i}",
                TENANT_HEADER: tenant,
            }
            try:
                async with session.post(url, json=body, headers=headers) as resp:
                    await resp.read()
                    sent += 200 <= resp.status < 300
            except (aiohttp.ClientError, TimeoutError):
                pass  # relmon restarting; the live path would not notice either
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate_per_s)
    return sent
