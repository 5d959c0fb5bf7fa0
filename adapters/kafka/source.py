"""Kafka as a traffic source: a consumer group on a topic of logged LLM calls (docs/kafka.md).

:class:`KafkaEventSource` reads events in ``getmany`` batches, validates each with
:func:`parse_event_bytes` (``monitor.core.events.parse_event`` with msgspec's faster JSON
decoder in front, same results) and offers it to the service (``sink(event, "kafka")``).
A malformed record is produced to a dead-letter topic with its original value and key
and the headers ``relmon-error`` (the reason, never payload text), ``relmon-stream``
(``traffic``), ``relmon-source-topic``, ``relmon-source-partition`` and
``relmon-source-offset``.

Offsets are committed only for work that is finished (at-least-once)::

    skipped / duplicate            done at once (a duplicate still running: when it is)
    sampled                        done when ``admission.done`` resolves (any outcome)
    malformed                      done when the dead-letter record is acknowledged
    busy (no budget)               not done: held, offered again later

Backpressure: the events are already durable in Kafka, so the source never drops one
for lack of budget. When the sink answers ``busy`` (give it ``service.offer`` with
``wait=True``) the partition is paused (``consumer.pause``) with the record and the
rest of its batch held in memory; before every fetch the held records are offered
again, and once they all went the partition is resumed. The events are thus admitted
at the budget's pace, and the committed offset never passes one not yet offered.

Per partition the committed offset is the first offset that is not done yet (or one
past the last record seen when all are done), so a restart re-delivers exactly the
records from the first unfinished one on. Commits happen at most every
``commit_interval_s``, when partitions are revoked, and at :meth:`stop`.

Consumer lag (:class:`ConsumerLag`): every ``lag_interval_s`` the log end of each
assigned partition is asked for and the records between it and the first record not
done yet (held, in flight or not fetched: what the commit point will pass) are exported
to ``relmon_kafka_consumer_lag{topic,partition}``; the series of a partition this
consumer no longer has are removed, so that a sum over replicas counts each once.

:class:`KafkaConsumerBase` holds what the source shares with the verdict consumer in
:mod:`adapters.kafka.review`: start/stop, commits, rebalances, the dead-letter producer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from monitor.core.errors import ConfigError, InputError, RelmonError
from monitor.core.events import MAX_EVENT_BYTES, TrafficEvent, parse_event
from monitor.engine.ports import EventSink

_fast_decode: Callable[[bytes], Any] | None
try:
    import msgspec.json
except ImportError:  # pragma: no cover - msgspec only makes decoding faster
    _fast_decode = None
    _FastDecodeError: type[Exception] = ValueError
else:
    _fast_decode = msgspec.json.Decoder().decode
    _FastDecodeError = msgspec.DecodeError

__all__ = [
    "CLIENT_OPTION_KEYS",
    "CONNECT_ERRORS",
    "METADATA_MAX_AGE_MS",
    "ConsumerLag",
    "KafkaConsumerBase",
    "KafkaEventSource",
    "KafkaUnavailableError",
    "PartitionProgress",
    "close_clients",
    "dead_letter_headers",
    "has_live_connection",
    "parse_event_bytes",
]

log = structlog.get_logger(__name__)

CLIENT_OPTION_KEYS = frozenset(
    {
        "api_version",
        "client_id",
        "connections_max_idle_ms",
        "metadata_max_age_ms",
        "request_timeout_ms",
        "retry_backoff_ms",
        "sasl_kerberos_domain_name",
        "sasl_kerberos_service_name",
        "sasl_mechanism",
        "sasl_oauth_token_provider",
        "sasl_plain_password",
        "sasl_plain_username",
        "security_protocol",
        "ssl_context",
    }
)
"""Consumer options that also apply to the dead-letter producer (same cluster)."""

CONNECT_ERRORS: tuple[type[Exception], ...] = (KafkaError, KeyError)
"""What starting an aiokafka client raises when the cluster refuses it: KafkaError, or
KeyError from aiokafka's SCRAM client when the broker ends the exchange with an error
(``e=unknown-user``) instead of its signature."""

_MAX_REASON_CHARS = 300
_POLL_MAX_S = 0.25
_LAG_TIMEOUT_S = 10.0
METADATA_MAX_AGE_MS = 10_000
"""Consumers refresh metadata this often: a new partition, or a topic that appears after
a broker came back empty, is seen within 10 s instead of aiokafka's 5 minutes."""
_DLQ_OVERHEAD_BYTES = 64 * 1024


