"""The base of relmon's Kafka consumers: partitions, ordered commits (an offset is
committed only once that record and every earlier one is handled), rebalances,
dead letters and restarts. :class:`~adapters.kafka.source.KafkaEventSource` reads
traffic with it."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from adapters.kafka.assignment import CheckedAssignor, leave_group
from adapters.kafka.connection import (
    CLIENT_OPTION_KEYS,
    CONNECT_ERRORS,
    MAX_REASON_CHARS,
    METADATA_MAX_AGE_MS,
    ConsumerLag,
    KafkaUnavailableError,
    StoppingError,
    close_clients,
    dead_letter_headers,
    has_live_connection,
    lost_commits,
    note_offset_reset,
    throttled_log,
    unless_stopping,
)
from adapters.kafka.logs import throttle_client_logs
from monitor.core.errors import ConfigError, StateError

__all__ = ["KafkaConsumerBase", "PartitionProgress"]

log = structlog.get_logger("adapters.kafka.source")

_POLL_MAX_S = 0.25
_REJOIN_MIN_INTERVAL_S = METADATA_MAX_AGE_MS / 1000
_DLQ_OVERHEAD_BYTES = 64 * 1024
_CHECK_COMMITS_TIMEOUT_S = 5.0


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


class KafkaConsumerBase(ABC):
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
        offset_resets: Any = None,
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
        if options["auto_offset_reset"] not in ("earliest", "latest"):
            raise ConfigError("auto_offset_reset must be 'earliest' or 'latest'")
        self._reset_policy: str = options["auto_offset_reset"]
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
        self._down = False
        """:meth:`run` ended while not stopped: not connected until :meth:`restart`."""
        self._closed = False
        self.commit_failures = 0
        """Commits that failed (retried at the next interval); for tests and logs."""
        hooks = (self._first_not_done, self._reset_past_end, self._check_commits)
        self.lag = ConsumerLag(lag_gauge, lag_interval_s, *hooks)
        self._offset_resets_metric = offset_resets
        self.offset_resets: dict[Any, int] = {}
        """Positions of a log the broker lost, found and reset, per partition."""
        self._committed_earlier: dict[Any, int] = {}
        """The offset this consumer last committed of a partition it no longer holds."""
        self._assignor = CheckedAssignor(self._assignment_stale)
        self._rejoin = False
        """The broker handed back an assignment the leader had not computed: join anew."""
        self._last_rejoin = float("-inf")
        self.restarts = 0
        """How often :meth:`restart` connected again after a failure."""

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect the consumer and the dead-letter producer and join the group."""
        if self._consumer is not None:
            raise StateError(f"{type(self).__name__} already started")
        throttle_client_logs()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self._group_id,
            enable_auto_commit=False,
            partition_assignment_strategy=(self._assignor,),
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
            raise StateError(f"{type(self).__name__} is not started")
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
                if self._rejoin:
                    await unless_stopping(self._stopping, self._join_anew(consumer, loop.time()))
                await self._before_poll()
                # Given up at stop(): during a rebalance getmany waits for the assignment.
                batch = await unless_stopping(self._stopping, consumer.getmany(timeout_ms=poll_ms))
                for tp, records in batch.items():
                    if records:
                        await self._process(tp, records)
                if loop.time() >= next_commit:
                    await unless_stopping(self._stopping, self._commit())
                    next_commit = loop.time() + interval
            if self._failure is not None:
                raise self._failure
        except StoppingError:
            pass  # stop() was called during a broker call, which is given up
        except KafkaError as exc:
            raise KafkaUnavailableError(
                f"consuming {self._topic} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            # Only stop() ends run() quietly: any other way out leaves it down.
            self._down = not self._stopping.is_set()
            lag_task.cancel()
            await asyncio.wait({lag_task}, timeout=1.0)
            self._run_task = None
            self._run_exited.set()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop consuming, wait for unfinished work, commit, close: within about
        ``timeout_s``. :meth:`run` gives up the broker call it is in (and is cancelled if
        it still runs at half the timeout); the final commit and the closing of the
        clients keep a slice of the timeout each (an eighth and a quarter, at most 1 and
        2 s), the wait for unfinished work has the rest."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        task = self._run_task
        closing_s = min(2.0, timeout_s / 4)  # kept for closing the clients
        commit_s = min(1.0, timeout_s / 8)  # kept for the final commit
        if task is not None and task is not asyncio.current_task():
            try:
                await asyncio.wait_for(self._run_exited.wait(), timeout_s / 2)
            except TimeoutError:
                task.cancel()
                await asyncio.wait({task}, timeout=min(1.0, timeout_s / 8))
        futures = [f for st in self._parts.values() for f in st.unfinished()]
        if futures and self._failure is None:
            left = deadline - closing_s - commit_s - loop.time()
            await asyncio.wait(futures, timeout=max(0.0, left))
        if self._consumer is not None:
            try:
                await asyncio.wait_for(self._commit(), max(0.0, deadline - closing_s - loop.time()))
            except TimeoutError:
                log.warning("kafka.final_commit_timeout", topic=self._topic)
        await close_clients(
            (self._consumer, self._producer), self._topic, max(0.0, deadline - loop.time())
        )
        self._parts.clear()
        self.lag.export({})
        log.info("kafka.stopped", topic=self._topic, group=self._group_id)

    async def restart(self) -> None:
        """After :meth:`run` failed: drop the clients and the progress, connect again and
        rejoin the group. Nothing is committed first: the records after the last commit
        are delivered again (at least once; the service knows those it already took)."""
        if self._closed:
            raise StateError(f"{type(self).__name__} is stopped")
        await self._close_clients()
        self._consumer = self._producer = None
        self._parts.clear()
        self._failure = None
        self._down = False
        self._forget_progress()
        self.lag.export({})
        self.restarts += 1
        await self.start()

    def _forget_progress(self) -> None:  # noqa: B027 (an optional hook)
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
        """Started, not stopped, failed or down, and holding a live broker connection."""
        if self._consumer is None or self._closed or self._failure is not None or self._down:
            return False
        return has_live_connection(self._consumer)

    async def _close_clients(self) -> None:
        await close_clients((self._consumer, self._producer), self._topic)

    # -- subclass hooks ----------------------------------------------------------------

    @abstractmethod
    async def _process(self, tp: Any, records: Sequence[Any]) -> None:
        """Handle one partition's batch of records (in offset order)."""

    async def _before_poll(self) -> None:  # noqa: B027 (an optional hook)
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
        try:  # never write a position of a lost log over the new log's (empty) commit
            await self._check_commits([tp for tp, _, _ in todo])
            todo = [(tp, st, pos) for tp, st, pos in todo if self._parts.get(tp) is st]
            if todo:
                await self._consumer.commit({tp: pos for tp, _, pos in todo})
        except (CommitFailedError, IllegalStateError) as exc:
            self.commit_failures += 1
            throttled_log.warning(
                "kafka.commit_skipped_rebalance",
                key=(self._topic, type(exc).__name__),
                topic=self._topic,
                error=str(exc),
            )
            return
        except (KafkaError, TimeoutError) as exc:
            self.commit_failures += 1
            error = type(exc).__name__
            throttled_log.warning(
                "kafka.commit_failed", key=(self._topic, error), topic=self._topic, error=error
            )
            return
        for _, st, pos in todo:
            st.committed = pos

    async def _on_revoked(self, revoked: Collection[Any]) -> None:
        try:
            await asyncio.wait_for(self._commit(only=set(revoked)), 30.0)
        except TimeoutError:
            log.warning("kafka.revoke_commit_timeout", topic=self._topic)
        for tp in revoked:
            st = self._parts.pop(tp, None)
            if st is not None and st.committed is not None:
                self._committed_earlier[tp] = st.committed

    def _on_assigned(self, assigned: Collection[Any]) -> None:
        for tp in assigned:  # what the group had of tp is checked again (_check_commits)
            self._parts[tp] = st = PartitionProgress()
            st.committed = self._committed_earlier.pop(tp, None)

    # -- positions past the log end, assignments the leader did not make ---------------

    async def _reset_past_end(self, tp: Any, position: int, log_end: int | None) -> None:
        """``tp``'s position belongs to a log the broker lost (its data, or the topic was
        recreated): it lies past the log end, or (``log_end`` None) the group's committed
        offset is gone. Move it per ``auto_offset_reset``, count it, log it once. The
        work of the old log still in flight no longer holds the commit point."""
        consumer = self._consumer
        self._parts[tp] = st = PartitionProgress()  # first: a concurrent check skips tp
        self._committed_earlier.pop(tp, None)  # the group's offset of the old log
        self._forget_partition(tp)
        if self._reset_policy == "earliest":
            await consumer.seek_to_beginning(tp)
        elif log_end is None:
            await consumer.seek_to_end(tp)
        else:
            consumer.seek(tp, log_end)
        st.next_offset = reset_to = await consumer.position(tp)  # committed next time
        note_offset_reset(
            self.offset_resets,
            self._offset_resets_metric,
            log,
            tp,
            position=position,
            log_end=log_end,
            reset_to=reset_to,
            policy=self._reset_policy,
            cause="past_log_end" if log_end is not None else "committed_offset_lost",
        )

    async def _check_commits(self, tps: Sequence[Any]) -> None:
        """Reset (:meth:`_reset_past_end`) each of ``tps`` whose offset this consumer
        committed the group no longer has (:func:`lost_commits`): the broker lost the log
        it was read from, even if the new one already reaches past the position.
        ``TimeoutError`` or a ``KafkaError`` when the group cannot be asked."""
        parts = {tp: st for tp in tps if (st := self._parts.get(tp)) is not None}
        committed = {tp: st.committed for tp, st in parts.items() if st.committed is not None}
        for tp in await lost_commits(self._consumer, committed, _CHECK_COMMITS_TIMEOUT_S):
            if tp in self._consumer.assignment():
                position = await self._consumer.position(tp)
                if self._parts.get(tp) is parts[tp]:  # not reset meanwhile
                    await self._reset_past_end(tp, position, None)

    def _forget_partition(self, tp: Any) -> None:  # noqa: B027 (an optional hook)
        """Subclass hook: drop what a position reset of ``tp`` makes stale."""

    def _assignment_stale(self) -> None:
        self._rejoin = True

    async def _join_anew(self, consumer: Any, now: float) -> None:
        """Leave and join the group again as a new member (a fresh assignment); at most
        once per metadata refresh interval."""
        if now - self._last_rejoin < _REJOIN_MIN_INTERVAL_S:
            return
        self._rejoin = False
        self._last_rejoin = now
        log.warning("kafka.assignment_stale", topic=self._topic, group=self._group_id)
        await leave_group(consumer)
        consumer.unsubscribe()
        consumer.subscribe([self._topic], listener=_Rebalance(self))

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
            reason=reason[:MAX_REASON_CHARS],
        )
        key = record.key
        if key is None and value is None:
            key = b""  # a tombstone: Kafka needs a key or a value
        # Until the dead letter is acknowledged the offset is not done; if it never is,
        # ``done`` stays unresolved and no commit passes this record.
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        st.pending.append((record.offset, done))
        try:
            sent = await unless_stopping(
                self._stopping,
                self._producer.send(self._dlq_topic, value=value, key=key, headers=headers),
            )
        except StoppingError:
            raise  # not sent: ``done`` stays unresolved, no commit passes this record
        except Exception as exc:  # KafkaError, or anything the client raises: not sent
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
