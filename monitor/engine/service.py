"""The streaming monitor, assembled from its parts.

Data flow (docs/architecture.md): a source offers an event →
:mod:`~monitor.engine.admission` resolves its task, hash-samples it and reserves call
budget, never waiting → a worker (:mod:`~monitor.engine.workers`) re-asks the model in
batches chosen by the stopping rule → canonicalize, rank, prediction sets from the
current thresholds → with the item's inclusion probability, a review item
(:mod:`~monitor.engine.reviews`) → a verdict becomes a score in the (model, task)
calibration window (:mod:`~monitor.engine.calibration`) → metrics.

Nothing here parses HTTP or Kafka: adapters call :meth:`MonitorService.offer` and
:meth:`MonitorService.apply_verdict`, and reach the outside only through the ports of
:mod:`monitor.engine.ports`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence

import structlog

from monitor.config import BudgetSettings
from monitor.core.apis.registry import capture_headers
from monitor.core.errors import ConfigError
from monitor.core.events import TrafficEvent
from monitor.core.reask import override_fields
from monitor.core.redaction import Redactor
from monitor.core.review import ReviewItem, TaskProgress, Verdict
from monitor.core.sampler import CallBudget
from monitor.core.segments import load_language_detector
from monitor.core.window import WindowSnapshot
from monitor.engine.admission import RECENT_ITEM_IDS, AdmissionControl
from monitor.engine.calibration import Calibration
from monitor.engine.metrics import Metrics
from monitor.engine.ports import (
    Admission,
    CalibrationStore,
    Clock,
    ReviewQueue,
    SystemClock,
    VerdictOutcome,
)
from monitor.engine.reviews import OutboxSettings, ReviewRouter
from monitor.engine.routing import TaskRouter
from monitor.engine.runtime import Job, ServiceStats, TaskRuntime
from monitor.engine.segments import detects_language, segment_headers
from monitor.engine.verdicts import VerdictScorer
from monitor.engine.workers import WorkerPool

__all__ = ["MonitorService", "ServiceStats", "TaskRuntime"]

log = structlog.get_logger("relmon")


class MonitorService:
    """Admission, workers, review routing and calibration of the configured tasks."""

    def __init__(
        self,
        tasks: Sequence[TaskRuntime],
        *,
        store: CalibrationStore,
        review_queue: ReviewQueue,
        metrics: Metrics,
        budget: BudgetSettings,
        clock: Clock | None = None,
        seed: int = 0,
        log_prompts: bool = False,
        query_hash_key: bytes | None = None,
        redactor: Redactor | None = None,
        outbox: OutboxSettings | None = None,
    ) -> None:
        if not tasks:
            raise ConfigError("at least one task is needed")
        self.tasks: dict[str, TaskRuntime] = {t.name: t for t in tasks}
        self.store = store
        self.review_queue = review_queue
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.redactor = redactor or Redactor.default()
        self.stats = ServiceStats()
        self.loaded = False
        self.budget = CallBudget(budget.calls_per_minute, self.clock.monotonic())
        queue: asyncio.Queue[Job] = asyncio.Queue(maxsize=budget.queue_size)
        self.router = TaskRouter(self.tasks)
        self.admission = AdmissionControl(
            self.router,
            store=store,
            metrics=metrics,
            clock=self.clock,
            budget=self.budget,
            queue=queue,
            stats=self.stats,
        )
        self.calibration = Calibration(
            self.tasks,
            store=store,
            metrics=metrics,
            clock=self.clock,
            scorer=VerdictScorer(self.tasks, self.redactor),
        )
        self.reviews = ReviewRouter(
            store=store,
            review_queue=review_queue,
            calibration=self.calibration,
            metrics=metrics,
            redactor=self.redactor,
            forget=self.admission.forget,
            outbox=outbox,
        )
        self.workers = WorkerPool(
            queue,
            size=budget.max_in_flight,
            calibration=self.calibration,
            reviews=self.reviews,
            metrics=metrics,
            clock=self.clock,
            budget=self.budget,
            stats=self.stats,
            redactor=self.redactor,
            seed=seed,
            log_prompts=log_prompts,
            # The key of the logged query hash (HMAC); a random one per process if none.
            query_hash_key=query_hash_key or secrets.token_bytes(32),
            pace=budget.pace,
        )
        # The headers the tasks' segments read stay on the traffic events (never re-sent).
        capture_headers(segment_headers(t.segments for t in tasks))
        # A verdict for an unknown item, or one that cannot be read, has no model or task:
        # it is counted in relmon_verdicts_rejected_total{reason} (created at 0 by Metrics).
        for t in tasks:
            fields = override_fields(t.reask, t.field_rules)
            self.metrics.init_task(t.model, t.name, t.alphas, t.client_outcomes, fields)
            self.metrics.reliability_target.labels(t.model, t.name).set(
                t.settings.reliability_target
            )
            self.metrics.max_samples_per_item.labels(t.model, t.name).set(t.settings.k_max)

    # ------------------------------------------------------------------ state

    @property
    def accepting(self) -> bool:
        """Whether traffic is admitted (False once stopping)."""
        return self.admission.accepting

    @accepting.setter
    def accepting(self, value: bool) -> None:
        self.admission.accepting = value

    @property
    def in_flight(self) -> int:
        return self.workers.in_flight

    def snapshot(self, model: str, task_name: str, *, max_age_s: float = 0.0) -> WindowSnapshot:
        """The window's snapshot now (cached for ``max_age_s`` seconds)."""
        return self.calibration.snapshot(model, task_name, max_age_s=max_age_s)

    def aci_alpha(self, model: str, task_name: str) -> float | None:
        """The adaptive alpha_t served for the target's sets (None when ACI is off)."""
        return self.calibration.aci_alpha(model, task_name)

    def review_progress(self) -> list[TaskProgress]:
        return self.calibration.review_progress()

    def circuits_open(self) -> list[str]:
        """Tasks whose model client's circuit breaker is not closed (no items re-asked)."""
        return [name for name, t in self.tasks.items() if t.client.circuit_state != "closed"]

    def publish(self) -> None:
        """Refresh every window's gauges (decay moves with time, not only with verdicts),
        each task's ``relmon_circuit_open``, the budget's use and the items waiting."""
        self.metrics.budget_utilization.set(self.budget.utilization(self.clock.monotonic()))
        self.metrics.items_waiting.set(self.workers.waiting)
        open_now = set(self.circuits_open())
        for name, task in self.tasks.items():
            self.metrics.circuit_open.labels(task.model, name).set(1.0 if name in open_now else 0.0)
        self.calibration.publish()

    async def load(self) -> int:
        """Rebuild the windows from the store and prepare the canonicalizers that can
        be (an embedding model loads now, before traffic, not on the first item while
        live requests wait); returns how many records were loaded."""
        tasks = self.tasks.values()
        for task in tasks:
            warm = getattr(task.canonicalizer, "warm_up", None)
            if warm is not None:
                started = self.clock.monotonic()
                await warm()
                log.info(
                    "canonicalizer_ready",
                    task=task.name,
                    seconds=round(self.clock.monotonic() - started, 3),
                )
        if detects_language(t.segments for t in tasks):
            started = self.clock.monotonic()
            await asyncio.to_thread(load_language_detector)  # once, off the event loop
            log.info("language_detector_ready", seconds=round(self.clock.monotonic() - started, 3))
        loaded = await self.calibration.load()
        await self.calibration.load_judgements()
        # A restart recognises items it already reviewed, and those waiting in the outbox.
        self.admission.remember_all(await self.store.recent_item_ids(RECENT_ITEM_IDS))
        self.admission.remember_all([item.item_id for item in await self.reviews.load()])
        self.loaded = True
        self.publish()
        log.info("windows_loaded", records=loaded, windows=len(self.calibration.windows))
        return loaded

    # -------------------------------------------------------------- admission

    def offer(self, event: TrafficEvent, source: str, *, wait: bool = False) -> Admission:
        """Admit or not; never blocks, never raises for a bad event.

        An item already admitted (same task and event id: a repeated ``X-Request-Id``, a
        Kafka re-delivery) or whose review item already exists is a ``duplicate`` and is
        not asked again. Without budget or queue room (or while stopping) a source that
        may ``wait`` gets ``busy`` (nothing counted: it offers the event again later,
        as Kafka does); any other source's event is ``dropped``.
        """
        return self.admission.offer(event, source, wait=wait)

    def reject(self, source: str, reason: str) -> None:
        """A malformed event a source could not parse (already dead-lettered by it)."""
        self.admission.reject(source, reason)

    def skip_unsampled(
        self, source: str, task_name: str | None, model: str | None, event_id: str
    ) -> bool:
        """A source's fast path: True (counted ``skipped``) when the event with these
        fields would not be sampled, so the source need not parse the rest of it."""
        return self.admission.skip_unsampled(source, task_name, model, event_id)

    def resolve_task(self, event: TrafficEvent) -> TaskRuntime | None:
        return self.router.resolve(event)

    # ----------------------------------------------------------------- workers

    def start(self) -> None:
        self.workers.start()
        self.reviews.start()

    async def drain(self) -> None:
        """Wait until every admitted item is handled."""
        await self.workers.drain()

    async def stop(self, timeout_s: float) -> bool:
        """Stop admitting, finish in-flight items within ``timeout_s``; True if drained."""
        self.accepting = False
        drained = await self.workers.stop(timeout_s)
        await self.reviews.stop()  # what waits in the outbox stays on disk
        return drained

    # ---------------------------------------------------------------- verdicts

    async def apply_verdict(self, verdict: Verdict) -> VerdictOutcome:
        outcome = await self.calibration.apply_verdict(verdict)
        if outcome.status == "applied":
            self.stats.verdicts += 1
        return outcome

    def reject_verdict(self, kind: str, reason: str) -> None:
        """A verdict a review backend refused before it reached :meth:`apply_verdict`."""
        self.calibration.reject_verdict(kind, reason)

    def note_review_item(self, item: ReviewItem) -> None:
        """A review item another replica published (read from the shared review log)."""
        self.calibration.note_review_item(item)
