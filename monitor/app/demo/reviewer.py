"""The demo's automatic reviewer: takes review items from the review API and answers
them from the ground truth, as a person would through the review page."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from monitor.app.demo.model import truth_of
from monitor.core.canon import get_canonicalizer

__all__ = ["auto_review"]


async def auto_review(
    api_url: str,
    token: str,
    *,
    stop: asyncio.Event,
    poll_s: float = 0.2,
    reviewer: str = "demo-bot",
) -> int:
    """Review until ``stop``; returns how many verdicts were accepted by the API."""
    canon = get_canonicalizer("numeric")
    headers = {"Authorization": f"Bearer {token}"}
    done = 0
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        while not stop.is_set():
            try:
                async with session.get(f"{api_url}/api/reviews/next") as resp:
                    item = await resp.json() if resp.status == 200 else None
                if item is None:
                    await asyncio.wait_for(stop.wait(), poll_s)
                    continue
                truth = truth_of(item["query"])
                ranks = [
                    c["rank"]
                    for c in item["candidates"]
                    if truth is not None and c["answer"] == canon.canonicalize(str(truth))
                ]
                verdict = (
                    {"accepted_ranks": ranks, "reviewer": reviewer}
                    if ranks
                    else {"none_of_these": True, "correct_answer": str(truth), "reviewer": reviewer}
                )
                async with session.post(
                    f"{api_url}/api/reviews/{item['item_id']}", json=verdict
                ) as resp:
                    done += resp.status == 200
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)
    return done
