"""Reliability per segment in the engine (DESIGN.md §6 "Reliability per segment").

**The segment of an item** is fixed by the worker once the item is ranked, before its
inclusion probability is decided (:func:`segment_label`): the raw value of the task's
``segments.by`` (a header the event kept, a JMESPath field of the production request, or
the query's language) as a label value (:func:`~monitor.core.segments.label_value`:
kept when it is at most 64 characters of ``[A-Za-z0-9_.:-]``, else ``h:`` and 12 hex
digits of a hash; never raw text). That *value* goes with the review item
(``segment``), and from its verdict into the calibration record, where it is stored.
The task's own :class:`~monitor.core.segments.SegmentTable` (the worker's, fed every
scored event) only decides which segments have a minimum review rate of their own
(``min_reviews_per_hour``: :mod:`monitor.engine.review_minimum`); the rest share
``other``'s.

**The windows per segment** (:class:`SegmentWindows`, one per (model, task), beside the
task's window, which stays the marginal one) hold the records of the task's window that
have a segment value, by value, and export them under at most ``max`` labels of their
own plus ``other``. Which values have a label of their own is decided at export time
from the task window's records alone (:func:`exported_values`): the ``max`` values with
the most traffic among those records (Σ 1/π, the reviewed items' estimate of the scored
items), each with at least :data:`MIN_SEGMENT_RECORDS` records. So

- a value's window is built from *all* its records in the task's window: a value that
  gains a label brings its history, whenever its first items came;
- ``other``'s window is the union of the records of the values without a label now:
  when a value gains one, its records leave ``other``; when it loses it, they join;
- the windows are exactly those a from-scratch computation over the same records gives
  (:class:`~monitor.core.window.CalibrationWindow` depends only on the items it holds),
  and the assignment is a function of the task window's records: every replica that
  reads the same records, and a restart that loads them, exports the same labels and
  figures, whatever order the records came in.

Memory: one record reference per reviewed item of the task's window, one entry per value
with a record there (at most the window's size, however many distinct values the
traffic has), and at most ``max + 1`` windows.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from monitor.core.alarm import SplitDetectors
from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent
from monitor.core.segments import (
    DEFAULT_MAX_SEGMENTS,
    OTHER,
    SegmentSpec,
    SegmentTable,
    label_value,
    segment_value,
)
from monitor.core.window import CalibrationWindow, OrderKey
from monitor.engine.ports import CalibrationRecord
from monitor.engine.review_minimum import SegmentReviewRates
from monitor.engine.segment_metrics import SegmentMetrics

__all__ = [
    "MIN_SEGMENT_RECORDS",
    "SegmentAlarms",
    "SegmentWindows",
    "TaskSegments",
    "detects_language",
    "exported_values",
    "segment_alarm_slots",
    "segment_headers",
    "segment_label",
]


class TaskSegments:
    """A task's ``segments`` setting, its label table and its review rates per label
    (``min_reviews_per_hour``: :mod:`monitor.engine.review_minimum`), the worker's, per
    task."""

    def __init__(self, spec: SegmentSpec) -> None:
        self.spec = spec
        self.table = SegmentTable(spec.max)
        self.reviews = _TableRates(
            SegmentReviewRates(spec.min_reviews_per_hour, max_labels=4 * (spec.max + 2)),
            self.table,
        )

    def label(self, event: TrafficEvent, query: Callable[[], str | None]) -> str:
        """Count ``event`` in the table; its segment value as a label value (kept or
        hashed: never raw text). ``query``: the production query, asked for only when
        the task segments by language."""
        text = query() if self.spec.by.kind == "language" else None
        raw = segment_value(self.spec, event.headers, event.request, text)
        self.table.observe(raw)
        return label_value(raw)


class _TableRates:
    """The review rates per label of the task's table: an item's segment value counts
    under its own label when the table gives it one, else under ``other``."""

    def __init__(self, rates: SegmentReviewRates, table: SegmentTable) -> None:
        self.rates = rates
        self.table = table

    def inclusion_probability(self, value: str, pi: float, now: float) -> float:
        label = value if self.table.holds(value) else OTHER
        return self.rates.inclusion_probability(label, pi, now)

    def items_per_hour(self, value: str, now: float) -> float:
        label = value if self.table.holds(value) else OTHER
        return self.rates.items_per_hour(label, now)

    def __len__(self) -> int:
        return len(self.rates)


def segment_label(
    segments: TaskSegments | None, event: TrafficEvent, query: Callable[[], str | None]
) -> str | None:
    """The segment value (a label value) of a scored item of a task (None: the task has
    no segments)."""
    return None if segments is None else segments.label(event, query)


def segment_headers(segments: Iterable[TaskSegments | None]) -> list[str]:
    """The header names the tasks segment by (their events must keep them)."""
    return [s.spec.by.name for s in segments if s is not None and s.spec.by.kind == "header"]


def detects_language(segments: Iterable[TaskSegments | None]) -> bool:
    """Whether a task segments by the query's language (the detector is then loaded)."""
    return any(s is not None and s.spec.by.kind == "language" for s in segments)


