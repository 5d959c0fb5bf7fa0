"""What every relmon Kafka client shares: the client options, connection checks,
closing, dead-letter headers, the log line of a record whose handling failed, the
consumer-lag gauge, and the error for an unreachable cluster."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import structlog
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from monitor.core.errors import ConfigError, RelmonError
from monitor.core.failures import internal_error, raised_at
from monitor.engine.logs import ThrottledLog

__all__ = [
    "CLIENT_OPTION_KEYS",
    "CONNECT_ERRORS",
    "MAX_REASON_CHARS",
    "METADATA_MAX_AGE_MS",
    "ConsumerLag",
    "KafkaUnavailableError",
    "PastEnd",
    "StoppingError",
    "close_clients",
    "dead_letter_headers",
    "has_live_connection",
    "lost_commits",
    "note_offset_reset",
    "past_log_end",
    "record_failed",
    "throttled_log",
    "unless_stopping",
]

T = TypeVar("T")

log = structlog.get_logger("adapters.kafka.source")
throttled_log = ThrottledLog(name="adapters.kafka.source")
"""For lines that an outage repeats (a failed commit, an unknown lag)."""

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

MAX_REASON_CHARS = 300
"""The longest dead-letter reason kept (in the ``relmon-error`` header)."""
_LAG_TIMEOUT_S = 10.0
METADATA_MAX_AGE_MS = 5_000
"""Consumers refresh metadata this often: a new partition, or a topic that appears after
a broker came back empty, is seen within 5 s instead of aiokafka's 5 minutes (then the
group rebalances: docs/kafka.md, "New partitions")."""


def has_live_connection(client: Any) -> bool:
    """Whether an (aiokafka) client holds at least one live broker connection."""
    conns = getattr(getattr(client, "_client", None), "_conns", None)
    if conns is None:
        return True
    return any(conn.connected() for conn in list(conns.values()))


class StoppingError(RelmonError):
    """A broker call given up because the client's ``stop()`` was called meanwhile."""


async def unless_stopping(stopping: asyncio.Event, call: Awaitable[T]) -> T:
    """Await a broker call, unless ``stopping`` is set first: then the call is cancelled
    and :class:`StoppingError` raised. A broker that accepts connections but does not
    answer (stalled, paused) keeps a metadata request or an acknowledgement waiting for
    ``request_timeout_ms`` and more; ``stop()`` must not wait for it."""
    task = asyncio.ensure_future(call)
    if stopping.is_set():
        task.cancel()
        raise StoppingError("stopping")
    waiter = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        finished = task.done()
        if not finished:
            task.cancel()
            task.add_done_callback(_retrieve)
    if not finished:
        raise StoppingError("stopping")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Take the outcome of a call given up, so that asyncio does not log it."""
    if not task.cancelled():
        task.exception()


async def close_clients(clients: Sequence[Any], topic: str, timeout_s: float | None = None) -> None:
    """Stop the started aiokafka clients (together), also when the broker is gone.

    ``timeout_s`` bounds the whole, for a broker that accepts connections but does not
    answer: at half of it, a producer still flushing has its unacknowledged records
    failed (whoever waits for one sees an error) so that it can close at once; at the
    end, a client still stopping is cancelled and its connections are closed.
    """
    tasks = [asyncio.ensure_future(_stop_client(c, topic)) for c in clients if c is not None]
    if not tasks:
        return
    if timeout_s is None:
        await asyncio.gather(*tasks)
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    _, pending = await asyncio.wait(tasks, timeout=timeout_s / 2)
    if pending:
        for client in clients:
            accumulator = getattr(client, "_message_accumulator", None)
            if accumulator is not None:  # a producer waiting for acknowledgements
                accumulator.fail_all(KafkaTimeoutError("the producer was closed"))
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
    for task in tasks:
        if task in pending:
            task.cancel()
            task.add_done_callback(_retrieve)
        else:
            task.result()
    if pending:
        log.warning("kafka.close_timeout", topic=topic)
        await asyncio.gather(*(_abandon(c) for c in clients if c is not None))


_BACKGROUND: Final = (
    ("_fetcher", "_fetch_task"),
    ("_coordinator", "_coordination_task"),
    ("_coordinator", "_heartbeat_task"),
    ("_coordinator", "_commit_refresh_task"),
    ("_coordinator", "_reset_committed_task"),
    ("_sender", "_sender_task"),
    ("_client", "_sync_task"),
)
"""aiokafka's own tasks in a consumer or producer (owner attribute, task attribute)."""


