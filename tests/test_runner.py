"""The runner's wiring of a task: canonicalizer (with answer pattern), judge client, rule;
the supervisor's restarts and their count."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from monitor.app.supervision import supervise
from monitor.app.wiring import build_task
from monitor.config import TaskSettings
from monitor.core.errors import ConfigError, RelmonError, StateError
from monitor.engine.metrics import Metrics
from tests.waiting import wait_until


async def test_answer_pattern_wraps_the_canonicalizer() -> None:
    settings = TaskSettings(
        name="t", canonicalizer="numeric", answer_pattern=r"Final: (.*)", endpoint={"model": "m"}
    )
    task = build_task(settings, Metrics(CollectorRegistry()))
    try:
        classes = await task.canonicalizer.canonicalize_many(["3 steps. Final: 42.0", "no final"])
        assert classes == ["42", "<INVALID>"]
        assert task.rule.name == "truncated" and task.rule.k_max == 20
    finally:
        await task.client.aclose()


async def test_llm_canonicalizer_gets_a_temperature_zero_judge() -> None:
    settings = TaskSettings(
        name="t",
        canonicalizer="llm",
        canonicalizer_options={"endpoint": "http://127.0.0.1:9/v1", "model": "judge"},
        endpoint={"model": "m"},
    )
    task = build_task(settings, Metrics(CollectorRegistry()))
    try:
        assert task.canonicalizer.name == "llm"
        assert task.sync_canonicalizer is None
    finally:
        await task.client.aclose()
        await task.canonicalizer.aclose()  # type: ignore[attr-defined]


async def test_answer_pattern_applies_before_the_llm_canonicalizer() -> None:
    """``answer_pattern`` is applied first with ``llm`` too (it used to be dropped)."""
    settings = TaskSettings(
        name="t",
        canonicalizer="llm",
        canonicalizer_options={"endpoint": "http://127.0.0.1:9/v1", "model": "judge"},
        answer_pattern=r"Final: (.*)",
        endpoint={"model": "m"},
    )
    task = build_task(settings, Metrics(CollectorRegistry()))
    try:
        assert task.sync_canonicalizer is None  # verdicts pick ranks, as without a pattern
        # No answer matches: no judge call (its endpoint, port 9, would refuse one).
        assert await task.canonicalizer.canonicalize_many(["no final", "x"]) == [
            "<INVALID>",
            "<INVALID>",
        ]
    finally:
        await task.client.aclose()
        await task.canonicalizer.aclose()  # type: ignore[attr-defined]


def test_a_task_needs_a_model() -> None:
    with pytest.raises(ConfigError, match=r"endpoint\.model"):
        build_task(TaskSettings(name="t"), Metrics(CollectorRegistry()))


async def test_close_releases_everything_even_when_not_drained(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A stop that times out with an item in flight still closes clients, servers, store."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from monitor.app.runner import start_service
    from monitor.config import load_settings
    from monitor.core.errors import ModelCallError
    from monitor.core.events import parse_event

    release = asyncio.Event()
    arrived = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.json_response({})

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", hang)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    settings = load_settings(
        None,
        tasks=[
            {
                "name": "a",
                "canonicalizer": "numeric",
                "sampling_rate": 1.0,
                "endpoint": {"base_url": f"http://127.0.0.1:{port}/v1", "model": "m"},
            }
        ],
        metrics={"port": 0},
        review={"port": 0, "token": "abcdefgh"},
        traffic={"port": 0},
        state_dir=tmp_path,
        drain_timeout_s=0.5,
    )
    try:
        running = await start_service(settings)
        metrics_port = running.metrics_server.bound_port  # type: ignore[union-attr]
        event = {
            "id": "x",
            "model": "m",
            "task": "a",
            "request": {"messages": [{"role": "user", "content": "1+1"}]},
        }
        assert running.service.offer(parse_event(event), "t").decision == "sampled"
        await wait_until(arrived.is_set, what="the model call to reach the endpoint")
        assert await running.close(0.5) is False  # not drained: the call hangs
        with pytest.raises(ModelCallError, match="closed"):
            await running.service.tasks["a"].client.sample(event["request"], 1)  # type: ignore[arg-type]
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get(f"http://127.0.0.1:{metrics_port}/healthz")
    finally:
        release.set()
        await runner.cleanup()


async def test_not_ready_until_every_listener_is_up(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """/readyz answers before the traffic port listens (the metrics server starts
    first): it must say 503 until start_service has started everything."""
    import asyncio

    import aiohttp

    from adapters.traffic.traffic import TrafficServer
    from monitor.app.runner import start_service
    from monitor.config import load_settings
    from tests.security import free_port

    gate = asyncio.Event()
    real_start = TrafficServer.start

    async def held_start(self: TrafficServer) -> None:
        await gate.wait()
        await real_start(self)

    monkeypatch.setattr(TrafficServer, "start", held_start)
    metrics_port = free_port()
    settings = load_settings(
        None,
        tasks=[{"name": "a", "endpoint": {"model": "m"}}],
        metrics={"port": metrics_port},
        review={"port": 0, "token": "abcdefgh"},
        traffic={"port": 0},
        state_dir=tmp_path,
    )
    starting = asyncio.create_task(start_service(settings))
    url = f"http://127.0.0.1:{metrics_port}/readyz"
    async with aiohttp.ClientSession() as session:
        answer: list[tuple[int, Any]] = []

        async def answered() -> bool:
            async with session.get(url) as resp:
                answer.append((resp.status, await resp.json()))
            return True

        await wait_until(  # the metrics port comes up while the traffic port waits
            answered,
            what="the metrics port to answer",
            interval_s=0.05,
            ignore=(aiohttp.ClientConnectionError,),
        )
        [(status, body)] = answer
        assert status == 503 and any("starting" in r for r in body["reasons"])
        async with session.get(f"{url}/traffic") as resp:  # nor is the traffic path
            assert resp.status == 503
            assert any("starting" in r for r in (await resp.json())["reasons"])
        gate.set()
        running = await starting
        try:
            async with session.get(url) as resp:
                assert resp.status == 200
            async with session.get(f"{url}/traffic") as resp:
                assert resp.status == 200
                assert await resp.json() == {"status": "ready", "degraded": []}
            running.service.accepting = False  # what stop() sets first
            async with session.get(f"{url}/traffic") as resp:
                assert resp.status == 503
                assert any("stopping" in r for r in (await resp.json())["reasons"])
        finally:
            await running.close(1)


class FlakySource:
    """Its first ``run_failures`` runs fail, then its first ``restart_failures`` restarts;
    a run that does not fail runs until it is stopped (it stops itself, at once)."""

    def __init__(self, run_failures: int, restart_failures: int) -> None:
        self.run_failures, self.restart_failures = run_failures, restart_failures
        self.runs = self.restart_attempts = 0
        self.stopped = False

    async def run(self) -> None:
        self.runs += 1
        if self.run_failures:
            self.run_failures -= 1
            raise RelmonError("lost the broker")
        self.stopped = True  # what stop() does to a running source; then run() returns

    async def restart(self) -> None:
        self.restart_attempts += 1
        if self.restart_failures:
            self.restart_failures -= 1
            raise RelmonError("still no broker")


@pytest.mark.timeout(120)
async def test_supervise_counts_the_restarts_that_worked_only() -> None:
    """Two failed runs, the first restart fails: 3 attempts, 2 restarts counted, run 3 times."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_source("kafka")
    source = FlakySource(run_failures=2, restart_failures=1)
    counter = metrics.source_restarts.labels("kafka")
    await asyncio.wait_for(supervise(source, max_delay_s=0.1, on_restart=counter.inc), 60)
    assert (source.runs, source.restart_attempts) == (3, 3)
    assert registry.get_sample_value("relmon_source_restarts_total", {"source": "kafka"}) == 2


