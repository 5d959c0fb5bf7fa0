"""Verdicts given before, during and after a restart of the service on Kafka: none lost,
none counted twice, the queue depth right at every step, and the level and thresholds
of an independent computation, also when the broker under-reports its end offsets
(simulated at the adapter boundary, as Tansu 0.6 does after a multi-record batch)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from monitor.app.demo.model import QuestionBank, SimulatedModel, truth_of
from monitor.app.runner import Running, start_service
from monitor.config import load_settings
from monitor.core.canon import get_canonicalizer
from tests.kafka import (
    arith_events,
    produce,
    read_all,
    relmon_config,
    relmon_topics,
    unique,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(600)  # ~33 s unloaded: room for a machine 10x slower

N = 40
ALPHAS = (0.1, 0.2, 0.3)
LABELS = {"model": "sim-arith-1", "task": "arithmetic"}


class Tail:
    """Every record of a topic as it arrives (no end offsets trusted, no group)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self.topic = topic
        self.records: list[Any] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Tail:
        await self.consumer.start()
        await self.consumer.topics()
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        for tp in tps:
            self.consumer.seek(tp, 0)
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=200)
            for records in batch.values():
                self.records.extend(records)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()


def metric(running: Running, name: str, **labels: str) -> float:
    value = running.registry.get_sample_value(name, {**LABELS, **labels})
    assert value is not None, (name, labels)
    return value


def independent(scores: list[float]) -> dict[str, float]:
    """Level and thresholds from the scores by hand (equal weights: pi = 1, no decay)."""
    n = len(scores)
    out = {"level": sum(s <= 1 for s in scores) / (n + 1)}
    for alpha in ALPHAS:
        k = math.ceil(round((n + 1) * (1 - alpha), 9))
        out[f"{alpha:g}"] = math.inf if k > n else sorted(scores)[k - 1]
    return out


def exported(running: Running) -> dict[str, float]:
    running.service.publish()
    out = {"level": metric(running, "relmon_reliability_level")}
    for alpha in ALPHAS:
        out[f"{alpha:g}"] = metric(running, "relmon_conformal_threshold", alpha=f"{alpha:g}")
    return out


@asynccontextmanager
async def service(config: Path) -> AsyncIterator[Running]:
    running = await start_service(load_settings(config))
    try:
        yield running
    finally:
        await running.close(10.0)


