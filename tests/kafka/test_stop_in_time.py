"""``stop()`` returns within its timeout while a consumer is inside a broker call that
the broker never answers: the broker is paused with SIGSTOP at the moment the call
starts (it keeps its connections, and answers nothing), the way a stalled broker looked
in a full-suite run where the verdict follower stayed in such a call after stop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import adapters.kafka.verdicts as verdicts_module
from adapters.kafka.connection import StoppingError, close_clients
from adapters.kafka.review import KafkaCalibrationStore, KafkaReviewQueue, durable_producer
from adapters.kafka.verdicts import KafkaVerdictConsumer
from monitor.core.review import Verdict, verdict_score
from monitor.engine.ports import VerdictOutcome
from tests.kafka import new_topic, produce, review_item, unique
from tests.kafka.test_kafka_source import Recorder, make_source
from tests.waiting import wait_until

STOP_TIMEOUT_S = 3.0
SLACK_S = 0.5
"""Scheduling slack on a loaded machine; the calls stop() gives up take 40 s and more."""


@asynccontextmanager
async def paused_on_demand(proc: subprocess.Popen[bytes]) -> AsyncIterator[Callable[[], None]]:
    """A function that pauses the broker (SIGSTOP); it is resumed on the way out."""
    paused = False

    def pause() -> None:
        nonlocal paused
        os.kill(proc.pid, signal.SIGSTOP)
        paused = True

    try:
        yield pause
    finally:
        if paused:
            os.kill(proc.pid, signal.SIGCONT)


ITEM = review_item(1)


def pausing(
    pause: Callable[[], None], call: Callable[..., Awaitable[Any]], entered: asyncio.Event
) -> Callable[..., Awaitable[Any]]:
    """``call``, which first pauses the broker: the call is sent and never answered."""

    async def paused_call(*args: Any, **kwargs: Any) -> Any:
        pause()
        entered.set()
        return await call(*args, **kwargs)

    return paused_call


async def timed_stop(stop: Callable[[float], Awaitable[None]], task: asyncio.Task[None]) -> float:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.wait_for(stop(STOP_TIMEOUT_S), 60)
    took = loop.time() - t0
    assert took < STOP_TIMEOUT_S + SLACK_S, f"stop() took {took:.1f} s"
    return took


async def applied(verdict: Verdict) -> VerdictOutcome:
    return VerdictOutcome("applied", score=1.0)


async def follower(bootstrap: str) -> tuple[KafkaVerdictConsumer, dict[str, str], list[Any]]:
    topics = {name: await new_topic(bootstrap, name) for name in ("reviews", "verdicts", "dlq")}
    store = KafkaCalibrationStore(
        bootstrap,
        topics["reviews"],
        topics["verdicts"],
        verdict_score,
        dead_letter_topic=topics["dlq"],
    )
    await store.load_records()
    rejects: list[Any] = []
    consumer = KafkaVerdictConsumer(store, applied, lambda *r: rejects.append(r), wait_s=30)
    return consumer, topics, rejects


async def test_the_verdict_follower_stops_in_time_inside_a_metadata_refresh(
    private_kafka: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside ``_assign`` (the metadata refresh of the topics) when the broker stalls:
    stop() gives the call up, run() ends quietly, all within the timeout."""
    bootstrap, proc = private_kafka
    consumer, _, _ = await follower(bootstrap)
    monkeypatch.setattr(verdicts_module, "_REFRESH_S", 0.2)
    await consumer.start()
    entered = asyncio.Event()
    async with paused_on_demand(proc) as pause:
        inner = consumer._consumer
        monkeypatch.setattr(inner, "topics", pausing(pause, inner.topics, entered))
        task = asyncio.create_task(consumer.run())
        await asyncio.wait_for(entered.wait(), 30)
        await asyncio.sleep(0.3)  # inside the unanswered metadata request
        assert not task.done()
        await timed_stop(consumer.stop, task)
        assert task.done()
        assert not task.cancelled()
        assert task.exception() is None


