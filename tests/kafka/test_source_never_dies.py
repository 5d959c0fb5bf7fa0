"""No event stops a Kafka source (docs/kafka.md, "A bad event"): whatever one record holds
and whatever handling it raises, that record is counted once as rejected, dead-lettered
with the reason in ``relmon-error``, its offset committed, and the next record goes.

Against a real broker: the event with invalid UTF-8 inside a JSON string that once
killed the traffic source for good, an exception nobody expected (raised by the sink),
``kafka.max_event_bytes`` under ``relmon run``, an escaped ``\\u0000`` (valid input), a
handful of random byte strings, and the verdict follower's own bad records.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.kafka.review import KafkaCalibrationStore, durable_producer
from adapters.kafka.source import parse_event_bytes
from adapters.kafka.verdicts import KafkaVerdictConsumer
from monitor.app.runner import start_service
from monitor.config import load_settings
from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent
from monitor.core.review import Verdict, verdict_score
from monitor.engine.ports import Admission, VerdictOutcome
from tests.kafka import (
    committed,
    event_bytes,
    free_port,
    http_get,
    new_topic,
    produce,
    read_all,
    relmon_config,
    relmon_topics,
    review_item,
    unique,
)
from tests.kafka.test_kafka_source import Recorder, make_source, running
from tests.waiting import wait_until

REPRO = (
    b'{"id":"k2","ts":"2026-11-22T07:00:00Z","model":"gpt-4.1","task":"triage",'
    b'"request":{"model":"gpt-4.1","messages":[{"role":"user",'
    b'"content":"What is 2 plus \xff 3?"}]}}'
)
"""The event of the report: a 0xff byte inside a JSON string."""

NUL_EVENT = (
    b'{"id":"nul","model":"gpt-4.1","task":"triage","request":{"messages":'
    b'[{"role":"user","content":"a\\u0000b"}]}}'
)
"""An escaped NUL inside a JSON string: valid input."""


def headers_of(record: Any) -> dict[str, bytes]:
    return dict(record.headers)


async def test_invalid_utf8_in_a_string_is_dead_lettered_and_the_partition_goes_on(
    kafka_bootstrap: str,
) -> None:
    """The report's repro: a valid event, the 0xff event, valid events."""
    topic = await new_topic(kafka_bootstrap, "events")
    dlq = await new_topic(kafka_bootstrap, "events-dlq")
    values = [event_bytes("k1"), REPRO, event_bytes("k3"), event_bytes("k4")]
    await produce(kafka_bootstrap, topic, values)
    rec = Recorder()
    group = unique("g")
    source = make_source(kafka_bootstrap, topic, group, rec, dlq=dlq, commit_interval_s=0.05)
    async with running(source) as task:
        await wait_until(
            lambda: rec.ids == ["k1", "k3", "k4"] or task.done(),
            timeout_s=60,
            what="k1, k3 and k4 at the sink",
        )
        assert not task.done(), task.exception() if task.done() else None
        tp = TopicPartition(topic, 0)

        async def past_the_end() -> bool:
            return await committed(kafka_bootstrap, group, [tp]) == [len(values)]

        await wait_until(past_the_end, timeout_s=60, what="the commit past the bad event")
    assert rec.ids == ["k1", "k3", "k4"]
    assert len(rec.rejects) == 1
    source_name, reason = rec.rejects[0]
    assert source_name == "kafka" and "not UTF-8" in reason
    [dead] = await read_all(kafka_bootstrap, dlq, at_least=1)
    assert dead.value == REPRO
    assert headers_of(dead)["relmon-error"].decode() == reason
    assert headers_of(dead)["relmon-source-offset"] == b"1"


class Exploding(Recorder):
    """A sink that raises an exception nobody expected for the ids in ``explode``."""

    def __init__(self, explode: set[str]) -> None:
        super().__init__()
        self.explode = explode

    def __call__(self, event: TrafficEvent, source: str) -> Admission:
        if event.id in self.explode:
            raise KeyError("a bug in the sink")
        return super().__call__(event, source)


