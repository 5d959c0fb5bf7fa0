"""The verdict follower after a failure: restarted by the runner's supervisor with
backoff, going on exactly where it stopped (nothing applied twice, nothing skipped, the
waiting verdicts and the dead letters not written yet kept), and ``/readyz`` back to 200.

Two ways to fail it on a real Tansu broker: the connection cut for real (the broker
behind a TCP relay that the test cuts, so that the broker and its log stay), and a
dead-letter write refused at the adapter boundary under a running ``relmon`` service.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError
from prometheus_client import CollectorRegistry

from adapters.kafka.review import KafkaCalibrationStore
from adapters.kafka.verdicts import KafkaVerdictConsumer
from monitor.app.runner import Running
from monitor.app.supervision import supervise
from monitor.core.review import ReviewItem
from monitor.engine.metrics import TRAFFIC_DECISIONS, Metrics
from tests.kafka import (
    free_port,
    http_get,
    new_topic,
    produce,
    read_all,
)
from tests.kafka.conftest import ATTEMPTS, _wait_ready, spawn_broker, stop_broker
from tests.kafka.test_kafka_review import Handler, item, verdict
from tests.kafka.test_source_restart import restarts, scrape, start_on_kafka
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)


class Relay:
    """A TCP relay on 127.0.0.1:``port`` to a broker; :meth:`cut` closes it and every
    connection through it (clients see the broker gone), :meth:`open` listens again."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port, self.target_port = port, target_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            pump = asyncio.create_task(self._pump(src, dst))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.transport.abort()
            self._writers.discard(dst)


@pytest.fixture
async def relayed_kafka(tmp_path: Path) -> AsyncIterator[tuple[str, Relay]]:
    """A broker of this test's own that advertises a relay's address: ``(bootstrap, relay)``."""
    for attempt in range(ATTEMPTS):
        broker_port, relay_port = free_port(), free_port()
        relay = Relay(relay_port, broker_port)
        proc = spawn_broker(broker_port, tmp_path, advertised_port=relay_port)
        bootstrap = f"127.0.0.1:{relay_port}"
        try:
            await relay.open()
            await _wait_ready(bootstrap, proc)
            break
        except Exception:
            with suppress(Exception):
                await relay.cut()
            stop_broker(proc)
            if attempt == ATTEMPTS - 1:
                raise
    try:
        yield bootstrap, relay
    finally:
        if relay._server is not None:
            await relay.cut()
        await asyncio.to_thread(stop_broker, proc)