async def _abandon(client: Any) -> None:
    """A client whose ``stop()`` did not end in time: its background tasks are cancelled,
    then its connections closed (each close() is immediate). Closing the connections alone
    was not enough: the metadata task, left running, opened a new one afterwards, never
    closed (a socket leaked per late stop)."""
    tasks = []
    for owner_name, task_name in _BACKGROUND:
        task = getattr(getattr(client, owner_name, None), task_name, None)
        if isinstance(task, asyncio.Future) and not task.done():
            task.cancel()
            tasks.append(task)
    if tasks:
        await asyncio.wait(tasks, timeout=1.0)
    inner = getattr(client, "_client", None)
    for conn in list(getattr(inner, "_conns", {}).values()):
        conn.close()


async def _stop_client(client: Any, topic: str) -> None:
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
        ("relmon-error", reason[:MAX_REASON_CHARS].encode("utf-8", "replace")),
        ("relmon-stream", stream.encode()),
        ("relmon-source-topic", topic.encode()),
        ("relmon-source-partition", str(partition).encode()),
        ("relmon-source-offset", str(offset).encode()),
    ]


def record_failed(record: Any, exc: Exception, event: str = "kafka.record_failed") -> str:
    """The reason for a record whose handling raised ``exc`` (a bug: ``internal error:
    <type>``, never the message, which may quote the record), logged as ``event`` with
    the record's topic, partition and offset and where it was raised."""
    reason = internal_error(exc)
    log.error(
        event,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        error=reason,
        at=raised_at(exc),
    )
    return reason


PastEnd = Callable[[Any, int, int], Awaitable[None]]
"""``on_past_end(tp, position, log_end)``: move a partition's position that lies past its
log end back into the log (:class:`ConsumerLag`)."""


def note_offset_reset(
    resets: dict[Any, int],
    metric: Any,
    logger: Any,
    tp: Any,
    *,
    position: int,
    log_end: int | None,
    reset_to: int,
    policy: str,
    cause: str = "past_log_end",
) -> None:
    """Count (``resets`` and ``relmon_kafka_offset_resets_total``, when given) and log
    once a position of ``tp`` moved because it belongs to a log the broker no longer has:
    it lay past the partition's log end (``past_log_end``), or the group's committed
    offset of the partition was gone (``committed_offset_lost``; ``log_end`` None)."""
    resets[tp] = resets.get(tp, 0) + 1
    if metric is not None:
        metric.labels(tp.topic).inc()
    logger.warning(
        "kafka.offset_reset",
        topic=tp.topic,
        partition=tp.partition,
        position=position,
        log_end=log_end,
        reset_to=reset_to,
        policy=policy,
        cause=cause,
    )


async def lost_commits(consumer: Any, committed: Mapping[Any, int], timeout_s: float) -> list[Any]:
    """The partitions of ``committed`` (what this consumer committed last, per partition)
    whose committed offset the group no longer has, or has below that.

    A group's committed offsets stay while the group is alive; a broker rebuilt without
    its data, or a topic deleted and recreated, drops them. Then the consumer's position
    belongs to a log that is gone, even where the new log already reaches past it (no
    position past the log end to see): a broker answers the fetch there with the new
    log's later records, and the ones before it would never be read. Another member that
    took a partition over commits at or above this one's offset, never below.
    ``TimeoutError`` when the group's coordinator does not answer within ``timeout_s``
    (aiokafka retries that call without end).
    """
    tps = list(committed)
    if not tps:
        return []
    answers = await asyncio.wait_for(
        asyncio.gather(*(consumer.committed(tp) for tp in tps)), timeout_s
    )
    return [tp for tp, now in zip(tps, answers, strict=True) if now is None or now < committed[tp]]