async def test_an_unexpected_exception_for_one_event_is_a_rejection_not_a_dead_source(
    kafka_bootstrap: str,
) -> None:
    topic = await new_topic(kafka_bootstrap, "events")
    dlq = await new_topic(kafka_bootstrap, "events-dlq")
    values = [event_bytes("a"), event_bytes("boom"), NUL_EVENT, event_bytes("b")]
    await produce(kafka_bootstrap, topic, values)
    rec = Exploding({"boom"})
    group = unique("g")
    source = make_source(kafka_bootstrap, topic, group, rec, dlq=dlq, commit_interval_s=0.05)
    async with running(source) as task:
        await wait_until(
            lambda: rec.ids == ["a", "nul", "b"] or task.done(),
            timeout_s=60,
            what="a, nul and b at the sink",
        )
        assert not task.done(), task.exception() if task.done() else None
        tp = TopicPartition(topic, 0)

        async def past_the_end() -> bool:
            return await committed(kafka_bootstrap, group, [tp]) == [len(values)]

        await wait_until(past_the_end, timeout_s=60, what="the commit past the bad event")
    assert rec.rejects == [("kafka", "internal error: KeyError")]
    nul = rec.events[1]
    assert nul.request["messages"][0]["content"] == "a\x00b"  # valid input
    [dead] = await read_all(kafka_bootstrap, dlq, at_least=1)
    assert dead.value == values[1]
    assert headers_of(dead)["relmon-error"] == b"internal error: KeyError"
    assert b"a bug" not in headers_of(dead)["relmon-error"]  # the type, never the message


