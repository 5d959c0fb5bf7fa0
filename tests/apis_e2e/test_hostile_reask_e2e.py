"""A client cannot steer a re-ask, nor stop monitoring, with what it sends (docs/apis/,
docs/security.md): through relmon's real proxy in front of the upstream fixture, which
is also every task's model endpoint.

- a target with ``..`` (plain, percent-encoded, encoded twice, with a path parameter),
  ``//``, or in absolute form is relayed to the upstream as it came, but never re-asked:
  counted ``relmon_not_reasked_total{reason="unsafe_path"}``, and the model endpoint never
  gets a request with a task's key on a path a client chose;
- a safe target is re-asked on the task's base URL + the API's own path only (a
  gateway's prefix before Gemini's version is not kept; a generic ``/./`` is normalised);
- generic requests that ask to stream are re-asked as they are and their streams read;
  streams whose answers relmon cannot read leave the circuit breaker closed and
  ``/readyz`` 200;
- a generic request whose ``query_path`` finds no text is a counted rejection.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.apis_e2e.conftest import (
    MODELS,
    PROD_KEY,
    TASK_KEYS,
    Relmon,
    api_task,
    relmon,
    review_item,
    rid,
    value,
)
from tests.apis_e2e.test_reask_rules_e2e import agent_task
from tests.apis_e2e.upstream import Upstream
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "Capital of Kenya?"}]}]}
CHAT_BODY = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "Capital of Chile?"}]}
AGENT_BODY = {"question": "What is the capital of Egypt?"}
GEMINI_OWN = "/v1beta/models/gemini-2.0-flash:generateContent"
METHOD = "gemini-2.0-flash:generateContent"

HOSTILE_GEMINI = [
    f"/v1beta/models/../../admin/secret/models/{METHOD}",
    f"/v1beta/models/%2e%2e/%2E%2e/admin/models/{METHOD}",
    f"/v1beta/.%2E/admin/models/{METHOD}",
    f"/v1beta/%252e%252e/admin/models/{METHOD}",
    f"/v1beta/..;x/admin/models/{METHOD}",
    f"/admin%2f..%2fv1beta/models/{METHOD}",
    f"//other.example/v1beta/models/{METHOD}",
    f"/v1beta//models/{METHOD}",
    "ABSOLUTE",  # http://127.0.0.1:PORT/v1beta/models/…: built with the upstream's port
]
HOSTILE_AGENT = ["/agent/../admin/ask", "/agent/%2e%2e/admin/ask", "/agent//ask"]
HOSTILE_CHAT = ["/v1/../v1/chat/completions", "/v1/%2E%2E/v1/chat/completions"]


async def raw_post(
    r: Relmon, target: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, bytes]:
    """One POST of ``target`` exactly as given (no client normalises it), on its own
    connection: the status and the whole answer."""
    port = int(r.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    head = [f"POST {target} HTTP/1.1", "Host: relmon.test", "Connection: close"]
    head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    head += [f"{name}: {val}" for name, val in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(-1), 30)
    writer.close()
    await writer.wait_closed()
    return int(answer.split(b" ", 2)[1]), answer


def not_reasked(r: Relmon, task: str, reason: str = "unsafe_path") -> float:
    model = MODELS.get(task, "support-agent-v3")
    return value(r.running, "relmon_not_reasked_total", model=model, task=task, reason=reason)


def events(r: Relmon, decision: str) -> float:
    return value(r.running, "relmon_traffic_events_total", source="proxy", decision=decision)


async def test_hostile_targets_are_relayed_but_never_reasked(
    tmp_path: Path, upstream: Upstream
) -> None:
    tasks = [api_task("gemini", upstream), api_task("chat", upstream), agent_task(upstream)]
    absolute = f"http://127.0.0.1:{upstream.port}/v1beta/models/{METHOD}"
    sent: dict[str, str] = {}  # request id -> the target as sent
    async with relmon(tmp_path, upstream, "proxy", tasks) as r:
        with capture_logs() as logs:
            for i, listed in enumerate(HOSTILE_GEMINI):
                target = absolute if listed == "ABSOLUTE" else listed
                headers = rid(f"hostile-gem-{i}") | {"x-goog-api-key": PROD_KEY}
                status, _ = await raw_post(r, target, GEMINI_BODY, headers)
                assert status == 200, target
                sent[f"hostile-gem-{i}"] = target
            for i, target in enumerate(HOSTILE_AGENT):
                headers = rid(f"hostile-agent-{i}") | {"Authorization": f"Bearer {PROD_KEY}"}
                status, _ = await raw_post(r, target, AGENT_BODY, headers)
                assert status == 200, target
                sent[f"hostile-agent-{i}"] = target
            for i, target in enumerate(HOSTILE_CHAT):
                headers = rid(f"hostile-chat-{i}") | {"Authorization": f"Bearer {PROD_KEY}"}
                status, _ = await raw_post(r, target, CHAT_BODY, headers)
                assert status == 200, target
                sent[f"hostile-chat-{i}"] = target
            # Safe targets, re-asked on the API's own path only: a gateway prefix before
            # Gemini's version is dropped; a generic "/./" is normalised.
            gateway = f"/gateway/v1beta/models/{METHOD}"
            headers = rid("safe-gem") | {"x-goog-api-key": PROD_KEY}
            assert (await raw_post(r, gateway, GEMINI_BODY, headers))[0] == 200
            headers = rid("safe-agent") | {"Authorization": f"Bearer {PROD_KEY}"}
            assert (await raw_post(r, "/agent/./ask", AGENT_BODY, headers))[0] == 200
            await review_item(r.running, "gemini", "safe-gem")
            agent_item = await review_item(r.running, "agent", "safe-agent")
            await r.running.sync_traffic()
            counted = {t: not_reasked(r, t) for t in ("gemini", "agent", "chat")}
            sampled, rejected = events(r, "sampled"), events(r, "rejected")
    assert counted == {
        "gemini": len(HOSTILE_GEMINI),
        "agent": len(HOSTILE_AGENT),
        "chat": len(HOSTILE_CHAT),
    }
    assert (sampled, rejected) == (2, 0)
    # Relayed as before: the upstream got every hostile request, with production's key.
    forwarded = {g.headers.get("x-request-id"): g for g in upstream.received(key=PROD_KEY)}
    for request_id, target in sent.items():
        assert request_id in forwarded, f"{target} was not relayed"
        if not target.startswith("http://"):
            assert forwarded[request_id].target == target  # as it came, not normalised
    # The model endpoint saw a task's key on the API's own paths only, never on one a
    # client chose.
    own = {"gemini": {GEMINI_OWN}, "chat": {"/v1/chat/completions"}, "agent": {"/agent/ask"}}
    for task, paths in own.items():
        got = upstream.received(key=TASK_KEYS[task])
        assert {g.target for g in got} <= paths, task
        assert {g.path for g in got} <= paths, task
    assert len(upstream.received(key=TASK_KEYS["gemini"])) >= 2  # the safe one's re-asks
    assert agent_item.query == "What is the capital of Egypt?"
    lines = [e for e in logs if e.get("event") == "event_not_reasked"]
    assert lines and all(e["log_level"] == "info" for e in lines)
    assert len(lines) <= 3  # one per task and reason per interval, not one per request
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")]


async def test_streaming_generic_requests_leave_the_breaker_closed(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Generic requests that ask for a stream: the re-asks stream too (the body is
    resent as it is) and are read as production's stream is. A task whose
    ``answer_path`` finds nothing in the streams abandons its items, but an answer made
    unreadable by what the request asked is no endpoint failure: the breaker stays
    closed and ``/readyz`` 200."""
    readable = agent_task(upstream) | {"match": {"path_prefix": "/agent/ask"}}
    unreadable = agent_task(upstream) | {
        "name": "agent-raw",
        "match": {"path_prefix": "/agent/raw"},
        "answer_path": "final.text",  # no event of the agent's stream holds it
    }
    unreadable["endpoint"] = unreadable["endpoint"] | {"api_key": "task-key-agent-raw-0008"}
    n = 7  # over the breaker's 5 consecutive failures, many times over with retries
    async with (
        relmon(tmp_path, upstream, "proxy", [readable, unreadable]) as r,
        aiohttp.ClientSession() as session,
    ):
        for i in range(n):
            for path, name in (("/agent/ask", "read"), ("/agent/raw", "raw")):
                body = AGENT_BODY | {"stream": True}
                headers = rid(f"stream-{name}-{i}") | {"Authorization": f"Bearer {PROD_KEY}"}
                async with session.post(r.url + path, json=body, headers=headers) as resp:
                    assert resp.status == 200
                    assert resp.content_type == "text/event-stream"
                    await resp.read()
        items = [await review_item(r.running, "agent", f"stream-read-{i}") for i in range(n)]

        def abandoned() -> float:
            labels = {"model": "support-agent-v3", "task": "agent-raw"}
            return value(r.running, "relmon_items_total", outcome="abandoned", **labels)

        await wait_until(lambda: abandoned() == n, timeout_s=60, what="abandoned items")
        metrics_port = r.running.metrics_server.bound_port  # type: ignore[union-attr]
        async with session.get(f"http://127.0.0.1:{metrics_port}/readyz") as resp:
            ready = (resp.status, await resp.text())
        r.running.service.publish()  # the gauges as a scrape refreshes them
        open_now = r.running.service.circuits_open()
        circuits = {
            task: value(r.running, "relmon_circuit_open", model="support-agent-v3", task=task)
            for task in ("agent", "agent-raw")
        }
        invalid = value(
            r.running,
            "relmon_model_calls_total",
            model="support-agent-v3",
            task="agent-raw",
            outcome="invalid_response",
        )
        not_ready = r.running.not_ready()
    assert open_now == []
    assert circuits == {"agent": 0, "agent-raw": 0}
    assert ready[0] == 200, ready
    assert not [reason for reason in not_ready if "circuit" in reason]
    assert invalid >= 3 * n  # each unreadable stream re-asked, read, retried twice, failed
    for item in items:  # the streamed re-asks were read: the final event's answer
        assert item.candidates[0][0] == "cairo"
    reasks = upstream.received(key=TASK_KEYS["agent"])
    assert reasks and all(g.body == AGENT_BODY | {"stream": True} for g in reasks)
    assert all(g.target == "/agent/ask" for g in reasks)


