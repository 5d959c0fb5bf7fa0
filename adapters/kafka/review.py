"""Kafka as the review backend: review items out, verdicts in, and the durable log.

- :class:`KafkaReviewQueue` writes each review item (``ReviewItem.to_json()``, key = the
  item id) to the review topic and returns once the brokers acknowledged it (acks=all),
  or gives the write up at once when :meth:`KafkaReviewQueue.stop` is called.
- :class:`KafkaCalibrationStore` is a :class:`monitor.engine.ports.CalibrationStore` whose
  durable state *is* the topics: at start it replays the review topic, the verdict
  topic and the verdicts' dead-letter topic from the beginning and rebuilds the scored
  verdicts; afterwards it keeps items and verdicted ids in memory.
- :class:`adapters.kafka.verdicts.KafkaVerdictConsumer` follows those three topics from
  where the replay stopped, without a consumer group and without commits: every
  replica reads every review item and every verdict, so all replicas hold the same
  calibration. A verdict whose review item is known is handed to the service; one
  whose item has not arrived yet waits for it (``wait_s``), then goes to the
  dead-letter topic with its reason, a log line and ``reject("unknown", reason)``; a
  malformed one goes there at once (``reject("invalid", reason)``).

A dead-lettered verdict is final: its partition and offset are in the dead letter's
headers, and a verdict found there is skipped, live and on replay, so a restart
neither applies it nor dead-letters it again (to apply it after all, produce it to the
verdict topic again once its item exists). With several replicas each may dead-letter
the same verdict once; the ``relmon-source-*`` headers tell the copies apart.

Verdicts should be keyed by item id so that every verdict of an item lands in one
partition: "the first verdict wins" then means the same thing live and on replay.

The calibration window's order is the verdict's place in the verdict log,
``(timestamp, partition, offset)``: the verdict consumer hands it over with each verdict
(:attr:`monitor.core.review.Verdict.position`) and the replay computes the same key, so the
window holds the same verdicts live and after a restart, however the partitions were
interleaved and however long a verdict waited for its item. Each replayed verdict becomes
a record by the same rule as live (:func:`monitor.engine.verdicts.calibration_record`,
scored by the service's :class:`~monitor.engine.verdicts.VerdictScorer`), its ACI step
included: its score against the review item's ``aci_threshold``. ACI's alpha_t depends
only on how many steps and misses there were (:class:`monitor.core.conformal.AdaptiveAlpha`),
not on their order, so the live alpha_t (verdicts applied in the order they arrived) and the
restored one (verdicts replayed in log order) are the same.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from adapters.kafka.connection import (
    CONNECT_ERRORS,
    KafkaUnavailableError,
    StoppingError,
    unless_stopping,
)
from adapters.kafka.logs import throttle_client_logs
from monitor.core.errors import ConfigError, InputError
from monitor.core.failures import internal_error
from monitor.core.review import ReviewItem, Verdict, parse_verdict, served_acceptable
from monitor.engine.ports import CalibrationRecord, Judgement
from monitor.engine.verdicts import calibration_record, ranks_beyond_candidates

__all__ = [
    "TOO_DEEP",
    "KafkaCalibrationStore",
    "KafkaReviewQueue",
    "durable_producer",
    "log_position",
    "review_item_of",
    "start_producer",
]

log = structlog.get_logger(__name__)

_ACKS_ALL = -1
TOO_DEEP = "verdict is not valid JSON: nested too deeply"
"""The reject reason of a verdict nested beyond json's limit."""


def durable_producer(bootstrap_servers: str, **options: Any) -> Any:
    """An (unstarted) ``AIOKafkaProducer`` fit for :class:`KafkaReviewQueue` (acks=all)."""
    options.pop("acks", None)
    options.setdefault("enable_idempotence", False)
    throttle_client_logs()
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", **options)


async def start_producer(producer: Any, bootstrap_servers: str) -> None:
    """Start ``producer``; :class:`KafkaUnavailableError` if the cluster cannot be reached."""
    try:
        await producer.start()
    except CONNECT_ERRORS as exc:
        await producer.stop()
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {bootstrap_servers}: {type(exc).__name__}"
        ) from exc


