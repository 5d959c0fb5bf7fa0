"""Kafka events of ``"format": "otlp"`` (docs/kafka.md, "Spans on Kafka"): one OTLP JSON
``ResourceSpans`` each, read with the OTLP receiver's span reader. Against a real broker:
a record's read span becomes a scored item (its unrecorded fields listed), its span
without content is counted unmonitored, a record with a cut span or one that does not
decode is dead-lettered. With fakes: a busy service holds the record and goes on from
the first span not offered, never offering one twice or counting one twice."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from adapters.kafka.consumer import PartitionProgress
from adapters.kafka.source import KafkaEventSource
from monitor.app.runner import start_service
from monitor.config import load_settings
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission
from tests.apis_e2e.conftest import TASK_KEYS, api_task
from tests.apis_e2e.upstream import Upstream
from tests.kafka import new_topic, produce, read_all, unique
from tests.otlp.harness import chat_attributes
from tests.security.test_source_fuzz import FakeProducer, record
from tests.traces.otlp import TRACE, attr, span
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(180)]

CUT = chat_attributes() | {"gen_ai.input.messages": '[{"role": "user", "parts": [{"ty'}


def otlp_event(*spans: dict[str, Any]) -> bytes:
    """A Kafka traffic event: one OTLP JSON ResourceSpans with ``"format": "otlp"``."""
    return json.dumps(
        {
            "format": "otlp",
            "resource": {"attributes": attr({"service.name": "checkout"})},
            "scopeSpans": [{"scope": {"name": "openai_v2"}, "spans": list(spans)}],
        }
    ).encode()


def sid(n: int) -> str:
    return f"{n:016x}"


@pytest.mark.integration
async def test_an_otlp_event_becomes_a_scored_item(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = {k: await new_topic(kafka_bootstrap, k) for k in ("traffic", "dlq")}
    up = await Upstream().start()
    path = tmp_path / "relmon.yaml"
    config = {
        "tasks": [api_task("chat", up, match={"attributes": {"service.name": "checkout"}})],
        "traffic": {"mode": "off"},
        "metrics": {"port": 0},
        "review": {"port": 0, "token": "kafka-otlp-review-token-01"},
        "budget": {"calls_per_minute": 6000, "pace": False},
        "kafka": {"enabled": True, "bootstrap_servers": kafka_bootstrap,
                  "traffic_topic": topics["traffic"], "dead_letter_topic": topics["dlq"],
                  "group_id": unique("otlp")},
        "state_dir": str(tmp_path / "state"),
        "query_hash_key": "0123456789abcdef0123456789abcdef",
    }  # fmt: skip
    path.write_text(json.dumps(config), encoding="utf-8")
    running = await start_service(load_settings(path))
    registry = running.registry

    def events(decision: str) -> float:
        labels = {"source": "kafka", "decision": decision}
        return registry.get_sample_value("relmon_traffic_events_total", labels) or 0.0

    try:
        await produce(
            kafka_bootstrap,
            topics["traffic"],
            [
                otlp_event(
                    span(chat_attributes(), span_id=sid(1)),
                    span(chat_attributes(None), span_id=sid(2)),  # content capture off
                    span({"http.method": "GET"}, span_id=sid(3)),  # not an inference span
                ),
                otlp_event(span(chat_attributes(), span_id=sid(4)), span(CUT, span_id=sid(5))),
                b'{"format": "otlp", "scopeSpans": 3}',
            ],
        )
        found: dict[str, Any] = {}

        async def stored() -> bool:
            for n in (1, 4):
                found[n] = await running.store.get_review_item(f"chat:{TRACE}-{sid(n)}")
            return all(found.values())

        await wait_until(stored, timeout_s=60, what="the items of both read spans")
        dead = await read_all(kafka_bootstrap, topics["dlq"], at_least=2, timeout_s=60)
        await wait_until(lambda: events("sampled") == 2, timeout_s=10, what="both sampled")
        assert events("unmonitored") == 1
        assert events("rejected") == 2
    finally:
        await running.close(5)
        await up.stop()
    item = found[1]
    assert item.candidates[0][0].lower() == "rome" and item.served_rank == 1
    assert item.reask_changes["tools"] == {"unrecorded": True}
    assert len(up.received(key=TASK_KEYS["chat"])) == found[1].k + found[4].k  # no served draw
    reasons = sorted(dict(d.headers)["relmon-error"].decode() for d in dead)
    assert reasons[0].startswith("event.scopeSpans")
    assert reasons[1] == "span truncated"


class BusySink:
    """Answers ``busy`` the first time it is offered ``busy_id``; records every event."""

    def __init__(self, busy_id: str) -> None:
        self.busy_id: str | None = busy_id
        self.ids: list[str] = []
        self.rejects: list[tuple[str, str]] = []

    def __call__(self, event: TrafficEvent, source: str) -> Admission:
        if event.id == self.busy_id:
            self.busy_id = None
            return Admission("busy")
        self.ids.append(event.id)
        return Admission("skipped")

    def reject(self, source: str, reason: str) -> None:
        self.rejects.append((source, reason))


class PausingConsumer:
    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.paused: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    def pause(self, tp: TopicPartition) -> None:
        self.paused.add(tp)

    def resume(self, tp: TopicPartition) -> None:
        self.paused.discard(tp)


async def test_a_busy_service_resumes_an_otlp_record_at_its_first_span_not_offered() -> None:
    sink = BusySink(f"{TRACE}-{sid(2)}")
    counted: list[tuple[str, str]] = []
    source = KafkaEventSource(
        "127.0.0.1:9",
        "t",
        "g",
        "dlq",
        sink,
        sink.reject,
        count_api=lambda source, api: counted.append((source, api)),
    )
    tp = TopicPartition("t", 0)
    consumer = source._consumer = PausingConsumer(tp)
    producer = source._producer = FakeProducer()
    progress = source._parts[tp] = PartitionProgress()
    spans = otlp_event(
        span(chat_attributes(), span_id=sid(1)),
        span(chat_attributes(None), span_id=sid(9)),  # no content: counted, not offered
        span(chat_attributes(), span_id=sid(2)),
        span(chat_attributes(), span_id=sid(3)),
    )
    plain = json.dumps({"id": "after", "model": "m", "request": {"messages": [
        {"role": "user", "content": "hi"}]}}).encode()  # fmt: skip
    await source._process(tp, [record(spans, 0), record(plain, 1)])
    assert sink.ids == [f"{TRACE}-{sid(1)}"] and consumer.paused == {tp} and source.paused
    await source._before_poll()
    assert sink.ids == [f"{TRACE}-{sid(n)}" for n in (1, 2, 3)] + ["after"]
    assert not consumer.paused and not source.paused
    assert counted == [("kafka", "unmonitored")]  # once, though the record went twice
    assert producer.sent == [] and sink.rejects == []
    await asyncio.sleep(0)
    assert progress.commit_point() == 2
