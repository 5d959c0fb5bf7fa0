"""Kafka as a traffic source: a consumer group on a topic of logged LLM calls (docs/kafka.md).

:class:`KafkaEventSource` reads events in ``getmany`` batches, validates each with
:func:`parse_event_bytes` (``monitor.core.events.parse_event`` with msgspec's faster JSON
decoder in front, same results) and offers it to the service (``sink(event, "kafka")``).
Given ``skip`` (``MonitorService.skip_unsampled``), it first reads only the id, task
and model of each record (:mod:`adapters.kafka.fastpath`, which answers only for a
valid event) and asks whether the event is sampled: an unsampled one is counted
``skipped`` and never parsed; every other record goes the full way above, so a
malformed event is rejected and dead-lettered whether it would be sampled or not.
A malformed record (over ``max_event_bytes``, not JSON, not UTF-8, not an event) is
produced to a dead-letter topic with its original value and key and the headers
``relmon-error`` (the reason, never payload text), ``relmon-stream`` (``traffic``),
``relmon-source-topic``, ``relmon-source-partition`` and ``relmon-source-offset``; so is a
record whose handling raised anything else (:func:`admit_record`: the reason is
``internal error: <type>``). Either way it is counted once (``reject``) and the next
record goes: no record can stop a partition.

A record of ``"format": "otlp"`` holds one OTLP JSON ``ResourceSpans`` (for pipelines
that already put traces on Kafka): :func:`parse_record` reads its spans with the OTLP
receiver's span reader (:func:`~monitor.core.traces.traffic.read_resource_spans`), and
each read span's event is offered in order (the record is done when they all are); an
inference span without content is counted ``unmonitored``, one that was rejected (cut,
another schema, no model) has the record dead-lettered once, its other spans monitored.

Offsets are committed only for work that is finished (at-least-once)::

    skipped / duplicate            done at once (a duplicate still running: when it is)
    sampled                        done when ``admission.done`` resolves (any outcome)
    malformed, or handling failed  done when the dead-letter record is acknowledged
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

A position past a partition's log end (the broker lost its data, or the topic was
recreated, and the broker answers such a fetch with nothing instead of
OffsetOutOfRange) is found by that same measurement and reset per
``auto_offset_reset`` (``earliest`` or ``latest``), counted in ``offset_resets``
(``relmon_kafka_offset_resets_total{topic}``) and logged once (``kafka.offset_reset``).

:class:`KafkaConsumerBase` holds what the source shares with the verdict consumer in
:mod:`adapters.kafka.review`: start/stop, commits, rebalances, the dead-letter producer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import structlog

from adapters.kafka.connection import KafkaUnavailableError, record_failed
from adapters.kafka.consumer import KafkaConsumerBase, PartitionProgress
from adapters.kafka.fastpath import event_head
from monitor.core.errors import InputError
from monitor.core.events import MAX_EVENT_BYTES, TrafficEvent, parse_event
from monitor.core.failures import internal_error
from monitor.core.traces.traffic import OTLP_FORMAT, SpanBatch, read_resource_spans
from monitor.engine.metrics import UNMONITORED
from monitor.engine.ports import Admission, EventSink

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
    "FETCH_PARTITION_BYTES",
    "KafkaEventSource",
    "KafkaUnavailableError",
    "SkipCheck",
    "admit_record",
    "parse_event_bytes",
    "parse_record",
]

log = structlog.get_logger(__name__)

FETCH_PARTITION_BYTES = 4 * 1024 * 1024
"""The most a fetch brings of one partition (aiokafka's default: 1 MiB). A backlog goes in
a quarter of the fetches, each with its round trip, wake-up and batch to go through: a
whole ``relmon run`` spent 18% less CPU per event (bench/kafka_ingest_bench.py). Still
bounded by ``fetch_max_bytes`` (50 MiB) for all partitions together."""

SkipCheck = Callable[[str, str | None, str, str], bool]
"""``skip(source, task, model, event_id)``: True (and counted ``skipped``) when the
event with these fields is not sampled (``MonitorService.skip_unsampled``)."""


def _decoded(value: bytes | None, max_bytes: int) -> Any:
    """A record value's JSON object, decoded by msgspec; the value itself where msgspec
    refuses it (``parse_event`` then decides and names the reason)."""
    if _fast_decode is not None and value is not None and len(value) <= max_bytes:
        try:
            obj = _fast_decode(value)
        except (_FastDecodeError, ValueError, RecursionError):  # UnicodeDecodeError too
            pass
        else:
            if type(obj) is dict:
                return obj
    return value


def _parsed(raw: Any, max_bytes: int) -> TrafficEvent:
    try:
        return parse_event(raw, max_bytes=max_bytes)
    except RecursionError:  # parse_event lets json's nesting limit through
        raise InputError("invalid JSON: nested too deeply") from None


def parse_event_bytes(value: bytes | None, max_bytes: int = MAX_EVENT_BYTES) -> TrafficEvent:
    """:func:`monitor.core.events.parse_event` on a record value, with a faster JSON decoder.

    Same result and same :class:`InputError` reasons as ``parse_event(value)``: msgspec
    decodes strict RFC 8259 JSON (big integers exact, floats correctly rounded) to the
    objects ``json.loads`` gives; whatever it refuses (oversize, not UTF-8, NaN, a
    BOM, too deep, not an object) goes to ``parse_event`` on the bytes, which decides.
    msgspec raises ``UnicodeDecodeError`` (not its ``DecodeError``) for invalid UTF-8
    inside a string, and may raise other errors: every refusal falls back alike.
    """
    return _parsed(_decoded(value, max_bytes), max_bytes)


def parse_record(
    value: bytes | None,
    max_bytes: int = MAX_EVENT_BYTES,
    attribute_keys: frozenset[str] = frozenset(),
) -> TrafficEvent | SpanBatch:
    """A record value as :func:`parse_event_bytes` reads it, or, an event of ``"format":
    "otlp"``, its OTLP JSON ``ResourceSpans`` read by the span reader
    (:func:`~monitor.core.traces.traffic.read_resource_spans`, with the attributes some
    task matches on); :class:`InputError` for either that does not decode."""
    raw = _decoded(value, max_bytes)
    if type(raw) is dict and raw.get("format") == OTLP_FORMAT:
        return read_resource_spans(raw, attribute_keys)
    return _parsed(raw, max_bytes)


def admit_record(
    record: Any,
    sink: EventSink,
    source: str,
    max_bytes: int,
    attribute_keys: frozenset[str] = frozenset(),
) -> Admission | SpanBatch | str:
    """Parse one record's value and offer the event: the sink's :class:`Admission`, the
    spans of a format ``otlp`` record (the caller offers their events), or the reason it
    is rejected (to be counted and dead-lettered).

    Never raises for one record: an :class:`InputError` gives its message; any other
    exception (a bug, here or in the sink) gives ``internal error: <type>`` and is
    logged with where it was raised. ``asyncio.CancelledError`` is not an
    ``Exception``: it goes through.
    """
    try:
        parsed = parse_record(record.value, max_bytes, attribute_keys)
        if isinstance(parsed, SpanBatch):
            return parsed
        admission = sink(parsed, source)
    except InputError as exc:
        return str(exc)
    except Exception as exc:
        return record_failed(record, exc, "kafka.event_failed")
    if admission.decision == "rejected":  # an API its task cannot re-ask in
        return admission.reason or "rejected"
    return admission


def skipped_at_once(record: Any, skip: SkipCheck, source: str, max_bytes: int) -> bool:
    """The fast path (:mod:`adapters.kafka.fastpath`): True when the record holds a valid
    event that ``skip`` does not sample (counted ``skipped`` by it), without parsing the
    whole event; False sends the record the full way (:func:`admit_record`), which
    decides: a malformed event is rejected there, sampled or not. Never raises for one
    record: a failure here (a bug) is logged and the full way decides."""
    try:
        head = event_head(record.value, max_bytes)
        return head is not None and skip(source, head[1], head[2], head[0])
    except Exception as exc:
        log.error("kafka.fast_path_failed", offset=record.offset, error=internal_error(exc))
        return False


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
        offset_resets: Any = None,
        skip: SkipCheck | None = None,
        count_api: Callable[[str, str], None] | None = None,
        attribute_keys: frozenset[str] = frozenset(),
        **consumer_options: Any,
    ) -> None:
        consumer_options.setdefault("max_partition_fetch_bytes", FETCH_PARTITION_BYTES)
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
            offset_resets=offset_resets,
        )
        self.source_name = source_name
        self._sink = sink
        self._skip = skip
        self._max_event_bytes = max_event_bytes
        self._held: dict[Any, deque[Any]] = {}
        """Records of paused partitions not offered yet (the service was busy), in order."""
        self._count_api = count_api
        self._attribute_keys = attribute_keys
        self._offered: dict[Any, tuple[int, int]] = {}
        """Per paused partition whose first held record is of format ``otlp``: that
        record's offset and how many of its events went before the service was busy."""

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
        sink = self._sink
        skip = self._skip
        name = self.source_name
        max_bytes = self._max_event_bytes
        pending = st.pending
        for i, record in enumerate(records):
            if skip is not None and skipped_at_once(record, skip, name, max_bytes):
                continue
            admission = admit_record(record, sink, name, max_bytes, self._attribute_keys)
            if isinstance(admission, SpanBatch):
                if not await self._offer_spans(tp, st, records, i, admission):
                    return  # held, failing or revoked
                continue
            if isinstance(admission, str):  # rejected: the reason
                await self._dead_letter(st, record, admission)
                if self._failure is not None or self._parts.get(tp) is not st:
                    return  # failing, or revoked while sending (the new owner takes over)
                continue
            if admission.decision == "busy":
                self._hold(tp, st, records[i:])
                return
            done = admission.done
            if done is not None and not done.done():
                pending.append((record.offset, done))
        st.next_offset = records[-1].offset + 1

    async def _offer_spans(
        self, tp: Any, st: PartitionProgress, records: Sequence[Any], i: int, batch: SpanBatch
    ) -> bool:
        """Offer the events of ``records[i]``, a format ``otlp`` record (``batch``), in
        order: each sampled one's offset done when its item is; its inference spans
        without content counted ``unmonitored``; the record dead-lettered (once) when
        one of its spans, or an event the service refused, was rejected. False when the
        partition stops here: the service was busy (the record and the rest held, to go
        on from the first event not offered), or the source is failing or revoked."""
        record, name = records[i], self.source_name
        resumed = self._offered.pop(tp, None)
        start = resumed[1] if resumed is not None and resumed[0] == record.offset else None
        if start is None and batch.no_content and self._count_api is not None:
            for _ in range(batch.no_content):
                self._count_api(name, UNMONITORED)
        reason = batch.rejected
        for j in range(start or 0, len(batch.events)):
            try:
                admission = self._sink(batch.events[j], name)
            except Exception as exc:
                reason = reason or record_failed(record, exc, "kafka.event_failed")
                continue
            if admission.decision == "busy":
                self._offered[tp] = (record.offset, j)
                self._hold(tp, st, records[i:])
                return False
            if admission.decision == "rejected":  # an API its task cannot re-ask in
                reason = reason or admission.reason or "rejected"
            elif admission.done is not None and not admission.done.done():
                st.pending.append((record.offset, admission.done))
        if reason is not None:
            await self._dead_letter(st, record, reason)
            return self._failure is None and self._parts.get(tp) is st
        return True

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
            self._offered.pop(tp, None)

    def _forget_progress(self) -> None:
        self._held.clear()
        self._offered.clear()

    def _forget_partition(self, tp: Any) -> None:
        """A position reset: the held records belong to the old log; fetch again."""
        self._offered.pop(tp, None)
        if self._held.pop(tp, None) is not None and tp in self._consumer.assignment():
            self._consumer.resume(tp)
