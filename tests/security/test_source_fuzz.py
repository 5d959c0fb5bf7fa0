"""The Kafka sources' per-record handling fuzzed with arbitrary bytes, without a broker
(fakes of the consumer and the producer): whatever a record holds and whatever handling
it raises, it is counted once (an event, or a rejection that is dead-lettered with its
reason in ``relmon-error``), the records after it go on, and the commit point passes
it (DESIGN.md §5, "Sources never die silently"). tests/kafka/test_source_never_dies.py
does the same against a real broker with a handful of inputs."""

from __future__ import annotations

import asyncio
import json
from collections import namedtuple
from typing import Any

from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.kafka.consumer import PartitionProgress
from adapters.kafka.review import KafkaCalibrationStore
from adapters.kafka.source import KafkaEventSource, admit_record
from adapters.kafka.verdicts import KafkaVerdictConsumer
from monitor.core.events import TrafficEvent
from monitor.core.review import ReviewItem, Verdict, verdict_score
from monitor.engine.ports import Admission, VerdictOutcome
from tests.waiting import wait_until

Record = namedtuple("Record", "topic partition offset key value headers timestamp")


def event(item_id: str, content: str = "What is 2+2?") -> bytes:
    return json.dumps(
        {
            "id": item_id,
            "model": "m",
            "request": {"messages": [{"role": "user", "content": content}]},
        }
    ).encode()


def spliced(junk: bytes) -> bytes:
    """A valid event with ``junk`` raw inside its content string (not escaped)."""
    return event("spliced", "<>").replace(b"<>", junk)


VALUES = (
    st.binary(max_size=200)
    | st.binary(min_size=1, max_size=10).map(spliced)
    | st.sampled_from(
        [
            None,
            spliced(b"\xff"),
            spliced(b"\\u0000"),
            spliced(b"\\ud800"),
            b"[" * 5000,
            event("big", "x" * 3000),  # over the 2048-byte limit below
            event("boom"),  # the sink raises for it
            b'{"id": "x", "model": "m", "n": 1e999, "request": {"messages": []}}',
        ]
    )
)


class Sink:
    """Records every event; raises an exception nobody expected for the id ``boom``."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.rejects: list[tuple[str, str]] = []

    def __call__(self, event: TrafficEvent, source: str) -> Admission:
        if event.id == "boom":
            raise KeyError("a bug in the sink")
        self.ids.append(event.id)
        return Admission("skipped")

    def reject(self, source: str, reason: str) -> None:
        self.rejects.append((source, reason))


class FakeProducer:
    """Acknowledges every send at once; keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, topic: str, **kw: Any) -> asyncio.Future[None]:
        self.sent.append({"topic": topic, **kw})
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def send_and_wait(self, topic: str, **kw: Any) -> None:
        await self.send(topic, **kw)


def record(value: bytes | None, offset: int = 0, topic: str = "t") -> Record:
    return Record(topic, 0, offset, None, value, [], 1_800_000_000_000 + offset)


class FakeConsumer:
    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}


