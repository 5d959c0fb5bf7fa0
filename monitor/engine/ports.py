"""The seams between the engine and the outside world: small Protocols.

Adapters in ``adapters/`` implement these; the engine (``monitor.engine``) only talks to
them, and the composition root (:mod:`monitor.app.runner`) is the one place that picks
an implementation. Fakes for tests live in :mod:`monitor.testing`.

- :class:`Clock`: wall and monotonic time;
- :class:`ModelClient`: asks the model again (``adapters.model``);
- :class:`ReviewQueue`: where review items go (``adapters.sqlite``, ``adapters.kafka``);
- :class:`CalibrationStore`: review items and scored verdicts, durable (the same two);
- :class:`OutboxStorage`: where review items wait while the review queue refuses writes
  (``adapters.files``; none: memory only);
- :class:`Source`: a long-running source of events or verdicts, supervised by the app
  (``adapters.kafka``); HTTP sources push into an :data:`EventSink` instead;
- :data:`EventSink`, :data:`VerdictHandler`: what sources and review backends call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from monitor.core.apis.base import Route, WireApi
from monitor.core.events import TrafficEvent
from monitor.core.review import ReviewItem, Verdict

__all__ = [
    "Admission",
    "CalibrationRecord",
    "CalibrationStore",
    "CircuitState",
    "Clock",
    "Decision",
    "EventSink",
    "ExportedVerdict",
    "Judgement",
    "ModelClient",
    "OutboxEntry",
    "OutboxStorage",
    "ReviewQueue",
    "SharedStore",
    "Source",
    "SystemClock",
    "VerdictHandler",
    "VerdictOutcome",
]

Decision = Literal[
    "sampled",
    "skipped",
    "duplicate",
    "dropped",
    "rejected",
    "not_reasked",
    "unmonitored",
    "busy",
]
"""What :meth:`MonitorService.offer` did; every value but ``busy`` is counted in
``relmon_traffic_events_total{decision}``. ``not_reasked``: sampled, but a request relmon
must not repeat (it would write into the user's conversation, or run a provider's tool
again: ``relmon_not_reasked_total{reason}``); ``unmonitored``: a request the traffic port
relayed but no API of relmon's reads (counted by the traffic port, never offered).
``busy`` (only for a source that may wait, such as Kafka) means: no budget or queue room
right now, nothing counted, offer it again later."""


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (ages of calibration items)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds (budgets, timeouts)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


CircuitState = Literal["closed", "open", "half_open"]
"""A model client's circuit breaker: ``closed`` (calls go out), ``open`` (none do),
``half_open`` (one trial call)."""


class ModelClient(Protocol):
    """Asks the model again. One client per endpoint, pooled connections."""

    @property
    def circuit_state(self) -> CircuitState:
        """The circuit breaker's state (``closed`` for a client without one)."""
        ...

    async def sample(
        self,
        request: Mapping[str, Any],
        n: int,
        *,
        api: WireApi | None = None,
        route: Route | None = None,
    ) -> list[str]:
        """``n`` answers to ``request``, the re-ask of a production request (sent as it
        is, asking for several answers where ``api`` can, without streaming), in ``api``
        by ``route`` (None: OpenAI chat completions).

        Raises :class:`monitor.core.errors.ModelCallError` when the calls fail after retries.
        """
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Admission:
    """What the service did with an offered event.

    ``done`` (sampled events only) resolves when the item is durably handled: scored and
    its review item persisted, or abandoned and counted. A Kafka source commits an
    offset only once every earlier event's ``done`` has resolved. A ``duplicate`` (an item
    already admitted) carries the first admission's ``done`` while that one is running.
    """

    decision: Decision
    done: asyncio.Future[None] | None = None
    reason: str | None = None
    """Of a ``rejected`` event (its API is one its task cannot re-ask in): why. Not
    counted yet: the source counts it as it counts an event it could not parse (Kafka:
    dead-lettered with this reason)."""


EventSink = Callable[[TrafficEvent, str], Admission]
"""``service.offer(event, source_name)``: never blocks, never raises for bad events."""


