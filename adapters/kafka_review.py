"""Kafka as the review backend: review items out, verdicts in, and the durable log.

- :class:`KafkaReviewQueue` writes each review item (``ReviewItem.to_json()``, key = the
  item id) to the review topic and returns once the brokers acknowledged it (acks=all).
- :class:`KafkaVerdictConsumer` reads the verdict topic in a consumer group, hands each
  valid verdict to the service and dead-letters malformed ones; offsets are committed
  only after the handler returned (verdicts are idempotent by item id, so a re-delivery
  after a crash is harmless).
- :class:`KafkaCalibrationStore` is a :class:`monitor.ports.CalibrationStore` whose
  durable state *is* the two topics: at start it replays both from the beginning and
  rebuilds the scored verdicts; afterwards it keeps items and verdicted ids in memory.

Verdicts should be keyed by item id so that every verdict of an item lands in one
partition: "the first verdict wins" then means the same thing live and on replay.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from adapters.kafka_source import KafkaConsumerBase, KafkaUnavailableError
from monitor.errors import ConfigError, InputError
from monitor.ports import CalibrationRecord, VerdictHandler
from monitor.review import ReviewItem, Verdict, parse_verdict

__all__ = [
    "KafkaCalibrationStore",
    "KafkaReviewQueue",
    "KafkaVerdictConsumer",
    "durable_producer",
]

log = structlog.get_logger(__name__)

_ACKS_ALL = -1


def durable_producer(bootstrap_servers: str, **options: Any) -> Any:
    """An (unstarted) ``AIOKafkaProducer`` fit for :class:`KafkaReviewQueue` (acks=all)."""
    options.pop("acks", None)
    options.setdefault("enable_idempotence", False)
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", **options)


class KafkaReviewQueue:
    """Review items to a Kafka topic; ``depth`` counts submitted items still unverdicted.

    The producer is the caller's (it starts and stops it) and must use ``acks="all"``.
    ``pending_item_ids`` restores the depth after a restart
    (see :meth:`KafkaCalibrationStore.pending_item_ids`).
    """

    def __init__(
        self, producer: Any, review_topic: str, *, pending_item_ids: Iterable[str] = ()
    ) -> None:
        acks = getattr(getattr(producer, "_sender", None), "_acks", _ACKS_ALL)
        if acks != _ACKS_ALL:
            raise ConfigError('the review queue needs a producer with acks="all"')
        self._producer = producer
        self._topic = review_topic
        self._pending: set[str] = set(pending_item_ids)

    async def submit(self, item: ReviewItem) -> None:
        """Write ``item`` to the review topic; returns once it is durable."""
        value = json.dumps(item.to_json(), separators=(",", ":")).encode()
        try:
            await self._producer.send_and_wait(self._topic, value, key=item.item_id.encode())
        except KafkaError as exc:
            raise KafkaUnavailableError(
                f"writing review item to {self._topic} failed: {type(exc).__name__}"
            ) from exc
        self._pending.add(item.item_id)

    async def depth(self) -> int:
        return len(self._pending)

    def verdict_seen(self, item_id: str) -> None:
        """Tell the queue an item got its verdict (the verdict consumer calls this)."""
        self._pending.discard(item_id)


class KafkaVerdictConsumer(KafkaConsumerBase):
    """Verdicts from a Kafka topic, handed one by one, in order, to ``handler``.

    A malformed verdict goes to ``dlq_topic`` and is counted with
    ``reject("verdicts", reason)``. When ``review_queue`` is given it is told about
    every verdict the handler applied or already had, to keep its depth.
    """

    source_name = "verdicts"

    def __init__(  # noqa: PLR0917 (the documented positional signature)
        self,
        bootstrap_servers: str,
        verdict_topic: str,
        group_id: str,
        handler: VerdictHandler,
        dlq_topic: str,
        reject: Callable[[str, str], None],
        *,
        commit_interval_s: float = 1.0,
        review_queue: KafkaReviewQueue | None = None,
        producer_options: Mapping[str, Any] | None = None,
        **consumer_options: Any,
    ) -> None:
        super().__init__(
            bootstrap_servers,
            verdict_topic,
            group_id,
            dlq_topic,
            reject,
            commit_interval_s=commit_interval_s,
            producer_options=producer_options,
            consumer_options=consumer_options,
        )
        self._handler = handler
        self._queue = review_queue

    async def _process(self, tp: Any, records: Sequence[Any]) -> None:
        st = self._progress(tp)
        if st is None:
            return
        for record in records:
            try:
                verdict = parse_verdict(record.value)
            except InputError as exc:
                await self._dead_letter(st, record, str(exc))
                if self._failure is not None:
                    return
            except RecursionError:  # parse_verdict lets json's nesting limit through
                await self._dead_letter(st, record, "verdict is not valid JSON: nested too deeply")
                if self._failure is not None:
                    return
            else:
                outcome = await self._handler(verdict)
                if self._queue is not None and outcome.status in ("applied", "duplicate"):
                    self._queue.verdict_seen(verdict.item_id)
            if self._parts.get(tp) is not st:
                return  # revoked meanwhile: the new owner re-reads from the commit
            st.next_offset = record.offset + 1


class KafkaCalibrationStore:
    """A calibration store whose durable log is the review and verdict topics.

    :meth:`load_records` replays both topics up to their end offsets at call time; it
    counts what it could not use in ``invalid_records`` (unparseable items or verdicts,
    ranks above the candidates), ``unknown_verdicts`` and ``duplicate_verdicts``.
    ``score(item, verdict)`` turns a verdict into the item's score (e.g.
    :func:`monitor.review.verdict_score` with the task's canonicalizer).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        review_topic: str,
        verdict_topic: str,
        score: Callable[[ReviewItem, Verdict], float],
        *,
        replay_timeout_s: float = 120.0,
        **consumer_options: Any,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._review_topic = review_topic
        self._verdict_topic = verdict_topic
        self._score = score
        self._replay_timeout_s = replay_timeout_s
        self._consumer_options = consumer_options
        self._items: dict[str, ReviewItem] = {}
        self._verdicted: set[str] = set()
        self.invalid_records = 0
        self.unknown_verdicts = 0
        self.duplicate_verdicts = 0

    async def load_records(self) -> list[CalibrationRecord]:
        """Every scored verdict in the topics, in verdict order (oldest first)."""
        logs = await self._replay([self._review_topic, self._verdict_topic])
        items: dict[str, ReviewItem] = {}
        for record in _in_order(logs, self._review_topic):
            try:
                reviewed = ReviewItem.from_json(json.loads(record.value))
            except (InputError, ValueError, TypeError, RecursionError):
                self.invalid_records += 1
                continue
            items.setdefault(reviewed.item_id, reviewed)
        verdicted: set[str] = set()
        out: list[CalibrationRecord] = []
        for record in _in_order(logs, self._verdict_topic):
            try:
                verdict = parse_verdict(record.value)
            except (InputError, RecursionError):
                self.invalid_records += 1
                continue
            item = items.get(verdict.item_id)
            if item is None:
                self.unknown_verdicts += 1
                log.warning(
                    "kafka.verdict_for_unknown_item",
                    item_id=verdict.item_id,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                )
                continue
            if verdict.item_id in verdicted:
                self.duplicate_verdicts += 1
                continue
            if any(r > len(item.candidates) for r in verdict.accepted_ranks):
                self.invalid_records += 1
                continue
            verdicted.add(verdict.item_id)
            out.append(
                CalibrationRecord(
                    model=item.model,
                    task=item.task,
                    item_id=item.item_id,
                    score=self._score(item, verdict),
                    inclusion_probability=item.inclusion_probability,
                    sampled_at=item.sampled_at,
                )
            )
        for item_id, item in self._items.items():
            items.setdefault(item_id, item)
        self._items = items
        self._verdicted |= verdicted
        log.info(
            "kafka.calibration_replayed",
            items=len(items),
            records=len(out),
            unknown_verdicts=self.unknown_verdicts,
            invalid_records=self.invalid_records,
        )
        return out

    async def save_review_item(self, item: ReviewItem) -> None:
        """Memory only: :class:`KafkaReviewQueue` already wrote the item to its topic."""
        self._items[item.item_id] = item

    async def get_review_item(self, item_id: str) -> ReviewItem | None:
        return self._items.get(item_id)

    async def save_record(self, record: CalibrationRecord, verdict: Verdict) -> bool:
        """False if the item already had a verdict (the verdict topic is the durable copy)."""
        if record.item_id in self._verdicted:
            return False
        self._verdicted.add(record.item_id)
        return True

    def pending_item_ids(self) -> set[str]:
        """Items known from the review topic or saved since, still without a verdict."""
        return set(self._items) - self._verdicted

    async def aclose(self) -> None:
        self._items.clear()
        self._verdicted.clear()

    async def _replay(self, topics: Sequence[str]) -> dict[Any, list[Any]]:
        """All records of ``topics`` up to their end offsets now, by partition."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            **{
                **self._consumer_options,
                "group_id": None,
                "enable_auto_commit": False,
                "auto_offset_reset": "earliest",
            },
        )
        try:
            await consumer.start()
            return await asyncio.wait_for(_read_to_end(consumer, topics), self._replay_timeout_s)
        except KafkaError as exc:
            raise KafkaUnavailableError(
                f"replaying {', '.join(topics)} failed: {type(exc).__name__}"
            ) from exc
        except TimeoutError:
            raise KafkaUnavailableError(
                f"replaying {', '.join(topics)} took over {self._replay_timeout_s} s"
            ) from None
        finally:
            await consumer.stop()


async def _read_to_end(consumer: Any, topics: Sequence[str]) -> dict[Any, list[Any]]:
    """Every record of ``topics``, read until the log is really exhausted.

    The reported end offset is only a lower bound: some brokers (Tansu 0.6) under-report it
    after a multi-record batch, and trusting it lost verdicts. A partition is done when its
    position has reached a freshly asked end offset *and* a fetch at that position came back
    empty; records past the first reported end are kept, not cut off.
    """
    await consumer.topics()  # refresh metadata without creating topics
    tps = [
        TopicPartition(topic, p)
        for topic in topics
        for p in sorted(consumer.partitions_for_topic(topic) or ())
    ]
    out: dict[Any, list[Any]] = {tp: [] for tp in tps}
    if not tps:
        return out
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)  # below the log start: auto_offset_reset="earliest" moves up
    remaining = set(tps)
    while remaining:
        batch = await consumer.getmany(*remaining, timeout_ms=200)
        for tp, records in batch.items():
            out[tp].extend(records)
        idle = [tp for tp in remaining if not batch.get(tp)]
        if not idle:
            continue
        end = await consumer.end_offsets(idle)
        for tp in idle:
            if await consumer.position(tp) >= end[tp]:
                remaining.discard(tp)
    return out


def _in_order(logs: Mapping[Any, Collection[Any]], topic: str) -> list[Any]:
    """The topic's records by timestamp, then partition and offset (stable on replay)."""
    records = [r for tp, rs in logs.items() if tp.topic == topic for r in rs]
    records.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    return records
