"""A restart restores exactly the live calibration with the Kafka backend.

Property (hypothesis, derandomized, few examples: each replays and follows the topics
of a real Tansu broker): review items with random sampling times, verdicts written to random
partitions of a three-partition verdict topic in a random order, restarts at random
points, a window smaller than the number of verdicts. The live service applies the
verdicts as its consumer hands them over (partitions interleaved however the consumer
fetched them); after each restart, the window rebuilt from the topics gives a snapshot
identical to the live one.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from adapters.kafka.review import KafkaCalibrationStore, KafkaReviewQueue, durable_producer
from adapters.kafka.verdicts import KafkaVerdictConsumer
from monitor.core.review import ReviewItem, verdict_score
from monitor.engine.service import MonitorService
from monitor.testing import ManualClock
from tests.kafka import new_topic
from tests.sqlite.test_restart_calibration import (
    CANDIDATES,
    MODEL,
    T0,
    TASK,
    mixed_answers,
    served_set_size,
    service,
)
from tests.waiting import wait_until


class Running:
    """A service on the Kafka backend with its verdict consumer."""

    def __init__(
        self,
        bootstrap: str,
        topics: dict[str, str],
        window: int,
        clock: Any,
        aci_gamma: float | None = None,
    ) -> None:
        self.bootstrap, self.topics = bootstrap, topics
        self.window, self.clock, self.aci_gamma = window, clock, aci_gamma

    async def start(self, producer: AIOKafkaProducer) -> None:
        self.store = KafkaCalibrationStore(
            self.bootstrap,
            self.topics["reviews"],
            self.topics["verdicts"],
            verdict_score,
            dead_letter_topic=self.topics["dlq"],
        )
        queue = KafkaReviewQueue(producer, self.topics["reviews"])
        self.service = service(
            self.store,
            self.clock,
            self.window,
            review_queue=queue,
            aci_gamma=self.aci_gamma,
            answer=mixed_answers(),
            review_rate=1.0,
        )
        await self.service.load()
        self.service.start()
        self.consumer = KafkaVerdictConsumer(
            self.store, self.service.apply_verdict, self.service.reject, wait_s=30.0
        )
        await self.consumer.start()
        self.task = asyncio.create_task(self.consumer.run())
        await asyncio.sleep(0)  # let it run before anything may stop it

    consumer: KafkaVerdictConsumer | None = None

    async def stop(self) -> None:
        if self.consumer is None:
            return
        await self.consumer.stop(5.0)
        await asyncio.gather(self.task)
        await self.service.stop(30.0)
        await self.store.aclose()


plans = st.lists(
    st.tuples(
        st.floats(0, 20_000),  # sampling time after T0
        st.sampled_from([1.0, 0.5, 0.25, 0.1]),  # inclusion probability
        st.integers(0, 3),  # verdict: none of these, or the accepted rank
        st.integers(0, 2),  # the verdict's partition
    ),
    min_size=6,
    max_size=14,
)


@settings(
    max_examples=3,
    derandomize=True,
    phases=[Phase.generate],  # no shrinking: every example costs consumer-group joins
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=plans, window=st.integers(2, 5), data=st.data())
async def test_a_restart_rebuilds_exactly_the_live_snapshot_from_the_topics(
    kafka_bootstrap: str, plan: list[tuple[float, float, int, int]], window: int, data: Any
) -> None:
    topics = {
        "reviews": await new_topic(kafka_bootstrap, "reviews"),
        "verdicts": await new_topic(kafka_bootstrap, "verdicts", partitions=3),
        "dlq": await new_topic(kafka_bootstrap, "dlq"),
    }
    order = data.draw(st.permutations(range(len(plan))), label="verdict order")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(plan) - 1), max_size=2))))
    chunks = [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(plan)], strict=True)]
    clock = ManualClock(T0 + 25_000.0)
    producer = durable_producer(kafka_bootstrap)
    await producer.start()
    live = Running(kafka_bootstrap, topics, window, clock)
    try:
        queue = KafkaReviewQueue(producer, topics["reviews"])
        for n, (at, pi, _, _) in enumerate(plan):
            await queue.submit(
                ReviewItem(f"{TASK}:e{n}", MODEL, TASK, "q", CANDIDATES, 10, pi, T0 + at)
            )
        await live.start(producer)
        for chunk in chunks:
            for n in chunk:
                choice, partition = plan[n][2], plan[n][3]
                body: dict[str, Any] = {"item_id": f"{TASK}:e{n}"}
                if choice:
                    body["accepted_ranks"] = [choice]
                else:
                    body["none_of_these"] = True
                await producer.send_and_wait(
                    topics["verdicts"], json.dumps(body).encode(), partition=partition
                )
            # A restarted service counts from 0 and follows the topics from where its
            # replay stopped: only the new chunk's verdicts are applied by it.
            service, expected = live.service, len(chunk)

            def caught_up(s: MonitorService = service, t: int = expected) -> bool:
                return s.stats.verdicts == t

            await wait_until(
                caught_up, timeout_s=30, what="the live service to apply every verdict"
            )
            before = live.service.snapshot(MODEL, TASK)
            await live.stop()
            live = Running(kafka_bootstrap, topics, window, clock)
            await live.start(producer)
            after = live.service.snapshot(MODEL, TASK)
            assert after == before
        assert live.service.snapshot(MODEL, TASK).n == min(len(plan), window)
    finally:
        await live.stop()
        await producer.stop()


aci_plans = st.lists(
    st.tuples(
        st.floats(0, 600),  # sampling time after T0
        st.sampled_from([1.0, 0.5, 0.25]),  # inclusion probability
        st.sampled_from([1.0, 2.0, math.inf]),  # the ACI threshold the item was served at
        st.sampled_from([1, 1, 2, 3, 0]),  # verdict: accepted rank, or none of these (0)
        st.integers(0, 2),  # the verdict's partition
    ),
    min_size=6,
    max_size=14,
)


@settings(
    max_examples=2,
    derandomize=True,
    phases=[Phase.generate],  # no shrinking: every example costs consumer-group joins
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=aci_plans, window=st.integers(3, 8), data=st.data())
async def test_a_restart_restores_aci_alpha_from_the_topics(
    kafka_bootstrap: str, plan: list[tuple[float, float, float, int, int]], window: int, data: Any
) -> None:
    """ACI on: review items carry the threshold they were served at, verdicts go to
    random partitions in a random order and are applied live in whatever order the
    consumer hands them over; the replay derives each step from the item and the score
    in log order. After each restart alpha_t, the served set size and the snapshot are
    the live ones."""
    gamma = 0.2
    topics = {
        "reviews": await new_topic(kafka_bootstrap, "reviews"),
        "verdicts": await new_topic(kafka_bootstrap, "verdicts", partitions=3),
        "dlq": await new_topic(kafka_bootstrap, "dlq"),
    }
    order = data.draw(st.permutations(range(len(plan))), label="verdict order")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(plan) - 1), max_size=2))))
    chunks = [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(plan)], strict=True)]
    clock = ManualClock(T0 + 1_000.0)
    producer = durable_producer(kafka_bootstrap)
    await producer.start()
    live = Running(kafka_bootstrap, topics, window, clock, aci_gamma=gamma)
    misses = 0
    try:
        queue = KafkaReviewQueue(producer, topics["reviews"])
        for n, (at, pi, aci_threshold, _, _) in enumerate(plan):
            await queue.submit(
                ReviewItem(
                    f"{TASK}:e{n}",
                    MODEL,
                    TASK,
                    "q",
                    CANDIDATES,
                    10,
                    pi,
                    T0 + at,
                    aci_threshold=aci_threshold,
                )
            )
        await live.start(producer)
        for round_, chunk in enumerate(chunks):
            for n in chunk:
                _, _, aci_threshold, choice, partition = plan[n]
                body: dict[str, Any] = {"item_id": f"{TASK}:e{n}"}
                if choice:
                    body["accepted_ranks"] = [choice]
                else:
                    body["none_of_these"] = True
                misses += (choice or math.inf) > aci_threshold
                await producer.send_and_wait(
                    topics["verdicts"], json.dumps(body).encode(), partition=partition
                )
            service, expected = live.service, len(chunk)

            def caught_up(s: MonitorService = service, t: int = expected) -> bool:
                return s.stats.verdicts == t

            await wait_until(
                caught_up, timeout_s=30, what="the live service to apply every verdict"
            )
            alpha_t = live.service.aci_alpha(MODEL, TASK)
            before = live.service.snapshot(MODEL, TASK)
            size = await served_set_size(live.service, f"probe-{round_}-live")
            await live.stop()
            live = Running(kafka_bootstrap, topics, window, clock, aci_gamma=gamma)
            await live.start(producer)
            assert live.service.aci_alpha(MODEL, TASK) == alpha_t
            assert live.service.snapshot(MODEL, TASK) == before
            assert await served_set_size(live.service, f"probe-{round_}-again") == size
        steps = len(plan)
        assert live.service.aci_alpha(MODEL, TASK) == pytest.approx(
            0.2 + gamma * (steps * 0.2 - misses), abs=1e-12
        )
    finally:
        await live.stop()
        await producer.stop()