@pytest.mark.timeout(120)
async def test_supervise_counts_nothing_for_a_source_stopped_while_down() -> None:
    calls: list[int] = []
    source = FlakySource(run_failures=1, restart_failures=0)
    source.stopped = True  # stop() came while it was down: no restart
    await asyncio.wait_for(supervise(source, on_restart=lambda: calls.append(1)), 60)
    assert (source.runs, source.restart_attempts, calls) == (1, 0, [])


@pytest.mark.timeout(120)
async def test_supervise_restarts_after_an_error_that_is_not_relmons() -> None:
    """A source that stops anyway is restarted and counted, whatever its run raised: an
    error that is not a RelmonError (a bug) too (it once ended the task for good, with
    /readyz still 200 and nothing counted). It is reported down until it runs again."""
    source = FlakySource(run_failures=0, restart_failures=0)
    real_run = source.run
    events: list[str] = []

    async def broken_once() -> None:
        if source.runs == 0:
            source.runs += 1
            raise KeyError("a bug")
        await real_run()

    source.run = broken_once  # type: ignore[method-assign]
    await asyncio.wait_for(
        supervise(
            source,  # type: ignore[arg-type]
            max_delay_s=0.1,
            on_restart=lambda: events.append("restarted"),
            on_down=lambda: events.append("down"),
        ),
        60,
    )
    assert (source.runs, source.restart_attempts) == (2, 1)
    assert events == ["down", "restarted"]