def parse_event_bytes(value: bytes | None, max_bytes: int = MAX_EVENT_BYTES) -> TrafficEvent:
    """:func:`monitor.core.events.parse_event` on a record value, with a faster JSON decoder.

    Same result and same :class:`InputError` reasons as ``parse_event(value)``: msgspec
    decodes strict RFC 8259 JSON (big integers exact, floats correctly rounded) to the
    objects ``json.loads`` gives; whatever it refuses (oversize, not UTF-8, NaN, a
    BOM, too deep, not an object) goes to ``parse_event`` on the bytes, which decides.
    """
    raw: Any = value
    if _fast_decode is not None and value is not None and len(value) <= max_bytes:
        try:
            obj = _fast_decode(value)
        except (_FastDecodeError, RecursionError):
            pass
        else:
            if type(obj) is dict:
                raw = obj
    try:
        return parse_event(raw, max_bytes=max_bytes)
    except RecursionError:  # parse_event lets json's nesting limit through
        raise InputError("invalid JSON: nested too deeply") from None


def has_live_connection(client: Any) -> bool:
    """Whether an (aiokafka) client holds at least one live broker connection."""
    conns = getattr(getattr(client, "_client", None), "_conns", None)
    if conns is None:
        return True
    return any(conn.connected() for conn in list(conns.values()))


async def close_clients(clients: Sequence[Any], topic: str) -> None:
    """Stop each started aiokafka client, also when the broker is gone."""
    for client in clients:
        if client is None:
            continue
        try:
            await client.stop()
        except KafkaError as exc:
            log.warning("kafka.close_failed", error=type(exc).__name__)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # aiokafka's fetcher re-raises the cancellation of its own retry sleep
            # when the broker is gone; finish closing the connections by hand.
            log.warning("kafka.close_interrupted", topic=topic)
            inner = getattr(client, "_client", None)
            if inner is not None:
                await inner.close()


class KafkaUnavailableError(RelmonError):
    """Kafka could not be reached, or refused to store a record or an offset."""

    retriable = True


def dead_letter_headers(
    reason: str, topic: str, partition: int, offset: int, stream: str = "traffic"
) -> list[tuple[str, bytes]]:
    """The headers of a dead-letter record (the reason is cut to a few hundred chars).

    ``relmon-stream`` names what the record was: ``traffic`` (an event) or ``verdicts``.
    """
    return [
        ("relmon-error", reason[:_MAX_REASON_CHARS].encode("utf-8", "replace")),
        ("relmon-stream", stream.encode()),
        ("relmon-source-topic", topic.encode()),
        ("relmon-source-partition", str(partition).encode()),
        ("relmon-source-offset", str(offset).encode()),
    ]