async def past_log_end(consumer: Any, tp: Any, end_offset: int | None) -> tuple[int, int] | None:
    """``(position, log_end)`` when ``tp``'s fetch position lies past its log end, else None.

    The log end is the larger of ``end_offset`` (a fresh ``end_offsets`` answer) and the
    high watermark of the last fetch answered at the current position. Judged only once a
    fetch was answered (a high watermark is known): a broker may under-report
    ``end_offsets`` (Tansu: 1 after a 100-record batch), never the high watermark of a
    fetch. A position reached by reading never passes that watermark; one taken from a
    committed offset, or kept across a broker rebuilt without its data, can: a broker
    that answers such a fetch with no records and no OffsetOutOfRange (Tansu) would
    leave the partition unread for good.
    """
    highwater = consumer.highwater(tp)
    if highwater is None:
        return None
    position = await consumer.position(tp)
    log_end = max(end_offset or 0, highwater)
    return (position, log_end) if position > log_end else None


class ConsumerLag:
    """Measures and exports one consumer's lag: records behind the log end per partition.

    ``consumed(tp)`` gives the first offset of a partition not done yet (None: use the
    consumer's position). The log end is the larger of a fresh ``end_offsets`` answer and
    the last fetch's high watermark (a broker may under-report one of them). Before
    measuring, ``verify(tps)`` (when given) moves back into the log the positions whose
    log the broker lost (:func:`lost_commits`), and a partition whose position lies past
    its log end (:func:`past_log_end`) is handed to ``on_past_end``, which moves it back
    into the log; its lag is then measured from there, so it never reads 0 for a
    partition that is not read. While the lag cannot be measured (no live connection, or
    no answer) the series read NaN: unknown, not 0.
    """

    def __init__(
        self,
        gauge: Any,
        interval_s: float,
        consumed: Callable[[Any], int | None],
        on_past_end: PastEnd | None = None,
        verify: Callable[[Sequence[Any]], Awaitable[None]] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ConfigError("lag_interval_s must be positive")
        self._gauge = gauge
        self._interval_s = interval_s
        self._consumed = consumed
        self._on_past_end = on_past_end
        self._verify = verify
        self._series: set[tuple[str, str]] = set()
        self.lag: dict[Any, int] = {}
        """The last measurement, per assigned partition."""

    async def measure(self, consumer: Any) -> dict[Any, int]:
        tps = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
        if self._verify is not None and tps:
            await self._verify(tps)
        end = await consumer.end_offsets(tps) if tps else {}
        lag: dict[Any, int] = {}
        for tp in tps:
            if tp not in consumer.assignment():
                continue  # revoked meanwhile
            log_end = max(end.get(tp) or 0, consumer.highwater(tp) or 0)
            if self._on_past_end is not None:
                past = await past_log_end(consumer, tp, end.get(tp))
                if past is not None:
                    await self._on_past_end(tp, *past)
                    if tp not in consumer.assignment():
                        continue
            done = self._consumed(tp)
            if done is None:
                done = await consumer.position(tp)
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

    def unknown(self) -> None:
        """Set this consumer's series to NaN: the partitions are not read and their lag
        cannot be measured (a last value of 0 would say they are caught up)."""
        if self._gauge is None:
            return
        for labels in self._series:
            self._gauge.labels(*labels).set(math.nan)

    async def loop(self, consumer: Any, topic: str) -> None:
        """Measure every ``interval_s`` until cancelled (a failed try is logged, at most
        once per cause every 10 s, and retried; meanwhile the series read NaN)."""
        while True:
            try:
                if not has_live_connection(consumer):
                    raise KafkaConnectionError("no live connection to a broker")
                await asyncio.wait_for(self.measure(consumer), _LAG_TIMEOUT_S)
            except (KafkaError, TimeoutError) as exc:
                self.unknown()
                error = type(exc).__name__
                throttled_log.info(
                    "kafka.lag_unknown", key=(topic, error), topic=topic, error=error
                )
            await asyncio.sleep(self._interval_s)