async def test_verdicts_before_during_and_after_a_restart(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = await relmon_topics(kafka_bootstrap, traffic_partitions=2)
    bank = QuestionBank(size=N, seed=11)
    model = SimulatedModel(quality=0.75, drift_after_s=None, bank=bank, seed=5)
    url = await model.start()
    config = tmp_path / "relmon.yaml"
    relmon_config(
        config,
        url,
        kafka_bootstrap,
        topics=topics,
        group=unique("restart"),
        task={"k_max": 6},
        kafka={"verdict_wait_s": 3},
        budget={"calls_per_minute": 100000},
    )
    events = arith_events([q for q, _ in bank.questions], "q")
    await produce(kafka_bootstrap, topics["traffic"], events)
    canon = get_canonicalizer("numeric")
    scores: dict[str, float] = {}
    verdicts: dict[str, bytes] = {}
    figures: dict[str, Any] = {"items": N, "verdicts": "15 before, 10 down, 5 starting, 10 after"}
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()

    async def give(ids: list[str], *extra: tuple[bytes, bytes]) -> None:
        """Verdicts sent together and flushed once: multi-record batches."""
        sent = [await producer.send(topics["verdict"], verdicts[i], key=i.encode()) for i in ids]
        sent += [await producer.send(topics["verdict"], v, key=k) for k, v in extra]
        await producer.flush()
        await asyncio.gather(*sent)

    try:
        async with Tail(kafka_bootstrap, topics["review"]) as reviews:
            async with service(config) as first:
                await wait_until(
                    lambda: len(reviews.records) >= N,
                    timeout_s=120,
                    what=f"{N} review items on the review topic",
                )
                assert len(reviews.records) == N
                for record in reviews.records:
                    item = json.loads(record.value)
                    truth = canon.canonicalize(str(truth_of(item["query"])))
                    ranks = [c["rank"] for c in item["candidates"] if c["answer"] == truth]
                    body = {"item_id": item["item_id"], "reviewer": "test"}
                    body |= {"accepted_ranks": ranks} if ranks else {"none_of_these": True}
                    scores[item["item_id"]] = float(min(ranks)) if ranks else math.inf
                    verdicts[item["item_id"]] = json.dumps(body).encode()
                ids = sorted(scores)
                assert metric(first, "relmon_review_queue_depth") == N
                # Before the restart: 15 verdicts.
                await give(ids[:15])
                await wait_until(
                    lambda: metric(first, "relmon_calibration_items") == 15,
                    timeout_s=60,
                    what="15 verdicts in the window before the restart",
                )
                first.service.publish()
                assert metric(first, "relmon_review_queue_depth") == N - 15

            # While it is down: 10 verdicts, one for an item that never existed, one junk.
            await give(ids[15:25], (b"ghost", b'{"item_id": "ghost", "accepted_ranks": [1]}'))
            await give([], (b"junk", b"not a verdict"))

            real = AIOKafkaConsumer.end_offsets

            async def under_reported(self: AIOKafkaConsumer, partitions: Any) -> dict[Any, int]:
                return {tp: min(end, 1) for tp, end in (await real(self, partitions)).items()}

            monkeypatch.setattr(AIOKafkaConsumer, "end_offsets", under_reported)
            # During the start (the replay): 5 more; after it: the last 10 and a second
            # verdict for an item that has one (it must not count).
            starting = asyncio.create_task(start_service(load_settings(config)))
            await give(ids[25:30])
            second = await starting
            try:
                await wait_until(
                    lambda: metric(second, "relmon_calibration_items") == 30,
                    timeout_s=60,
                    what="30 verdicts in the window after the restart",
                )
                second.service.publish()
                assert metric(second, "relmon_review_queue_depth") == N - 30
                duplicate = json.dumps({"item_id": ids[3], "none_of_these": True}).encode()
                await give(ids[30:], (ids[3].encode(), duplicate))
                await wait_until(
                    lambda: metric(second, "relmon_calibration_items") == N,
                    timeout_s=60,
                    what=f"all {N} verdicts in the window",
                )

                def refused() -> bool:
                    get = second.registry.get_sample_value
                    return (
                        get("relmon_verdicts_rejected_total", {"reason": "unknown"}) == 1
                        and get("relmon_verdicts_rejected_total", {"reason": "invalid"}) == 1
                    )

                await wait_until(
                    refused,
                    timeout_s=30,
                    what="the ghost verdict counted as unknown and the junk one as invalid",
                )
                assert exported(second) == pytest.approx(independent(list(scores.values())))
                assert metric(second, "relmon_reviews_total", verdict="duplicate") == 1
                assert metric(second, "relmon_review_queue_depth") == 0
                live = sum(
                    metric(second, "relmon_reviews_total", verdict=v) for v in ("accepted", "none")
                )
                assert 10 <= live <= 25  # the rest came from the replay, none twice
                figures |= {"second start": exported(second), "applied live": live}
                # Nothing of the traffic was asked again (all committed by the first run).
                assert second.service.stats.scored == 0
            finally:
                await second.close(10.0)
            monkeypatch.undo()

            # A third start holds exactly the same calibration, refuses nothing again.
            async with service(config) as third:
                third.service.publish()
                assert metric(third, "relmon_calibration_items") == N
                assert exported(third) == pytest.approx(independent(list(scores.values())))
                assert metric(third, "relmon_review_queue_depth") == 0
                figures["third start"] = exported(third)
                # A barrier: a verdict for an item that never comes, refused as unknown
                # once verdict_wait_s has passed. The ghost, had it been waiting again
                # since the start, would have been refused (and dead-lettered) first.
                await give([], (b"marker", b'{"item_id": "marker", "accepted_ranks": [1]}'))
                get = third.registry.get_sample_value
                unknown = {"reason": "unknown"}
                await wait_until(
                    lambda: (get("relmon_verdicts_rejected_total", unknown) or 0) >= 1,
                    timeout_s=60,
                    what="the marker verdict refused as unknown",
                )
                assert get("relmon_verdicts_rejected_total", unknown) == 1  # the marker only
            assert len(reviews.records) == N  # no item was published twice
        dead = await read_all(kafka_bootstrap, topics["verdict-dlq"], at_least=3)
        assert sorted(r.key for r in dead) == [b"ghost", b"junk", b"marker"]
        assert {dict(r.headers)["relmon-stream"] for r in dead} == {b"verdicts"}
        figures |= {"independent": independent(list(scores.values())), "dead letters": 2}
        print(json.dumps(figures, default=str))  # the restart's figures (pytest -s)
    finally:
        await producer.stop()
        await model.stop()