class ConsumerLag:
    """Measures and exports one consumer's lag: records behind the log end per partition.

    ``consumed(tp)`` gives the first offset of a partition not done yet (None: use the
    consumer's position). The log end is the larger of a fresh ``end_offsets`` answer and
    the last fetch's high watermark (a broker may under-report one of them).
    """

    def __init__(
        self, gauge: Any, interval_s: float, consumed: Callable[[Any], int | None]
    ) -> None:
        if interval_s <= 0:
            raise ConfigError("lag_interval_s must be positive")
        self._gauge = gauge
        self._interval_s = interval_s
        self._consumed = consumed
        self._series: set[tuple[str, str]] = set()
        self.lag: dict[Any, int] = {}
        """The last measurement, per assigned partition."""

    async def measure(self, consumer: Any) -> dict[Any, int]:
        tps = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
        end = await consumer.end_offsets(tps) if tps else {}
        lag: dict[Any, int] = {}
        for tp in tps:
            if tp not in consumer.assignment():
                continue  # revoked meanwhile
            done = self._consumed(tp)
            if done is None:
                done = await consumer.position(tp)
            log_end = max(end.get(tp) or 0, consumer.highwater(tp) or 0)
            lag[tp] = max(0, log_end - done)
        self.lag = lag
        self.export(lag)
        return lag

    def export(self, lag: Mapping[Any, int]) -> None:
        """Set the gauge's series of ``lag``; remove this consumer's other series."""
        if self._gauge is None:
            return
        series = {(tp.topic, str(tp.partition)): n for tp, n in lag.items()}
        for labels in self._series - series.keys():
            with contextlib.suppress(KeyError):
                self._gauge.remove(*labels)
        for labels, n in series.items():
            self._gauge.labels(*labels).set(n)
        self._series = set(series)

    async def loop(self, consumer: Any, topic: str) -> None:
        """Measure every ``interval_s`` until cancelled (a failed try is logged, retried)."""
        while True:
            try:
                await asyncio.wait_for(self.measure(consumer), _LAG_TIMEOUT_S)
            except (KafkaError, TimeoutError) as exc:
                log.info("kafka.lag_unknown", topic=topic, error=type(exc).__name__)
            await asyncio.sleep(self._interval_s)


class PartitionProgress:
    """What is done in one assigned partition.

    ``pending`` holds ``(offset, future)`` for records that are not finished, in offset
    order; every other record up to ``next_offset`` is done.
    """

    __slots__ = ("committed", "next_offset", "pending")

    def __init__(self) -> None:
        self.pending: deque[tuple[int, asyncio.Future[Any]]] = deque()
        self.next_offset: int | None = None
        self.committed: int | None = None

    def commit_point(self) -> int | None:
        """The offset to commit: the first unfinished record, else one past the last."""
        pending = self.pending
        while pending and pending[0][1].done():
            offset, fut = pending.popleft()
            if not fut.cancelled() and fut.exception() is not None:
                log.warning(
                    "kafka.item_failed",
                    offset=offset,
                    error=type(fut.exception()).__name__,
                )
        if pending:
            return pending[0][0]
        return self.next_offset

    def unfinished(self) -> list[asyncio.Future[Any]]:
        return [fut for _, fut in self.pending if not fut.done()]


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: KafkaConsumerBase) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: Collection[Any]) -> None:
        await self._owner._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Collection[Any]) -> None:
        self._owner._on_assigned(assigned)


