"""``relmon_kafka_consumer_lag{topic,partition}`` from the Kafka source on a real broker."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from adapters.kafka.source import KafkaEventSource
from monitor.core.events import TrafficEvent
from monitor.engine.metrics import Metrics
from monitor.engine.ports import Admission
from tests.kafka import FAST_GROUP, event_bytes, new_topic, produce, unique
from tests.waiting import wait_until


def lag_series(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.labels["topic"], s.labels["partition"]): s.value
        for family in registry.collect()
        if family.name == "relmon_kafka_consumer_lag"
        for s in family.samples
    }


async def test_lag_counts_records_not_done_and_goes_at_stop(kafka_bootstrap: str) -> None:
    """While the service is busy the source holds its partitions: everything is behind
    the log end. Once the service takes events the lag falls to 0 per partition, and a
    stopped source exports no stale series."""
    topic = await new_topic(kafka_bootstrap, "traffic-lag", partitions=2)
    await produce(kafka_bootstrap, topic, [event_bytes(f"a{i}") for i in range(9)], partition=0)
    await produce(kafka_bootstrap, topic, [event_bytes(f"b{i}") for i in range(3)], partition=1)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    open_ = asyncio.Event()
    seen: list[str] = []

    def sink(event: TrafficEvent, source: str) -> Admission:
        if not open_.is_set():
            return Admission("busy")
        seen.append(event.id)
        return Admission("skipped")

    source = KafkaEventSource(
        kafka_bootstrap,
        topic,
        unique("lag"),
        "unused-dlq",
        sink,
        lambda s, r: None,
        lag_gauge=metrics.kafka_consumer_lag,
        lag_interval_s=0.1,
        **FAST_GROUP,
    )
    await source.start()
    task = asyncio.create_task(source.run())
    try:
        await wait_until(
            lambda: lag_series(registry) == {(topic, "0"): 9.0, (topic, "1"): 3.0},
            timeout_s=30,
            what="lag 9 and 3 on the two partitions",
        )
        assert seen == []
        open_.set()
        await wait_until(lambda: len(seen) == 12, timeout_s=30, what="12 events at the sink")
        await wait_until(
            lambda: lag_series(registry) == {(topic, "0"): 0.0, (topic, "1"): 0.0},
            timeout_s=30,
            what="lag 0 on both partitions",
        )
        assert source.lag.lag == {TopicPartition(topic, 0): 0, TopicPartition(topic, 1): 0}
        # New records show up as lag only until they are taken.
        await produce(kafka_bootstrap, topic, [event_bytes("late")], partition=1)
        await wait_until(lambda: "late" in seen, timeout_s=30, what="the late event at the sink")
        await wait_until(
            lambda: lag_series(registry)[(topic, "1")] == 0.0,
            timeout_s=30,
            what="lag 0 on partition 1 again",
        )
    finally:
        await source.stop()
        await asyncio.wait_for(task, 30)
    assert lag_series(registry) == {}
