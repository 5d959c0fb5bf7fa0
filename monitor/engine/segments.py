"""Reliability per segment in the engine (DESIGN.md §6 "Reliability per segment").

**The label of an item** is fixed by the worker once the item is ranked, before its
inclusion probability is decided (:func:`segment_label`; the segment's minimum review
rate may raise it: :mod:`monitor.engine.review_minimum`): the raw value of the task's
``segments.by`` (a header the event kept, a JMESPath field of the production request, or
the query's language), made a label by the task's own
:class:`~monitor.core.segments.SegmentTable` (one per task, so per (model, task): a task
has one ``model`` label), which gives the busiest ``max`` values a label of their own and
the rest ``other``. The label goes with the review item
(``segment``), and from its verdict into the calibration record, where it is stored.

**The windows per segment** (:class:`SegmentWindows`, one per (model, task), beside the
task's window, which stays the marginal one): a :class:`~monitor.core.window.CalibrationWindow`
per stored label value, with the task window's settings, fed by the same records in the
same order (a live verdict, a restart's replay, another replica's verdict followed).
They are keyed by the label *stored with the record*, never by this replica's table, so
every replica that reads the same records holds the same windows. A segment's window
exists while the task's window holds a verdict of that segment: when the last one is
evicted from the task's window, the segment's window goes and its series with it. So
the segment label values exported are at most those of the task window's records.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Iterable, Sequence

from monitor.core.alarm import SplitDetectors
from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent
from monitor.core.segments import SegmentSpec, SegmentTable, segment_value
from monitor.core.window import CalibrationWindow, OrderKey
from monitor.engine.ports import CalibrationRecord
from monitor.engine.review_minimum import SegmentReviewRates
from monitor.engine.segment_metrics import SegmentMetrics

__all__ = [
    "SegmentAlarms",
    "SegmentWindows",
    "TaskSegments",
    "detects_language",
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
        self.reviews = SegmentReviewRates(spec.min_reviews_per_hour, max_labels=4 * (spec.max + 2))

    def label(self, event: TrafficEvent, query: Callable[[], str | None]) -> str:
        """Count ``event`` in the table; its label (``query``: the production query,
        asked for only when the task segments by language)."""
        text = query() if self.spec.by.kind == "language" else None
        raw = segment_value(self.spec, event.headers, event.request, text)
        return self.table.observe(raw)


def segment_label(
    segments: TaskSegments | None, event: TrafficEvent, query: Callable[[], str | None]
) -> str | None:
    """The segment label of a scored item of a task (None: the task has no segments)."""
    return None if segments is None else segments.label(event, query)


def segment_headers(segments: Iterable[TaskSegments | None]) -> list[str]:
    """The header names the tasks segment by (their events must keep them)."""
    return [s.spec.by.name for s in segments if s is not None and s.spec.by.kind == "header"]


def detects_language(segments: Iterable[TaskSegments | None]) -> bool:
    """Whether a task segments by the query's language (the detector is then loaded)."""
    return any(s is not None and s.spec.by.kind == "language" for s in segments)


class SegmentWindows:
    """The per-segment windows of one (model, task) (see the module). ``make`` builds an
    empty window with the task window's settings."""

    def __init__(self, make: Callable[[], CalibrationWindow]) -> None:
        self._make = make
        self.windows: dict[str, CalibrationWindow] = {}
        self._members: dict[str, str] = {}  # item id -> label, of the task window's items
        self._heap: list[tuple[OrderKey, str]] = []  # the members by order key
        self._counts: dict[str, int] = {}  # members per label
        self._gone: list[str] = []  # labels whose window went since the last publish
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self.windows)

    def add(self, record: CalibrationRecord, task_window: CalibrationWindow) -> None:
        """``record``, just given to ``task_window``, into its segment's window (a record
        without a segment, or one the task window did not keep, into none); then the
        segments none of whose verdicts the task window holds any more are dropped."""
        label, item_id = record.segment, record.item_id
        if label is not None and item_id in task_window and item_id not in self._members:
            window = self.windows.get(label)
            if window is None:
                window = self.windows[label] = self._make()
                if label in self._gone:
                    self._gone.remove(label)
            self._arrivals += 1
            order = record.order or None
            window.add(
                item_id,
                record.score,
                record.inclusion_probability,
                record.sampled_at,
                order=order,
                served=record.served_acceptable,
            )
            self._members[item_id] = label
            self._counts[label] = self._counts.get(label, 0) + 1
            heapq.heappush(self._heap, (order or (self._arrivals,), item_id))
        self._prune(task_window)

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
        label = self._members.pop(item_id, None)
        if label is None:
            return
        self._counts[label] -= 1
        if self._counts[label] <= 0:
            del self._counts[label]
            del self.windows[label]
            self._gone.append(label)

    def publish(
        self,
        metrics: SegmentMetrics,
        model: str,
        task: str,
        alphas: Sequence[float],
        now: float,
    ) -> None:
        """Every segment's gauges now; the series of the segments gone removed."""
        for label in self._gone:
            metrics.remove(model, task, label, alphas)
        self._gone.clear()
        for label, window in self.windows.items():
            metrics.publish(model, task, label, window.snapshot(now), alphas)


def segment_alarm_slots(spec: SegmentSpec) -> int:
    """m of the Bonferroni split: the label values a task can have, fixed by its setting
    before any data (``max`` labels of their own, ``other`` and ``none``)."""
    return spec.max + 2


class SegmentAlarms:
    """The anytime-valid alarm per segment of one (model, task) (docs/metrics.md,
    "Segments"): one e-detector per segment label, each at ``alarm_alpha / m``
    (:class:`~monitor.core.alarm.SplitDetectors`, m = :func:`segment_alarm_slots`), fed
    the same reviewed items as the task's detector (X_t = top answer accepted, the same
    pi_t), in the same order, so a restart's replay rebuilds them. A segment's detector
    lives as long as its window (:class:`SegmentWindows`): when the last verdict of the
    segment leaves the task's window, the detector goes with the segment's series."""

    def __init__(self, detectors: SplitDetectors) -> None:
        self.detectors = detectors

    def add(self, record: CalibrationRecord, windows: SegmentWindows) -> None:
        """``record``, just applied to the task's window and ``windows``."""
        label = record.segment
        if label is not None:
            # InputError: reviewed under an older, lower floor, not in the task's alarm either
            with contextlib.suppress(InputError):
                self.detectors.update(label, record.score <= 1.0, record.inclusion_probability)
        for gone in [s for s in self.detectors.detectors if s not in windows.windows]:
            self.detectors.drop(gone)

    def publish(self, metrics: SegmentMetrics, model: str, task: str) -> None:
        """Every segment's alarm gauges (the series of segments gone are removed with
        their windows' in :meth:`SegmentWindows.publish`)."""
        for label, detector in self.detectors.detectors.items():
            metrics.publish_alarm(model, task, label, detector.value, detector.alarm)