@settings(max_examples=500, derandomize=True, deadline=None, database=None)
@given(value=VALUES)
def test_admit_record_never_raises(value: bytes | None) -> None:
    sink = Sink()
    outcome = admit_record(record(value), sink, "kafka", 2048)
    if isinstance(outcome, str):
        assert outcome and sink.ids == []  # a reason; nothing offered
    else:
        assert outcome.decision == "skipped" and len(sink.ids) == 1


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(values=st.lists(VALUES, min_size=1, max_size=6), batch=st.integers(1, 6))
async def test_every_record_is_counted_once_and_the_partition_goes_on(
    values: list[bytes | None], batch: int
) -> None:
    """Each random record is followed by a valid marker; the records come in batches of
    ``batch``. Every marker reaches the sink, every random record is an event or a
    dead-lettered rejection (exactly one of both), and the commit passes them all."""
    sink = Sink()
    source = KafkaEventSource(
        "127.0.0.1:9", "t", "g", "dlq", sink, sink.reject, max_event_bytes=2048
    )
    tp = TopicPartition("t", 0)
    source._consumer = FakeConsumer(tp)
    producer = source._producer = FakeProducer()
    st_ = source._parts[tp] = PartitionProgress()
    raw: list[bytes | None] = []
    for n, value in enumerate(values):
        raw += [value, event(f"marker-{n}")]
    records = [record(v, offset) for offset, v in enumerate(raw)]
    for i in range(0, len(records), batch):
        await source._process(tp, records[i : i + batch])
    assert [i for i in sink.ids if i.startswith("marker-")] == [
        f"marker-{n}" for n in range(len(values))
    ]
    assert len(sink.ids) - len(values) + len(sink.rejects) == len(values)
    assert [s for s, _ in sink.rejects] == ["kafka"] * len(sink.rejects)
    assert [dict(m["headers"])["relmon-error"].decode() for m in producer.sent] == [
        reason for _, reason in sink.rejects
    ]
    rejected = [v for v in values if isinstance(admit_record(record(v), Sink(), "k", 2048), str)]
    assert [m["value"] for m in producer.sent] == rejected  # each one once, as it came
    await wait_until(  # the acknowledgements' callbacks run at the loop's next turn
        lambda: st_.commit_point() == len(records),
        what="the commit point past every record",
        interval_s=0.001,
    )


# -- the verdict follower ---------------------------------------------------------------

ITEM = ReviewItem(
    item_id="i0",
    model="m",
    task="t",
    query="q",
    candidates=(("a", 5), ("b", 3)),
    k=8,
    inclusion_probability=1.0,
    sampled_at=1_800_000_000.0,
)
GOOD_VERDICT = json.dumps({"item_id": "i0", "accepted_ranks": [1]}).encode()
VERDICT_VALUES = (
    st.binary(max_size=120)
    | st.binary(min_size=1, max_size=8).map(
        lambda j: GOOD_VERDICT.replace(b'"i0"', b'"' + j + b'"')
    )
    | st.sampled_from(
        [
            None,
            b'{"item_id": "boom", "accepted_ranks": [1]}',  # the handler raises
            b'{"item_id": "i0", "accepted_ranks": [1], "reviewer": "r\xff"}',
            json.dumps(ITEM.to_json() | {"k": float("inf")}).encode(),
        ]
    )
)


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(values=st.lists(st.tuples(st.booleans(), VERDICT_VALUES), min_size=1, max_size=6))
async def test_the_verdict_follower_handles_any_record_once(
    values: list[tuple[bool, bytes | None]],
) -> None:
    """Random records on the review and the verdict topic, each followed by a valid
    verdict: every valid verdict is applied, every random verdict is applied, waits
    for its item, or is dead-lettered and counted ``invalid`` (once); nothing raises."""
    store = KafkaCalibrationStore(
        "127.0.0.1:9", "reviews", "verdicts", verdict_score, dead_letter_topic="dlq"
    )
    store.add_item(ITEM)
    applied: list[str] = []
    rejects: list[tuple[str, str]] = []

    async def handle(v: Verdict) -> VerdictOutcome:
        if v.item_id == "boom":
            raise RuntimeError("a bug in the handler")
        applied.append(v.item_id)
        return VerdictOutcome("applied", score=1.0)

    consumer = KafkaVerdictConsumer(store, handle, lambda k, r: rejects.append((k, r)))
    producer = consumer._producer = FakeProducer()
    offsets = {"reviews": 0, "verdicts": 0}
    verdicts = 0
    for on_reviews, value in values:
        topic = "reviews" if on_reviews else "verdicts"
        if not on_reviews:
            verdicts += 1
        for t, v in ((topic, value), ("verdicts", GOOD_VERDICT)):
            await consumer._dispatch_one(record(v, offsets[t], t))
            offsets[t] += 1
    assert applied.count("i0") >= len(values)  # every valid verdict after a random record
    assert len(rejects) == len(producer.sent)
    assert all(kind == "invalid" for kind, _ in rejects)
    dead = [dict(m["headers"])["relmon-source-offset"] for m in producer.sent]
    assert len(dead) == len(set(dead))  # each dead letter a different record
    waiting = consumer.waiting
    random_applied = len(applied) - len(values)
    assert random_applied + waiting + len(rejects) == verdicts
