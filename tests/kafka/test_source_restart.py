"""A Kafka traffic source whose run failed is restarted by the runner's supervisor and
takes events again (a dead-letter write that failed during a broker outage, simulated at
the adapter boundary), instead of staying down with the process up; every restart that
worked is counted in ``relmon_source_restarts_total{source="kafka"}``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from adapters.kafka.source import KafkaEventSource
from monitor.app.runner import Running, start_service
from monitor.app.supervision import supervise
from monitor.config import load_settings
from monitor.core.events import TrafficEvent
from monitor.engine.metrics import Metrics
from monitor.engine.ports import Admission
from tests.kafka import (
    FAST_GROUP,
    event_bytes,
    free_port,
    http_get,
    new_topic,
    produce,
    relmon_config,
    relmon_topics,
    unique,
)
from tests.waiting import wait_until


def restarts(registry: CollectorRegistry, source: str) -> float | None:
    """``relmon_source_restarts_total{source}``; None if the series does not exist."""
    return registry.get_sample_value("relmon_source_restarts_total", {"source": source})


async def scrape(port: int) -> str:
    status, text = await http_get(port, "/metrics")
    assert status == 200
    return text


async def start_on_kafka(
    bootstrap: str, tmp_path: Path, **kafka: Any
) -> tuple[Running, dict[str, str], int]:
    """A started ``relmon`` on fresh topics (Kafka traffic and review, no model server):
    the service, its topics and its metrics port; ``kafka`` adds Kafka settings."""
    topics = await relmon_topics(bootstrap)
    port = free_port()
    config = tmp_path / "relmon.yaml"
    model = "http://127.0.0.1:9/v1"
    group = f"g-{port}"
    relmon_config(config, model, bootstrap, topics=topics, group=group, port=port, kafka=kafka)
    return await start_service(load_settings(config)), topics, port


async def test_a_failed_source_is_restarted_and_takes_events_again(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap, "traffic-restart")
    seen: list[str] = []

    def sink(event: TrafficEvent, source: str) -> Admission:
        seen.append(event.id)
        return Admission("skipped")

    source = KafkaEventSource(
        kafka_bootstrap,
        topic,
        unique("restart"),
        "unused-dlq",
        sink,
        lambda s, r: None,
        **FAST_GROUP,
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_source(source.source_name)
    counter = metrics.source_restarts.labels(source.source_name)
    await source.start()
    task = asyncio.create_task(supervise(source, max_delay_s=1.0, on_restart=counter.inc))
    try:
        await produce(kafka_bootstrap, topic, [event_bytes(f"a{i}") for i in range(3)])
        await wait_until(lambda: len(seen) >= 3, timeout_s=30, what="3 events at the sink")
        assert restarts(registry, "kafka") == 0
        # What a failed dead-letter acknowledgement does; run() raises at its next poll.
        source._fail("dead-letter send to unused-dlq failed: KafkaConnectionError")
        await wait_until(lambda: not source.connected, timeout_s=30, what="the source to fail")
        assert not task.done()
        await wait_until(
            lambda: source.restarts == 1 and source.connected,
            timeout_s=30,
            what="the source restarted and connected",
        )
        await wait_until(
            lambda: restarts(registry, "kafka") == 1, timeout_s=30, what="the restart counted"
        )
        await produce(kafka_bootstrap, topic, [event_bytes(f"b{i}") for i in range(3)])
        await wait_until(
            lambda: {"b0", "b1", "b2"} <= set(seen),
            timeout_s=60,
            what="b0, b1 and b2 at the sink after the restart",
        )
    finally:
        await source.stop()
        await asyncio.wait_for(task, 30)
    # At least once: nothing skipped over; the a's may come twice (not committed yet).
    assert {f"a{i}" for i in range(3)} | {f"b{i}" for i in range(3)} == set(seen)
    assert task.result() is None
    assert restarts(registry, "kafka") == 1  # stopping is not a restart


@pytest.mark.timeout(300)
async def test_the_service_counts_every_restart_of_its_traffic_source(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Under ``relmon run``: both sources' counters exist at 0 from the start; each failure
    of the traffic source and its restart count once, under ``kafka`` only, and the
    restarted source takes events again."""
    running, topics, port = await start_on_kafka(kafka_bootstrap, tmp_path)
    registry = running.registry
    try:
        source = next(s for s in running.sources if isinstance(s, KafkaEventSource))
        await wait_until(lambda: not running.not_ready(), timeout_s=60, what="relmon ready")
        text = await scrape(port)
        assert 'relmon_source_restarts_total{source="kafka"} 0.0' in text
        assert 'relmon_source_restarts_total{source="verdicts"} 0.0' in text
        for n in (1, 2):
            source._fail("dead-letter send failed: KafkaConnectionError")
            await wait_until(lambda: not source.connected, timeout_s=30, what="the source to fail")
            await wait_until(
                lambda n=n: restarts(registry, "kafka") == n,
                timeout_s=90,
                what=f"restart {n} counted",
            )
        await wait_until(lambda: not running.not_ready(), timeout_s=90, what="relmon ready")
        # Events for no configured task: skipped, counted under the same source.
        await produce(kafka_bootstrap, topics["traffic"], [event_bytes(f"c{i}") for i in range(3)])

        def skipped() -> float:
            labels = {"source": "kafka", "decision": "skipped"}
            return registry.get_sample_value("relmon_traffic_events_total", labels) or 0.0

        await wait_until(lambda: skipped() >= 3, timeout_s=90, what="3 events skipped")
        text = await scrape(port)
        assert 'relmon_source_restarts_total{source="kafka"} 2.0' in text
        assert 'relmon_source_restarts_total{source="verdicts"} 0.0' in text
    finally:
        await running.close(10.0)
    assert restarts(registry, "kafka") == 2 and restarts(registry, "verdicts") == 0


