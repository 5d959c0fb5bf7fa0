"""The Kafka source takes every wire API (docs/kafka.md, "Traffic events"): events that
name their ``api``, with the request and response in that API's own shape (the response
as JSON or as the SSE text), ``path`` for Gemini and the headers Anthropic's re-asks
carry, read from a real broker; each is re-asked in its own API (its path, the task's
key sent its way) and its review item names the API. An event whose API its task's
endpoint cannot speak is rejected and dead-lettered, never re-asked in another API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from monitor.app.runner import start_service
from monitor.config import load_settings
from tests.apis_e2e import bodies
from tests.apis_e2e.conftest import APIS, MODELS, TASK_KEYS, api_task
from tests.apis_e2e.upstream import Upstream
from tests.kafka import new_topic, produce, read_all, unique
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Q = "What is the capital of France?"


def _events() -> list[dict[str, Any]]:
    sse = b"".join(bodies.message_sse("Paris", MODELS["messages"])).decode()
    gemini_sse = b"".join(bodies.gemini_sse("Paris", MODELS["gemini"])).decode()
    return [
        {"id": "c1", "api": "openai.chat", "request": {"model": MODELS["chat"],
         "messages": [{"role": "user", "content": Q}]}},
        {"id": "r1", "api": "openai.responses", "request": {"model": MODELS["responses"],
         "input": Q, "store": True}, "response": bodies.response_json("Paris", "m")},
        {"id": "a1", "api": "anthropic.messages", "request": {"model": MODELS["messages"],
         "max_tokens": 16, "messages": [{"role": "user", "content": Q}]}, "response": sse,
         "headers": {"Anthropic-Version": "2023-06-01", "anthropic-beta": "b-1",
                     "x-api-key": "production-key"}},
        {"id": "g1", "api": "gemini.generate_content", "response": gemini_sse,
         "path": f"/v1beta/models/{MODELS['gemini']}:streamGenerateContent?alt=sse&key=prod-k",
         "request": {"contents": [{"role": "user", "parts": [{"text": Q}]}]}},
        {"id": "p1", "api": "openai.completions", "request": {"model": MODELS["completions"],
         "prompt": Q, "seed": 3}},
        # A chat event for the Claude task: never re-asked in another API.
        {"id": "x1", "task": "messages", "request": {"model": MODELS["messages"],
         "messages": [{"role": "user", "content": Q}]}},
    ]  # fmt: skip


async def test_kafka_events_of_every_api_are_re_asked_in_their_own_api(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = {k: await new_topic(kafka_bootstrap, k) for k in ("traffic", "dlq")}
    up = await Upstream().start()
    path = tmp_path / "relmon.yaml"
    config = {
        "tasks": [api_task(name, up) for name in APIS],
        "traffic": {"mode": "off"},
        "metrics": {"port": 0},
        "review": {"port": 0, "token": "kafka-apis-review-token-01"},
        "budget": {"calls_per_minute": 6000, "pace": False},
        "kafka": {"enabled": True, "bootstrap_servers": kafka_bootstrap,
                  "traffic_topic": topics["traffic"], "dead_letter_topic": topics["dlq"],
                  "group_id": unique("apis")},
        "state_dir": str(tmp_path / "state"),
        "query_hash_key": "0123456789abcdef0123456789abcdef",
    }  # fmt: skip
    path.write_text(json.dumps(config), encoding="utf-8")
    running = await start_service(load_settings(path))
    try:
        await produce(
            kafka_bootstrap, topics["traffic"], [json.dumps(e).encode() for e in _events()]
        )
        items = {}
        for name, event_id in [("chat", "c1"), ("responses", "r1"), ("messages", "a1"),
                               ("gemini", "g1"), ("completions", "p1")]:  # fmt: skip

            async def stored(name: str = name, event_id: str = event_id) -> bool:
                items[name] = await running.store.get_review_item(f"{name}:{event_id}")
                return items[name] is not None

            await wait_until(stored, timeout_s=60, what=f"the {name} item")
        [dead] = await read_all(kafka_bootstrap, topics["dlq"], at_least=1, timeout_s=60)
    finally:
        await running.close(5)
        await up.stop()
    assert {name: item.api for name, item in items.items()} == APIS
    assert dict(dead.headers)["relmon-error"].decode().startswith("a openai.chat event")
    gemini = f"/v1beta/models/{MODELS['gemini']}:generateContent"
    paths = {
        "chat": "/v1/chat/completions",
        "responses": "/v1/responses",
        "messages": "/v1/messages",
        "completions": "/v1/completions",
        "gemini": gemini,
    }
    for name, prefix in paths.items():
        asks = up.received(prefix, key=TASK_KEYS[name])
        item = items[name]
        # the served answer (the event's response) is one of the K draws when the re-ask
        # is the production request unchanged: then one re-ask fewer (DESIGN.md §6)
        drawn = item.served_rank is not None and not item.reask_changes
        assert len(asks) == item.k - int(drawn), (name, len(asks), item.k, drawn)
        assert all(not r.query for r in asks)  # never a production ?key=
    claude = up.received("/v1/messages")
    assert all(r.headers.get("anthropic-version") == "2023-06-01" for r in claude)
    assert all(r.headers.get("anthropic-beta") == "b-1" for r in claude)
    assert all(r.headers.get("x-api-key") == TASK_KEYS["messages"] for r in claude)
    assert all(r.body.get("store") is False for r in up.received("/v1/responses"))
    assert all("seed" not in r.body for r in up.received("/v1/completions"))
    assert not up.received("/v1/chat/completions", key=TASK_KEYS["messages"])  # x1 never asked