MIN_SEGMENT_RECORDS: Final = 5
"""The records a value needs in the task's window before it can have a label of its own:
a value seen once never appears in a label."""

_FIXED_BITS: Final = 1100  # Σ 1/π kept exactly (every finite float is k · 2^-1074)


def _fixed(x: float) -> int:
    num, den = x.as_integer_ratio()
    return num * ((1 << _FIXED_BITS) // den)


def exported_values(
    values: Mapping[str, tuple[int, int]],
    max_segments: int,
    *,
    min_records: int = MIN_SEGMENT_RECORDS,
) -> frozenset[str]:
    """The values that have a label of their own, from each value's (traffic, records)
    in the task's window: the ``max_segments`` values with the most traffic (Σ 1/π of
    their records, any exact measure; ties: more records, then the value), each with at
    least ``min_records`` records. ``other`` (the label of records stored before
    values were kept) never has one."""
    ranked = heapq.nsmallest(
        max_segments,
        (
            (-traffic, -records, value)
            for value, (traffic, records) in values.items()
            if records >= min_records and value != OTHER
        ),
    )
    return frozenset(value for _, _, value in ranked)


@dataclass(slots=True)
class _Value:
    """The records of one segment value in the task's window."""

    records: dict[str, CalibrationRecord] = field(default_factory=dict)
    traffic: int = 0  # Σ 1/π, fixed point (exact: the same in any order)


class SegmentWindows:
    """The per-segment windows of one (model, task) (see the module). ``make`` builds an
    empty window with the task window's settings; ``max_segments``: the task's
    ``segments.max``; ``track_left``: keep the values whose last record left for
    :meth:`left` (:class:`SegmentAlarms` asks)."""

    def __init__(
        self,
        make: Callable[[], CalibrationWindow],
        max_segments: int = DEFAULT_MAX_SEGMENTS,
        *,
        min_records: int = MIN_SEGMENT_RECORDS,
        track_left: bool = False,
    ) -> None:
        self._make = make
        self.track_left = track_left
        self.max_segments = max_segments
        self.min_records = min_records
        self._windows: dict[str, CalibrationWindow] = {}  # exported label -> its window
        self._values: dict[str, _Value] = {}  # every value with a record in the window
        self._slots: frozenset[str] = frozenset()  # the values the windows are built for
        self._members: dict[str, str] = {}  # item id -> value, of the task window's items
        self._heap: list[tuple[OrderKey, str]] = []  # the members by order key
        self._gone: list[str] = []  # labels whose window went since the last publish
        self._left: list[str] = []  # values whose last record left, since last asked
        self._dirty = False
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self.windows)

    @property
    def windows(self) -> dict[str, CalibrationWindow]:
        """The window of each label exported now (a value's own, and ``other``)."""
        self._settle()
        return self._windows

    def values(self) -> frozenset[str]:
        """The segment values with a record in the task's window."""
        return frozenset(self._values)

    def has_value(self, value: str) -> bool:
        """Whether ``value`` has a record in the task's window."""
        return value in self._values

    def labelled(self) -> frozenset[str]:
        """The values exported under a label of their own now."""
        self._settle()
        return self._slots

    def label_of(self, value: str) -> str:
        """The label a record of ``value`` is exported under now."""
        self._settle()
        return value if value in self._slots else OTHER

    def records(self, value: str) -> list[CalibrationRecord]:
        """The records of ``value`` in the task's window."""
        held = self._values.get(value)
        return [] if held is None else list(held.records.values())

    def left(self) -> list[str]:
        """The values whose last record left the task's window since the last call (with
        ``track_left``)."""
        out, self._left = self._left, []
        return out

    def add(self, record: CalibrationRecord, task_window: CalibrationWindow) -> None:
        """``record``, just given to ``task_window``, among its value's records and into
        the window it is exported in now (a record without a segment, or one the task
        window did not keep, nowhere); then the records the task window no longer holds
        are taken out."""
        value, item_id = record.segment, record.item_id
        if value is not None and item_id in task_window and item_id not in self._members:
            held = self._values.get(value)
            if held is None:
                held = self._values[value] = _Value()
            held.records[item_id] = record
            held.traffic += _fixed(1.0 / record.inclusion_probability)
            self._members[item_id] = value
            self._arrivals += 1
            heapq.heappush(self._heap, (record.order or (self._arrivals,), item_id))
            self._into(value if value in self._slots else OTHER, record)
            self._dirty = True
        self._prune(task_window)

    def _into(self, label: str, record: CalibrationRecord) -> None:
        window = self._windows.get(label)
        if window is None:
            window = self._windows[label] = self._make()
            if label in self._gone:
                self._gone.remove(label)
        window.add(
            record.item_id,
            record.score,
            record.inclusion_probability,
            record.sampled_at,
            order=record.order or None,
            served=record.served_acceptable,
        )

    def _out(self, label: str, item_id: str) -> None:
        window = self._windows.get(label)
        if window is None:
            return
        window.remove(item_id)
        if not len(window):
            del self._windows[label]
            self._gone.append(label)

    def _prune(self, task_window: CalibrationWindow) -> None:
        """Forget the members the task window evicted: it evicts the lowest order keys
        first, so they are at the top of the heap (all of them are looked for when the
        members outnumber the window, e.g. records without an order key)."""
        heap = self._heap
        while heap and heap[0][1] not in task_window:
            self._forget(heapq.heappop(heap)[1])
        if len(self._members) > len(task_window):
            for item_id in [i for i in self._members if i not in task_window]:
                self._forget(item_id)
            self._heap = [(k, i) for k, i in self._heap if i in self._members]
            heapq.heapify(self._heap)

    def _forget(self, item_id: str) -> None:
        value = self._members.pop(item_id, None)
        if value is None:
            return
        held = self._values[value]
        record = held.records.pop(item_id)
        held.traffic -= _fixed(1.0 / record.inclusion_probability)
        self._out(value if value in self._slots else OTHER, item_id)
        if not held.records:
            del self._values[value]
            self._slots = self._slots - {value}
            if self.track_left:
                self._left.append(value)
        self._dirty = True

    def _settle(self) -> None:
        """Give the labels to the values that have them now (:func:`exported_values`):
        a value that gains one takes its records out of ``other`` into a window of its
        own, built from all of them; one that loses it gives them to ``other``."""
        if not self._dirty:
            return
        self._dirty = False
        counts = {v: (h.traffic, len(h.records)) for v, h in self._values.items()}
        slots = exported_values(counts, self.max_segments, min_records=self.min_records)
        if slots == self._slots:
            return
        for value in sorted(self._slots - slots):  # sorted: the same steps everywhere
            window = self._windows.pop(value, None)
            if window is not None:
                self._gone.append(value)
            for record in self._values[value].records.values():
                self._into(OTHER, record)
        for value in sorted(slots - self._slots):
            records = self._values[value].records
            for item_id in records:
                self._out(OTHER, item_id)
            for record in records.values():
                self._into(value, record)
        self._slots = slots

    def publish(
        self,
        metrics: SegmentMetrics,
        model: str,
        task: str,
        alphas: Sequence[float],
        now: float,
    ) -> None:
        """Every segment's gauges now; the series of the segments gone removed."""
        windows = self.windows
        for label in self._gone:
            if label not in windows:
                metrics.remove(model, task, label, alphas)
        self._gone.clear()
        for label, window in windows.items():
            metrics.publish(model, task, label, window.snapshot(now), alphas)


