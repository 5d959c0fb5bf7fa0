"""kill -9 of a real ``relmon run`` reading Kafka traffic, with reviewed but uncommitted
events, on either review backend (Kafka topics or SQLite): after the restart the
re-delivered events whose review items exist are not asked again nor published again,
and the review queue depth is right."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiokafka import AIOKafkaProducer, TopicPartition

from monitor.app.demo.model import QuestionBank, SimulatedModel
from tests.kafka import (
    arith_events,
    committed,
    free_port,
    produce,
    read_all,
    relmon_config,
    relmon_topics,
    unique,
)
from tests.kafka.test_run_kafka import metrics_of
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(600)  # ~33 s unloaded: room for a machine 10x slower

N = 30
REVIEWED = 10
TOKEN = "crash-test-review-token-123"


class StuckModel(SimulatedModel):
    """Answers ``stuck`` only once ``released`` is set; counts the calls per question."""

    def __init__(self, stuck: str, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.stuck = stuck
        self.released = asyncio.Event()
        self.asked: Counter[str] = Counter()

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        query = "\n".join(str(m.get("content", "")) for m in body.get("messages") or [])
        self.asked[query] += 1
        if query == self.stuck:
            await self.released.wait()
        return await super()._completions(_Replay(body))


class _Replay:
    """The already read request body, for the parent's handler."""

    def __init__(self, body: object) -> None:
        self._body = body

    async def json(self) -> object:
        return self._body


def start_relmon(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(cfg)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            return metrics_of(await resp.text())
    except aiohttp.ClientError:
        return {}


@pytest.mark.parametrize("backend", ["kafka", "sqlite"])
async def test_items_delivered_again_after_kill_9_are_not_asked_again(
    kafka_bootstrap: str, tmp_path: Path, backend: str
) -> None:
    """Idempotent by item id on both review backends: the Kafka review topic, and the
    SQLite store (Kafka traffic with ``review.backend: http``)."""
    topics = await relmon_topics(kafka_bootstrap)
    group = unique("crash")
    bank = QuestionBank(size=N, seed=21)
    questions = [q for q, _ in bank.questions]
    model = StuckModel(questions[0], quality=0.8, drift_after_s=None, bank=bank, seed=3)
    url = await model.start()
    port, review_port = free_port(), free_port()
    cfg, log = tmp_path / "relmon.yaml", tmp_path / "relmon.log"
    sqlite: dict[str, Any] = {
        "review": {"backend": "http", "port": review_port, "token": TOKEN},
        "state_dir": str(tmp_path / "state"),
    }
    relmon_config(
        cfg,
        url,
        kafka_bootstrap,
        topics=topics,
        group=group,
        port=port,
        task={"endpoint": {"base_url": url, "model": "sim-arith-1", "timeout_s": 200}},
        budget={"calls_per_minute": 100000},
        **(sqlite if backend == "sqlite" else {}),
    )
    await produce(kafka_bootstrap, topics["traffic"], arith_events(questions, "c"))
    labels = (("model", "sim-arith-1"), ("task", "arithmetic"))
    reviewed_ids = [f"arithmetic:c{i}" for i in range(1, REVIEWED + 1)]

    def value(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
        return m.get((name, labels), -1.0)

    async def review_items() -> Counter[str]:
        """How many times each item id was published for review."""
        if backend == "kafka":
            records = await read_all(kafka_bootstrap, topics["review"])
            return Counter(json.loads(r.value)["item_id"] for r in records)
        with sqlite3.connect(tmp_path / "state" / "relmon.sqlite3") as conn:
            return Counter(str(r[0]) for r in conn.execute("SELECT item_id FROM review_items"))

    async def give_verdicts() -> None:
        if backend == "sqlite":
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as session:
                for item_id in reviewed_ids:
                    async with session.post(
                        f"http://127.0.0.1:{review_port}/api/reviews/{item_id}",
                        json={"accepted_ranks": [1]},
                    ) as resp:
                        assert resp.status == 200, await resp.text()
            return
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for item_id in reviewed_ids:
                verdict = {"item_id": item_id, "accepted_ranks": [1]}
                await producer.send_and_wait(
                    topics["verdict"], json.dumps(verdict).encode(), key=item_id.encode()
                )
        finally:
            await producer.stop()

    proc = start_relmon(cfg, log)
    try:
        # Every event but the first (its model call hangs) is scored and reviewed, so
        # the committed offset cannot pass event 0: all of them are delivered again.
        async def all_but_one_reviewed() -> bool:
            return value(await scrape(port), "relmon_review_queue_depth") == N - 1

        await wait_until(
            all_but_one_reviewed, timeout_s=120, what=f"{N - 1} items waiting for review"
        )
        assert len(await review_items()) == N - 1
        await give_verdicts()

        async def reviewed() -> bool:
            return value(await scrape(port), "relmon_calibration_items") == REVIEWED

        await wait_until(
            reviewed, timeout_s=60, what=f"{REVIEWED} verdicts in the calibration window"
        )
        assert value(await scrape(port), "relmon_review_queue_depth") == N - 1 - REVIEWED
        tp = TopicPartition(topics["traffic"], 0)
        assert await committed(kafka_bootstrap, group, [tp]) in ([None], [0])
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 30)
        model.released.set()
        before = Counter(model.asked)

        proc = start_relmon(cfg, log)

        async def redelivered() -> bool:
            m = await scrape(port)
            return (
                m.get(
                    (
                        "relmon_traffic_events_total",
                        (("decision", "duplicate"), ("source", "kafka")),
                    )
                )
                == N - 1
                and m.get(("relmon_items_total", tuple(sorted((*labels, ("outcome", "scored"))))))
                == 1
            )

        try:
            await wait_until(
                redelivered, timeout_s=120, what="the unfinished events redelivered after the kill"
            )
        except AssertionError:
            state = {k: v for k, v in (await scrape(port)).items() if "traffic" in k[0]}
            raise AssertionError(f"{state}\n{log.read_text()[-4000:]}") from None
        after = await scrape(port)
        key = ("relmon_traffic_events_total", (("decision", "sampled"), ("source", "kafka")))
        assert after[key] == 1  # only the event that never finished
        asked_again = {q: n for q, n in (model.asked - before).items() if q != questions[0]}
        assert asked_again == {}, "re-delivered items were asked again"
        assert value(after, "relmon_calibration_items") == REVIEWED
        assert value(after, "relmon_review_queue_depth") == N - REVIEWED
        published = await review_items()
        assert len(published) == N and set(published.values()) == {1}, published
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await model.stop()
