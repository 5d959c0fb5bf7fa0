"""Property, on a real broker: whatever the order of review items and verdicts (a verdict
may come before its item) and wherever restarts fall, every verdict of an existing item
is applied exactly once (the first per item wins), a verdict for an item that never
comes is dead-lettered exactly once, and a fresh replay gives the same calibration."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.kafka.review import KafkaCalibrationStore, durable_producer
from adapters.kafka.verdicts import KafkaVerdictConsumer
from monitor.core.review import ReviewItem, Verdict, verdict_score
from monitor.engine.ports import CalibrationRecord, VerdictOutcome
from tests.kafka import new_topic, read_all
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(600)

WAIT_S = 4.0


def review_item(n: int) -> ReviewItem:
    return ReviewItem(
        item_id=f"i{n}",
        model="m",
        task="t",
        query="q",
        candidates=(("a", 5), ("b", 3), ("c", 1)),
        k=9,
        inclusion_probability=1.0,
        sampled_at=1_800_000_000.0 + n,
    )


class Replica:
    """A store, its verdict consumer and the service's part (first verdict wins)."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self.stopped = False
        self.store = KafkaCalibrationStore(
            bootstrap,
            topics["reviews"],
            topics["verdicts"],
            verdict_score,
            dead_letter_topic=topics["dlq"],
        )
        self.applied: dict[str, float] = {}
        self.consumer: KafkaVerdictConsumer | None = None
        self.task: asyncio.Task[None] | None = None

    async def handle(self, v: Verdict) -> VerdictOutcome:
        item = await self.store.get_review_item(v.item_id)
        assert item is not None
        score = verdict_score(item, v)
        record = CalibrationRecord("m", "t", v.item_id, score, 1.0, item.sampled_at)
        if not await self.store.save_record(record, v):
            return VerdictOutcome("duplicate", score=score)
        assert v.item_id not in self.applied
        self.applied[v.item_id] = score
        return VerdictOutcome("applied", score=score)

    async def start(self) -> None:
        self.applied = {r.item_id: r.score for r in await self.store.load_records()}
        self.consumer = KafkaVerdictConsumer(
            self.store, self.handle, lambda kind, reason: None, wait_s=WAIT_S
        )
        await self.consumer.start()
        self.task = asyncio.create_task(self.consumer.run())

    async def stop(self) -> None:
        if self.stopped or self.consumer is None or self.task is None:
            return
        self.stopped = True
        await self.consumer.stop(10.0)
        await asyncio.gather(self.task)


# An operation: ("item", n) publishes item n, ("verdict", n, rank) a verdict for item n
# (n = 9: an item that never exists), ("restart",) restarts the replica.
operation = st.one_of(
    st.tuples(st.just("verdict"), st.sampled_from([0, 1, 2, 3, 9]), st.integers(1, 3)),
    st.tuples(st.just("restart")),
)


@st.composite
def scenarios(draw: Any) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = draw(st.lists(operation, min_size=3, max_size=10))
    ops = [op for op in ops if op[0] != "restart"][:8] + [o for o in ops if o[0] == "restart"][:2]
    ops = draw(st.permutations(ops))
    # Each of the items 0..3 is published somewhere in the sequence (maybe after its
    # verdicts: they must wait for it).
    for n in range(4):
        ops.insert(draw(st.integers(0, len(ops))), ("item", n))
    return ops


@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=scenarios())
async def test_verdicts_are_applied_exactly_once_whatever_the_order_and_restarts(
    kafka_bootstrap: str, ops: list[tuple[Any, ...]]
) -> None:
    topics = {
        "reviews": await new_topic(kafka_bootstrap, "reviews"),
        "verdicts": await new_topic(kafka_bootstrap, "verdicts", partitions=2),
        "dlq": await new_topic(kafka_bootstrap, "dlq"),
    }
    producer: AIOKafkaProducer = durable_producer(kafka_bootstrap)
    await producer.start()
    replica = Replica(kafka_bootstrap, topics)
    expected: dict[str, float] = {}
    ghosts = 0
    try:
        await replica.start()
        for op in ops:
            if op[0] == "item":
                it = review_item(op[1])
                value = json.dumps(it.to_json()).encode()
                await producer.send_and_wait(topics["reviews"], value, key=it.item_id.encode())
            elif op[0] == "verdict":
                item_id, rank = f"i{op[1]}", op[2]
                body = {"item_id": item_id, "accepted_ranks": [rank]}
                await producer.send_and_wait(
                    topics["verdicts"], json.dumps(body).encode(), key=item_id.encode()
                )
                if op[1] == 9:
                    ghosts += 1
                else:
                    expected.setdefault(item_id, float(rank))
            else:
                await replica.stop()
                replica = Replica(kafka_bootstrap, topics)
                await replica.start()
        consumer = replica.consumer
        assert consumer is not None

        def settled() -> bool:
            return replica.applied == expected and consumer.waiting == 0

        await wait_until(
            settled, timeout_s=WAIT_S + 20, what="every verdict applied and none waiting"
        )
        dead = await read_all(kafka_bootstrap, topics["dlq"], at_least=ghosts)
        assert len(dead) == ghosts  # exactly once, also across restarts
        assert len({_source(r) for r in dead}) == ghosts  # each one a different verdict
        # A fresh replay holds the same calibration and refuses nothing again.
        await replica.stop()
        again = Replica(kafka_bootstrap, topics)
        await again.start()
        try:
            assert again.applied == expected
            assert again.store.dead_lettered_verdicts == ghosts
            assert again.consumer is not None and again.consumer.waiting == 0
        finally:
            await again.stop()
    finally:
        await replica.stop()
        await producer.stop()


@dataclasses.dataclass(frozen=True)
class _Source:
    partition: bytes
    offset: bytes


def _source(record: Any) -> _Source:
    headers = dict(record.headers)
    return _Source(headers["relmon-source-partition"], headers["relmon-source-offset"])
