"""A broker rebuilt without its data under a running source, on a real broker (Tansu),
when the recreated topic already reaches past the old positions before the source reads
again: no position lies past a log end there, only the group's lost committed offsets
tell the source that its positions belong to a log that is gone."""

from __future__ import annotations

import asyncio
import math
import subprocess
from collections.abc import Collection
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from tests.kafka import event_bytes, new_topic, produce, unique
from tests.kafka.conftest import _wait_ready, spawn_broker, stop_broker
from tests.kafka.test_kafka_truth import (
    NEW_PARTITIONS_WITHIN_S,
    Sink,
    create_topic,
    lag_series,
    resets,
    source_on,
    structlog_lines,
)
from tests.waiting import wait_until

AFTER = {p: [f"b{p}-{i}" for i in range(15)] for p in (0, 1, 2)}
"""The events produced after the rebuild, per partition of the recreated topic."""


class LagWatch:
    """Samples the lag every 20 ms once armed: a partition whose lag reads 0 while some of
    its events produced after the rebuild were not read yet is a wrong reading."""

    def __init__(self, registry: CollectorRegistry, sink: Sink) -> None:
        self.registry, self.sink = registry, sink
        self.armed = False
        self.wrong: list[str] = []

    async def run(self) -> None:
        while True:
            seen = set(self.sink.seen)
            for (_, p), n in lag_series(self.registry).items():
                unread = set(AFTER[int(p)]) - seen
                if self.armed and n == 0 and unread:
                    self.wrong.append(f"partition {p}: lag 0 with {len(unread)} unread")
            await asyncio.sleep(0.02)


def all_nan(values: Collection[float]) -> bool:
    return bool(values) and all(math.isnan(n) for n in values)


@pytest.mark.timeout(240)
async def test_a_recreated_topic_already_past_the_old_positions_is_read_from_its_start(
    private_kafka: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A source has read and committed 10 events on each of two partitions; the broker is
    replaced by an empty one, the topic recreated with three partitions and 15 events
    produced to each before the source reads again. Every one of them is read, each old
    partition is reset once (``committed_offset_lost``, to 0), and the lag, sampled all
    along, reads NaN while no broker answers and never 0 for a partition with events not
    read."""
    bootstrap, old = private_kafka
    port = int(bootstrap.rsplit(":", 1)[1])
    topic = await new_topic(bootstrap, "traffic-outgrown", partitions=2)
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    sink = Sink()
    registry = CollectorRegistry()
    source = source_on(bootstrap, topic, unique("outgrown"), sink, registry)
    watch = LagWatch(registry, sink)
    new: subprocess.Popen[bytes] | None = None
    with structlog_lines() as lines:
        await source.start()
        task = asyncio.create_task(source.run())
        sampler = asyncio.create_task(watch.run())
        try:
            for p in (0, 1):
                before = [event_bytes(f"a{p}-{i}") for i in range(10)]
                await produce(bootstrap, topic, before, partition=p)
            await wait_until(
                lambda: all(getattr(source._parts.get(tp), "committed", None) == 10 for tp in tps),
                timeout_s=30,
                what="offset 10 committed on both partitions",
            )
            await asyncio.to_thread(stop_broker, old)
            await wait_until(
                lambda: all_nan(lag_series(registry).values()),
                timeout_s=30,
                what="the lag NaN while no broker answers",
                detail=lambda: str(lag_series(registry)),
            )
            new = spawn_broker(port, tmp_path)
            await _wait_ready(bootstrap, new)
            await create_topic(bootstrap, topic, 3)
            for p, ids in AFTER.items():
                await produce(bootstrap, topic, [event_bytes(i) for i in ids], partition=p)
            watch.armed = True
            everything = {i for ids in AFTER.values() for i in ids}
            await wait_until(
                lambda: everything <= set(sink.seen),
                timeout_s=NEW_PARTITIONS_WITHIN_S + 10,
                what="every event produced after the rebuild",
                detail=lambda: f"not read: {sorted(everything - set(sink.seen))}",
            )
            await wait_until(
                lambda: lag_series(registry) == {(topic, str(p)): 0.0 for p in (0, 1, 2)},
                timeout_s=30,
                what="lag 0 on the three partitions once everything is read",
                detail=lambda: str(lag_series(registry)),
            )
        finally:
            sampler.cancel()
            await asyncio.wait({sampler})
            await source.stop()
            await asyncio.wait_for(task, 30)
            if new is not None:
                await asyncio.to_thread(stop_broker, new)
    assert watch.wrong == []
    assert source.offset_resets == {tp: 1 for tp in tps}
    assert resets(registry, topic) == 2.0
    logged = [line for line in lines if line["event"] == "kafka.offset_reset"]
    assert sorted((line["partition"], line["cause"], line["reset_to"]) for line in logged) == [
        (0, "committed_offset_lost", 0),
        (1, "committed_offset_lost", 0),
    ]
