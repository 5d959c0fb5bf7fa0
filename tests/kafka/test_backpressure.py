"""A Kafka backlog over budget is paced, not dropped: the source pauses its partitions
and resumes them as the call budget refills (real broker, real service, fake model,
manual clock so that the budget's pace is exact)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from adapters.kafka.source import KafkaEventSource
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.events import TrafficEvent
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.ports import Admission
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock
from tests.kafka import FAST_GROUP, committed, new_topic, produce, unique
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

EVENTS = 480
PARTITIONS = 2
PER_MINUTE = 60  # the bucket holds 60 calls and refills one call per (manual) second
K_MAX = 4


def event(i: int) -> bytes:
    return json.dumps(
        {
            "id": f"e{i}",
            "model": "sim-1",
            "task": "arith",
            "request": {"messages": [{"role": "user", "content": f"What is {i} + 1?"}]},
        }
    ).encode()


async def test_a_backlog_over_budget_is_paced_and_nothing_is_dropped(
    kafka_bootstrap: str,
) -> None:
    topic = await new_topic(kafka_bootstrap, "backlog", partitions=PARTITIONS)
    where: dict[str, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        ids = range(p, EVENTS, PARTITIONS)
        sent = await produce(kafka_bootstrap, topic, [event(i) for i in ids], partition=p)
        where |= {f"e{i}": (md.partition, md.offset) for i, md in zip(ids, sent, strict=True)}
    ends = {p: 1 + max(o for q, o in where.values() if q == p) for p in range(PARTITIONS)}

    clock = ManualClock()
    client = FakeModelClient(lambda query, call: "2")
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=TaskSettings(
            name="arith",
            canonicalizer="numeric",
            k_max=K_MAX,
            k0=3,
            sampling_rate=0.5,
            review_rate=0.2,
            endpoint={"model": "sim-1"},
        ),
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=K_MAX, k0=3),
        client=client,
        sync_canonicalizer=canon,
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry, k_max=K_MAX)
    metrics.init_source("kafka")
    store = InMemoryStore()
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=metrics,
        # Unpaced: the pace runs on the event loop's clock, this budget on the manual one.
        budget=BudgetSettings(
            calls_per_minute=PER_MINUTE, max_in_flight=4, queue_size=64, pace=False
        ),
        clock=clock,
    )
    await service.load()
    service.start()

    offers: dict[str, list[str]] = {}
    done: dict[str, asyncio.Future[None] | None] = {}
    last_busy: list[tuple[float, int]] = []

    def sink(ev: TrafficEvent, source: str) -> Admission:
        admission = service.offer(ev, source, wait=True)
        offers.setdefault(ev.id, []).append(admission.decision)
        if admission.decision == "busy":
            last_busy[:] = [(clock.monotonic(), service.stats.scored)]
        else:
            done[ev.id] = admission.done
        return admission

    def finished(event_id: str) -> bool:
        fut = done.get(event_id, False)
        return fut is None or (fut is not False and fut.done())

    group = unique("paced")
    source = KafkaEventSource(
        kafka_bootstrap, topic, group, topic + "-dlq", sink, service.reject,
        commit_interval_s=0.05, **FAST_GROUP,
    )  # fmt: skip
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    async def commits_never_pass_unfinished_events() -> None:
        offsets = await committed(kafka_bootstrap, group, tps)
        for p, offset in enumerate(offsets):
            unfinished = [o for i, (q, o) in where.items() if q == p and not finished(i)]
            limit = min(unfinished, default=ends[p])
            assert offset is None or offset <= limit, (p, offset, limit)

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    def settled() -> bool:
        """The source took all the budget allows now, and the service finished it: the
        last offer found no room after every admitted item was done."""
        if service.in_flight:
            return False
        return len(done) == EVENTS or last_busy == [(clock.monotonic(), service.stats.scored)]

    await source.start()
    runner = asyncio.create_task(source.run())
    start = clock.monotonic()
    try:
        steps = 0
        while True:
            await wait_until(
                settled,
                timeout_s=60,
                what="the source to take what the budget allows and the service to finish it",
            )
            # The budget's promise: never more calls than the bucket plus its refill.
            assert client.calls <= PER_MINUTE + (clock.monotonic() - start) * PER_MINUTE / 60
            await commits_never_pass_unfinished_events()
            if len(done) == EVENTS:
                break
            clock.advance(30.0)
            steps += 1
            assert steps < 100, "the backlog does not move"

        async def all_committed() -> bool:
            return await committed(kafka_bootstrap, group, tps) == [ends[p] for p in range(2)]

        await wait_until(all_committed, timeout_s=30, what="every partition committed to its end")
    finally:
        await source.stop(10.0)
        await asyncio.gather(runner, return_exceptions=True)
        await service.stop(5.0)

    # Every event was offered until it went, exactly once with a final decision.
    finals = {i: [d for d in ds if d != "busy"] for i, ds in offers.items()}
    assert sorted(finals) == sorted(where)
    assert all(len(ds) == 1 for ds in finals.values())
    sampled = sum(ds == ["sampled"] for ds in finals.values())
    skipped = sum(ds == ["skipped"] for ds in finals.values())
    assert sampled + skipped == EVENTS and 150 < sampled < 330
    assert any("busy" in ds for ds in offers.values())  # the source really had to wait
    assert value("relmon_traffic_events_total", source="kafka", decision="dropped") == 0
    assert value("relmon_traffic_events_total", source="kafka", decision="sampled") == sampled
    assert value("relmon_items_total", model="sim-1", task="arith", outcome="scored") == sampled
    calls = value("relmon_samples_per_item_sum", model="sim-1", task="arith")
    assert client.calls == calls >= sampled
    # and no slower: the refill was used up to a few steps of the manual clock.
    elapsed = clock.monotonic() - start
    assert elapsed <= (client.calls - PER_MINUTE) * 60 / PER_MINUTE + 3 * 30