async def test_the_verdict_follower_stops_in_time_inside_a_dead_letter_send(
    private_kafka: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside the dead-letter send of a malformed verdict when the broker stalls: stop()
    gives it up (not counted: it was not written; the next start replays the verdict
    and writes it then), run() ends quietly, all within the timeout."""
    bootstrap, proc = private_kafka
    consumer, topics, rejects = await follower(bootstrap)
    await consumer.start()
    entered = asyncio.Event()
    async with paused_on_demand(proc) as pause:
        producer = consumer._producer
        send = pausing(pause, producer.send_and_wait, entered)
        monkeypatch.setattr(producer, "send_and_wait", send)
        task = asyncio.create_task(consumer.run())
        await produce(bootstrap, topics["verdicts"], [b'{"item_id": 7}'])
        await asyncio.wait_for(entered.wait(), 30)
        await asyncio.sleep(0.3)  # inside the unanswered produce request
        assert not task.done()
        await timed_stop(consumer.stop, task)
        assert task.done()
        assert not task.cancelled()
        assert task.exception() is None
    assert rejects == []
    assert consumer.dead_letters == 0
    assert [(r.value, kind) for r, _, kind in consumer._undelivered] == [
        (b'{"item_id": 7}', "invalid")
    ]


async def test_the_traffic_source_stops_in_time_with_a_dead_letter_unacknowledged(
    private_kafka: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source dead-letters a malformed event just as the broker stalls: the final
    commit, the producer's flush and the group's leave are never answered. stop() gives
    them up at its timeout; the malformed event's offset is not committed (it is read
    again after a restart: at least once)."""
    bootstrap, proc = private_kafka
    topic = await new_topic(bootstrap, "events")
    await new_topic(bootstrap, "events-dlq")  # its metadata is known: send() returns
    rec = Recorder()
    source = make_source(bootstrap, topic, unique("g"), rec, dlq=topic + "-dlq")
    await source.start()
    entered = asyncio.Event()
    async with paused_on_demand(proc) as pause:
        producer = source._producer
        monkeypatch.setattr(producer, "send", pausing(pause, producer.send, entered))
        task = asyncio.create_task(source.run())
        await produce(bootstrap, topic, [json.dumps({"id": "x"}).encode()])
        await asyncio.wait_for(entered.wait(), 30)
        await asyncio.sleep(0.3)
        await timed_stop(source.stop, task)
        await wait_until(task.done, timeout_s=5, what="run() to end")
        assert not task.cancelled()
    assert [reason for _, reason in rec.rejects] == [
        "'request' must be a chat request with a non-empty 'messages' list"
    ]


async def test_the_review_queue_gives_up_a_write_in_progress_at_stop(
    private_kafka: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review item is being written (``send_and_wait``) just as the broker stalls: the
    produce request is never answered, which aiokafka would wait out for its request
    timeout and retries. The queue's stop() gives the write up at once (StoppingError,
    the item not counted as waiting), later writes are refused, and the producer
    closes within the timeout."""
    bootstrap, proc = private_kafka
    topic = await new_topic(bootstrap, "reviews")
    producer = durable_producer(bootstrap)
    await producer.start()
    queue = KafkaReviewQueue(producer, topic)
    item = ITEM
    await queue.submit(item)  # the topic's metadata is known: the next send goes out
    entered = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with paused_on_demand(proc) as pause:
        send = pausing(pause, producer.send_and_wait, entered)
        monkeypatch.setattr(producer, "send_and_wait", send)
        task = asyncio.create_task(queue.submit(dataclasses.replace(item, item_id="i2")))
        await asyncio.wait_for(entered.wait(), 30)
        await asyncio.sleep(0.3)  # inside the unanswered produce request
        assert not task.done()
        t0 = loop.time()
        await queue.stop()
        await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        assert task.done(), "submit() still waits for the broker after stop()"
        assert isinstance(task.exception(), StoppingError)
        assert loop.time() - t0 < SLACK_S
        with pytest.raises(StoppingError):
            await queue.submit(dataclasses.replace(item, item_id="i3"))
        assert await queue.depth() == 1  # only the item the broker acknowledged
        await close_clients((producer,), topic, STOP_TIMEOUT_S)
        assert loop.time() - t0 < STOP_TIMEOUT_S + SLACK_S


async def test_the_verdict_follower_started_before_its_topics_follows_them_and_stops(
    kafka_bootstrap: str,
) -> None:
    """Started before any of its topics exists (a fresh deployment: no review item was
    ever published), the follower must not sit in aiokafka's ``getmany``, which waits
    for an assignment without end: it picks the topics up once they appear, applies
    their verdicts, and stops at once."""
    topics = {name: unique(name) for name in ("reviews", "verdicts", "dlq")}
    store = KafkaCalibrationStore(
        kafka_bootstrap,
        topics["reviews"],
        topics["verdicts"],
        verdict_score,
        dead_letter_topic=topics["dlq"],
    )
    await store.load_records()
    seen: list[str] = []

    async def handle(verdict: Verdict) -> VerdictOutcome:
        seen.append(verdict.item_id)
        return VerdictOutcome("applied", score=1.0)

    consumer = KafkaVerdictConsumer(store, handle, lambda *r: None, wait_s=30)
    await consumer.start()
    task = asyncio.create_task(consumer.run())
    try:
        await asyncio.sleep(0.5)  # running with no topic to follow
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, 1, 1) for t in topics.values()])
        finally:
            await admin.close()
        item = ITEM
        await produce(kafka_bootstrap, topics["reviews"], [json.dumps(item.to_json()).encode()])
        body = json.dumps({"item_id": "i1", "accepted_ranks": [1]}).encode()
        await produce(kafka_bootstrap, topics["verdicts"], [body])
        await wait_until(lambda: seen == ["i1"] or task.done(), what="the verdict applied")
        assert not task.done(), task.exception() if task.done() else None
    finally:
        await timed_stop(consumer.stop, task)
    assert task.done()
    assert not task.cancelled()
    assert task.exception() is None
