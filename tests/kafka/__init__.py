"""Tests of the Kafka adapters against a real Tansu broker, and helpers they share."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from monitor.core.review import ReviewItem
from tests.ports import free_port
from tests.waiting import wait_until

__all__ = [
    "FAST_GROUP",
    "arith_events",
    "committed",
    "event_bytes",
    "free_port",
    "http_get",
    "new_topic",
    "produce",
    "read_all",
    "relmon_config",
    "relmon_topics",
    "review_item",
    "unique",
]

_counter = itertools.count()

FAST_GROUP = {"session_timeout_ms": 1000, "heartbeat_interval_ms": 100, "rebalance_timeout_ms": 500}
"""Consumer options that make Tansu's group joins take ~1 s instead of ~5 s.

Tansu numbers the first generation 0, so aiokafka skips LeaveGroup on stop and a
restarted member waits for the old one's session to expire: keep sessions short.
"""


async def http_get(port: int, path: str, timeout_s: float = 30.0) -> tuple[int, str]:
    """The status and body of ``GET http://127.0.0.1:<port><path>``."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp,
    ):
        return resp.status, await resp.text()


def unique(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


async def new_topic(bootstrap: str, prefix: str, partitions: int = 1, **options: Any) -> str:
    name = unique(prefix)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


def review_item(n: int) -> ReviewItem:
    """A review item with id ``i<n>`` and two candidate answers."""
    return ReviewItem(
        item_id=f"i{n}",
        model="m",
        task="t",
        query="q",
        candidates=(("a", 5), ("b", 3)),
        k=8,
        inclusion_probability=1.0,
        sampled_at=1_800_000_000.0 + n,
    )


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
    **options: Any,
) -> list[Any]:
    """Send ``values`` one by one (acks=all); returns their RecordMetadata. ``options``:
    more client options (security)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **options)
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
    bootstrap: str, topic: str, *, at_least: int = 0, timeout_s: float = 60, **options: Any
) -> list[Any]:
    """Every record of ``topic`` (waiting until there are ``at_least``; fails after
    ``timeout_s`` with fewer), by partition. ``options``: more client options (security)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **options,
    )
    await consumer.start()
    records: list[Any] = []

    async def enough() -> bool:
        """Read the whole topic again from the start: ``at_least`` records yet?"""
        records.clear()
        await consumer.topics()
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
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
        return len(records) >= at_least

    try:
        await wait_until(
            enough,
            timeout_s=timeout_s,
            what=f"{at_least} records on {topic}",
            interval_s=0.05,
            detail=lambda: f"{len(records)} records read",
        )
        return sorted(records, key=lambda r: (r.partition, r.offset))
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


async def relmon_topics(
    bootstrap: str, *, traffic_partitions: int = 1, **options: Any
) -> dict[str, str]:
    """Fresh topics for one relmon on Kafka: traffic, review, verdict and dead letters."""
    names = ("traffic", "review", "verdict", "dlq", "verdict-dlq")
    return {
        k: await new_topic(bootstrap, k, traffic_partitions if k == "traffic" else 1, **options)
        for k in names
    }


def relmon_config(
    path: Path,
    model_url: str,
    bootstrap: str,
    *,
    topics: dict[str, str],
    group: str,
    port: int = 0,
    task: dict[str, Any] | None = None,
    kafka: dict[str, Any] | None = None,
    **top: Any,
) -> None:
    """Write a relmon.yaml: Kafka traffic in, the Kafka review backend, one arithmetic
    task on ``model_url``; ``task``, ``kafka`` and ``top`` override or add keys."""
    data = {
        "tasks": [
            {
                "name": "arithmetic",
                "canonicalizer": "numeric",
                "endpoint": {
                    "base_url": model_url,
                    "model": "sim-arith-1",
                    "concurrency": 4,
                    "timeout_s": 5,
                },
                "k_max": 10,
                "sampling_rate": 1.0,
                "review_rate": 1.0,
                "half_life_s": None,
                "alphas": [0.1, 0.2, 0.3],
            }
            | (task or {})
        ],
        "metrics": {"port": port},
        "traffic": {"mode": "off"},
        "review": {"backend": "kafka"},
        "kafka": {
            "enabled": True,
            "bootstrap_servers": bootstrap,
            "traffic_topic": topics["traffic"],
            "review_topic": topics["review"],
            "verdict_topic": topics["verdict"],
            "dead_letter_topic": topics["dlq"],
            "verdict_dead_letter_topic": topics["verdict-dlq"],
            "group_id": group,
        }
        | (kafka or {}),
        "log_format": "json",
    } | top
    path.write_text(yaml.safe_dump(data))


def arith_events(questions: Sequence[str], prefix: str, *, task: bool = True) -> list[bytes]:
    """One traffic event per question, ids ``<prefix><i>``, for the model sim-arith-1."""
    return [
        json.dumps(
            {"id": f"{prefix}{i}", "model": "sim-arith-1"}
            | ({"task": "arithmetic"} if task else {})
            | {"request": {"messages": [{"role": "user", "content": q}]}}
        ).encode()
        for i, q in enumerate(questions)
    ]
