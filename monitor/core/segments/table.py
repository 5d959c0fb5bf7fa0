"""Which segments get a review rate of their own (``segments.min_reviews_per_hour``): at
most ``max``, the busiest, stable over time, in bounded memory whatever the number of
distinct values. (Which segments are *exported* under a label of their own is decided
from the verdicts instead: :mod:`monitor.engine.segments`.)

:class:`SegmentTable` counts the label value of every event of a task
(:func:`~monitor.core.segments.labels.label_value`: sanitised or hashed first, so the
table never holds user text) and answers which label the event gets: its own, or
``other``.

**Traffic, decayed.** Each event counts 1, and every count halves every
``half_life_events`` events of the task (default :data:`DEFAULT_HALF_LIFE_EVENTS`,
10,000): what matters is the recent traffic, and a segment that stops fades away. The
half-life is in events, not seconds, so that the table is a pure function of the
sequence of values: two tables fed the same values agree, whatever the clock.

**Bounded memory.** The counts live in a *space-saving* sketch (Metwally, Agrawal and
El Abbadi, 2005) of ``10 × max`` entries: a value not in a full sketch takes the place
of the least-counted one and inherits its count as an *error* (its count is then an
upper bound and count − error a lower bound of its decayed traffic). The value that
makes way is the least-counted one that holds no slot, so any value with more than
``1 / (9 × max)`` of the decayed traffic is always in the sketch. Ten thousand, or ten
million, distinct values cost the same memory.

**Who gets a slot.** A value that has no slot gets one when its *guaranteed* count
(count − error) is at least ``min_events`` (5: six events in a row, since the first
five have already decayed a little) and at least ``1 / (10 × max)`` of all the decayed
traffic, and either a slot is free or the guaranteed count exceeds
``hysteresis`` (1.5) times the count of the weakest holder, which it then replaces. A
holder is never evicted from the sketch, and keeps its slot until so replaced: no
flapping between two segments of about the same traffic. A value seen once never gets
a slot, so no one-off text ever becomes a label.

**How a new busy segment enters.** A value that starts to carry a share ``p`` of the
traffic, against a weakest holder's steady share ``q``, takes that holder's slot after
about :func:`entry_events` = ``half_life_events × log2(1 / (1 − hysteresis × q / p))``
events: 2 half-lives when ``p = 2q``, 1 when ``p = 3q`` (20,000 and 10,000 events with
the defaults), sooner when the holder's traffic is falling at the same time; never
when ``p ≤ hysteresis × q``: a segment must be clearly busier than the weakest holder,
not merely busier. A decayed count is noisy: by about ``sqrt((1 − p) ln 2 / (2 p H))``
of itself for a share ``p`` (1% at a share of 0.2, 4% at 0.02, 13% at 0.002 with the
default half-life ``H``), well inside the factor 1.5 for the segments that ``max`` is
meant for; a smaller half-life makes it larger.

**What is bounded.** At any time at most ``max`` values have a label of their own, so
an event's label is one of at most ``max + 1`` values (with ``other``); the table
tracks at most ``10 × max`` values. Over a run the distinct labels ever given are at
most ``max + 1 + changes`` (:attr:`SegmentTable.changes`: how many times a slot went
to another value), plus the values given by :meth:`~SegmentTable.restore`; each change
needs a value whose guaranteed traffic is 1.5 times a holder's.

**Shared assignment.** :meth:`SegmentTable.snapshot` exports the holders (their label
values, busiest first: never raw text); :meth:`SegmentTable.restore` takes such a list
back (a restart, or another replica's assignment through the store). A restored
holder starts with the least count that could have entered, so it is not displaced by
the first few events of another value.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import Final

from monitor.core.errors import ConfigError, InputError
from monitor.core.segments.labels import OTHER, is_label, label_value

__all__ = [
    "CAPACITY_PER_SEGMENT",
    "DEFAULT_HALF_LIFE_EVENTS",
    "DEFAULT_HYSTERESIS",
    "DEFAULT_MIN_EVENTS",
    "SegmentTable",
    "entry_events",
]

DEFAULT_HALF_LIFE_EVENTS: Final = 10_000.0
DEFAULT_HYSTERESIS: Final = 1.5
DEFAULT_MIN_EVENTS: Final = 5.0
CAPACITY_PER_SEGMENT: Final = 10
"""The sketch tracks this many values per label slot."""
_RESCALE_AT: Final = 2.0**256
"""Counts are kept in growing units (each event weighs ``2**(t/H)``, so nothing needs
decaying); past this weight every count is scaled down by a power of two, exactly."""


def entry_events(
    share: float,
    holder_share: float,
    *,
    half_life_events: float = DEFAULT_HALF_LIFE_EVENTS,
    hysteresis: float = DEFAULT_HYSTERESIS,
) -> float:
    """About how many events a value that starts to carry ``share`` of the traffic takes
    to replace a holder with a steady ``holder_share`` (see the module); ``inf`` if never."""
    if share <= hysteresis * holder_share:
        return math.inf
    return half_life_events * math.log2(1.0 / (1.0 - hysteresis * holder_share / share))


class SegmentTable:
    """Label slots of one task's segments (see the module). Not thread-safe; pure."""

    def __init__(
        self,
        max_segments: int,
        *,
        half_life_events: float = DEFAULT_HALF_LIFE_EVENTS,
        hysteresis: float = DEFAULT_HYSTERESIS,
        min_events: float = DEFAULT_MIN_EVENTS,
        key: bytes = b"",
    ) -> None:
        if isinstance(max_segments, bool) or not isinstance(max_segments, int):
            raise ConfigError(f"max_segments must be a whole number, not {max_segments!r}")
        if max_segments < 1:
            raise ConfigError(f"max_segments must be 1 or more, not {max_segments}")
        if not half_life_events > 0 or not math.isfinite(half_life_events):
            raise ConfigError(f"half_life_events must be positive, not {half_life_events}")
        if not hysteresis >= 1 or not math.isfinite(hysteresis):
            raise ConfigError(f"hysteresis must be 1 or more, not {hysteresis}")
        if not min_events >= 0 or not math.isfinite(min_events):
            raise ConfigError(f"min_events must be 0 or more, not {min_events}")
        self.max_segments = max_segments
        self.capacity = CAPACITY_PER_SEGMENT * max_segments
        self.half_life_events = float(half_life_events)
        self.hysteresis = float(hysteresis)
        self.min_events = float(min_events)
        self._min_share = 1.0 / self.capacity
        self._key = key
        self._step = 2.0 ** (1.0 / self.half_life_events)
        self._weight = 1.0  # of the next event, in the table's units
        self._total = 0.0  # all events' weights
        self._count: dict[str, float] = {}
        self._error: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []  # one entry per tracked value, maybe stale
        self._slots: set[str] = set()
        self._weakest = 0.0  # at most the least holder count (counts only grow)
        self.changes = 0
        """Times a slot went from one value to another (not the first fills)."""
        self.events = 0

    # -- reading -----------------------------------------------------------------------

    def label_of(self, raw: str | None) -> str:
        """The label an event with this raw value gets now, without counting it."""
        label = label_value(raw, key=self._key)
        return label if label in self._slots else OTHER

    def holds(self, label: str) -> bool:
        """Whether the label value ``label`` has a label of its own now."""
        return label in self._slots

    def labels(self) -> frozenset[str]:
        """The values that have a label of their own (``other`` not included)."""
        return frozenset(self._slots)

    @property
    def tracked(self) -> int:
        """How many values the sketch holds (at most :attr:`capacity`)."""
        return len(self._count)

    def traffic(self, label: str) -> tuple[float, float]:
        """A label value's decayed event count, as (lower, upper) bounds; (0, 0) when it
        is not tracked. In events: an event just counted weighs 1."""
        count = self._count.get(label)
        if count is None:
            return (0.0, 0.0)
        unit = self._weight / self._step  # the weight of the last event
        return ((count - self._error[label]) / unit, count / unit)

    def snapshot(self) -> list[str]:
        """The holders' label values, busiest first (ties by value)."""
        return [label for _, label in sorted((-self._count[h], h) for h in self._slots)]

    # -- counting ----------------------------------------------------------------------

    def observe(self, raw: str | None) -> str:
        """Count one event whose segment value is ``raw`` (None: no value); the label it
        gets: its own label value, or ``other``."""
        label = label_value(raw, key=self._key)
        weight = self._weight
        self._total += weight
        self.events += 1
        if label in self._count:
            self._count[label] += weight
        else:
            self._track(label, weight)
        if label not in self._slots:
            self._consider(label)
        self._weight = weight * self._step
        if self._weight > _RESCALE_AT:
            self._rescale()
        return label if label in self._slots else OTHER

    def _track(self, label: str, count: float) -> None:
        error = self._evict() if len(self._count) >= self.capacity else 0.0
        self._count[label] = error + count
        self._error[label] = error
        heapq.heappush(self._heap, (error + count, label))

    def _evict(self) -> float:
        """Drop the least-counted value that holds no slot; its count."""
        held = []
        while True:
            count, label = heapq.heappop(self._heap)
            now = self._count[label]
            if now != count:  # stale: counted since it was pushed
                heapq.heappush(self._heap, (now, label))
            elif label in self._slots:
                held.append((count, label))
            else:
                del self._count[label], self._error[label]
                break
        for item in held:
            heapq.heappush(self._heap, item)
        return count

    def _floor(self) -> float:
        """The least guaranteed count that may hold a slot, in the table's units."""
        return max(self.min_events * self._weight, self._min_share * self._total)

    def _consider(self, label: str) -> None:
        """Give ``label`` a slot if it has earned one (see the module)."""
        guaranteed = self._count[label] - self._error[label]
        if guaranteed < self._floor():
            return
        if len(self._slots) < self.max_segments:
            self._slots.add(label)
            self._weakest = min(self._count[h] for h in self._slots)
            return
        if guaranteed <= self.hysteresis * self._weakest:
            return
        least, weakest = min((self._count[h], h) for h in self._slots)
        self._weakest = least
        if guaranteed > self.hysteresis * least:
            self._slots.remove(weakest)
            self._slots.add(label)
            self._weakest = min(self._count[h] for h in self._slots)
            self.changes += 1

    def _rescale(self) -> None:
        scale = 2.0 ** -math.floor(math.log2(self._weight))  # exact: a power of two
        self._weight *= scale
        self._total *= scale
        self._weakest *= scale
        for label in self._count:
            self._count[label] *= scale
            self._error[label] *= scale
        self._heap = [(count, label) for label, count in self._count.items()]
        heapq.heapify(self._heap)

    # -- sharing -----------------------------------------------------------------------

    def restore(self, labels: Iterable[str]) -> None:
        """Give the slots to ``labels`` (label values, busiest first, as
        :meth:`snapshot` returns them; the first ``max`` count), taking them from the
        values that hold them now. An :class:`InputError` for a value that no
        :func:`label_value` returns (``other``, text outside the label alphabet)."""
        wanted: list[str] = []
        for label in labels:
            if not is_label(label):
                raise InputError(f"segment slots: {label!r} is not a segment label value")
            if label not in wanted:
                wanted.append(label)
        kept = wanted[: self.max_segments]
        self._slots = set(kept)
        seed = self._floor()
        for label in kept:  # in order, not the set's: the sketch stays deterministic
            if label not in self._count:
                self._track(label, seed)
            elif self._count[label] < seed:
                self._count[label] = seed  # its heap entry is now stale: fixed lazily
        self._weakest = min((self._count[h] for h in self._slots), default=0.0)
