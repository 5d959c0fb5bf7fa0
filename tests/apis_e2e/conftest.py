"""relmon in-process in front of the upstream fixture (:mod:`.upstream`), for every wire
API: one task per API (``match.api``), each re-asking the upstream in its own API with a
key of its own, so that a re-ask is told from a production request by its credential.

The ``upstream`` fixture (:mod:`.upstream`) starts and stops the server; :func:`relmon`
starts the service (proxy or mirror) and always closes it; :func:`review_item` waits for
a scored item.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from google import genai
from google.genai import types as gtypes

from monitor.app.runner import Running, start_service
from monitor.config import load_settings
from monitor.core.review import ReviewItem
from tests.apis_e2e.upstream import Upstream
from tests.ports import free_port
from tests.waiting import wait_until

__all__ = [
    "APIS",
    "MODELS",
    "PROD_KEY",
    "TASK_KEYS",
    "Relmon",
    "api_task",
    "gemini_client",
    "reask_calls",
    "relmon",
    "review_item",
    "rid",
    "value",
]

PROD_KEY = "sk-production-key-9999"
"""The key every production request carries (the SDKs send it their API's way)."""

TASK_KEYS = {
    "chat": "task-key-chat-0001",
    "responses": "task-key-resp-0002",
    "messages": "task-key-anth-0003",
    "gemini": "task-key-gem-0004",
    "completions": "task-key-cmpl-0005",
    "agent": "task-key-agent-0006",
}
"""Each task's own endpoint key: what its re-asks carry (never production's)."""
MODELS = {
    "chat": "gpt-4.1",
    "responses": "gpt-4.1-mini",
    "messages": "claude-haiku-4-5",
    "gemini": "gemini-2.0-flash",
    "completions": "gpt-3.5-turbo-instruct",
}
APIS = {
    "chat": "openai.chat",
    "responses": "openai.responses",
    "messages": "anthropic.messages",
    "gemini": "gemini.generate_content",
    "completions": "openai.completions",
}
_VERSIONED = ("chat", "responses", "completions")  # OpenAI-style base URLs end in /v1


def api_task(name: str, up: Upstream, **extra: Any) -> dict[str, Any]:
    """The task of one standard API (``name``: a key of :data:`APIS`), matched by API."""
    base = up.url + ("/v1" if name in _VERSIONED else "")
    task: dict[str, Any] = {
        "name": name,
        "match": {"api": APIS[name]},
        "canonicalizer": "text",
        "endpoint": {
            "api": APIS[name],
            "base_url": base,
            "model": MODELS[name],
            "api_key": TASK_KEYS[name],
            "timeout_s": 10,
        },
        "sampling_rate": 1.0,
        "review_rate": 1.0,
        "k_max": 4,
        "k0": 3,
    }
    for key, val in extra.items():
        if isinstance(val, dict) and isinstance(task.get(key), dict):
            task[key] = task[key] | val
        else:
            task[key] = val
    return task


@dataclass
class Relmon:
    running: Running
    url: str
    """The traffic port: the proxy or the mirror."""
    state_dir: Path


@contextlib.asynccontextmanager
async def relmon(
    tmp_path: Path,
    up: Upstream,
    mode: str,
    tasks: list[dict[str, Any]] | None = None,
    **traffic_extra: Any,
) -> AsyncIterator[Relmon]:
    """relmon (``mode``: proxy or mirror) with ``tasks`` (default: one per standard API);
    ``traffic_extra``: more ``traffic`` keys (``data_plane="process"``; None drops one)."""
    port = free_port()
    traffic: dict[str, Any] = {"mode": mode, "port": port, "offer_batch_s": 0, "uvloop": False}
    if mode == "proxy":
        traffic["upstream_url"] = up.url
    traffic = {k: v for k, v in (traffic | traffic_extra).items() if v is not None}
    state = tmp_path / "state"
    config = {
        "tasks": tasks if tasks is not None else [api_task(name, up) for name in APIS],
        "traffic": traffic,
        "metrics": {"port": 0},
        "review": {"port": 0, "token": "apis-e2e-review-token-0123"},
        "budget": {"calls_per_minute": 6000, "max_in_flight": 8, "pace": False},
        "state_dir": str(state),
        "query_hash_key": "0123456789abcdef0123456789abcdef",
    }
    path = tmp_path / "relmon.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    running = await start_service(load_settings(path))
    try:
        yield Relmon(running, f"http://127.0.0.1:{port}", state)
    finally:
        await running.close(5.0)


def reask_calls(item: ReviewItem) -> int:
    """The re-asks ``item`` made: its K draws, but for the served answer when it was one
    of them (it was known and the re-ask was the production request unchanged: no field
    dropped, raised or set, DESIGN.md §6)."""
    drawn = item.served_rank is not None and not item.reask_changes
    return item.k - int(drawn)


def rid(request_id: str) -> dict[str, str]:
    """The header that names a request's item id."""
    return {"X-Request-Id": request_id}


@contextlib.asynccontextmanager
async def gemini_client(
    base_url: str, api_version: str | None = "v1beta"
) -> AsyncIterator[genai.Client]:
    """A google-genai client with the production key on its aiohttp transport (the SDK's
    choice when aiohttp is installed), with a session of the test's own that is closed at
    the end. ``api_version=None``: the SDK's default version."""
    async with aiohttp.ClientSession() as session:
        options = gtypes.HttpOptions(base_url=base_url, aiohttp_client=session)
        if api_version is not None:
            options.api_version = api_version
        client = genai.Client(api_key=PROD_KEY, http_options=options)
        try:
            yield client
        finally:
            await client.aio.aclose()
            client.close()


def value(running: Running, name: str, **labels: str) -> float:
    return running.registry.get_sample_value(name, labels) or 0.0


async def review_item(running: Running, task: str, rid: str) -> ReviewItem:
    """The stored review item of request ``rid`` under ``task``, once it is scored."""
    found: list[ReviewItem] = []

    async def stored() -> bool:
        item = await running.store.get_review_item(f"{task}:{rid}")
        if item is not None:
            found.append(item)
        return item is not None

    def detail() -> str:
        events = {
            d: value(running, "relmon_traffic_events_total", source=s, decision=d)
            for s in ("proxy", "mirror")
            for d in ("sampled", "rejected", "not_reasked", "dropped", "skipped")
        }
        model = MODELS.get(task, task)
        items = {
            o: value(running, "relmon_items_total", model=model, task=task, outcome=o)
            for o in ("scored", "abandoned")
        }
        return f"events {events}, items {items}"

    await wait_until(stored, timeout_s=30, what=f"review item {task}:{rid}", detail=detail)
    return found[-1]
