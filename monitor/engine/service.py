"""The streaming monitor: admission, re-asking, consensus, review routing, calibration.

Data flow (the README, "How it works"): a source offers an event →
:meth:`MonitorService.offer` resolves its task, hash-samples it and reserves call
budget, never waiting → a worker re-asks the model in batches chosen by the stopping
rule → canonicalize, rank, prediction sets from the current thresholds → with the
task's review probability, a review item → a verdict (:meth:`apply_verdict`) becomes
a score in the (model, task) calibration window → metrics.

An item whose model calls fail is abandoned and counted, never scored on partial data.
Nothing here parses HTTP or Kafka: adapters call :meth:`offer` and
:meth:`apply_verdict`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from monitor.config import BudgetSettings, TaskSettings
from monitor.core.alarm import EDetector
from monitor.core.canon.base import AsyncCanonicalizer, Canonicalizer, QueryContext
from monitor.core.certify import item_rng
from monitor.core.conformal import AdaptiveAlpha
from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import InputError, ModelCallError
from monitor.core.events import TrafficEvent, query_hash, query_text
from monitor.core.priority import review_probability
from monitor.core.redaction import Redactor
from monitor.core.review import (
    ReviewItem,
    TaskProgress,
    Verdict,
    aci_miss,
    minimum_calibration_items,
    verdict_score,
)
from monitor.core.sampler import CallBudget, sampled
from monitor.core.scores import set_size
from monitor.core.stopping import StoppingRule
from monitor.core.window import CalibrationWindow, WindowSnapshot
from monitor.engine.metrics import Metrics
from monitor.engine.ports import (
    Admission,
    CalibrationRecord,
    CalibrationStore,
    Clock,
    ModelClient,
    ReviewQueue,
    SystemClock,
    VerdictOutcome,
)

__all__ = ["RECENT_ITEM_IDS", "MonitorService", "TaskRuntime"]

log = structlog.get_logger("relmon")

RECENT_ITEM_IDS = 100_000
REVIEW_SUBMIT_ATTEMPTS = 3
"""Writes of one review item (the review queue: SQLite, or the Kafka review topic whose
producer retries within each attempt), 1 s then 2 s apart, before it is given up."""
REVIEW_SUBMIT_BACKOFF_S = 1.0
"""How many admitted item ids the service remembers to recognise a repeated event."""


@dataclass
class TaskRuntime:
    """A configured task with its live parts."""

    settings: TaskSettings
    canonicalizer: AsyncCanonicalizer
    rule: StoppingRule
    client: ModelClient
    sync_canonicalizer: Canonicalizer | None = None
    client_outcomes: tuple[str, ...] = ()
    """Every ``relmon_model_calls_total{outcome}`` value the client reports (pre-created)."""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def target_alpha(self) -> float:
        return round(1.0 - self.settings.reliability_target, 10)

    @property
    def alphas(self) -> tuple[float, ...]:
        return tuple(sorted({*self.settings.alphas, self.target_alpha}))

    def review_probability(self, consensus: Consensus) -> float:
        """pi for this item: the task's rate, or by uncertainty with a floor."""
        s = self.settings
        if s.review_priority == "uniform":
            return s.review_rate
        return review_probability(consensus, floor=s.review_floor, ceiling=s.review_rate)


@dataclass
class _Job:
    event: TrafficEvent
    task: TaskRuntime
    source: str
    sampled_at: float
    reserved: int
    done: asyncio.Future[None]


@dataclass
class _WindowState:
    window: CalibrationWindow
    snapshot: WindowSnapshot | None = None
    snapshot_at: float = -1.0
    pending_reviews: int = 0
    detector: EDetector | None = None
    aci: AdaptiveAlpha | None = None
    """With ACI on: the counts behind the adaptive alpha_t served for the target's sets."""

    @property
    def aci_alpha(self) -> float | None:
        return None if self.aci is None else self.aci.value


@dataclass
class ServiceStats:
    scored: int = 0
    abandoned: int = 0
    interrupted: int = 0
    reviewed: int = 0
    verdicts: int = 0
    calls: int = 0
    by_decision: Counter[str] = field(default_factory=Counter)