@pytest.mark.timeout(300)
async def test_a_source_that_crashes_on_a_bug_is_restarted_counted_and_not_ready_while_down(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``relmon run``: the traffic source's run raises an exception that is not a
    RelmonError (a bug outside any one event). It used to end the source's task for
    good with /readyz 200 and nothing counted; now /readyz is 503 while it is down, the
    restart is counted, and the restarted source takes events again."""
    running, topics, port = await start_on_kafka(kafka_bootstrap, tmp_path, **FAST_GROUP)
    registry = running.registry
    try:
        source = next(s for s in running.sources if isinstance(s, KafkaEventSource))
        await wait_until(lambda: not running.not_ready(), timeout_s=60, what="relmon ready")
        gate = asyncio.Event()
        real_restart = source.restart

        async def held_restart() -> None:
            await gate.wait()
            await real_restart()

        async def crash() -> None:
            monkeypatch.undo()  # once
            raise ZeroDivisionError("a bug in the run loop")

        monkeypatch.setattr(source, "_before_poll", crash)
        with monkeypatch.context() as patch:
            patch.setattr(source, "restart", held_restart)

            async def down() -> bool:
                status, body = await http_get(port, "/readyz")
                return status == 503 and "stopped and is being restarted" in body

            await wait_until(down, timeout_s=60, what="/readyz 503 while the source is down")
            assert not source.connected
            assert restarts(registry, "kafka") == 0
            gate.set()
            await wait_until(
                lambda: restarts(registry, "kafka") == 1, timeout_s=60, what="the restart counted"
            )
        await wait_until(lambda: not running.not_ready(), timeout_s=60, what="relmon ready again")
        status, _ = await http_get(port, "/readyz")
        assert status == 200
        await produce(kafka_bootstrap, topics["traffic"], [event_bytes("after")])

        def skipped() -> float:
            labels = {"source": "kafka", "decision": "skipped"}
            return registry.get_sample_value("relmon_traffic_events_total", labels) or 0.0

        await wait_until(lambda: skipped() >= 1, timeout_s=90, what="the next event handled")
    finally:
        await running.close(10.0)
    assert restarts(registry, "kafka") == 1