def segment_alarm_slots(spec: SegmentSpec) -> int:
    """m of the Bonferroni split: the label values a task can have, fixed by its setting
    before any data (``max`` labels of their own, ``other`` and ``none``)."""
    return spec.max + 2


class SegmentAlarms:
    """The anytime-valid alarm per segment of one (model, task) (docs/metrics.md,
    "Segments"): one e-detector per segment *value*, each at ``alarm_alpha / m``
    (:class:`~monitor.core.alarm.SplitDetectors`, m = :func:`segment_alarm_slots`), fed
    the same reviewed items as the task's detector (X_t = top answer accepted, the same
    pi_t), in the same order, so a restart's replay rebuilds them. A value's detector
    lives as long as the value has a record in the task's window.

    Exported per label (:meth:`publish`): a value with a label of its own shows its own
    detector, with its whole history; ``other`` shows the largest statistic of the values
    without one. Each detector moves only on its own value's items, so the sum of their
    Shiryaev-Roberts processes is the supermartingale of
    :class:`~monitor.core.alarm.SplitDetectors` however many values there are, and a
    label's statistic (one of them, or the largest of several) reaches ``m / alpha`` only
    when that sum does: the mean number of items to the first false alarm of any label
    stays >= m / alpha_alarm."""

    def __init__(self, detectors: SplitDetectors) -> None:
        self.detectors = detectors

    def add(self, record: CalibrationRecord, windows: SegmentWindows) -> None:
        """``record``, just applied to the task's window and ``windows``."""
        value = record.segment
        if value is not None and windows.has_value(value):
            # InputError: reviewed under an older, lower floor, not in the task's alarm either
            with contextlib.suppress(InputError):
                self.detectors.update(value, record.score <= 1.0, record.inclusion_probability)
        for gone in windows.left():
            self.detectors.drop(gone)

    def statistics(self, windows: SegmentWindows) -> dict[str, tuple[float, bool]]:
        """Each exported label's statistic and whether its alarm is raised."""
        out: dict[str, tuple[float, bool]] = {}
        threshold = self.detectors.threshold
        own = windows.labelled()
        for value, detector in self.detectors.detectors.items():
            label = value if value in own else OTHER
            statistic = detector.value
            if label not in out or statistic > out[label][0]:
                out[label] = (statistic, statistic >= threshold)
        return out

    def publish(
        self, metrics: SegmentMetrics, model: str, task: str, windows: SegmentWindows
    ) -> None:
        """Every exported segment's alarm gauges (the series of segments gone are removed
        with their windows' in :meth:`SegmentWindows.publish`)."""
        exported = windows.windows
        for label, (value, alarm) in self.statistics(windows).items():
            if label in exported:
                metrics.publish_alarm(model, task, label, value, alarm)