@pytest.mark.parametrize("data_plane", ["inline", "process"])
async def test_a_query_path_that_finds_no_text_is_a_counted_rejection(
    tmp_path: Path, upstream: Upstream, data_plane: str
) -> None:
    nothing: list[dict[str, Any]] = [
        {"question": None},
        {"other": "What is the capital of Egypt?"},  # missing
        {"question": []},
        {"question": ""},
        {"question": "   "},
        {"question": {"text": None}},
        {"question": [None, ""]},
    ]
    async with relmon(
        tmp_path, upstream, "proxy", [agent_task(upstream)], data_plane=data_plane
    ) as r:
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as session:
                for i, body in enumerate(nothing):
                    headers = rid(f"no-text-{i}") | {"Authorization": f"Bearer {PROD_KEY}"}
                    url = r.url + "/agent/ask"
                    async with session.post(url, json=body, headers=headers) as resp:
                        assert resp.status == 200  # relayed as ever
                headers = rid("has-text") | {"Authorization": f"Bearer {PROD_KEY}"}
                url = r.url + "/agent/ask"
                async with session.post(url, json=AGENT_BODY, headers=headers) as resp:
                    assert resp.status == 200
            await review_item(r.running, "agent", "has-text")
            await r.running.sync_traffic()
        rejected, sampled = events(r, "rejected"), events(r, "sampled")
        stored = [
            await r.running.store.get_review_item(f"agent:no-text-{i}") for i in range(len(nothing))
        ]
    assert (rejected, sampled) == (len(nothing), 1)
    assert stored == [None] * len(nothing)
    # The reason is logged, once per interval (the second variant's line may be held back).
    reasons = [e["reason"] for e in logs if e.get("event") == "event_rejected"]
    assert set(reasons) <= {"generic: query_path 'question' found no text in the request"}
    assert len(reasons) <= 1 and (reasons or data_plane == "process")
    asked = [g.body for g in upstream.received(key=TASK_KEYS["agent"])]
    assert asked and all(body == AGENT_BODY for body in asked)  # only the one with text
