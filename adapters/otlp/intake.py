"""What the OTLP receiver does with the spans and log records it accepted: every span is
counted and, when it is an inference span, read and offered to the service as a traffic
event of source ``otlp``; nothing accepted is dropped silently.

At receipt each span is read alone (:func:`read_alone`, pure: the receiver runs it
off the event loop, so a request of thousands of spans never stalls the other sources),
then taken (:meth:`OtlpIntake.take_spans`, in the request): a span that is not an
inference span is counted and forgotten (never read past the attributes that classify
it); an inference span whose own record is unreadable (messages cut mid-JSON, another
schema, no model) is rejected at once, so the request's ``partial_success`` counts it;
every other inference span waits for its log records
(:class:`~monitor.core.traces.join.LogJoiner`, ``join_s`` and ``max_waiting_spans``).
GenAI log records (``gen_ai.*`` events) join their span; a record naming no span is
rejected; other records are not relmon's (ignored).

When a span's wait is over (:meth:`OtlpIntake.tick`, every ``tick_s``) it is read with
its records: ``no_content`` counts as an unmonitored event, ``read`` becomes a traffic
event (:func:`~monitor.core.traces.traffic.span_event`: its draw from its trace id, so a
trace is sampled whole) offered with ``wait``: one the service has no room for yet stays
held, in order, and is offered again at the next tick (the budget's pace, as a Kafka source).
At most ``queue_size`` spans are held (waiting for records or for room): past that a
request is refused (the receiver answers 429), or, when it went on to ``forward_to``
anyway, its inference spans are counted ``dropped``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import structlog

from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent
from monitor.core.traces.join import LogJoiner
from monitor.core.traces.shapes import SpanCall, is_inference, provider_api, read_span
from monitor.core.traces.spans import LogRecord, Span
from monitor.core.traces.traffic import span_event
from monitor.engine.metrics import UNMONITORED
from monitor.engine.otlp_metrics import OtlpMetrics
from monitor.engine.ports import Admission

__all__ = ["SOURCE", "OtlpIntake", "Reading", "read_alone"]

log = structlog.get_logger("relmon")

SOURCE = "otlp"
_GENAI_EVENT = "gen_ai."

Reading = tuple[Span, SpanCall, bool]
"""A span, its reading without log records, and whether it may be an inference span."""


def read_alone(spans: Sequence[Span]) -> list[Reading]:
    """Each span read without its log records (no state touched: safe in a thread)."""
    return [(s, read_span(s), is_inference(s.attributes) is not False) for s in spans]


class Offer(Protocol):
    """``service.offer``: ``wait`` lets it answer ``busy`` (no room yet) for an event
    offered again later, where without it the event is counted ``dropped``."""

    def __call__(self, event: TrafficEvent, source: str, *, wait: bool = False) -> Admission: ...


class OtlpIntake:
    """The receiver's side of the service (see the module); a supervised source whose
    :meth:`run` releases the spans whose wait is over."""

    source_name = SOURCE
    topic: str | None = None

    def __init__(
        self,
        offer: Offer,
        reject: Callable[[str, str], None],
        count: Callable[[str, str], None],
        count_api: Callable[[str, str], None],
        metrics: OtlpMetrics,
        *,
        attribute_keys: frozenset[str] = frozenset(),
        join_s: float = 5.0,
        max_waiting_spans: int = 10_000,
        queue_size: int = 20_000,
        tick_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._offer = offer
        self._reject = reject
        self._count_decision = count
        self._count_api = count_api
        self._metrics = metrics
        self._keys = attribute_keys
        self._joiner = LogJoiner(join_s, max_waiting_spans)
        self._alone: dict[tuple[str, str], SpanCall] = {}
        self._held: deque[TrafficEvent] = deque()
        self._dropped_records = 0
        self.queue_size = queue_size
        self.tick_s = tick_s
        self._clock = clock
        self._stopped = False

    # ------------------------------------------------------------ the Source protocol

    @property
    def connected(self) -> bool:
        return not self._stopped

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def paused(self) -> bool:
        """Spans wait for their records, or events for the service's room."""
        return bool(self._held) or self._joiner.waiting > 0

    async def run(self) -> None:
        while not self._stopped:
            self.tick()
            await asyncio.sleep(self.tick_s)

    async def restart(self) -> None:
        """Nothing to connect to: the spans held are still held."""

    async def stop(self, timeout_s: float) -> None:
        """Read and offer every span still waiting, at once (without waiting for room:
        what the service cannot take is counted ``dropped``)."""
        self._stopped = True
        for joined in self._joiner.drain():
            self._settle(joined.span, joined.records)
        self._flush_records()
        while self._held:
            self._offer_now(self._held.popleft(), wait=False)

    # -------------------------------------------------------------------- receipt

    @property
    def held(self) -> int:
        """Spans held: waiting for their records or for the service's room."""
        return self._joiner.waiting + len(self._held)

    def has_room(self, readings: Sequence[Reading]) -> bool:
        """Whether the inference spans of a request fit under ``queue_size``."""
        wanted = sum(1 for _, _, inference in readings if inference)
        return wanted == 0 or self.held + wanted <= self.queue_size

    def take_spans(self, readings: Sequence[Reading]) -> tuple[int, str]:
        """Count, reject or hold each span (see the module); the number rejected and
        why (for the answer's ``partial_success``)."""
        now = self._clock()
        rejected: dict[str, int] = {}
        for span, alone, inference in readings:
            if not inference:
                self._metrics.spans.labels(alone.shape, "not_inference").inc()
                continue
            if alone.outcome == "rejected":
                self._count(span, alone)
                reason = alone.reason or "unreadable"
                rejected[reason] = rejected.get(reason, 0) + 1
                continue
            self._alone[(span.trace_id, span.span_id)] = alone
            for joined in self._joiner.add_span(span, now):  # past max_waiting_spans
                self._settle(joined.span, joined.records)
        return sum(rejected.values()), _why(rejected, "spans")

    def refused(self, status: int) -> None:
        """A request refused whole (400, 413, 415, 429, 503): counted, its items not."""
        self._metrics.requests_refused.labels(str(status)).inc()

    def drop_spans(self, readings: Sequence[Reading]) -> None:
        """A forwarded request relmon had no room for: its spans counted, not read."""
        for span, alone, inference in readings:
            outcome = "rejected" if inference else "not_inference"
            self._metrics.spans.labels(alone.shape, outcome).inc()
            if inference:
                self._count_api(SOURCE, provider_api(span.attributes))
                self._count_decision(SOURCE, "dropped")

    def take_records(self, records: Sequence[LogRecord]) -> tuple[int, str]:
        """Join the GenAI log records to their spans; the number rejected and why."""
        now = self._clock()
        rejected = 0
        for record in records:
            if not record.event_name.startswith(_GENAI_EVENT):
                self._metrics.log_records.labels("ignored").inc()
            elif self._joiner.add_record(record, now):
                self._metrics.log_records.labels("taken").inc()
            else:
                rejected += 1
                self._metrics.log_records.labels("rejected").inc()
        self._flush_records()
        why = f"{rejected} GenAI log record(s) name no span to join to" if rejected else ""
        return rejected, why

    # ----------------------------------------------------------------- released

    def tick(self) -> None:
        """Settle the spans whose wait is over; offer the held events again."""
        while self._held:
            if self._offer_now(self._held[0], wait=True) == "busy":
                break
            self._held.popleft()
        for joined in self._joiner.release(self._clock()):
            self._settle(joined.span, joined.records)
        self._flush_records()

    def _settle(self, span: Span, records: Sequence[LogRecord]) -> None:
        """Read a released span (with its records) and count or offer it."""
        alone = self._alone.pop((span.trace_id, span.span_id), None)
        call = alone if alone is not None and not records else read_span(span, records)
        if call.outcome != "read":
            self._count(span, call)
            return
        try:
            event = span_event(span, call, self._keys)
        except InputError as exc:
            self._count(span, replace(call, outcome="rejected", reason=str(exc)))
            return
        self._metrics.spans.labels(call.shape, "read").inc()
        # In order: behind the ones waiting for room, or waiting itself.
        if self._held or self._offer_now(event, wait=True) == "busy":
            self._held.append(event)

    def _count(self, span: Span, call: SpanCall) -> None:
        self._metrics.spans.labels(call.shape, call.outcome).inc()
        if call.outcome == "no_content":
            self._count_api(SOURCE, UNMONITORED)
        elif call.outcome == "rejected":
            self._reject(SOURCE, f"span {call.reason}")

    def _offer_now(self, event: TrafficEvent, *, wait: bool) -> str:
        admission = self._offer(event, SOURCE, wait=wait)
        if admission.decision == "rejected":
            self._reject(SOURCE, admission.reason or "rejected")
        return admission.decision

    def _flush_records(self) -> None:
        dropped = self._joiner.dropped_records - self._dropped_records
        if dropped:
            self._metrics.log_records.labels("dropped").inc(dropped)
            self._dropped_records = self._joiner.dropped_records


def _why(rejected: Mapping[str, int], what: str) -> str:
    """The ``error_message`` of a ``partial_success``: each reason with its count."""
    if not rejected:
        return ""
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(rejected.items()))
    return f"{what} rejected, not monitored: {reasons}"