class MonitorService:
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
    ) -> None:
        if not tasks:
            raise ValueError("at least one task is needed")
        self.tasks = {t.name: t for t in tasks}
        # The first task with no match condition takes unmatched traffic (computed once:
        # resolve_task runs for every offered event).
        self._catch_all = next(
            (
                t
                for t in tasks
                if t.settings.match.model is None
                and t.settings.match.header is None
                and t.settings.match.path_prefix is None
            ),
            None,
        )
        self.store = store
        self.review_queue = review_queue
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.seed = seed
        self.log_prompts = log_prompts
        # The key of the logged query hash (HMAC); a random one per process if none.
        self.query_hash_key = query_hash_key or secrets.token_bytes(32)
        self.redactor = redactor or Redactor.default()
        self.budget_settings = budget
        self.budget = CallBudget(budget.calls_per_minute, self.clock.monotonic())
        self.queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=budget.queue_size)
        self.windows: dict[tuple[str, str], _WindowState] = {}
        self.stats = ServiceStats()
        self.loaded = False
        self.accepting = True
        self._workers: list[asyncio.Task[None]] = []
        self._in_flight = 0
        self._admitted: OrderedDict[str, asyncio.Future[None] | None] = OrderedDict()
        # A verdict for an unknown item, or one that cannot be read, has no model or task
        # to be counted under.
        self.metrics.reviews.labels("", "", "unknown")
        self.metrics.reviews.labels("", "", "invalid")
        for t in tasks:
            model = self._model(t)
            self.metrics.init_task(model, t.name, t.alphas, t.client_outcomes)
            self.metrics.reliability_target.labels(model, t.name).set(t.settings.reliability_target)
            self.metrics.max_samples_per_item.labels(model, t.name).set(t.settings.k_max)

    # ------------------------------------------------------------------ windows

    @staticmethod
    def _model(task: TaskRuntime) -> str:
        """The ``model`` label: always the task's configured model, never a request's.

        A client-supplied model name is unbounded (one series per distinct value), so a
        request is counted under the model of the task it resolved to.
        """
        s = task.settings
        return s.endpoint.model or s.match.model or task.name

    def _state(self, model: str, task: TaskRuntime) -> _WindowState:
        key = (model, task.name)
        state = self.windows.get(key)
        if state is None:
            s = task.settings
            state = _WindowState(
                CalibrationWindow(
                    alphas=task.alphas,
                    max_items=s.window_size,
                    half_life_s=s.half_life_s,
                    min_inclusion_probability=s.review_floor,
                ),
                detector=EDetector(
                    tau=s.reliability_target, alpha=s.alarm_alpha, pi_min=s.review_floor
                ),
                aci=(
                    AdaptiveAlpha(task.target_alpha, s.aci_gamma)
                    if s.aci_gamma is not None
                    else None
                ),
            )
            self.windows[key] = state
        return state

    def snapshot(self, model: str, task_name: str, *, max_age_s: float = 0.0) -> WindowSnapshot:
        """The window's snapshot now (cached for ``max_age_s`` seconds)."""
        task = self.tasks[task_name]
        state = self._state(model, task)
        now = self.clock.time()
        if state.snapshot is None or now - state.snapshot_at > max_age_s:
            state.snapshot = state.window.snapshot(now)
            state.snapshot_at = now
        return state.snapshot

    def circuits_open(self) -> list[str]:
        """Tasks whose model client's circuit breaker is not closed (no items re-asked)."""
        return [
            name
            for name, task in self.tasks.items()
            if getattr(task.client, "circuit_state", "closed") != "closed"
        ]

    def publish(self) -> None:
        """Refresh every window's gauges (decay moves with time, not only with verdicts)
        and each task's ``relmon_circuit_open``."""
        self.metrics.budget_utilization.set(self.budget.utilization(self.clock.monotonic()))
        open_now = set(self.circuits_open())
        for name, task in self.tasks.items():
            self.metrics.circuit_open.labels(self._model(task), name).set(
                1.0 if name in open_now else 0.0
            )
        for (model, name), state in self.windows.items():
            snap = self.snapshot(model, name)
            self.metrics.publish(model, name, snap, self.tasks[name].alphas)
            self.metrics.review_queue_depth.labels(model, name).set(state.pending_reviews)

    async def load(self) -> int:
        """Rebuild the windows from the store; returns how many records were loaded."""
        records = await self.store.load_records()
        loaded = 0
        for r in records:
            task = self.tasks.get(r.task)
            if task is None:
                continue  # a task no longer configured
            state = self._state(r.model, task)
            added = state.window.add(
                r.item_id, r.score, r.inclusion_probability, r.sampled_at, order=r.order or None
            )
            loaded += added
            if added:
                self._update_alarm(state, r.score, r.inclusion_probability)
                if state.aci is not None and r.aci_miss is not None:
                    state.aci.update(r.aci_miss)
        recent = getattr(self.store, "recent_item_ids", None)
        if recent is not None:  # a restart recognises items it already reviewed
            for item_id in await recent(RECENT_ITEM_IDS):
                self._remember(item_id, None)
        pending = getattr(self.store, "pending_counts", None)
        if pending is not None:
            for (model, name), count in (await pending()).items():
                if name in self.tasks:
                    self._state(model, self.tasks[name]).pending_reviews = count
        self.loaded = True
        for (model, name), state in self.windows.items():
            self._publish_alarm(model, name, state)
        self.publish()
        log.info("windows_loaded", records=loaded, windows=len(self.windows))
        return loaded

    # ---------------------------------------------------------------- admission

    def resolve_task(self, event: TrafficEvent) -> TaskRuntime | None:
        if event.task is not None:
            return self.tasks.get(event.task)
        for task in self.tasks.values():
            m = task.settings.match
            if m.model is not None and m.model == event.model:
                return task
        return self._catch_all

    def resolve_task_name(
        self, headers: Mapping[str, str], path: str, body: Mapping[str, Any], header_name: str
    ) -> str | None:
        """Task for an HTTP request: header value, then path prefix, then model."""
        value = headers.get(header_name)
        for task in self.tasks.values():
            m = task.settings.match
            if value is not None and value in {m.header, task.name}:
                return task.name
        for task in self.tasks.values():
            m = task.settings.match
            if m.path_prefix is not None and path.startswith(m.path_prefix):
                return task.name
        model = body.get("model")
        for task in self.tasks.values():
            if task.settings.match.model is not None and task.settings.match.model == model:
                return task.name
        return None

    def _count(self, source: str, decision: str) -> None:
        self.metrics.traffic_events.labels(source, decision).inc()
        self.stats.by_decision[decision] += 1

    def reject(self, source: str, reason: str) -> None:
        """A malformed event a source could not parse (already dead-lettered by it)."""
        self._count(source, "rejected")
        log.warning("event_rejected", source=source, reason=reason)

    def reject_verdict(self, kind: str, reason: str) -> None:
        """A verdict a review backend refused before it reached :meth:`apply_verdict`
        (``invalid``: unreadable; ``unknown``: its review item never came)."""
        self.metrics.reviews.labels("", "", kind).inc()
        log.warning("verdict_rejected", kind=kind, reason=reason)

    def offer(self, event: TrafficEvent, source: str, *, wait: bool = False) -> Admission:
        """Admit or not; never blocks, never raises for a bad event.

        An item already admitted (same task and event id: a repeated ``X-Request-Id``, a
        Kafka re-delivery) or whose review item already exists is a ``duplicate`` and is
        not asked again. Without budget or queue room (or while stopping) a source that
        may ``wait`` gets ``busy`` (nothing counted: it offers the event again later,
        as Kafka does); any other source's event is ``dropped``.
        """
        task = self.resolve_task(event)
        if task is None or not sampled(task.name, event.id, task.settings.sampling_rate):
            self._count(source, "skipped")
            return Admission("skipped")
        item_id = f"{task.name}:{event.id}"
        if item_id in self._admitted or self._has_review_item(item_id):
            self._count(source, "duplicate")
            earlier = self._admitted.get(item_id)
            return Admission("duplicate", earlier if earlier and not earlier.done() else None)
        now = self.clock.monotonic()
        reserve = task.settings.k_max
        if not self.accepting or not self.budget.try_reserve(reserve, now):
            return self._no_room(source, wait)
        loop = asyncio.get_running_loop()
        job = _Job(event, task, source, self.clock.time(), reserve, loop.create_future())
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            self.budget.refund(reserve, now)
            return self._no_room(source, wait)
        self._remember(item_id, job.done)
        self._count(source, "sampled")
        return Admission("sampled", job.done)

    def _no_room(self, source: str, wait: bool) -> Admission:
        if wait:
            return Admission("busy")
        self._count(source, "dropped")
        return Admission("dropped")

    def _remember(self, item_id: str, done: asyncio.Future[None] | None) -> None:
        """Keep the id of an admitted item (the last ``RECENT_ITEM_IDS`` of them)."""
        admitted = self._admitted
        admitted[item_id] = done
        admitted.move_to_end(item_id)
        if len(admitted) > RECENT_ITEM_IDS:
            admitted.popitem(last=False)

    def _has_review_item(self, item_id: str) -> bool:
        has = getattr(self.store, "has_review_item", None)
        return bool(has(item_id)) if has is not None else False

    def note_review_item(self, item: ReviewItem) -> None:
        """A review item another replica published (read from the shared review log)."""
        task = self.tasks.get(item.task)
        if task is None:
            return
        state = self._state(item.model, task)
        state.pending_reviews += 1
        self.metrics.review_queue_depth.labels(item.model, item.task).set(state.pending_reviews)

    # ------------------------------------------------------------------ workers

    async def _sample(self, job: _Job) -> tuple[list[str], list[str]]:
        """The raw answers and their classes. With redaction before canonicalization
        (:meth:`Redactor.redacts_before`) the canonicalizer sees only redacted answers and
        a redacted query, so no secret reaches it, a judge model or a class."""
        task, event = job.task, job.event
        redact = self.redactor.redacts_before(task.canonicalizer)
        query = query_text(event.request)
        context = QueryContext(query=self.redactor.redact(query) if redact else query)
        answers: list[str] = []
        seen: list[str] = []  # what the canonicalizer is given
        redacted: dict[str, str] = {}
        classes: list[str] = []
        decision = task.rule.decide([])
        while not decision.stop:
            batch = await task.client.sample(event.request, decision.more)
            answers.extend(batch)
            seen.extend(self.redactor.redact_all(batch, redacted) if redact else batch)
            self.stats.calls += decision.more
            classes = await task.canonicalizer.canonicalize_many(seen, context)
            decision = task.rule.decide(Counter(classes).values())
        return answers, classes

    async def _process(self, job: _Job) -> None:
        task, event = job.task, job.event
        model = self._model(task)
        started = self.clock.monotonic()
        used = 0
        try:
            try:
                answers, classes = await self._sample(job)
            except asyncio.CancelledError:  # stopped before the item was finished
                self._interrupted(job)
                raise
            except (ModelCallError, InputError) as exc:
                self.stats.abandoned += 1
                self.metrics.items.labels(model, task.name, "abandoned").inc()
                log.warning(
                    "item_abandoned", item=event.id, task=task.name, model=model, error=str(exc)
                )
                return
            used = len(answers)
            rng = item_rng(self.seed, f"{task.name}\x00{event.id}")
            consensus = rank_classes(classes, rng)
            pi = task.review_probability(consensus)
            reviewed = bool(rng.random() < pi)
            snap = self.snapshot(model, task.name, max_age_s=1.0)
            sizes = {a: set_size(consensus, "rank", snap.thresholds[a]) for a in task.alphas}
            state = self._state(model, task)
            aci_threshold = None
            if state.aci_alpha is not None:  # the served set follows alpha_t
                aci_threshold = state.window.threshold_at(state.aci_alpha, self.clock.time())
                sizes[task.target_alpha] = set_size(consensus, "rank", aci_threshold)
            self.metrics.samples_per_item.labels(model, task.name).observe(consensus.k)
            self.metrics.set_size.labels(model, task.name).observe(sizes[task.target_alpha])
            self.metrics.items.labels(model, task.name, "scored").inc()
            self.metrics.item_duration.labels(model, task.name).observe(
                self.clock.monotonic() - started
            )
            self.stats.scored += 1
            if reviewed:
                thresholds = tuple((a, snap.thresholds[a]) for a in task.alphas)
                await self._route_to_review(
                    job, model, consensus, pi=pi, thresholds=thresholds, aci_threshold=aci_threshold
                )
            log.info(
                "item",
                item=event.id,
                task=task.name,
                model=model,
                source=job.source,
                query=(
                    query_text(event.request)
                    if self.log_prompts
                    else query_hash(event.request, self.query_hash_key)
                ),
                k=consensus.k,
                classes=len(consensus.classes),
                strength=round(consensus.strength, 3),
                margin=round(consensus.margin, 3),
                set_size=sizes[task.target_alpha],
                reviewed=reviewed,
                seconds=round(self.clock.monotonic() - started, 3),
                **({"answer": consensus.classes[0]} if self.log_prompts else {}),
            )
        finally:
            self.budget.settle(job.reserved, used, self.clock.monotonic())
            if not job.done.done():
                job.done.set_result(None)

    async def _route_to_review(
        self,
        job: _Job,
        model: str,
        consensus: Consensus,
        *,
        pi: float,
        thresholds: tuple[tuple[float, float], ...] = (),
        aci_threshold: float | None = None,
    ) -> None:
        task, event = job.task, job.event
        item = ReviewItem.from_consensus(
            item_id=f"{task.name}:{event.id}",
            model=model,
            task=task.name,
            query=self.redactor.redact(query_text(event.request)),
            consensus=self.redactor.redact_consensus(consensus),
            inclusion_probability=pi,
            sampled_at=job.sampled_at,
            thresholds=thresholds,
            aci_threshold=aci_threshold,
        )
        store: object = self.store
        if store is not self.review_queue:  # the SQLite store is both
            await self.store.save_review_item(item)
        if not await self._submit(item):
            # Not published: a later delivery of the same event must not count as a
            # duplicate of it.
            self._admitted.pop(item.item_id, None)
            discard = getattr(self.store, "discard_review_item", None)
            if discard is not None:
                discard(item.item_id)
            return
        self._state(model, task).pending_reviews += 1
        self.metrics.review_queue_depth.labels(model, task.name).set(
            self._state(model, task).pending_reviews
        )
        self.stats.reviewed += 1

    async def _submit(self, item: ReviewItem) -> bool:
        """Write ``item`` to the review queue, again after a failure (a broker
        re-electing its leader, a locked database); False once every attempt failed,
        which is counted and logged (without the item's text). The item stays scored
        once: it is not re-asked."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.review_queue.submit(item)
                return True
            except Exception as exc:  # any failure of the queue's backend
                error = f"{type(exc).__name__}: {exc}"
                if attempt == REVIEW_SUBMIT_ATTEMPTS:
                    self.metrics.review_submit_failures.labels(item.model, item.task).inc()
                    log.error(
                        "review_item_not_written",
                        item=item.item_id,
                        model=item.model,
                        task=item.task,
                        attempts=attempt,
                        error=error,
                    )
                    return False
                log.warning(
                    "review_item_write_retry",
                    item=item.item_id,
                    model=item.model,
                    task=item.task,
                    attempt=attempt,
                    error=error,
                )
                await asyncio.sleep(REVIEW_SUBMIT_BACKOFF_S * 2 ** (attempt - 1))

    async def _worker(self) -> None:
        while True:
            job = await self.queue.get()
            self._in_flight += 1
            try:
                await self._process(job)
            except Exception:  # one item's failure must not stop the worker
                log.exception("item_failed", item=job.event.id, task=job.task.name)
                if not job.done.done():
                    job.done.set_result(None)
            finally:
                self._in_flight -= 1
                self.queue.task_done()

    def start(self) -> None:
        if not self._workers:
            self._workers = [
                asyncio.create_task(self._worker(), name=f"relmon-worker-{i}")
                for i in range(self.budget_settings.max_in_flight)
            ]

    async def drain(self) -> None:
        """Wait until every admitted item is handled."""
        await self.queue.join()

    async def stop(self, timeout_s: float) -> bool:
        """Stop admitting, finish in-flight items within ``timeout_s``; True if drained.

        Items not finished are counted as ``relmon_items_total{outcome="interrupted"}``;
        those never started keep their ``done`` unresolved, so a Kafka source does not
        commit them and they are delivered again after a restart.
        """
        self.accepting = False
        drained = True
        try:
            await asyncio.wait_for(self.queue.join(), timeout_s)
        except TimeoutError:
            drained = False
        for w in self._workers:
            w.cancel()
        for w in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await w
        self._workers = []
        while not self.queue.empty():  # admitted, never started: counted, not dropped
            job = self.queue.get_nowait()
            self._interrupted(job)
            self.budget.refund(job.reserved, self.clock.monotonic())
            self.queue.task_done()
        return drained

    def _interrupted(self, job: _Job) -> None:
        model = self._model(job.task)
        self.metrics.items.labels(model, job.task.name, "interrupted").inc()
        self.stats.interrupted += 1
        log.warning("item_interrupted", item=job.event.id, task=job.task.name, model=model)

    # ----------------------------------------------------------------- verdicts

    async def apply_verdict(self, verdict: Verdict) -> VerdictOutcome:
        item = await self.store.get_review_item(verdict.item_id)
        if item is None or item.task not in self.tasks:
            self.metrics.reviews.labels("", "", "unknown").inc()
            return VerdictOutcome("unknown", reason="no such review item")
        task = self.tasks[item.task]
        if any(r > len(item.candidates) for r in verdict.accepted_ranks):
            self.metrics.reviews.labels(item.model, item.task, "invalid").inc()
            return VerdictOutcome("invalid", reason="accepted rank beyond the candidates")
        score = verdict_score(
            item,
            verdict,
            self.redactor.for_verdicts(task.sync_canonicalizer),
            QueryContext(query=item.query),
        )
        record = CalibrationRecord(
            model=item.model,
            task=item.task,
            item_id=item.item_id,
            score=score,
            inclusion_probability=item.inclusion_probability,
            sampled_at=item.sampled_at,
            aci_miss=aci_miss(item, score),
        )
        state = self._state(item.model, task)
        order = await self.store.save_record(record, verdict)
        if order is None or item.item_id in state.window:
            # The item keeps its first verdict: answer with the score that one gave.
            stored = await self.store.get_record(item.item_id)
            self.metrics.reviews.labels(item.model, item.task, "duplicate").inc()
            return VerdictOutcome("duplicate", score=score if stored is None else stored.score)
        state.window.add(
            item.item_id, score, item.inclusion_probability, item.sampled_at, order=order
        )
        state.pending_reviews = max(0, state.pending_reviews - 1)
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
        # ACI: one step per applied verdict, kept as counts (the same at a restart,
        # which replays the stored aci_miss, whatever order the verdicts came in).
        if state.aci is not None and record.aci_miss is not None:
            state.aci.update(record.aci_miss)
        self._update_alarm(state, score, item.inclusion_probability)
        self._publish_alarm(item.model, item.task, state)
        self.stats.verdicts += 1
        state.snapshot = None
        self.metrics.publish(
            item.model, item.task, self.snapshot(item.model, item.task), task.alphas
        )
        self.metrics.review_queue_depth.labels(item.model, item.task).set(state.pending_reviews)
        return VerdictOutcome("applied", score=score)

    def review_progress(self) -> list[TaskProgress]:
        """Each configured task's calibration state against what its target needs."""
        out = []
        for task in self.tasks.values():
            model = self._model(task)
            snap = self.snapshot(model, task.name, max_age_s=1.0)
            out.append(
                TaskProgress(
                    model=model,
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
    def _update_alarm(state: _WindowState, score: float, pi: float) -> None:
        if state.detector is None:
            return
        try:
            state.detector.update(score <= 1.0, pi)
        except ValueError:
            # A record reviewed under an older, lower floor: it cannot be weighted
            # validly against the current floor, so it does not enter the alarm.
            return

    def _publish_alarm(self, model: str, task: str, state: _WindowState) -> None:
        if state.detector is None:
            return
        self.metrics.reliability_alarm_evalue.labels(model, task).set(state.detector.value)
        self.metrics.reliability_alarm.labels(model, task).set(1.0 if state.detector.alarm else 0.0)

    def aci_alpha(self, model: str, task_name: str) -> float | None:
        """The adaptive alpha_t served for the target's sets (None when ACI is off).

        A function of the applied verdicts' ACI steps (:attr:`CalibrationRecord.aci_miss`),
        not of their order: a restart, which replays the stored records, restores it.
        """
        return self._state(model, self.tasks[task_name]).aci_alpha

    @property
    def in_flight(self) -> int:
        return self._in_flight + self.queue.qsize()
