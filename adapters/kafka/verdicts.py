"""Verdicts from Kafka for every replica: :class:`KafkaVerdictConsumer`.

It follows the review topic, the verdict topic and the verdicts' dead-letter topic from
where :class:`adapters.kafka.review.KafkaCalibrationStore` stopped its replay, with no
consumer group and no commits (the topics are the durable state and every start replays
them), so every replica sees every review item and every verdict. The rules for waiting
verdicts and dead letters are in :mod:`adapters.kafka.review`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from adapters.kafka.connection import (
    CLIENT_OPTION_KEYS,
    CONNECT_ERRORS,
    METADATA_MAX_AGE_MS,
    ConsumerLag,
    KafkaUnavailableError,
    StoppingError,
    close_clients,
    dead_letter_headers,
    has_live_connection,
    note_offset_reset,
    record_failed,
    unless_stopping,
)
from adapters.kafka.logs import throttle_client_logs
from adapters.kafka.review import (
    TOO_DEEP,
    KafkaCalibrationStore,
    KafkaReviewQueue,
    log_position,
    review_item_of,
)
from monitor.core.errors import ConfigError, InputError, StateError
from monitor.core.failures import internal_error, raised_at
from monitor.core.review import MAX_VERDICT_BYTES, ReviewItem, Verdict, parse_verdict
from monitor.engine.ports import VerdictHandler

__all__ = ["KafkaVerdictConsumer"]

log = structlog.get_logger(__name__)

_POLL_MS = 250
_REFRESH_S = 30.0
_REFRESH_MISSING_S = 1.0


@dataclass
class _Waiting:
    record: Any
    verdict: Verdict
    deadline: float


class KafkaVerdictConsumer:
    """Follows the review, verdict and dead-letter topics of ``store`` after its replay.

    Every replica reads every record (no consumer group, nothing committed). In each
    fetch, review items are taken first (new ones go to ``store``, ``on_item`` and
    ``review_queue``), then dead letters, then verdicts, in partition order:

    - a verdict already dead-lettered (by this or another replica): skipped;
    - malformed, or over a size limit (``monitor.core.review``): to the dead-letter topic
      at once, ``reject("invalid", reason)`` (a value over the verdict limit is cut to
      it there, its size in the ``relmon-value-truncated-from`` header);
    - its review item known: ``handler(verdict)``;
    - else it waits up to ``wait_s`` for the item (then handled in order with the
      item's other verdicts); after that it goes to the dead-letter topic with the
      reason ``no review item ... within N s``, ``reject("unknown", reason)``.

    Verdicts still waiting at :meth:`stop` are not lost: the next start replays them.

    After :meth:`run` failed (a dead-letter write the broker did not acknowledge, a
    failed read), :meth:`restart` connects again and goes on from the first record not
    handled yet: the waiting verdicts keep waiting, and the dead letters whose write
    failed are written first, so nothing is handled twice and nothing is skipped.
    """

    source_name = "verdicts"

    def __init__(
        self,
        store: KafkaCalibrationStore,
        handler: VerdictHandler,
        reject: Callable[[str, str], None],
        *,
        wait_s: float = 30.0,
        review_queue: KafkaReviewQueue | None = None,
        on_item: Callable[[ReviewItem], None] | None = None,
        producer_options: Mapping[str, Any] | None = None,
        lag_gauge: Any = None,
        lag_interval_s: float = 5.0,
        offset_resets: Any = None,
    ) -> None:
        if store.dead_letter_topic is None:
            raise ConfigError("the verdict consumer needs the store's dead_letter_topic")
        if wait_s <= 0:
            raise ConfigError("wait_s must be positive")
        self._store = store
        self._dlq_topic: str = store.dead_letter_topic
        self._handler = handler
        self._reject = reject
        self._wait_s = wait_s
        self._queue = review_queue
        self._on_item = on_item
        options = dict(store.consumer_options)
        for key in ("group_id", "enable_auto_commit", "auto_offset_reset"):
            options.pop(key, None)
        options.setdefault("metadata_max_age_ms", METADATA_MAX_AGE_MS)
        self._consumer_options = options
        shared = {k: v for k, v in options.items() if k in CLIENT_OPTION_KEYS}
        self._producer_options = {**shared, **(producer_options or {})}
        self._consumer: Any = None
        self._producer: Any = None
        self._next: dict[TopicPartition, int] = {}
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._waiting: dict[str, list[_Waiting]] = {}
        self._undelivered: list[tuple[Any, str, str]] = []
        """Dead letters not written yet (record, reason, kind): tried at the next run."""
        self._stopping = asyncio.Event()
        self._run_exited = asyncio.Event()
        self._run_exited.set()
        self._run_task: asyncio.Task[Any] | None = None
        self._failure: KafkaUnavailableError | None = None
        self._down = False
        """:meth:`run` ended while not stopped: not connected until :meth:`restart`."""
        self._closed = False
        self.dead_letters = 0
        """Verdicts this consumer dead-lettered (for tests and logs)."""
        self.restarts = 0
        """How often :meth:`restart` connected again after a failure."""
        self.lag = ConsumerLag(lag_gauge, lag_interval_s, self._next_offset, self._reset_past_end)
        self._offset_resets_metric = offset_resets
        self.offset_resets: dict[TopicPartition, int] = {}
        """Positions found past their partition's log end and reset, per partition."""

    @property
    def waiting(self) -> int:
        """Verdicts waiting for their review item."""
        return sum(len(w) for w in self._waiting.values())

    async def start(self) -> None:
        """Connect, and take over the store's replay: its positions and leftovers."""
        if self._consumer is not None:
            raise StateError("KafkaVerdictConsumer already started")
        self._next = dict(self._store.positions)
        await self._connect()
        deadline = asyncio.get_running_loop().time() + self._wait_s
        for record, verdict in self._store.waiting:
            self._park(record, verdict, deadline)
        self._store.waiting.clear()
        log.info("kafka.started", topic=",".join(self._store.topics), group=None)

    async def restart(self) -> None:
        """After :meth:`run` failed: drop the clients and connect again, keeping the
        positions, the waiting verdicts and the dead letters not written yet; the next
        :meth:`run` goes on from the first record not handled."""
        if self._closed:
            raise StateError("KafkaVerdictConsumer is stopped")
        await self._close_clients()
        self._consumer = self._producer = None
        self._assigned = frozenset()
        self._failure = None
        self._down = False
        self.lag.export({})
        self.restarts += 1
        await self._connect()
        if self.stopped:  # stopped while connecting: stop() closed the old clients only
            await self._close_clients()

    @property
    def stopped(self) -> bool:
        """:meth:`stop` was called."""
        return self._closed

    async def _connect(self) -> None:
        """Start the clients and assign the partitions at ``_next``."""
        throttle_client_logs()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._store.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **self._consumer_options,
        )
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._store.bootstrap_servers,
            **{**self._producer_options, "acks": "all", "enable_idempotence": False},
        )
        try:
            await self._consumer.start()
            await self._producer.start()
            await self._assign()
        except CONNECT_ERRORS as exc:
            await self._close_clients()
            self._consumer = self._producer = None
            self._assigned = frozenset()
            raise KafkaUnavailableError(
                f"cannot reach Kafka at {self._store.bootstrap_servers}: {type(exc).__name__}"
            ) from exc

    async def run(self) -> None:
        """Follow the topics until :meth:`stop`; raises :class:`KafkaUnavailableError`."""
        consumer = self._consumer
        if self._stopping.is_set():
            return  # stopped before it ran
        if consumer is None:
            raise StateError("KafkaVerdictConsumer is not started")
        loop = asyncio.get_running_loop()
        self._run_task = asyncio.current_task()
        self._run_exited.clear()
        order = {t: i for i, t in enumerate(self._store.topics)}
        next_refresh = loop.time() + self._refresh_interval_s()
        lag_task = asyncio.create_task(self.lag.loop(consumer, self._store.verdict_topic))
        try:
            unreadable, self._store.unreadable = self._store.unreadable, []
            undelivered, self._undelivered = self._undelivered, []
            undelivered += [(record, reason, "invalid") for record, reason in unreadable]
            for record, reason, kind in undelivered:
                await self._dead_letter(record, reason, kind)
            while not self._stopping.is_set():
                if self._failure is not None:
                    raise self._failure
                if loop.time() >= next_refresh:
                    await self._assign()
                    next_refresh = loop.time() + self._refresh_interval_s()
                batch = await self._poll(consumer)
                for tp in sorted(batch, key=lambda tp: (order.get(tp.topic, 9), tp.partition)):
                    for record in batch[tp]:
                        self._next[tp] = record.offset + 1
                        await self._dispatch_one(record)
                await self._expire(loop.time())
            if self._failure is not None:
                raise self._failure
        except StoppingError:
            pass  # stop() was called during a broker call, which is given up
        except KafkaError as exc:
            raise KafkaUnavailableError(
                f"following {', '.join(self._store.topics)} failed: {type(exc).__name__}"
            ) from exc
        finally:
            # Only stop() ends run() quietly: any other way out leaves it down.
            self._down = not self._stopping.is_set()
            lag_task.cancel()
            await asyncio.wait({lag_task}, timeout=1.0)
            self._run_task = None
            self._run_exited.set()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop following (verdicts still waiting are replayed at the next start).

        Returns within about ``timeout_s``: :meth:`run` gives up the broker call it is in
        (``unless_stopping``) and ends; should it still run at the deadline's half (in a
        handler), it is cancelled; the clients are closed in the time left."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            await asyncio.wait_for(self._run_exited.wait(), timeout_s / 2)
        except TimeoutError:
            log.warning("kafka.stop_timeout", topic=self._store.verdict_topic)
            task = self._run_task
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()) / 2)
        await close_clients(
            (self._consumer, self._producer),
            self._store.verdict_topic,
            max(0.0, deadline - loop.time()),
        )
        self.lag.export({})
        if self._waiting or self._undelivered:  # both replayed at the next start
            log.info(
                "kafka.verdicts_left_waiting",
                verdicts=self.waiting,
                dead_letters_not_written=len(self._undelivered),
            )
        log.info("kafka.stopped", topic=",".join(self._store.topics), group=None)

    @property
    def topic(self) -> str:
        return ",".join(self._store.topics)

    @property
    def paused(self) -> bool:
        """Never: verdicts are applied as they come (the budget paces traffic only)."""
        return False

    def _next_offset(self, tp: TopicPartition) -> int | None:
        """The first record of ``tp`` not handled yet (``_next`` is replaced at start)."""
        return self._next.get(tp)

    @property
    def connected(self) -> bool:
        """Started, not stopped, failed or down, and holding a live broker connection."""
        if self._consumer is None or self._closed or self._failure is not None or self._down:
            return False
        return has_live_connection(self._consumer)

    async def _reset_past_end(self, tp: TopicPartition, position: int, log_end: int) -> None:
        """``tp``'s position lies past its log end (the broker lost its data, the topic
        was recreated): follow it again from its start (these topics are read in full),
        count it and log it once. Review items and verdicts seen before stay known, so
        none is applied twice."""
        await self._consumer.seek_to_beginning(tp)
        self._next[tp] = reset_to = await self._consumer.position(tp)
        note_offset_reset(
            self.offset_resets,
            self._offset_resets_metric,
            log,
            tp,
            position=position,
            log_end=log_end,
            reset_to=reset_to,
            policy="earliest",
        )

    def _refresh_interval_s(self) -> float:
        """Until the next metadata refresh: short while a topic is not there yet."""
        if len({tp.topic for tp in self._assigned}) < len(self._store.topics):
            return _REFRESH_MISSING_S
        return _REFRESH_S

    async def _poll(self, consumer: Any) -> dict[TopicPartition, list[Any]]:
        """One fetch, given up when :meth:`stop` is called. None while no partition is
        assigned (no topic exists yet): aiokafka's ``getmany`` would wait without end for
        an assignment, which only this loop makes."""
        if not self._assigned:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), _POLL_MS / 1000)
            return {}
        batch: dict[TopicPartition, list[Any]] = await unless_stopping(
            self._stopping, consumer.getmany(timeout_ms=_POLL_MS)
        )
        return batch

    async def _assign(self) -> None:
        """Assign every partition of the topics (new topics and partitions included)."""
        consumer = self._consumer
        # Refresh metadata without creating topics (given up when stop() is called).
        await unless_stopping(self._stopping, consumer.topics())
        tps = frozenset(
            TopicPartition(topic, p)
            for topic in self._store.topics
            for p in consumer.partitions_for_topic(topic) or ()
        )
        if tps == self._assigned:
            return
        consumer.assign(sorted(tps))
        for tp in tps:
            # 0 is below the log start after retention: auto_offset_reset moves it up
            consumer.seek(tp, self._next.get(tp, 0))
        self._assigned = tps

    async def _dispatch_one(self, record: Any) -> None:
        """:meth:`_dispatch`, never raising for one record: whatever handling it raises
        (a bug) is logged; a verdict is then dead-lettered and counted ``invalid``."""
        try:
            await self._dispatch(record)
        except StoppingError:
            raise
        except Exception as exc:
            reason = record_failed(record, exc)
            if record.topic == self._store.verdict_topic:
                await self._dead_letter(record, reason, "invalid")
            else:
                self._store.invalid_records += 1

    async def _dispatch(self, record: Any) -> None:
        store = self._store
        if record.topic == store.review_topic:
            item = review_item_of(record)
            if item is None:
                store.invalid_records += 1
                log.warning("kafka.invalid_review_item", offset=record.offset)
                return
            if store.add_item(item):
                if self._on_item is not None:
                    self._on_item(item)
                if self._queue is not None:
                    self._queue.item_seen(item.item_id)
            for waiting in self._waiting.pop(item.item_id, ()):
                await self._apply(waiting.record, waiting.verdict)
            return
        if record.topic == self._dlq_topic:
            store.note_dead_letter(record)
        if record.topic != store.verdict_topic or store.is_dead_lettered(record):
            return
        try:
            # Its place in the log is its order in the calibration window (as on replay).
            verdict = replace(parse_verdict(record.value), position=log_position(record))
        except InputError as exc:
            await self._dead_letter(record, str(exc), "invalid")
            return
        except RecursionError:  # parse_verdict lets json's nesting limit through
            await self._dead_letter(record, TOO_DEEP, "invalid")
            return
        if verdict.item_id in self._waiting or not store.has_review_item(verdict.item_id):
            deadline = asyncio.get_running_loop().time() + self._wait_s
            self._park(record, verdict, deadline)
            return
        await self._apply(record, verdict)

    def _park(self, record: Any, verdict: Verdict, deadline: float) -> None:
        self._waiting.setdefault(verdict.item_id, []).append(_Waiting(record, verdict, deadline))

    async def _apply(self, record: Any, verdict: Verdict) -> None:
        """``handler(verdict)``; if it raises (a bug), the verdict is dead-lettered and
        counted ``invalid``, and the records after it go on."""
        try:
            outcome = await self._handler(verdict)
        except Exception as exc:
            reason = internal_error(exc)
            log.error("kafka.verdict_failed", item_id=verdict.item_id, at=raised_at(exc))
            await self._dead_letter(record, reason, "invalid")
            return
        if self._queue is not None and outcome.status in ("applied", "duplicate"):
            self._queue.verdict_seen(verdict.item_id)

    async def _expire(self, now: float) -> None:
        for item_id in [i for i, ws in self._waiting.items() if ws[0].deadline <= now]:
            waiting = self._waiting.pop(item_id)
            keep = [w for w in waiting if w.deadline > now]
            if keep:
                self._waiting[item_id] = keep
            for w in waiting:
                if w.deadline <= now:
                    reason = f"no review item {w.verdict.item_id!r} within {self._wait_s:g} s"
                    await self._dead_letter(w.record, reason, "unknown")

    async def _dead_letter(self, record: Any, reason: str, kind: str) -> None:
        """Produce a refused verdict to the dead-letter topic (acknowledged), count it.

        If the write fails, :meth:`run` fails at its next step and this dead letter and
        those after it are kept for the run after :meth:`restart`.
        """
        if self._failure is not None:
            self._undelivered.append((record, reason, kind))
            return
        headers = dead_letter_headers(
            reason, record.topic, record.partition, record.offset, "verdicts"
        )
        value = record.value
        if value is not None and len(value) > MAX_VERDICT_BYTES:
            # Over the verdict limit, so refused anyway: its start is enough to find it,
            # and a whole one could exceed what the producer may send (a follower stuck).
            headers.append(("relmon-value-truncated-from", str(len(value)).encode()))
            value = value[:MAX_VERDICT_BYTES]
        key = record.key
        if key is None and value is None:
            key = b""  # a tombstone: Kafka needs a key or a value
        try:
            sending = self._producer.send_and_wait(
                self._dlq_topic, value=value, key=key, headers=headers
            )
            await unless_stopping(self._stopping, sending)
        except StoppingError:
            self._undelivered.append((record, reason, kind))  # written at the next start
            raise
        except Exception as exc:  # KafkaError, or anything the client raises: not sent
            message = f"dead-letter send to {self._dlq_topic} failed: {type(exc).__name__}"
            log.error("kafka.failed", topic=self._store.verdict_topic, error=message)
            self._failure = KafkaUnavailableError(message)
            self._undelivered.append((record, reason, kind))
            return
        self._store.mark_dead_lettered(record.partition, record.offset)
        self.dead_letters += 1
        self._reject(kind, reason)
        log.warning(
            "kafka.dead_letter",
            stream="verdicts",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=reason[:300],
        )

    async def _close_clients(self) -> None:
        await close_clients((self._consumer, self._producer), self._store.verdict_topic)
