"""Tests of the Kafka adapters against a real Tansu broker, and helpers they share."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

__all__ = [
    "FAST_GROUP",
    "committed",
    "event_bytes",
    "eventually",
    "free_port",
    "new_topic",
    "produce",
    "read_all",
    "unique",
]

_counter = itertools.count()

FAST_GROUP = {"session_timeout_ms": 1000, "heartbeat_interval_ms": 100, "rebalance_timeout_ms": 500}
"""Consumer options that make Tansu's group joins take ~1 s instead of ~5 s.

Tansu numbers the first generation 0, so aiokafka skips LeaveGroup on stop and a
restarted member waits for the old one's session to expire: keep sessions short.
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


async def new_topic(bootstrap: str, prefix: str, partitions: int = 1) -> str:
    name = unique(prefix)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


def event_bytes(item_id: str, *, content: str = "What is 2+2?", task: str = "triage") -> bytes:
    return json.dumps(
        {
            "id": item_id,
            "ts": "2026-11-22T07:00:00Z",
            "model": "gpt-4.1",
            "task": task,
            "request": {"model": "gpt-4.1", "messages": [{"role": "user", "content": content}]},
            "response": {"choices": [{"message": {"content": "4"}}]},
        }
    ).encode()


async def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | None],
    *,
    partition: int | None = None,
    keys: Sequence[bytes | None] | None = None,
    timestamps_ms: Sequence[int] | None = None,
) -> list[Any]:
    """Send ``values`` one by one (acks=all); returns their RecordMetadata."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        out = []
        for i, value in enumerate(values):
            out.append(
                await producer.send_and_wait(
                    topic,
                    value,
                    key=keys[i] if keys is not None else None,
                    partition=partition,
                    timestamp_ms=timestamps_ms[i] if timestamps_ms is not None else None,
                )
            )
        return out
    finally:
        await producer.stop()


async def read_all(
    bootstrap: str, topic: str, *, at_least: int = 0, timeout_s: float = 10
) -> list[Any]:
    """Every record of ``topic`` (waiting until there are ``at_least``), by partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            await consumer.topics()
            parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            records: list[Any] = []
            if tps:
                # The reported end offset is only a lower bound (Tansu under-reports it
                # after a multi-record batch): a partition is done when a fetch came back
                # empty at or past a freshly asked end offset.
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, 0)
                todo = set(tps)
                while todo:
                    batch = await consumer.getmany(*todo, timeout_ms=200)
                    for recs in batch.values():
                        records.extend(recs)
                    idle = [tp for tp in todo if not batch.get(tp)]
                    if not idle:
                        continue
                    end = await consumer.end_offsets(idle)
                    for tp in idle:
                        if await consumer.position(tp) >= end[tp]:
                            todo.discard(tp)
            if len(records) >= at_least or time.monotonic() > deadline:
                return sorted(records, key=lambda r: (r.partition, r.offset))
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


async def committed(bootstrap: str, group: str, tps: Sequence[TopicPartition]) -> list[int | None]:
    """The group's committed offsets, read by a separate (non-member) consumer."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        return [await consumer.committed(tp) for tp in tps]
    finally:
        await consumer.stop()


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout_s: float = 10.0
) -> None:
    """Wait until ``check()`` is true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.02)
