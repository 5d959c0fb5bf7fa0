"""Re-asks as a recording upstream sees them: the request production made, through the
real model client and the service (a real aiohttp server on 127.0.0.1)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from monitor.app.wiring import build_task
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon.toolcall import REFUSAL
from monitor.core.events import parse_event
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService
from monitor.testing import InMemoryStore, ManualClock

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            },
        },
    }
]


def _tool_call(call_id: str, arguments: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


class Upstream:
    """Records every body; answers by the request: tool calls (parallel, arguments as
    strings, ids and key order varying) when it offers tools, else text."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        n = int(body.get("n", 1))
        if "tools" in body:
            k = len(self.bodies)
            message = {
                "role": "assistant",
                "content": None if k % 2 else "Let me check.",
                "tool_calls": [
                    _tool_call(f"call_{k}a", '{"unit": "c", "city": "Paris"}'),
                    _tool_call(f"call_{k}b", '{ "city" : "Lyon", "unit":"c" }'),
                ][:: 1 if k % 2 else -1],
            }
        else:
            message = {"role": "assistant", "content": "It is sunny."}
        choices = [{"index": i, "message": message, "finish_reason": "stop"} for i in range(n)]
        return web.json_response({"id": "x", "object": "chat.completion", "choices": choices})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    recorder = Upstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield recorder, f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def _run(url: str, canonicalizer: str, requests: list[dict[str, Any]], **task: Any):
    settings = TaskSettings(
        name="agent",
        canonicalizer=canonicalizer,
        k_max=4,
        k0=4,
        stopping_rule="fixed",
        sampling_rate=1.0,
        review_rate=1.0,
        endpoint={"model": "m-7b", "base_url": url},
        **task,
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry, k_max=4)
    runtime = build_task(settings, metrics)
    store = InMemoryStore()
    service = MonitorService(
        [runtime],
        store=store,
        review_queue=store,
        metrics=metrics,
        budget=BudgetSettings(calls_per_minute=10_000, max_in_flight=1),
        clock=ManualClock(),
    )
    await service.load()
    service.start()
    try:
        for i, request in enumerate(requests):
            event = {"id": f"e{i}", "model": request.get("model", "m-7b"), "request": request}
            assert service.offer(parse_event(event), "mirror").decision == "sampled"
        await service.drain()
    finally:
        await service.stop(5)
        await runtime.client.aclose()
    return store, registry


def _overrides(registry: CollectorRegistry, name: str) -> float | None:
    labels = {"model": "m-7b", "task": "agent", "field": name, "change": "changed"}
    return registry.get_sample_value("relmon_reask_overrides_total", labels)


async def test_a_tools_request_goes_out_as_sent_and_its_calls_are_the_answer(
    upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    request = {
        "model": "m-7b",
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "temperature": 0.8,
        "max_tokens": 2000,
        "seed": 42,
        "user": "alice@example.com",
        "stream": True,
    }
    store, registry = await _run(url, "tool_call", [request])
    assert len(recorder.bodies) == 4
    sent = {k: v for k, v in request.items() if k not in ("seed", "user", "stream")}
    for body in recorder.bodies:
        assert {k: v for k, v in body.items() if k not in ("n", "stream")} == sent
        assert body["stream"] is False
    item = store.pending()[0]
    # Parallel calls in either order, ids and whitespace differing, content or not:
    # one class, the sorted list of calls with parsed arguments.
    assert len(item.candidates) == 1
    answer, count = item.candidates[0]
    assert count == 4
    assert json.loads(answer) == [
        {"arguments": {"city": "Lyon", "unit": "c"}, "name": "get_weather"},
        {"arguments": {"city": "Paris", "unit": "c"}, "name": "get_weather"},
    ]
    assert item.reask_changes == {"seed": {"from": 42}, "user": {"from": "<text, 17 chars>"}}
    assert _overrides(registry, "seed") == 1 and _overrides(registry, "user") == 1
    assert _overrides(registry, "temperature") == 0
    assert "alice" not in json.dumps(item.to_json())


async def test_tool_calls_are_invalid_under_a_text_canonicalizer(
    upstream: tuple[Upstream, str],
) -> None:
    _, url = upstream
    store, _ = await _run(url, "text", [{"model": "m-7b", "messages": MESSAGES, "tools": TOOLS}])
    assert store.pending()[0].candidates == (("<INVALID>", 4),)


async def test_temperature_zero_is_raised_and_long_max_tokens_kept(
    upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    cold = {"model": "m-7b", "messages": MESSAGES, "temperature": 0.0, "top_p": 0.9}
    long = {"model": "m-7b", "messages": MESSAGES, "max_tokens": 4000, "stop": ["\n\n"]}
    store, registry = await _run(url, "text", [cold, long])
    by_kind = {("temperature" in b): b for b in recorder.bodies}
    assert by_kind[True] == {**cold, "temperature": 0.5, "stream": False}
    assert by_kind[False] == {**long, "stream": False}  # nothing added: server defaults
    changes = {i.item_id: i.reask_changes for i in store.pending()}
    assert changes == {
        "agent:e0": {"temperature": {"from": 0.0, "to": 0.5}},
        "agent:e1": {},
    }
    assert _overrides(registry, "temperature") == 1
    assert _overrides(registry, "max_tokens") == 0


async def test_a_messages_only_event_gets_the_task_defaults_and_set_and_drop_apply(
    upstream: tuple[Upstream, str],
) -> None:
    recorder, url = upstream
    store, registry = await _run(
        url,
        "text",
        [{"messages": MESSAGES}, {"messages": MESSAGES, "tools": TOOLS, "top_p": 0.2}],
        reask={"set": {"top_p": 1.0}, "drop": ["tools"]},
    )
    bodies = {json.dumps(b, sort_keys=True) for b in recorder.bodies}
    assert len(bodies) == 2  # each item's four calls are the same request
    expected_built = {"messages": MESSAGES, "model": "m-7b", "temperature": 0.7}
    expected_built |= {"max_tokens": 256, "top_p": 1.0, "stream": False}
    expected_full = {"messages": MESSAGES, "model": "m-7b", "top_p": 1.0, "stream": False}
    assert {
        json.dumps(expected_built, sort_keys=True),
        json.dumps(expected_full, sort_keys=True),
    } == bodies
    changes = {i.item_id: i.reask_changes for i in store.pending()}
    assert changes["agent:e0"] == {
        "model": {"to": "m-7b"},
        "temperature": {"to": 0.7},
        "max_tokens": {"to": 256},
        "top_p": {"to": 1.0},
    }
    assert changes["agent:e1"] == {
        "model": {"to": "m-7b"},
        "top_p": {"from": 0.2, "to": 1.0},
        "tools": {"from": "<list, 1 items>"},
    }
    assert _overrides(registry, "tools") == 1 and _overrides(registry, "top_p") == 2


def test_a_refusal_is_a_class_of_its_own() -> None:
    from monitor.core.canon import get_canonicalizer
    from monitor.core.canon.toolcall import choice_answer

    canon = get_canonicalizer("tool_call")
    refusal = choice_answer({"content": None, "refusal": "I can't help with that."})
    assert refusal is not None and canon.canonicalize(refusal) == REFUSAL
    assert canon.canonicalize("It is SUNNY.") == canon.canonicalize("it is sunny")
    bad = choice_answer({"content": None, "tool_calls": [_tool_call("c", "{not json")]})
    assert bad is not None and canon.canonicalize(bad) == "<INVALID>"