def metric(registry: Any, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.timeout(300)
async def test_relmon_run_rejects_bad_and_oversize_events_and_stays_ready(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Under ``relmon run``: the 0xff event and one over ``kafka.max_event_bytes`` are each
    counted once as rejected and dead-lettered; the source is never restarted, /readyz
    stays 200, and the events around them (and the escaped NUL) are handled."""
    topics = await relmon_topics(kafka_bootstrap)
    port = free_port()
    config = tmp_path / "relmon.yaml"
    group = unique("g")
    relmon_config(
        config,
        "http://127.0.0.1:9/v1",
        kafka_bootstrap,
        topics=topics,
        group=group,
        port=port,
        kafka={"max_event_bytes": 4096},
    )
    settings = load_settings(config)
    assert settings.kafka.max_event_bytes == 4096
    assert load_settings(None).kafka.max_event_bytes == 1_048_576  # the mirror's body limit
    big = event_bytes("big", content="x" * 5000)
    values = [event_bytes("r1"), REPRO, big, NUL_EVENT, event_bytes("r2")]
    run = await start_service(settings)
    registry = run.registry
    try:
        await wait_until(lambda: not run.not_ready(), timeout_s=60, what="relmon ready")
        await produce(kafka_bootstrap, topics["traffic"], values)

        def handled() -> float:
            return sum(
                metric(registry, "relmon_traffic_events_total", source="kafka", decision=d)
                for d in ("skipped", "rejected")
            )

        await wait_until(lambda: handled() >= 5, timeout_s=90, what="5 events handled")
        labels = {"source": "kafka", "decision": "rejected"}
        assert metric(registry, "relmon_traffic_events_total", **labels) == 2
        tp = TopicPartition(topics["traffic"], 0)

        async def past_the_end() -> bool:
            return await committed(kafka_bootstrap, group, [tp]) == [len(values)]

        await wait_until(past_the_end, timeout_s=60, what="the commit past every event")
        status, body = await http_get(port, "/readyz")
        assert status == 200, body
        assert metric(registry, "relmon_source_restarts_total", source="kafka") == 0
    finally:
        await run.close(10.0)
    dead = await read_all(kafka_bootstrap, topics["dlq"], at_least=2)
    reasons = [headers_of(r)["relmon-error"].decode() for r in dead]
    assert "not UTF-8" in reasons[0]
    assert "over the 4096-byte limit" in reasons[1]
    assert [r.value for r in dead] == [REPRO, big]


def spliced(junk: bytes, n: int) -> bytes:
    """A valid event with ``junk`` inside its content string (raw, not escaped)."""
    return event_bytes(f"s{n}", content="<>").replace(b"<>", junk)


@settings(
    max_examples=4,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    junk=st.lists(
        st.binary(max_size=200) | st.tuples(st.binary(min_size=1, max_size=8)).map(lambda t: t[0]),
        min_size=2,
        max_size=4,
    ),
    splice=st.lists(st.booleans(), min_size=4, max_size=4),
)
async def test_random_bytes_never_stop_the_source(
    kafka_bootstrap: str, junk: list[bytes], splice: list[bool]
) -> None:
    """Random records between valid markers: after each one the next marker is handled,
    and each random record is either a valid event or rejected, exactly once."""
    values: list[bytes] = []
    markers: list[str] = []
    for n, raw in enumerate(junk):
        values.append(spliced(raw, n) if splice[n] else raw)
        markers.append(f"marker-{n}")
        values.append(event_bytes(markers[-1]))
    valid = 0
    for value in values[::2]:
        try:
            parse_event_bytes(value)
            valid += 1
        except InputError:
            pass
    topic = await new_topic(kafka_bootstrap, "fuzz")
    rec = Recorder()
    group = unique("g")
    source = make_source(kafka_bootstrap, topic, group, rec, commit_interval_s=0.05)
    await produce(kafka_bootstrap, topic, values)
    async with running(source) as task:
        await wait_until(
            lambda: set(markers) <= set(rec.ids) or task.done(),
            timeout_s=60,
            what="every marker at the sink",
        )
        assert not task.done(), task.exception() if task.done() else None
        tp = TopicPartition(topic, 0)

        async def past_the_end() -> bool:
            return await committed(kafka_bootstrap, group, [tp]) == [len(values)]

        await wait_until(past_the_end, timeout_s=60, what="the commit past every record")
    assert [i for i in rec.ids if i.startswith("marker-")] == markers
    assert len(rec.events) - len(markers) == valid
    assert len(rec.rejects) == len(junk) - valid


# -- the verdict follower ---------------------------------------------------------------


def verdict(item_id: str) -> bytes:
    return json.dumps({"item_id": item_id, "accepted_ranks": [1]}).encode()


async def test_the_verdict_follower_rejects_bad_records_and_goes_on(kafka_bootstrap: str) -> None:
    """A verdict with invalid UTF-8, a review item whose ``k`` is Infinity (an
    OverflowError once), a verdict whose handler raises: each refused (verdicts
    dead-lettered and counted ``invalid``), and the verdicts after them applied."""
    topics = {
        "reviews": await new_topic(kafka_bootstrap, "reviews"),
        "verdicts": await new_topic(kafka_bootstrap, "verdicts"),
        "dlq": await new_topic(kafka_bootstrap, "dlq"),
    }
    store = KafkaCalibrationStore(
        kafka_bootstrap,
        topics["reviews"],
        topics["verdicts"],
        verdict_score,
        dead_letter_topic=topics["dlq"],
    )
    await store.load_records()
    applied: list[str] = []
    rejects: list[tuple[str, str]] = []

    async def handle(v: Verdict) -> VerdictOutcome:
        if v.item_id == "i1":
            raise RuntimeError("a bug in the handler")
        applied.append(v.item_id)
        return VerdictOutcome("applied", score=1.0)

    consumer = KafkaVerdictConsumer(
        store, handle, lambda kind, reason: rejects.append((kind, reason)), wait_s=30
    )
    producer: AIOKafkaProducer = durable_producer(kafka_bootstrap)
    await producer.start()
    await consumer.start()
    task = asyncio.create_task(consumer.run())
    try:
        infinite = json.dumps(review_item(9).to_json() | {"k": float("inf")}).encode()
        for value in (json.dumps(review_item(n).to_json()).encode() for n in range(3)):
            await producer.send_and_wait(topics["reviews"], value)
        await producer.send_and_wait(topics["reviews"], infinite)
        bad_utf8 = b'{"item_id": "i0", "accepted_ranks": [1], "reviewer": "r\xff"}'
        for value in (bad_utf8, verdict("i1"), verdict("i0"), verdict("i2")):
            await producer.send_and_wait(topics["verdicts"], value)
        await wait_until(
            lambda: applied == ["i0", "i2"] or task.done(),
            timeout_s=60,
            what="the verdicts of i0 and i2 applied",
        )
        assert not task.done(), task.exception() if task.done() else None
        await wait_until(lambda: len(rejects) == 2, timeout_s=30, what="2 verdicts refused")
        assert consumer.connected
    finally:
        await consumer.stop(10.0)
        # As relmon's own shutdown does (Running.close): a run still busy after stop's
        # timeout is cancelled, never awaited without end (a full suite run once saw it
        # stay in a broker call past stop).
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.wait_for(producer.stop(), 30)
    assert [kind for kind, _ in rejects] == ["invalid", "invalid"]
    assert "not valid JSON" in rejects[0][1]
    assert rejects[1][1] == "internal error: RuntimeError"
    dead = await read_all(kafka_bootstrap, topics["dlq"], at_least=2)
    assert [r.value for r in dead] == [bad_utf8, verdict("i1")]
    assert [headers_of(r)["relmon-error"].decode() for r in dead] == [r for _, r in rejects]
