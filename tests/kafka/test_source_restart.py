"""A Kafka traffic source whose run failed is restarted by the runner's supervisor and
takes events again (a dead-letter write that failed during a broker outage, simulated at
the adapter boundary), instead of staying down with the process up."""

from __future__ import annotations

import asyncio

from adapters.kafka_source import KafkaEventSource
from monitor.events import TrafficEvent
from monitor.ports import Admission
from monitor.runner import supervise
from tests.kafka import FAST_GROUP, event_bytes, eventually, new_topic, produce, unique


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
    await source.start()
    task = asyncio.create_task(supervise(source, max_delay_s=1.0))
    try:
        await produce(kafka_bootstrap, topic, [event_bytes(f"a{i}") for i in range(3)])
        await eventually(lambda: len(seen) >= 3, timeout_s=30)
        # What a failed dead-letter acknowledgement does; run() raises at its next poll.
        source._fail("dead-letter send to unused-dlq failed: KafkaConnectionError")
        await eventually(lambda: not source.connected, timeout_s=30)
        assert not task.done()
        await eventually(lambda: source.restarts == 1 and source.connected, timeout_s=30)
        await produce(kafka_bootstrap, topic, [event_bytes(f"b{i}") for i in range(3)])
        await eventually(lambda: {"b0", "b1", "b2"} <= set(seen), timeout_s=60)
    finally:
        await source.stop()
        await asyncio.wait_for(task, 30)
    # At least once: nothing skipped over; the a's may come twice (not committed yet).
    assert {f"a{i}" for i in range(3)} | {f"b{i}" for i in range(3)} == set(seen)
    assert task.result() is None
