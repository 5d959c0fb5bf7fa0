"""The circuit breaker closes again once the endpoint recovers, whatever the batch size,
and health says so meanwhile (real aiohttp endpoint, real time, real metrics server).

Before the fix a batch of several parallel calls after the cool-down sent the trial
with its siblings; their immediate ``circuit_open`` failures cancelled it, and a healthy
model got no call at all again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from adapters.http.metrics import MetricsServer
from adapters.model.client import HttpModelClient
from monitor.app.runner import Running
from monitor.app.wiring import build_task
from monitor.config import BudgetSettings, TaskSettings, load_settings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.errors import ModelCallError
from monitor.core.events import parse_event
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import InMemoryStore
from tests.model.conftest import Endpoint, completion
from tests.waiting import wait_until

COOLDOWN_S = 0.5
MARGIN_S = 3.0  # generous: the machine may be loaded; the bug gave *no* call for 100 s
K = 5
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def failing_until(healthy: asyncio.Event) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        if not healthy.is_set():
            return web.Response(status=500, text="down")
        n = int((await request.json()).get("n", 1))
        return web.json_response(completion(*(["4"] * n)))

    return handle


def breaker_client(
    endpoint: Endpoint, threshold: int, *, supports_n: bool = False
) -> HttpModelClient:
    """No retries (each failure counts at once), a short cool-down."""
    return HttpModelClient(
        base_url=endpoint.base_url,
        model="m",
        retries={"error": 0},
        breaker_threshold=threshold,
        breaker_cooldown_s=COOLDOWN_S,
        concurrency=K,
        supports_n=supports_n,
    )


# Every batch up to the client's concurrency, and batches larger than it (a stopping
# rule may ask for up to k_max - k calls at once: 17 with the defaults); with parallel
# single calls and with one call asking for n answers.
@pytest.mark.parametrize(
    ("batch", "supports_n"),
    [*((b, False) for b in range(1, K + 1)), (8, False), (17, False), (3, True), (17, True)],
)
async def test_calls_resume_within_the_cooldown_for_every_batch_size(
    endpoint: Endpoint, batch: int, supports_n: bool
) -> None:
    healthy = asyncio.Event()
    endpoint.default = failing_until(healthy)
    client = breaker_client(endpoint, threshold=2, supports_n=supports_n)
    try:
        for _ in range(4):  # the endpoint fails: the circuit opens
            with pytest.raises(ModelCallError, match=r"HTTP 500|circuit open"):
                await client.sample(REQUEST, batch)
        assert client.circuit_state == "open"
        healthy.set()
        result: list[str] = []

        async def answered() -> bool:  # as a worker taking the next item tries again
            result[:] = await client.sample(REQUEST, batch)
            return True

        await wait_until(
            answered,
            timeout_s=COOLDOWN_S + MARGIN_S,
            what="a call answered (the circuit closed again)",
            ignore=(Exception,),
        )
        assert result == ["4"] * batch
        assert client.circuit_state == "closed"
        assert await client.sample(REQUEST, batch) == ["4"] * batch
    finally:
        await client.aclose()


def event(i: int) -> Any:
    return parse_event(
        {
            "id": f"req-{i}",
            "model": "m",
            "task": "arith",
            "request": REQUEST,
            "response": {"choices": [{"message": {"content": "4"}}]},
        }
    )


async def test_items_are_scored_again_and_health_is_honest(endpoint: Endpoint) -> None:
    """k0 = 3 parallel calls per batch (the defaults): items are abandoned while the
    endpoint fails, /readyz is 503 and relmon_circuit_open 1; once it recovers, items are
    scored again within the cool-down, /readyz is 200 and the gauge 0."""
    healthy = asyncio.Event()
    endpoint.default = failing_until(healthy)
    client = breaker_client(endpoint, threshold=3)
    settings = TaskSettings(
        name="arith",
        canonicalizer="numeric",
        k0=3,
        k_max=6,
        sampling_rate=1.0,
        review_rate=0.01,
        endpoint={"model": "m"},
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings,
        as_async(canon),
        get_stopping_rule(k_max=6, k0=3),
        client,
        canon,
    )
    registry = CollectorRegistry()
    store = InMemoryStore()
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(registry, k_max=6),
        budget=BudgetSettings(calls_per_minute=100_000, max_in_flight=2, queue_size=100),
    )
    await service.load()
    service.start()
    running = Running(
        settings=None,  # type: ignore[arg-type]
        service=service,
        registry=registry,
        store=store,
        metrics_server=None,
        review_server=None,
        traffic_server=None,
        started=True,
    )
    server = MetricsServer(
        registry,
        running.not_ready,
        port=0,
        before_scrape=service.publish,
        traffic_readiness=running.not_ready_for_traffic,
    )
    await server.start()
    base = f"http://127.0.0.1:{server.bound_port}"

    def gauge() -> float | None:
        return registry.get_sample_value("relmon_circuit_open", {"model": "m", "task": "arith"})

    async def offer(i: int) -> None:
        admission = service.offer(event(i), "mirror")
        assert admission.done is not None
        await asyncio.wait_for(admission.done, 30)

    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200
            service.publish()
            assert gauge() == 0.0
            i = 0
            while service.stats.abandoned < 3:
                await offer(i := i + 1)
            assert client.circuit_state != "closed"
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 503
                body = await resp.json()
            assert any("circuit breaker" in r and "arith" in r for r in body["reasons"])
            # The traffic path (a sidecar's or a proxy's readiness) does not stop with it.
            async with http.get(f"{base}/readyz/traffic") as resp:
                assert resp.status == 200
                body = await resp.json()
            assert any("circuit breaker" in r and "arith" in r for r in body["degraded"])
            async with http.get(f"{base}/metrics") as resp:
                assert 'relmon_circuit_open{model="m",task="arith"} 1.0' in await resp.text()

            healthy.set()
            scored = service.stats.scored

            async def scored_again() -> bool:  # one more item each time
                nonlocal i
                await offer(i := i + 1)
                return service.stats.scored != scored

            await wait_until(
                scored_again, timeout_s=COOLDOWN_S + MARGIN_S, what="an item scored again"
            )
            for _ in range(5):  # and it stays that way
                await offer(i := i + 1)
            assert service.stats.scored >= scored + 6
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/readyz/traffic") as resp:
                assert resp.status == 200
                assert (await resp.json())["degraded"] == []
            async with http.get(f"{base}/metrics") as resp:
                assert 'relmon_circuit_open{model="m",task="arith"} 0.0' in await resp.text()
    finally:
        await server.stop()
        await service.stop(5.0)
        await client.aclose()


# ----------------------------------------- endpoint.circuit_breaker from the configuration


def configured_client(
    endpoint: Endpoint, tmp_path: Path, failures: int, cooldown_s: float
) -> tuple[HttpModelClient, CollectorRegistry]:
    """The client ``relmon run`` builds from a relmon.yaml with this circuit breaker (no
    retries, so that every failed call counts at once)."""
    path = tmp_path / "relmon.yaml"
    breaker = {"failures": failures, "cooldown_s": cooldown_s}
    task = {
        "name": "arith",
        "endpoint": {
            "base_url": endpoint.base_url,
            "model": "m",
            "retries": {"error": 0},
            "circuit_breaker": breaker,
        },
    }
    path.write_text(yaml.safe_dump({"tasks": [task]}))
    registry = CollectorRegistry()
    runtime = build_task(load_settings(path).tasks[0], Metrics(registry))
    assert isinstance(runtime.client, HttpModelClient)
    return runtime.client, registry


def timed_failures(arrivals: list[float], healthy: asyncio.Event) -> Any:
    """Answer 500 until ``healthy``; note when each request arrived."""
    answer = failing_until(healthy)

    async def handle(request: web.Request) -> web.StreamResponse:
        arrivals.append(time.monotonic())
        return await answer(request)

    return handle


def calls(registry: CollectorRegistry, outcome: str) -> float:
    labels = {"model": "m", "task": "arith", "outcome": outcome}
    return registry.get_sample_value("relmon_model_calls_total", labels) or 0.0


@pytest.mark.parametrize("failures", [1, 2, 4])
async def test_the_configured_failures_open_the_circuit_and_it_stays_open(
    endpoint: Endpoint, tmp_path: Path, failures: int
) -> None:
    """``failures: N`` opens the circuit at exactly the Nth failed call (not the default
    5th); during the cool-down (60 s: no loaded machine gets there) nothing is sent."""
    arrivals: list[float] = []
    endpoint.default = timed_failures(arrivals, asyncio.Event())
    client, registry = configured_client(endpoint, tmp_path, failures, 60.0)
    try:
        for n in range(1, failures + 1):
            assert client.circuit_state == "closed"
            with pytest.raises(ModelCallError, match="HTTP 500"):
                await client.sample(REQUEST, 1)
            assert len(arrivals) == n
        assert client.circuit_state == "open"
        for _ in range(3):
            with pytest.raises(ModelCallError, match="circuit open"):
                await client.sample(REQUEST, 1)
        assert len(arrivals) == failures, "a call reached the endpoint while open"
        assert calls(registry, "server_error") == failures
        assert calls(registry, "circuit_open") == 3
    finally:
        await client.aclose()


async def test_the_configured_cooldown_decides_when_the_circuit_closes_again(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """``failures: 2, cooldown_s: 1``: open after the 2nd failure; the next call reaches
    the endpoint no sooner than 1 s after it (load only makes it later), and well before
    the default 30 s; its success closes the circuit."""
    cooldown = 1.0
    arrivals: list[float] = []
    healthy = asyncio.Event()
    endpoint.default = timed_failures(arrivals, healthy)
    client, registry = configured_client(endpoint, tmp_path, 2, cooldown)
    try:
        for _ in range(2):
            with pytest.raises(ModelCallError, match="HTTP 500"):
                await client.sample(REQUEST, 1)
        assert client.circuit_state in ("open", "half_open")  # half_open only if loaded
        healthy.set()
        opened = arrivals[-1]  # the breaker opened after this request's answer
        result: list[str] = []

        async def answered() -> bool:
            try:
                result[:] = await client.sample(REQUEST, 1)
            except ModelCallError as exc:
                assert "circuit open" in str(exc)
                return False
            return True

        await wait_until(
            answered,
            timeout_s=max(0.0, opened + 15.0 - time.monotonic()),
            what="the circuit to close again",
            interval_s=0.05,
        )
        assert result == ["4"]
        assert len(arrivals) == 3, "only the trial call went through"
        assert arrivals[2] - opened >= cooldown, "a call went through before the cool-down"
        assert client.circuit_state == "closed"
        assert await client.sample(REQUEST, 2) == ["4", "4"]
        assert calls(registry, "server_error") == 2 and calls(registry, "ok") == 3
    finally:
        await client.aclose()