@pytest.mark.timeout(120)
async def test_supervise_restarts_a_source_whose_run_returns_while_not_stopped() -> None:
    source = FlakySource(run_failures=0, restart_failures=0)
    returns = [True, False]  # the first run returns without being stopped
    real_run = source.run
    events: list[str] = []

    async def returns_early() -> None:
        if returns.pop(0):
            source.runs += 1
            return
        await real_run()

    source.run = returns_early  # type: ignore[method-assign]
    await asyncio.wait_for(
        supervise(
            source,  # type: ignore[arg-type]
            max_delay_s=0.1,
            on_restart=lambda: events.append("restarted"),
            on_down=lambda: events.append("down"),
        ),
        60,
    )
    assert (source.runs, source.restart_attempts, events) == (2, 1, ["down", "restarted"])


@pytest.mark.timeout(120)
async def test_supervise_keeps_trying_a_restart_that_raises_a_bug() -> None:
    source = FlakySource(run_failures=1, restart_failures=0)
    real_restart = source.restart

    async def restart() -> None:
        if source.restart_attempts == 0:
            source.restart_attempts += 1
            raise AttributeError("a bug in restart")
        await real_restart()

    source.restart = restart  # type: ignore[method-assign]
    calls: list[int] = []
    await asyncio.wait_for(
        supervise(source, max_delay_s=0.1, on_restart=lambda: calls.append(1)),  # type: ignore[arg-type]
        60,
    )
    assert (source.runs, source.restart_attempts, calls) == (2, 2, [1])


async def test_supervise_does_not_restart_a_source_used_out_of_order() -> None:
    """A StateError is a RelmonError, but a bug in relmon's wiring (run before start)
    that no restart mends: it ends the task with its traceback, and the source stays
    reported down (``on_down``), so /readyz says so instead of staying 200."""
    source = FlakySource(run_failures=0, restart_failures=0)

    async def not_started() -> None:
        source.runs += 1
        raise StateError("not started")

    source.run = not_started  # type: ignore[method-assign]
    downs: list[int] = []
    with pytest.raises(StateError, match="not started"):
        await supervise(source, on_down=lambda: downs.append(1))  # type: ignore[arg-type]
    assert (source.runs, source.restart_attempts, downs) == (1, 0, [1])


class StubSource:
    """A source for :meth:`Running.not_ready`: only its name, topic and connection."""

    source_name = "kafka"
    topic = "t"

    def __init__(self) -> None:
        self.connected = True


def test_not_ready_names_a_source_that_is_down_or_not_connected() -> None:
    from types import SimpleNamespace

    from monitor.app.runner import Running

    outbox = SimpleNamespace(problem=lambda: None)
    service = SimpleNamespace(
        loaded=True,
        accepting=True,
        circuits_open=lambda: [],
        reviews=SimpleNamespace(outbox=outbox),
    )
    source = StubSource()
    running = Running(
        settings=None,  # type: ignore[arg-type]
        service=service,  # type: ignore[arg-type]
        registry=CollectorRegistry(),
        store=None,  # type: ignore[arg-type]
        metrics_server=None,
        review_server=None,
        traffic_server=None,
        sources=[source],  # type: ignore[list-item]
        started=True,
    )
    assert running.not_ready() == []
    running.down.add("kafka")  # supervise's on_down: its run stopped anyway
    assert running.not_ready() == ["StubSource stopped and is being restarted"]
    running.down.discard("kafka")  # on_restart
    source.connected = False
    assert running.not_ready() == ["Kafka broker not reachable (StubSource, topic t)"]


def test_init_source_creates_restarts_for_every_source_and_traffic_only_for_traffic() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_source("mirror")
    metrics.init_source("verdicts", traffic=False)
    for source in ("mirror", "verdicts"):
        labels = {"source": source}
        assert registry.get_sample_value("relmon_source_restarts_total", labels) == 0
    traffic = {
        s.labels["source"]
        for family in registry.collect()
        if family.name == "relmon_traffic_events"
        for s in family.samples
    }
    assert traffic == {"mirror"}