class KafkaConsumerBase:
    """A consumer-group loop that commits finished work and dead-letters bad records.

    Subclasses implement :meth:`_process` for one partition's batch of records.
    """

    source_name = "kafka"
    stream = "traffic"
    """The ``relmon-stream`` header of this consumer's dead letters."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        group_id: str,
        dlq_topic: str,
        reject: Callable[[str, str], None],
        *,
        commit_interval_s: float = 1.0,
        dlq_max_value_bytes: int = 1_000_000,
        producer_options: Mapping[str, Any] | None = None,
        consumer_options: Mapping[str, Any] | None = None,
        lag_gauge: Any = None,
        lag_interval_s: float = 5.0,
    ) -> None:
        if commit_interval_s <= 0:
            raise ConfigError("commit_interval_s must be positive")
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._group_id = group_id
        self._dlq_topic = dlq_topic
        self._reject = reject
        self._commit_interval_s = commit_interval_s
        self._dlq_max_value_bytes = dlq_max_value_bytes
        options = dict(consumer_options or {})
        options.pop("enable_auto_commit", None)
        options.setdefault("auto_offset_reset", "earliest")
        options.setdefault("metadata_max_age_ms", METADATA_MAX_AGE_MS)
        self._consumer_options = options
        shared = {k: v for k, v in options.items() if k in CLIENT_OPTION_KEYS}
        self._producer_options = {**shared, **(producer_options or {})}
        self._consumer: Any = None
        self._producer: Any = None
        self._parts: dict[Any, PartitionProgress] = {}
        self._stopping = asyncio.Event()
        self._run_exited = asyncio.Event()
        self._run_exited.set()
        self._run_task: asyncio.Task[Any] | None = None
        self._failure: KafkaUnavailableError | None = None
        self._closed = False
        self.commit_failures = 0
        """Commits that failed (retried at the next interval); for tests and logs."""
        self.lag = ConsumerLag(lag_gauge, lag_interval_s, self._first_not_done)
        self.restarts = 0
        """How often :meth:`restart` connected again after a failure."""

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect the consumer and the dead-letter producer and join the group."""
        if self._consumer is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self._group_id,
            enable_auto_commit=False,
            **self._consumer_options,
        )
        producer_options = {
            "max_request_size": self._dlq_max_value_bytes + _DLQ_OVERHEAD_BYTES,
            **self._producer_options,
            "acks": "all",
            "enable_idempotence": False,
        }
        self._producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, **producer_options)
        try:
            await self._consumer.start()
            await self._producer.start()
        except CONNECT_ERRORS as exc:
            await self._close_clients()
            self._consumer = self._producer = None  # start() may be tried again
            raise KafkaUnavailableError(
                f"cannot reach Kafka at {self._bootstrap}: {type(exc).__name__}"
            ) from exc
        self._consumer.subscribe([self._topic], listener=_Rebalance(self))
        log.info("kafka.started", topic=self._topic, group=self._group_id)

    async def run(self) -> None:
        """Consume until :meth:`stop`; raises :class:`KafkaUnavailableError` on failure."""
        consumer = self._consumer
        if consumer is None or self._closed:
            raise RuntimeError(f"{type(self).__name__} is not started")
        loop = asyncio.get_running_loop()
        self._run_task = asyncio.current_task()
        self._run_exited.clear()
        interval = self._commit_interval_s
        poll_ms = max(1, int(min(interval, _POLL_MAX_S) * 1000))
        next_commit = loop.time() + interval
        lag_task = asyncio.create_task(self.lag.loop(consumer, self._topic))
        try:
            while not self._stopping.is_set():
                if self._failure is not None:
                    raise self._failure
                await self._before_poll()
                batch = await consumer.getmany(timeout_ms=poll_ms)
                for tp, records in batch.items():
                    if records:
                        await self._process(tp, records)
                if loop.time() >= next_commit:
                    await self._commit()
                    next_commit = loop.time() + interval
            if self._failure is not None:
                raise self._failure
        except KafkaError as exc:
            raise KafkaUnavailableError(
                f"consuming {self._topic} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            lag_task.cancel()
            await asyncio.wait({lag_task})
            self._run_task = None
            self._run_exited.set()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop consuming, wait up to ``timeout_s`` for unfinished work, commit, close."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        task = self._run_task
        if task is not None and task is not asyncio.current_task():
            try:
                await asyncio.wait_for(self._run_exited.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        futures = [f for st in self._parts.values() for f in st.unfinished()]
        if futures and self._failure is None:
            await asyncio.wait(futures, timeout=max(0.0, deadline - loop.time()))
        if self._consumer is not None:
            try:
                await asyncio.wait_for(self._commit(), max(0.1, deadline - loop.time()))
            except TimeoutError:
                log.warning("kafka.final_commit_timeout", topic=self._topic)
        await self._close_clients()
        self._parts.clear()
        self.lag.export({})
        log.info("kafka.stopped", topic=self._topic, group=self._group_id)

    async def restart(self) -> None:
        """After :meth:`run` failed: drop the clients and the progress, connect again and
        rejoin the group. Nothing is committed first: the records after the last commit
        are delivered again (at least once; the service knows those it already took)."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is stopped")
        await self._close_clients()
        self._consumer = self._producer = None
        self._parts.clear()
        self._failure = None
        self._forget_progress()
        self.lag.export({})
        self.restarts += 1
        await self.start()

    def _forget_progress(self) -> None:
        """Subclass hook: drop what :meth:`restart` makes stale."""

    @property
    def stopped(self) -> bool:
        """:meth:`stop` was called."""
        return self._closed

    @property
    def topic(self) -> str:
        return self._topic

    def _first_not_done(self, tp: Any) -> int | None:
        st = self._parts.get(tp)
        return None if st is None else st.commit_point()

    @property
    def connected(self) -> bool:
        """Started, not stopped or failed, and holding a live broker connection."""
        if self._consumer is None or self._closed or self._failure is not None:
            return False
        return has_live_connection(self._consumer)

    async def _close_clients(self) -> None:
        await close_clients((self._consumer, self._producer), self._topic)

    # -- subclass hooks ----------------------------------------------------------------

    async def _process(self, tp: Any, records: Sequence[Any]) -> None:
        raise NotImplementedError

    async def _before_poll(self) -> None:
        """Called before every fetch (and at least every 250 ms)."""

    # -- offsets -----------------------------------------------------------------------

    def _progress(self, tp: Any) -> PartitionProgress | None:
        """The state of an assigned partition, or None if it was revoked meanwhile."""
        st = self._parts.get(tp)
        if st is None and tp in self._consumer.assignment():
            st = self._parts[tp] = PartitionProgress()
        return st

    async def _commit(self, only: Collection[Any] | None = None) -> None:
        todo: list[tuple[Any, PartitionProgress, int]] = []
        for tp, st in self._parts.items():
            if only is not None and tp not in only:
                continue
            pos = st.commit_point()
            if pos is not None and pos != st.committed:
                todo.append((tp, st, pos))
        if not todo:
            return
        try:
            await self._consumer.commit({tp: pos for tp, _, pos in todo})
        except (CommitFailedError, IllegalStateError) as exc:
            self.commit_failures += 1
            log.warning("kafka.commit_skipped_rebalance", topic=self._topic, error=str(exc))
            return
        except KafkaError as exc:
            self.commit_failures += 1
            log.warning("kafka.commit_failed", topic=self._topic, error=type(exc).__name__)
            return
        for _, st, pos in todo:
            st.committed = pos

    async def _on_revoked(self, revoked: Collection[Any]) -> None:
        try:
            await asyncio.wait_for(self._commit(only=set(revoked)), 30.0)
        except TimeoutError:
            log.warning("kafka.revoke_commit_timeout", topic=self._topic)
        for tp in revoked:
            self._parts.pop(tp, None)

    def _on_assigned(self, assigned: Collection[Any]) -> None:
        for tp in assigned:
            self._parts[tp] = PartitionProgress()

    # -- dead letters ------------------------------------------------------------------

    async def _dead_letter(self, st: PartitionProgress, record: Any, reason: str) -> None:
        """Produce ``record`` to the dead-letter topic; its offset is done once acked."""
        self._reject(self.source_name, reason)
        value = record.value
        headers = dead_letter_headers(
            reason, record.topic, record.partition, record.offset, self.stream
        )
        if value is not None and len(value) > self._dlq_max_value_bytes:
            headers.append(("relmon-value-truncated-from", str(len(value)).encode()))
            value = value[: self._dlq_max_value_bytes]
        log.warning(
            "kafka.dead_letter",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=reason[:_MAX_REASON_CHARS],
        )
        key = record.key
        if key is None and value is None:
            key = b""  # a tombstone: Kafka needs a key or a value
        # Until the dead letter is acknowledged the offset is not done; if it never is,
        # ``done`` stays unresolved and no commit passes this record.
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        st.pending.append((record.offset, done))
        try:
            sent = await self._producer.send(self._dlq_topic, value=value, key=key, headers=headers)
        except KafkaError as exc:
            self._fail(f"dead-letter send to {self._dlq_topic} failed: {type(exc).__name__}")
            return

        def acked(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                error = "cancelled" if fut.cancelled() else type(fut.exception()).__name__
                self._fail(f"dead-letter send to {self._dlq_topic} failed: {error}")
            elif not done.done():
                done.set_result(None)

        sent.add_done_callback(acked)

    def _fail(self, message: str) -> None:
        log.error("kafka.failed", topic=self._topic, error=message)
        if self._failure is None:
            self._failure = KafkaUnavailableError(message)


class KafkaEventSource(KafkaConsumerBase):
    """Traffic events from a Kafka topic, offered to the service (docs/kafka.md)."""

    def __init__(  # noqa: PLR0917 (the documented positional signature)
        self,
        bootstrap_servers: str,
        topic: str,
        group_id: str,
        dlq_topic: str,
        sink: EventSink,
        reject: Callable[[str, str], None],
        max_event_bytes: int = MAX_EVENT_BYTES,
        commit_interval_s: float = 1.0,
        *,
        source_name: str = "kafka",
        producer_options: Mapping[str, Any] | None = None,
        lag_gauge: Any = None,
        lag_interval_s: float = 5.0,
        **consumer_options: Any,
    ) -> None:
        super().__init__(
            bootstrap_servers,
            topic,
            group_id,
            dlq_topic,
            reject,
            commit_interval_s=commit_interval_s,
            dlq_max_value_bytes=max(max_event_bytes, 1_000_000),
            producer_options=producer_options,
            consumer_options=consumer_options,
            lag_gauge=lag_gauge,
            lag_interval_s=lag_interval_s,
        )
        self.source_name = source_name
        self._sink = sink
        self._max_event_bytes = max_event_bytes
        self._held: dict[Any, deque[Any]] = {}
        """Records of paused partitions not offered yet (the service was busy), in order."""

    async def _process(self, tp: Any, records: Sequence[Any]) -> None:
        st = self._progress(tp)
        if st is None:
            return
        held = self._held.get(tp)
        if held is not None:  # fetched before the pause took effect: keep the order
            held.extend(records)
            return
        await self._offer_all(tp, st, records)

    async def _offer_all(self, tp: Any, st: PartitionProgress, records: Sequence[Any]) -> None:
        """Offer ``records`` in order; at the first ``busy`` one, hold it and the rest and
        pause the partition (its offset stays uncommitted until they are offered)."""
        parse = parse_event_bytes
        sink = self._sink
        name = self.source_name
        max_bytes = self._max_event_bytes
        pending = st.pending
        for i, record in enumerate(records):
            try:
                event = parse(record.value, max_bytes)
            except InputError as exc:
                await self._dead_letter(st, record, str(exc))
            else:
                admission = sink(event, name)
                if admission.decision == "busy":
                    self._hold(tp, st, records[i:])
                    return
                done = admission.done
                if done is not None and not done.done():
                    pending.append((record.offset, done))
                continue
            if self._failure is not None or self._parts.get(tp) is not st:
                return  # failing, or revoked while sending (the new owner takes over)
        st.next_offset = records[-1].offset + 1

    @property
    def paused(self) -> bool:
        """Holding events until the service has room for them (partitions paused)."""
        return bool(self._held)

    def _hold(self, tp: Any, st: PartitionProgress, records: Sequence[Any]) -> None:
        if not self._held:
            log.info("kafka.paused", topic=self._topic, reason="budget")
        self._held[tp] = deque(records)
        st.next_offset = records[0].offset
        self._consumer.pause(tp)

    async def _before_poll(self) -> None:
        """Offer the held records again; resume each partition whose records all went."""
        if not self._held:
            return
        for tp in list(self._held):
            records = self._held.pop(tp)
            st = self._parts.get(tp)
            if st is None:
                continue  # revoked: the new owner reads them from the committed offset
            await self._offer_all(tp, st, list(records))
            if tp not in self._held and tp in self._consumer.assignment():
                self._consumer.resume(tp)
        if not self._held:
            log.info("kafka.resumed", topic=self._topic)

    async def _on_revoked(self, revoked: Collection[Any]) -> None:
        await super()._on_revoked(revoked)
        for tp in revoked:
            self._held.pop(tp, None)

    def _forget_progress(self) -> None:
        self._held.clear()