async def test_a_cut_connection_fails_the_follower_and_it_resumes_where_it_stopped(
    relayed_kafka: tuple[str, Relay],
) -> None:
    bootstrap, relay = relayed_kafka
    review = await new_topic(bootstrap, "reviews")
    verdicts = await new_topic(bootstrap, "verdicts")
    dlq = await new_topic(bootstrap, "verdict-dlq")
    store = KafkaCalibrationStore(
        bootstrap, review, verdicts, lambda i, v: 1.0, dead_letter_topic=dlq
    )
    await store.load_records()
    handler = Handler(store)
    follower = KafkaVerdictConsumer(
        store,
        handler,
        handler.reject,
        wait_s=4.0,
        on_item=handler.on_item,
        producer_options={"request_timeout_ms": 3000},
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_source(follower.source_name, traffic=False)
    counter = metrics.source_restarts.labels(follower.source_name)
    await follower.start()
    task = asyncio.create_task(supervise(follower, max_delay_s=1.0, on_restart=counter.inc))
    try:
        await produce(bootstrap, review, [json.dumps(item(1).to_json()).encode()])
        await produce(bootstrap, verdicts, [verdict("item-1", 1)])
        await wait_until(
            lambda: [v.item_id for v in handler.seen] == ["item-1"],
            timeout_s=30,
            what="the verdict for item-1 handed over",
        )
        # A verdict whose item never comes: its dead letter is due in 4 s, the relay is
        # cut before, so the write fails and the follower with it.
        await produce(bootstrap, verdicts, [verdict("ghost", 1)])
        await wait_until(
            lambda: follower.waiting == 1,
            timeout_s=30,
            what="the ghost verdict waiting for its item",
        )
        await relay.cut()
        await wait_until(
            lambda: not follower.connected,
            timeout_s=30,
            what="the follower to lose the cut connection",
        )
        await wait_until(
            lambda: follower._failure is not None,
            timeout_s=60,
            what="the follower to fail on the dead-letter write",
        )
        assert handler.rejects == [] and follower.dead_letters == 0
        assert not task.done()
        assert restarts(registry, "verdicts") == 0

        await relay.open()
        await wait_until(
            lambda: follower.restarts >= 1 and follower.connected,
            timeout_s=60,
            what="the follower restarted and connected",
        )
        # Counted once it worked (attempts while the relay was cut failed and do not count).
        await wait_until(
            lambda: (restarts(registry, "verdicts") or 0) >= 1,
            timeout_s=30,
            what="the restart counted",
        )
        # The dead letter not written is written once after the restart, and counted once.
        await wait_until(
            lambda: follower.dead_letters == 1, timeout_s=60, what="the ghost's dead letter written"
        )
        assert [kind for kind, _ in handler.rejects] == ["unknown"]
        # Verdicts given after the restart are applied, the earlier one not again.
        await produce(bootstrap, review, [json.dumps(item(n).to_json()).encode() for n in (2, 3)])
        await produce(bootstrap, verdicts, [verdict("item-2", 1), verdict("item-3", 2)])
        await wait_until(
            lambda: len(handler.seen) >= 3,
            timeout_s=60,
            what="the verdicts for item-2 and item-3 handed over",
        )
        # A barrier: a later verdict; one taken twice would have come before it.
        await produce(bootstrap, review, [json.dumps(item(4).to_json()).encode()])
        await produce(bootstrap, verdicts, [verdict("item-4", 1)])
        await wait_until(
            lambda: any(v.item_id == "item-4" for v in handler.seen),
            timeout_s=60,
            what="the marker verdict for item-4 handed over",
        )
    finally:
        await follower.stop()
        await asyncio.wait_for(task, 30)
    assert task.result() is None
    assert 1 <= (restarts(registry, "verdicts") or 0) <= follower.restarts
    for decision in TRAFFIC_DECISIONS:  # not a traffic source
        labels = {"source": "verdicts", "decision": decision}
        assert registry.get_sample_value("relmon_traffic_events_total", labels) is None
    assert [v.item_id for v in handler.seen] == ["item-1", "item-2", "item-3", "item-4"]
    assert handler.items == ["item-1", "item-2", "item-3", "item-4"]
    letters = await read_all(bootstrap, dlq, at_least=1)
    assert [json.loads(r.value)["item_id"] for r in letters] == ["ghost"]
    assert dict(letters[0].headers)["relmon-source-offset"] == b"1"  # the ghost's verdict


LABELS = {"model": "sim-arith-1", "task": "arithmetic"}


def review_item(n: int) -> bytes:
    it = ReviewItem(
        item_id=f"it-{n}",
        model="sim-arith-1",
        task="arithmetic",
        query="[redacted]",
        candidates=(("4", 7), ("5", 3)),
        k=10,
        inclusion_probability=1.0,
        sampled_at=1_800_000_000.0 + n,
    )
    return json.dumps(it.to_json()).encode()


def reviews(running: Running, kind: str, **labels: str) -> float:
    return (
        running.registry.get_sample_value("relmon_reviews_total", {**labels, "verdict": kind})
        or 0.0
    )


def rejected(running: Running, reason: str) -> float:
    """Verdicts that name no known item: ``relmon_verdicts_rejected_total{reason}``."""
    return (
        running.registry.get_sample_value("relmon_verdicts_rejected_total", {"reason": reason})
        or 0.0
    )


async def readyz(port: int) -> int:
    return (await http_get(port, "/readyz"))[0]


async def test_the_service_restarts_a_failed_follower_and_is_ready_again(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    running, topics, port = await start_on_kafka(kafka_bootstrap, tmp_path, verdict_wait_s=120)
    try:
        follower = next(s for s in running.sources if isinstance(s, KafkaVerdictConsumer))
        await wait_until(lambda: not running.not_ready(), timeout_s=60, what="relmon ready")
        assert await readyz(port) == 200
        text = await scrape(port)
        assert 'relmon_source_restarts_total{source="verdicts"} 0.0' in text
        assert 'relmon_source_restarts_total{source="kafka"} 0.0' in text
        assert 'source="verdicts",decision=' not in text  # not a traffic source
        await produce(kafka_bootstrap, topics["review"], [review_item(1)])
        await produce(kafka_bootstrap, topics["verdict"], [verdict("it-1", 1)])
        await wait_until(
            lambda: reviews(running, "accepted", **LABELS) == 1,
            timeout_s=30,
            what="the verdict for it-1 applied",
        )
        # A verdict waiting for its item across the failure.
        await produce(kafka_bootstrap, topics["verdict"], [verdict("it-2", 1)])
        await wait_until(
            lambda: follower.waiting == 1,
            timeout_s=30,
            what="the verdict for it-2 waiting for its item",
        )

        # The broker does not acknowledge the next dead letter (what a lost broker does);
        # the restart waits for the test so that readiness can be asked meanwhile.
        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise KafkaTimeoutError()

        follower._producer.send_and_wait = refused
        gate = asyncio.Event()
        restart = follower.restart

        async def gated_restart() -> None:
            await gate.wait()
            await restart()

        follower.restart = gated_restart  # type: ignore[method-assign]
        await produce(kafka_bootstrap, topics["verdict"], [b"{not json"])
        await wait_until(
            lambda: follower._failure is not None,
            timeout_s=30,
            what="the follower to fail on the refused dead letter",
        )
        assert await readyz(port) == 503
        assert any("KafkaVerdictConsumer" in r for r in running.not_ready())
        # Given while it is down: applied after the restart.
        await produce(kafka_bootstrap, topics["review"], [review_item(3)])
        await produce(kafka_bootstrap, topics["verdict"], [verdict("it-3", 2)])
        assert rejected(running, "invalid") == 0
        assert restarts(running.registry, "verdicts") == 0  # not restarted yet
        gate.set()

        await wait_until(
            lambda: follower.restarts == 1 and not running.not_ready(),
            timeout_s=60,
            what="the follower restarted and relmon ready",
        )
        assert await readyz(port) == 200
        await wait_until(
            lambda: restarts(running.registry, "verdicts") == 1,
            timeout_s=30,
            what="the restart counted",
        )
        assert restarts(running.registry, "kafka") == 0
        assert 'relmon_source_restarts_total{source="verdicts"} 1.0' in await scrape(port)
        await wait_until(
            lambda: reviews(running, "accepted", **LABELS) == 2,
            timeout_s=30,
            what="the verdict for it-3 applied after the restart",
        )
        # The waiting verdict's item comes after the restart: it is applied.
        await produce(kafka_bootstrap, topics["review"], [review_item(2)])
        await wait_until(
            lambda: reviews(running, "accepted", **LABELS) == 3,
            timeout_s=30,
            what="the waiting verdict for it-2 applied",
        )
        await wait_until(
            lambda: rejected(running, "invalid") == 1,
            timeout_s=30,
            what="the malformed verdict counted as invalid",
        )
        # A barrier: a later verdict ("none of these": the only one counted so); one
        # applied twice would have been counted before it.
        await produce(kafka_bootstrap, topics["review"], [review_item(4)])
        await produce(kafka_bootstrap, topics["verdict"], [verdict("it-4")])
        await wait_until(
            lambda: reviews(running, "none", **LABELS) == 1,
            timeout_s=30,
            what="the marker verdict for it-4 applied",
        )
        assert reviews(running, "duplicate", **LABELS) == 0
        assert reviews(running, "accepted", **LABELS) == 3
        assert rejected(running, "invalid") == 1 and follower.dead_letters == 1
        assert follower.waiting == 0
    finally:
        await running.close(10.0)
    letters = await read_all(kafka_bootstrap, topics["verdict-dlq"], at_least=1)
    assert [r.value for r in letters] == [b"{not json"]