class KafkaReviewQueue:
    """Review items to a Kafka topic; ``depth`` counts submitted items still unverdicted.

    The producer is the caller's (it starts and stops it) and must use ``acks="all"``.
    ``pending_item_ids`` restores the depth after a restart
    (see :meth:`KafkaCalibrationStore.pending_item_ids`). :meth:`stop` gives up the
    writes in progress, as every broker call of relmon's Kafka clients races their
    stop (:func:`~adapters.kafka.connection.unless_stopping`): a broker that accepts
    connections but answers nothing would hold each for ``request_timeout_ms`` and more.
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
        self._stopping = asyncio.Event()

    async def submit(self, item: ReviewItem) -> None:
        """Write ``item`` to the review topic; returns once it is durable.

        Raises :class:`KafkaUnavailableError` if the write failed, :class:`StoppingError`
        if :meth:`stop` was called before it was acknowledged (it may still land: the
        producer's own close decides)."""
        value = json.dumps(item.to_json(), separators=(",", ":")).encode()
        send = self._producer.send_and_wait(self._topic, value, key=item.item_id.encode())
        try:
            await unless_stopping(self._stopping, send)
        except StoppingError:
            raise StoppingError(
                f"writing review item to {self._topic} given up: the review queue is stopping"
            ) from None
        except KafkaError as exc:
            raise KafkaUnavailableError(
                f"writing review item to {self._topic} failed: {type(exc).__name__}"
            ) from exc
        self._pending.add(item.item_id)

    async def stop(self) -> None:
        """Give up the writes in progress, and refuse later ones (relmon is stopping)."""
        self._stopping.set()

    async def depth(self) -> int:
        return len(self._pending)

    def verdict_seen(self, item_id: str) -> None:
        """Tell the queue an item got its verdict (the verdict consumer calls this)."""
        self._pending.discard(item_id)

    def item_seen(self, item_id: str) -> None:
        """An item waiting for a verdict that this queue did not submit (replayed, or
        published by another replica)."""
        self._pending.add(item_id)


class KafkaCalibrationStore:
    """A calibration store whose durable log is the review and verdict topics.

    :meth:`load_records` replays the topics to their ends; it counts what it could not
    use in ``invalid_records`` (unparseable items or verdicts, ranks above the
    candidates), ``unknown_verdicts`` (no review item yet: handed to the verdict
    consumer in ``waiting``, which waits for the item), ``duplicate_verdicts`` and
    ``dead_lettered_verdicts`` (refused before, skipped). Malformed verdicts not yet
    dead-lettered are left in ``unreadable`` for the verdict consumer to dead-letter.
    ``score(item, verdict)`` turns a verdict into the item's score (e.g.
    :func:`monitor.core.review.verdict_score` with the task's canonicalizer); its
    ``served(item, verdict, score)``, when it has one (the service's
    :class:`~monitor.engine.verdicts.VerdictScorer`), whether the verdict accepted the
    served answer (else :func:`monitor.core.review.served_acceptable` without a
    canonicalizer).
    ``dead_letter_topic`` is where refused verdicts go (replayed to know which).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        review_topic: str,
        verdict_topic: str,
        score: Callable[[ReviewItem, Verdict], float],
        *,
        dead_letter_topic: str | None = None,
        replay_timeout_s: float = 120.0,
        **consumer_options: Any,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.review_topic = review_topic
        self.verdict_topic = verdict_topic
        self.dead_letter_topic = dead_letter_topic
        self.consumer_options = consumer_options
        self._score = score
        self._served: Callable[[ReviewItem, Verdict, float], bool | None] = getattr(
            score, "served", served_acceptable
        )
        self._replay_timeout_s = replay_timeout_s
        self._items: dict[str, ReviewItem] = {}
        self._verdicted: set[str] = set()
        self._records: dict[str, CalibrationRecord] = {}
        self._unlogged = itertools.count()
        self._dead_lettered: set[tuple[int, int]] = set()
        self.positions: dict[TopicPartition, int] = {}
        """Where the replay stopped, per partition: the verdict consumer goes on from there."""
        self.waiting: list[tuple[Any, Verdict]] = []
        self.unreadable: list[tuple[Any, str]] = []
        self.invalid_records = 0
        self.unknown_verdicts = 0
        self.duplicate_verdicts = 0
        self.dead_lettered_verdicts = 0

    @property
    def topics(self) -> list[str]:
        """The topics replayed and then followed: review, verdict, dead letters."""
        out = [self.review_topic, self.verdict_topic]
        return out if self.dead_letter_topic is None else [*out, self.dead_letter_topic]

    async def load_records(self) -> list[CalibrationRecord]:
        """Every scored verdict in the topics, in verdict-log order: ``order`` is the
        verdict's ``(timestamp, partition, offset)`` (see :func:`log_position`)."""
        logs, self.positions = await self._replay(self.topics)
        items: dict[str, ReviewItem] = {}
        for record in _in_order(logs, self.review_topic):
            reviewed = review_item_of(record)
            if reviewed is None:
                self.invalid_records += 1
                continue
            items.setdefault(reviewed.item_id, reviewed)
        if self.dead_letter_topic is not None:
            for record in _in_order(logs, self.dead_letter_topic):
                self.note_dead_letter(record)
        verdicted: set[str] = set()
        out: list[CalibrationRecord] = []
        for record in _in_order(logs, self.verdict_topic):
            if self.is_dead_lettered(record):
                self.dead_lettered_verdicts += 1
                continue
            try:
                verdict = replace(parse_verdict(record.value), position=log_position(record))
            except InputError as exc:
                self.invalid_records += 1
                self.unreadable.append((record, str(exc)))
                continue
            except RecursionError:  # parse_verdict lets json's nesting limit through
                self.invalid_records += 1
                self.unreadable.append((record, TOO_DEEP))
                continue
            except Exception as exc:  # a bug: refused like a malformed verdict, not a crash
                self.invalid_records += 1
                self.unreadable.append((record, internal_error(exc)))
                continue
            item = items.get(verdict.item_id)
            if item is None:
                self.unknown_verdicts += 1
                self.waiting.append((record, verdict))
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
            if ranks_beyond_candidates(item, verdict):
                self.invalid_records += 1
                continue
            verdicted.add(verdict.item_id)
            score = self._score(item, verdict)
            scored = calibration_record(
                item, score, order=log_position(record), served=self._served(item, verdict, score)
            )
            self._records.setdefault(item.item_id, scored)
            out.append(scored)
        for item_id, item in self._items.items():
            items.setdefault(item_id, item)
        self._items = items
        self._verdicted |= verdicted
        log.info(
            "kafka.calibration_replayed",
            items=len(items),
            records=len(out),
            waiting_verdicts=len(self.waiting),
            dead_lettered_verdicts=self.dead_lettered_verdicts,
            invalid_records=self.invalid_records,
        )
        return out

    async def save_review_item(self, item: ReviewItem) -> None:
        """Memory only: :class:`KafkaReviewQueue` already wrote the item to its topic."""
        self._items[item.item_id] = item

    def add_item(self, item: ReviewItem) -> bool:
        """An item read from the review topic; True if it was not known before."""
        if item.item_id in self._items:
            return False
        self._items[item.item_id] = item
        return True

    def discard_review_item(self, item_id: str) -> None:
        """Forget an item whose publication failed."""
        if item_id not in self._verdicted:
            self._items.pop(item_id, None)

    def has_review_item(self, item_id: str) -> bool:
        return item_id in self._items

    async def recent_item_ids(self, limit: int) -> list[str]:
        """None: every replayed review item is known to :meth:`has_review_item`."""
        return []

    async def save_judgement(self, judgement: Judgement) -> int:
        """Judge labels are not kept on Kafka (``tasks[].judge`` needs review.backend
        http; ``check-config`` says so): nothing is stored."""
        return 0

    async def load_judgements(self, since: float) -> list[Judgement]:
        return []

    async def get_review_item(self, item_id: str) -> ReviewItem | None:
        return self._items.get(item_id)

    async def save_record(
        self, record: CalibrationRecord, verdict: Verdict
    ) -> tuple[int, ...] | None:
        """None if the item already had a verdict (the verdict topic is the durable copy).

        The order key is the verdict's :attr:`~monitor.core.review.Verdict.position` in the
        verdict log, what the replay computes. A verdict that did not come from the log
        (no position) is ordered by the time now, after the log's verdicts of the same
        millisecond; it is not replayed at a restart.
        """
        if record.item_id in self._verdicted:
            return None
        self._verdicted.add(record.item_id)
        order = verdict.position
        if order is None:
            order = (int(time.time() * 1000), 1 << 31, next(self._unlogged))
        self._records[record.item_id] = replace(record, order=order)
        return order

    async def get_record(self, item_id: str) -> CalibrationRecord | None:
        """The scored verdict of ``item_id`` (replayed or saved since), if any."""
        return self._records.get(item_id)

    def pending_item_ids(self) -> set[str]:
        """Items known from the review topic or saved since, still without a verdict."""
        return set(self._items) - self._verdicted

    async def pending_counts(self) -> dict[tuple[str, str], int]:
        """Items waiting for a verdict per ``(model, task)`` (the queue-depth gauge)."""
        counts: Counter[tuple[str, str]] = Counter()
        for item_id, item in self._items.items():
            if item_id not in self._verdicted:
                counts[item.model, item.task] += 1
        return dict(counts)

    def note_dead_letter(self, record: Any) -> None:
        """A record of the dead-letter topic: remember it if it was one of our verdicts."""
        key = _dead_letter_key(record, self.verdict_topic)
        if key is not None:
            self._dead_lettered.add(key)

    def mark_dead_lettered(self, partition: int, offset: int) -> None:
        self._dead_lettered.add((partition, offset))

    def is_dead_lettered(self, record: Any) -> bool:
        return (record.partition, record.offset) in self._dead_lettered

    async def aclose(self) -> None:
        self._items.clear()
        self._verdicted.clear()
        self._records.clear()

    async def _replay(
        self, topics: Sequence[str]
    ) -> tuple[dict[Any, list[Any]], dict[TopicPartition, int]]:
        """All records of ``topics`` up to their ends now, by partition, and the positions."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            **{
                **self.consumer_options,
                "group_id": None,
                "enable_auto_commit": False,
                "auto_offset_reset": "earliest",
            },
        )
        try:
            try:
                await consumer.start()
            except CONNECT_ERRORS as exc:
                raise KafkaUnavailableError(
                    f"cannot reach Kafka at {self.bootstrap_servers}: {type(exc).__name__}"
                ) from exc
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


def review_item_of(record: Any) -> ReviewItem | None:
    """The review item a record of the review topic holds (None if it holds none,
    whatever reading it raised: one record never stops the replay or the follower)."""
    try:
        return ReviewItem.from_json(json.loads(record.value))
    except Exception:  # InputError, ValueError, RecursionError, OverflowError (Infinity) ...
        return None


def _dead_letter_key(record: Any, verdict_topic: str) -> tuple[int, int] | None:
    """``(partition, offset)`` of the verdict a dead letter holds, if it holds one."""
    headers = {k: v for k, v in record.headers or ()}
    if headers.get("relmon-source-topic") != verdict_topic.encode():
        return None
    try:
        return int(headers["relmon-source-partition"]), int(headers["relmon-source-offset"])
    except (KeyError, ValueError):
        return None


async def _read_to_end(
    consumer: Any, topics: Sequence[str]
) -> tuple[dict[Any, list[Any]], dict[TopicPartition, int]]:
    """Every record of ``topics``, read until the log is really exhausted, and the
    position reached in each partition.

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
        return out, {}
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
    return out, {tp: await consumer.position(tp) for tp in tps}


def log_position(record: Any) -> tuple[int, int, int]:
    """A record's place in its topic, ``(timestamp, partition, offset)``: the order key
    of a verdict in the calibration window."""
    return (int(record.timestamp), int(record.partition), int(record.offset))


def _in_order(logs: Mapping[Any, Collection[Any]], topic: str) -> list[Any]:
    """The topic's records by timestamp, then partition and offset (stable on replay)."""
    records = [r for tp, rs in logs.items() if tp.topic == topic for r in rs]
    records.sort(key=log_position)
    return records