class ReviewQueue(Protocol):
    """Where review items go. ``submit`` returns once the item is durable."""

    async def submit(self, item: ReviewItem) -> None: ...

    async def depth(self) -> int:
        """Items waiting for a verdict."""
        ...


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A review item waiting in the outbox, numbered in the order it came."""

    seq: int
    item: ReviewItem


class OutboxStorage(Protocol):
    """Where the review outbox (:mod:`monitor.engine.outbox`) keeps its items across a
    restart: one durable record per item, written before :meth:`save` returns."""

    @property
    def where(self) -> str:
        """Where the items are kept, for messages (a directory)."""
        ...

    async def load(self) -> tuple[list[OutboxEntry], int]:
        """The items kept, in their order, and how many records could not be read
        (skipped, set aside, never raised)."""
        ...

    async def save(self, entry: OutboxEntry) -> None:
        """Keep ``entry`` durably (raises :class:`OSError` if it cannot)."""
        ...

    async def remove(self, seq: int) -> None:
        """Forget the entry numbered ``seq`` (written to the review queue, or dropped)."""
        ...


@dataclass(frozen=True, slots=True)
class VerdictOutcome:
    """``applied``: new verdict scored into the window; ``duplicate``: already had one;
    ``unknown``: no such review item; ``invalid``: rejected (message in ``reason``)."""

    status: Literal["applied", "duplicate", "unknown", "invalid"]
    score: float | None = None
    reason: str | None = None


VerdictHandler = Callable[[Verdict], Awaitable[VerdictOutcome]]
"""``service.apply_verdict(verdict)``; review backends call it for every verdict."""


@dataclass(frozen=True, slots=True)
class CalibrationRecord:
    """One scored verdict as the calibration window needs it."""

    model: str
    task: str
    item_id: str
    score: float
    inclusion_probability: float
    sampled_at: float
    order: tuple[int, ...] = ()
    """The verdict's persisted order key (see :meth:`CalibrationStore.save_record`);
    ``()`` before it is saved."""
    aci_miss: bool | None = None
    """The verdict's ACI step: did the score exceed the threshold served at alpha_t when
    the item was scored (:attr:`monitor.core.review.ReviewItem.aci_threshold`)? ``None``: the
    item had no ACI threshold, no step. Persisted so that a restart restores alpha_t."""
    served_acceptable: bool | None = None
    """Whether the verdict accepted the class of the answer production served
    (:func:`monitor.core.review.served_acceptable`); ``None``: the item had no served
    answer (and every record stored before relmon kept this). Persisted with the record."""
    segment: str | None = None
    """The item's segment value as a label value (kept or hashed, never raw text:
    :attr:`monitor.core.review.ReviewItem.segment`), fixed when it was scored; ``None``
    for a task without segments and every record stored before them (records stored
    before values were kept carry their label then: a value's own, or ``other``).
    Persisted with the record: every replica builds its per-segment windows from it
    (:mod:`monitor.engine.segments`)."""


@dataclass(frozen=True, slots=True)
class Judgement:
    """The LLM judge's label of one scored item (``tasks[].judge``): was its top answer
    acceptable? Kept for every judged item, reviewed or not."""

    item_id: str
    model: str
    task: str
    sampled_at: float
    acceptable: bool
    seq: int = 0
    """The store's number for it (a shared store: followed in this order); 0 before."""


@dataclass(frozen=True, slots=True)
class ExportedVerdict:
    """One applied verdict with its review item, as ``relmon verdicts export`` writes it
    and ``import`` reads it (whichever store holds them)."""

    item: ReviewItem
    verdict: Verdict
    score: float
    applied_at: float
    aci_miss: bool | None = None
    """The verdict's ACI step (:attr:`CalibrationRecord.aci_miss`)."""


class CalibrationStore(Protocol):
    """Durable calibration state: review items waiting, scored verdicts, judge labels."""

    async def save_judgement(self, judgement: Judgement) -> int:
        """Persist a judge label once per item id; its number (0: it was there already)."""
        ...

    async def load_judgements(self, since: float) -> Sequence[Judgement]:
        """The judge labels of items sampled at or after ``since``, in their order."""
        ...

    async def save_review_item(self, item: ReviewItem) -> None: ...

    async def get_review_item(self, item_id: str) -> ReviewItem | None: ...

    async def save_record(
        self, record: CalibrationRecord, verdict: Verdict
    ) -> tuple[int, ...] | None:
        """Persist a scored verdict; None if this item already had one (idempotent).

        Returns the verdict's order key, persisted with it: the windows hold the
        verdicts latest in this order, live and when :meth:`load_records` rebuilds them.
        """
        ...

    async def get_record(self, item_id: str) -> CalibrationRecord | None:
        """The scored verdict stored for ``item_id`` (with its order key), if any."""
        ...

    async def load_records(self) -> Sequence[CalibrationRecord]:
        """Every scored verdict with its order key, in that order, to rebuild the windows."""
        ...

    def has_review_item(self, item_id: str) -> bool:
        """Whether another replica already published a review item with this id (a
        re-delivered event is then not asked again). Never blocks: answered from memory."""
        ...

    def discard_review_item(self, item_id: str) -> None:
        """Forget a review item whose publication failed (it may be published again)."""
        ...

    async def recent_item_ids(self, limit: int) -> Sequence[str]:
        """The ids of the last ``limit`` review items written, so that a restart
        recognises events it already handled."""
        ...

    async def pending_counts(self) -> Mapping[tuple[str, str], int]:
        """Review items still waiting for a verdict, per (model, task)."""
        ...

    async def aclose(self) -> None: ...


class SharedStore(CalibrationStore, Protocol):
    """A calibration store several replicas write (PostgreSQL): each follows the
    verdicts the others stored, in the order the store numbered them."""

    async def records_after(self, seq: int) -> Sequence[CalibrationRecord]:
        """The scored verdicts numbered after ``seq``, in order, without gaps."""
        ...

    async def get_verdict(self, item_id: str) -> Verdict | None: ...

    async def judgements_after(self, seq: int) -> Sequence[Judgement]:
        """The judge labels numbered after ``seq``, in order (the other replicas')."""
        ...

    async def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever a verdict may have been stored (a notification), and
        once after each (re)connection, until cancelled; reconnects by itself after a
        lost connection. A store without notifications returns at once (polling only)."""
        ...


class Source(Protocol):
    """A long-running source the app supervises (the Kafka traffic source, the verdict
    follower): :meth:`run` until stopped; when it stops anyway (raises anything, or
    returns while not :attr:`stopped`), :meth:`restart` connects again. ``/readyz``
    reports a source that is not :attr:`connected`: a source whose run ended anyway is
    not, until its restart. One bad event never ends :meth:`run`: it is a counted
    rejection (docs/kafka.md, "A bad event")."""

    source_name: str
    """Its ``source`` label (``relmon_source_restarts_total``, traffic counters)."""

    @property
    def connected(self) -> bool: ...

    @property
    def stopped(self) -> bool:
        """:meth:`stop` was called: no restart."""
        ...

    @property
    def paused(self) -> bool:
        """Holding events until the service has room (a drain is not quiet yet)."""
        ...

    @property
    def topic(self) -> str | None:
        """The topic it reads, for messages (None when it reads none)."""
        ...

    async def run(self) -> None: ...

    async def restart(self) -> None: ...

    async def stop(self, timeout_s: float) -> None: ...
