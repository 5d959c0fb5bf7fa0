"""The calibration of every (model, task): its window, alarm and ACI state, fed by
verdicts, rebuilt from the store at a start, published as gauges.

A verdict (:meth:`Calibration.apply_verdict`) becomes a score by the one rule of
:mod:`monitor.engine.verdicts`, is stored once by item id (the first stored verdict
counts), and enters the window, the e-detector, ACI's alpha_t and the live check of the
guarantee (was the score within the threshold in force when the item was scored?).
A record with a segment value also enters the per-segment windows, beside the task's
(:mod:`monitor.engine.segments`: each value's records, exported under its own label or
``other``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from monitor.core.alarm import EDetector, SplitDetectors
from monitor.core.conformal import AdaptiveAlpha
from monitor.core.errors import InputError
from monitor.core.review import ReviewItem, TaskProgress, Verdict, minimum_calibration_items
from monitor.core.segments import DEFAULT_MAX_SEGMENTS
from monitor.core.window import CalibrationWindow, WindowSnapshot
from monitor.engine.judged import JUDGED_PER_WINDOW, JudgedItems
from monitor.engine.metrics import Metrics
from monitor.engine.ports import (
    CalibrationRecord,
    CalibrationStore,
    Clock,
    Judgement,
    SharedStore,
    VerdictOutcome,
)
from monitor.engine.runtime import TaskRuntime
from monitor.engine.segments import SegmentAlarms, SegmentWindows, segment_alarm_slots
from monitor.engine.verdicts import VerdictScorer, calibration_record, ranks_beyond_candidates

__all__ = [
    "PPI_EVERY_S",
    "Calibration",
    "JudgementListener",
    "VerdictListener",
    "WindowState",
]

log = structlog.get_logger("relmon")

PPI_EVERY_S = 1.0
"""The prediction-powered gauges are recomputed at most this often."""

VerdictListener = Callable[[ReviewItem, Verdict, CalibrationRecord], None]
"""Told of each verdict this replica stored (not of those it follows): the OTel export."""
JudgementListener = Callable[[Judgement], None]
"""Told of each judge label this replica stored (not of those it follows)."""


@dataclass
class WindowState:
    """One (model, task)'s calibration: the window and what is derived from the same
    verdicts (the alarm, ACI's alpha_t), and the review items still waiting."""

    window: CalibrationWindow
    snapshot: WindowSnapshot | None = None
    snapshot_at: float = -1.0
    pending_reviews: int = 0
    detector: EDetector | None = None
    aci: AdaptiveAlpha | None = None
    """With ACI on: the counts behind the adaptive alpha_t served for the target's sets."""
    judged: JudgedItems | None = None
    """With ``tasks[].judge``: the judge's labels (the prediction-powered level)."""
    ppi_at: float = -math.inf
    segments: SegmentWindows | None = None
    """The windows per segment of the records (:mod:`monitor.engine.segments`)."""
    segment_alarms: SegmentAlarms | None = None
    """With ``tasks[].segments``: the alarm per segment, alpha split over max + 2 labels."""

    @property
    def aci_alpha(self) -> float | None:
        return None if self.aci is None else self.aci.value


class Calibration:
    """The windows of every configured task, one per (model, task)."""

    def __init__(
        self,
        tasks: Mapping[str, TaskRuntime],
        *,
        store: CalibrationStore,
        metrics: Metrics,
        clock: Clock,
        scorer: VerdictScorer,
    ) -> None:
        self.tasks = tasks
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.scorer = scorer
        self.windows: dict[tuple[str, str], WindowState] = {}
        self.loaded_through = 0
        """The highest first order key :meth:`load` read (a shared store's ``seq``)."""
        self.listeners: list[VerdictListener] = []
        self.judgement_listeners: list[JudgementListener] = []
        self.judged_through = 0
        """The highest judge label number seen (a shared store's follower goes on from it)."""

    def state(self, model: str, task: TaskRuntime) -> WindowState:
        key = (model, task.name)
        state = self.windows.get(key)
        if state is None:
            s = task.settings
            state = WindowState(
                self._new_window(task),
                detector=EDetector(
                    tau=s.reliability_target, alpha=s.alarm_alpha, pi_min=s.review_floor
                ),
                aci=(
                    AdaptiveAlpha(task.target_alpha, s.aci_gamma)
                    if s.aci_gamma is not None
                    else None
                ),
                judged=(
                    JudgedItems(JUDGED_PER_WINDOW * s.window_size)
                    if task.judge is not None
                    else None
                ),
                segments=SegmentWindows(
                    lambda: self._new_window(task, segment=True),
                    DEFAULT_MAX_SEGMENTS if task.segments is None else task.segments.spec.max,
                    track_left=task.segments is not None,  # for its alarms
                ),
                segment_alarms=self._segment_alarms(task),
            )
            self.windows[key] = state
        return state

    @staticmethod
    def _segment_alarms(task: TaskRuntime) -> SegmentAlarms | None:
        """The task's alarms per segment (None: the task has no segments)."""
        if task.segments is None:
            return None
        s = task.settings
        slots = segment_alarm_slots(task.segments.spec)
        return SegmentAlarms(
            SplitDetectors(
                tau=s.reliability_target, alpha=s.alarm_alpha, pi_min=s.review_floor, slots=slots
            )
        )

    @staticmethod
    def _new_window(task: TaskRuntime, *, segment: bool = False) -> CalibrationWindow:
        """An empty window with the task's settings (the task's, or a segment's). A
        segment with ``min_reviews_per_hour`` has its items reviewed more often than the
        task's floor: its test point weighs the largest 1/pi its items had, not 1/floor."""
        s = task.settings
        spec = task.segments.spec if segment and task.segments is not None else None
        return CalibrationWindow(
            alphas=task.alphas,
            max_items=s.window_size,
            half_life_s=s.half_life_s,
            min_inclusion_probability=s.review_floor,
            test_weight_seen=spec is not None and spec.min_reviews_per_hour > 0,
        )

    def snapshot(self, model: str, task_name: str, *, max_age_s: float = 0.0) -> WindowSnapshot:
        """The window's snapshot now (cached for ``max_age_s`` seconds)."""
        state = self.state(model, self.tasks[task_name])
        now = self.clock.time()
        if state.snapshot is None or now - state.snapshot_at > max_age_s:
            state.snapshot = state.window.snapshot(now)
            state.snapshot_at = now
        return state.snapshot

    def publish(self) -> None:
        """Every window's gauges (decay moves with time, not only with verdicts)."""
        for (model, name), state in self.windows.items():
            self._publish_window(model, name, state)

    def _publish_window(self, model: str, name: str, state: WindowState) -> None:
        snapshot = self.snapshot(model, name)
        self.metrics.publish(model, name, snapshot, self.tasks[name].alphas)
        self.metrics.served.publish(model, name, snapshot.served)
        if state.segments is not None:
            alphas = self.tasks[name].alphas
            state.segments.publish(self.metrics.segments, model, name, alphas, self.clock.time())
        self.metrics.review_queue_depth.labels(model, name).set(state.pending_reviews)
        now = self.clock.time()
        if state.judged is not None and now - state.ppi_at >= PPI_EVERY_S:
            # O(labels) each time: at most once a second, however fast verdicts come.
            state.ppi_at = now
            self.metrics.publish_ppi(model, name, state.judged.estimate(state.window, now))

    def note_judgement(self, judgement: Judgement) -> bool:
        """A judge label (this replica's, loaded, or another replica's); False if the
        item was labelled already or its task has no judge here."""
        self.judged_through = max(self.judged_through, judgement.seq)
        task = self.tasks.get(judgement.task)
        if task is None or task.judge is None:
            return False
        state = self.state(judgement.model, task)
        return state.judged is not None and state.judged.add(judgement)

    @property
    def judges(self) -> bool:
        """Whether any task has a judge (``tasks[].judge``)."""
        return any(t.judge is not None for t in self.tasks.values())

    async def load_judgements(self) -> int:
        """The judge labels still weighing in the windows (the last 20 half-lives)."""
        judged = [t for t in self.tasks.values() if t.judge is not None]
        if not judged:
            return 0
        lives = [t.settings.half_life_s for t in judged]
        since = 0.0 if None in lives else self.clock.time() - 20 * max(h or 0 for h in lives)
        loaded = sum(self.note_judgement(j) for j in await self.store.load_judgements(since))
        for (model, name), state in self.windows.items():
            if state.judged is not None:
                self._publish_window(model, name, state)
        return loaded

    async def load(self) -> int:
        """Rebuild the windows from the store; returns how many records were loaded."""
        loaded = 0
        for r in await self.store.load_records():
            if r.order:
                self.loaded_through = max(self.loaded_through, r.order[0])
            task = self.tasks.get(r.task)
            if task is None:
                continue  # a task no longer configured
            loaded += self._add(self.state(r.model, task), r)
        self.set_pending(await self.store.pending_counts())
        for (model, name), state in self.windows.items():
            self._publish_alarm(model, name, state)
        return loaded

    def set_pending(self, counts: Mapping[tuple[str, str], int]) -> None:
        """The review items waiting per (model, task), as the store counts them (a
        shared store: every replica's)."""
        for state in self.windows.values():
            state.pending_reviews = 0
        for (model, name), count in counts.items():
            if name in self.tasks:
                self.state(model, self.tasks[name]).pending_reviews = count
        for (model, name), state in self.windows.items():
            self.metrics.review_queue_depth.labels(model, name).set(state.pending_reviews)

    def _add(self, state: WindowState, record: CalibrationRecord) -> bool:
        """A record into the window and what follows the same verdicts; False if the
        window already held its item."""
        added = state.window.add(
            record.item_id,
            record.score,
            record.inclusion_probability,
            record.sampled_at,
            order=record.order or None,
            served=record.served_acceptable,
        )
        if added:
            if state.segments is not None:  # the record's segment window, if it has one
                state.segments.add(record, state.window)
                if state.segment_alarms is not None:  # and its alarm (same X_t, same pi)
                    state.segment_alarms.add(record, state.segments)
            self._update_alarm(state, record.score, record.inclusion_probability)
            # ACI: one step per applied verdict, kept as counts (the same at a restart,
            # which replays the stored aci_miss, whatever order the verdicts came in).
            if state.aci is not None and record.aci_miss is not None:
                state.aci.update(record.aci_miss)
            state.snapshot = None
        return added

    def note_review_item(self, item: ReviewItem) -> None:
        """A review item is waiting for a verdict (written here or by another replica)."""
        task = self.tasks.get(item.task)
        if task is None:
            return
        state = self.state(item.model, task)
        state.pending_reviews += 1
        self.metrics.review_queue_depth.labels(item.model, item.task).set(state.pending_reviews)

    def reject_verdict(self, kind: str, reason: str) -> None:
        """A verdict a review backend refused before it reached :meth:`apply_verdict`
        (``invalid``: unreadable; ``unknown``: its review item never came)."""
        self.metrics.verdicts_rejected.labels(kind).inc()
        log.warning("verdict_rejected", kind=kind, reason=reason)

    async def apply_verdict(self, verdict: Verdict) -> VerdictOutcome:
        item = await self.store.get_review_item(verdict.item_id)
        if item is None or item.task not in self.tasks:
            # No item, so no model or task to count it under (not empty labels).
            self.metrics.verdicts_rejected.labels("unknown").inc()
            return VerdictOutcome("unknown", reason="no such review item")
        task = self.tasks[item.task]
        if ranks_beyond_candidates(item, verdict):
            self.metrics.reviews.labels(item.model, item.task, "invalid").inc()
            return VerdictOutcome("invalid", reason="accepted rank beyond the candidates")
        score = self.scorer(item, verdict)
        served = self.scorer.served(item, verdict, score)
        state = self.state(item.model, task)
        order = await self.store.save_record(
            calibration_record(item, score, served=served), verdict
        )
        if order is None:
            # The item keeps its first verdict: answer with the score that one gave.
            stored = await self.store.get_record(item.item_id)
            self.metrics.reviews.labels(item.model, item.task, "duplicate").inc()
            return VerdictOutcome("duplicate", score=score if stored is None else stored.score)
        record = calibration_record(item, score, order=order, served=served)
        if item.item_id not in state.window:  # else a shared store's follower, woken by
            # the store's notice of this very verdict, applied (and counted) it already
            self._applied(state, item, verdict, record, task)
        self._tell(item, verdict, record)
        return VerdictOutcome("applied", score=score)

    def judged_here(self, judgement: Judgement) -> None:
        """A judge label this replica's worker stored: kept, and its listeners told."""
        self.note_judgement(judgement)
        for listener in self.judgement_listeners:
            try:
                listener(judgement)
            except Exception as exc:  # a bug in a listener: the label stands
                log.error("judgement_listener_failed", item=judgement.item_id, error=repr(exc))

    def _tell(self, item: ReviewItem, verdict: Verdict, record: CalibrationRecord) -> None:
        """The listeners, after the verdict is stored: one failing never undoes it."""
        for listener in self.listeners:
            try:
                listener(item, verdict, record)
            except Exception as exc:  # a bug in a listener: the verdict stands
                log.error("verdict_listener_failed", item=item.item_id, error=repr(exc))

    def _applied(
        self,
        state: WindowState,
        item: ReviewItem,
        verdict: Verdict,
        record: CalibrationRecord,
        task: TaskRuntime,
    ) -> None:
        """A stored verdict enters the window and the counts, here or followed."""
        self._add(state, record)
        state.pending_reviews = max(0, state.pending_reviews - 1)
        self._count_verdict(item, verdict, record.score, task)
        self._publish_alarm(item.model, item.task, state)
        self._publish_window(item.model, item.task, state)

    async def follow(self, record: CalibrationRecord, shared: SharedStore) -> bool:
        """A verdict another replica stored in the shared store enters this replica's
        window and counts as if applied here, so that every replica exports the same
        level, bound, thresholds and counters. False if already here or not ours."""
        task = self.tasks.get(record.task)
        if task is None:
            return False
        state = self.state(record.model, task)
        if record.item_id in state.window:
            return False
        item = await shared.get_review_item(record.item_id)
        verdict = await shared.get_verdict(record.item_id)
        if item is None or verdict is None or record.item_id in state.window:
            return False  # (in the window now: applied here while this read the store)
        self._applied(state, item, verdict, record, task)
        return True

    def _count_verdict(
        self, item: ReviewItem, verdict: Verdict, score: float, task: TaskRuntime
    ) -> None:
        self.metrics.reviews.labels(
            item.model, item.task, "none" if verdict.none_of_these else "accepted"
        ).inc()
        # The SLI: was the top-ranked answer acceptable? Weighted 1/pi so that the rate
        # estimates the share over all traffic even when review is not uniform.
        top = "accepted" if score <= 1 else "rejected"
        self.metrics.top_answers.labels(item.model, item.task, top).inc(
            1.0 / item.inclusion_probability
        )
        self._self_check(item, score, task)

    def review_progress(self) -> list[TaskProgress]:
        """Each configured task's calibration state against what its target needs."""
        out = []
        for task in self.tasks.values():
            snap = self.snapshot(task.model, task.name, max_age_s=1.0)
            out.append(
                TaskProgress(
                    model=task.model,
                    task=task.name,
                    calibration_items=snap.n,
                    effective_items=round(snap.n_eff, 3),
                    minimum_items=minimum_calibration_items(task.target_alpha),
                    threshold_finite=math.isfinite(snap.thresholds[task.target_alpha]),
                )
            )
        return out

    def _self_check(self, item: ReviewItem, score: float, task: TaskRuntime) -> None:
        """The guarantee checked live: was the score within the threshold in force when
        the item was scored? Weighted 1/pi like the SLI, so that 1 - misses/checks
        estimates the coverage of traffic, not of the (possibly prioritised) reviews."""
        weight = 1.0 / item.inclusion_probability
        known = set(task.alphas)
        for alpha, threshold in item.thresholds:
            if alpha not in known:
                continue  # an alpha no longer configured (no pre-created series)
            label = f"{alpha:g}"
            self.metrics.coverage_checks.labels(item.model, item.task, label).inc(weight)
            if score > threshold:
                self.metrics.coverage_misses.labels(item.model, item.task, label).inc(weight)

    @staticmethod
    def _update_alarm(state: WindowState, score: float, pi: float) -> None:
        if state.detector is None:
            return
        try:
            state.detector.update(score <= 1.0, pi)
        except InputError:
            # A record reviewed under an older, lower floor: it cannot be weighted
            # validly against the current floor, so it does not enter the alarm.
            return

    def _publish_alarm(self, model: str, task: str, state: WindowState) -> None:
        if state.detector is None:
            return
        self.metrics.reliability_alarm_evalue.labels(model, task).set(state.detector.value)
        self.metrics.reliability_alarm.labels(model, task).set(1.0 if state.detector.alarm else 0.0)
        if state.segment_alarms is not None and state.segments is not None:
            state.segment_alarms.publish(self.metrics.segments, model, task, state.segments)

    def aci_alpha(self, model: str, task_name: str) -> float | None:
        """The adaptive alpha_t served for the target's sets (None when ACI is off).

        A function of the applied verdicts' ACI steps (:attr:`CalibrationRecord.aci_miss`),
        not of their order: a restart, which replays the stored records, restores it.
        """
        return self.state(model, self.tasks[task_name]).aci_alpha
