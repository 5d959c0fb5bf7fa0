"""The workers: each takes an admitted job, re-asks the model in batches chosen by the
stopping rule, canonicalizes and ranks the answers, serves the prediction sets from the
current thresholds, and with the item's inclusion probability sends it to review.

An item whose model calls fail is abandoned and counted, never scored on partial data;
an item a stop interrupts is counted as interrupted. Every item settles its reserved
budget with the calls it used and resolves its ``done`` future.

**The served answer** (the event's ``response_text``: what production answered) goes
through the same redaction and canonicalization as the re-asks' answers. When the
re-ask is the production request unchanged (no field dropped, raised or set, none its
span did not record, the same model), it is a draw of the same distribution: the first
one, which the stopping rule sees, so the re-asks make one draw fewer (the budget
settles the calls made, not the draws). Otherwise its class is only offered for
review, outside the ranking.

**The segment** of an item of a task with ``segments`` is fixed once the item is ranked,
before its inclusion probability is decided
(:func:`monitor.engine.segments.segment_label`, the task's own label table): a segment
short of ``segments.min_reviews_per_hour`` gets a raised inclusion probability
(:mod:`monitor.engine.review_minimum`), which the review item stores for its 1/π weight.
The label goes with the review item to its verdict's calibration record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import replace

import structlog

from monitor.core.apis.base import Route, WireApi
from monitor.core.apis.registry import carried
from monitor.core.canon.base import QueryContext, per_answer
from monitor.core.certify import item_rng
from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import InputError, ModelCallError, StoreError
from monitor.core.events import query_hash, query_text
from monitor.core.reask import CHANGED, UNRECORDED, reask_request, with_unrecorded
from monitor.core.redaction import Redactor
from monitor.core.sampler import CallBudget
from monitor.core.scores import set_size
from monitor.engine.calibration import Calibration
from monitor.engine.judged import ask_judge
from monitor.engine.logs import ThrottledLog
from monitor.engine.metrics import Metrics
from monitor.engine.ports import Clock, Judgement, ModelClient
from monitor.engine.reviews import ReviewRouter
from monitor.engine.runtime import Job, ServiceStats, TaskRuntime, item_seed_key
from monitor.engine.segments import segment_label

__all__ = ["WorkerPool"]

log = structlog.get_logger("relmon")
_throttled = ThrottledLog()
"""The lines a client's request or an endpoint's outage can trigger for every item (an
item abandoned, a judge call failed): at most one per task and cause per interval."""


async def _yield() -> None:
    """Let the event loop serve what came in meanwhile (live requests, with the traffic
    listener inline) between two steps of an item: each step's code runs cold, about ten
    times as long as hot, and a whole item's end at once held the requests in flight
    for some 0.4 ms."""
    await asyncio.sleep(0)


class WorkerPool:
    """``max_in_flight`` workers on one bounded queue.

    With ``pace`` (``budget.pace``) items start no faster than the budget refills the
    fewest calls each can use (:attr:`TaskRuntime.fewest_calls`, 6 calls = 0.6 s at the
    default 600 calls/min). Every item uses at least that many, so in the long run this
    never binds; after a lull it spreads the items a refilled budget admits at once,
    which otherwise all run in the first seconds, beside the live requests on the same
    event loop and against the same model server. A stop lets the waiting items start
    at once.
    """

    def __init__(
        self,
        queue: asyncio.Queue[Job],
        *,
        size: int,
        calibration: Calibration,
        reviews: ReviewRouter,
        metrics: Metrics,
        clock: Clock,
        budget: CallBudget,
        stats: ServiceStats,
        redactor: Redactor,
        seed: int,
        log_prompts: bool,
        query_hash_key: bytes,
        pace: bool = True,
    ) -> None:
        self.queue = queue
        self.size = size
        self.calibration = calibration
        self.reviews = reviews
        self.metrics = metrics
        self.clock = clock
        self.budget = budget
        self.stats = stats
        self.redactor = redactor
        self.seed = seed
        self.log_prompts = log_prompts
        self.query_hash_key = query_hash_key
        self.busy = 0
        """Jobs a worker is handling now."""
        self._workers: list[asyncio.Task[None]] = []
        self.pace = pace
        self._next_start = 0.0
        """The event loop's time at which the next item may start (``pace``)."""
        self._hurry = asyncio.Event()
        """Set by a stop: no more pacing."""
        self._pacing = 0
        """Workers waiting for their item's turn."""

    @property
    def in_flight(self) -> int:
        """Admitted items not finished: being handled or queued."""
        return self.busy + self.queue.qsize()

    @property
    def waiting(self) -> int:
        """Admitted items not started: queued, or taken by a worker and waiting for their
        turn (``pace``)."""
        return self.queue.qsize() + self._pacing

    def start(self) -> None:
        if not self._workers:
            self._workers = [
                asyncio.create_task(self._worker(), name=f"relmon-worker-{i}")
                for i in range(self.size)
            ]

    async def drain(self) -> None:
        """Wait until every admitted item is handled."""
        await self.queue.join()

    async def stop(self, timeout_s: float) -> bool:
        """Finish in-flight items within ``timeout_s``; True if drained.

        Items not finished are counted as ``relmon_items_total{outcome="interrupted"}``;
        those never started keep their ``done`` unresolved, so a Kafka source does not
        commit them and they are delivered again after a restart.
        """
        drained = True
        self._hurry.set()  # the admitted items start now, to finish within the timeout
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

    async def _worker(self) -> None:
        while True:
            job = await self.queue.get()
            self.busy += 1
            try:
                await self._paced(job.task)
                await self._process(job)
            except Exception:  # one item's failure must not stop the worker
                log.exception("item_failed", item=job.item_id, task=job.task.name)
                if not job.done.done():
                    job.done.set_result(None)
            finally:
                self.busy -= 1
                self.queue.task_done()

    async def _paced(self, task: TaskRuntime) -> None:
        """Wait for this item's turn to start (the class's ``pace``)."""
        if not self.pace or self._hurry.is_set():
            return
        now = asyncio.get_running_loop().time()
        start = max(now, self._next_start)
        self._next_start = start + task.fewest_calls / self.budget.rate
        if start > now:
            self._pacing += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), start - now)
            finally:
                self._pacing -= 1

    def _interrupted(self, job: Job) -> None:
        model = job.task.model
        self.metrics.items.labels(model, job.task.name, "interrupted").inc()
        self.stats.interrupted += 1
        log.warning("item_interrupted", item=job.item_id, task=job.task.name, model=model)

    async def _sample(self, job: Job) -> tuple[int, list[str]]:
        """The model calls made and the classes of the item's draws (the served answer
        first when it is one: :func:`served_is_draw`). With redaction before
        canonicalization (:meth:`Redactor.redacts_before`) the canonicalizer sees only
        redacted answers and a redacted query, so no secret reaches it, a judge model or
        a class. Sets ``job.served``: the served answer's class, if any."""
        task, event = job.task, job.event
        api = task.api(event)
        redact = self.redactor.redacts_before(task.canonicalizer)
        query = api.query(event.request)
        context = QueryContext(query=self.redactor.redact(query) if redact else query)
        calls = 0
        seen: list[str] = []  # what the canonicalizer is given
        redacted: dict[str, str] = {}
        classes: list[str] = []
        canon = task.canonicalizer
        incremental = per_answer(canon)
        reask = reask_request(event.request, task.reask, api.rules)
        route = carried(
            api.route(event.request, event.path, task.settings.endpoint.model), event.headers
        )
        job.reask_changes = with_unrecorded(reask.changes, event.unrecorded)
        overrides = self.metrics.reask_overrides
        for name in reask.changes:
            overrides.labels(task.model, task.name, name, CHANGED).inc()
        for name in event.unrecorded:
            overrides.labels(task.model, task.name, name, UNRECORDED).inc()
        served = event.response_text
        drawn = served is not None and served_is_draw(job, api, route)
        if drawn and served is not None:
            seen.append(self.redactor.redact_all([served], redacted)[0] if redact else served)
            classes = await canon.canonicalize_many(seen, context)
        decision = task.rule.decide(Counter(classes).values())
        while not decision.stop:
            batch = await task.client.sample(reask.body, decision.more, api=api, route=route)
            calls += len(batch)
            seen.extend(self.redactor.redact_all(batch, redacted) if redact else batch)
            self.stats.calls += decision.more
            await _yield()
            if incremental:  # the earlier answers' classes cannot change
                classes += await canon.canonicalize_many(seen[len(classes) :], context)
            else:  # a joint grouping: every answer again
                classes = await canon.canonicalize_many(seen, context)
            decision = task.rule.decide(Counter(classes).values())
            await _yield()
        job.served_drawn = drawn
        if drawn:
            job.served = classes[0]
        elif served is not None:
            answer = self.redactor.redact_all([served], redacted)[0] if redact else served
            job.served = await _served_class(
                job, answer, seen=seen, classes=classes, context=context
            )
        return calls, classes

    async def _process(self, job: Job) -> None:
        task, event = job.task, job.event
        model = task.model
        started = self.clock.monotonic()
        used = 0
        try:
            try:
                used, classes = await self._sample(job)
            except asyncio.CancelledError:  # stopped before the item was finished
                self._interrupted(job)
                raise
            except (ModelCallError, InputError) as exc:
                self.stats.abandoned += 1
                self.metrics.items.labels(model, task.name, "abandoned").inc()
                _throttled.warning(
                    "item_abandoned",
                    key=(task.name, type(exc).__name__),
                    item=job.item_id,
                    task=task.name,
                    model=model,
                    error=str(exc),
                )
                return
            rng = item_rng(self.seed, item_seed_key(task.name, event.id))
            consensus = rank_classes(classes, rng)
            pi = self._inclusion_probability(job, consensus)
            reviewed = bool(rng.random() < pi)
            if task.judge is not None:
                await self._judge(job, task.judge, consensus)
            await _yield()
            set_size_served = await self._score(job, consensus, pi, reviewed, started)
            await _yield()
            self._log_item(job, consensus, set_size_served, reviewed, started)
        finally:
            self.budget.settle(job.reserved, used, self.clock.monotonic())
            if not job.done.done():
                job.done.set_result(None)

    def _inclusion_probability(self, job: Job, consensus: Consensus) -> float:
        """Fix the item's segment label (``job.segment``) and return its inclusion
        probability: the task's, raised for a segment short of its minimum review rate
        (``segments.min_reviews_per_hour``). It depends on the ranking and the segment's
        earlier traffic only, never on a draw or a verdict, so the 1/pi weights stay
        right."""
        task = job.task
        pi = task.inclusion_probability(consensus)
        segments = task.segments
        job.segment = segment_label(
            segments, job.event, lambda: task.api(job.event).query(job.event.request)
        )
        if segments is None or job.segment is None:
            return pi
        return segments.reviews.inclusion_probability(job.segment, pi, self.clock.monotonic())

    async def _judge(self, job: Job, judge: ModelClient, consensus: Consensus) -> None:
        """The judge's label of the item's top answer (``tasks[].judge``), stored and
        kept for the prediction-powered level. The judge sees the redacted query and
        answer, as a reviewer does; a failed call or an unusable reply is counted, the
        item goes on without a label."""
        task = job.task
        counts = self.metrics.judge_labels
        query = self.redactor.redact(task.api(job.event).query(job.event.request))
        answer = self.redactor.redact(consensus.classes[0]) if consensus.classes else ""
        try:
            label = await ask_judge(judge, task.judge_template, query, answer)
        except ModelCallError as exc:
            counts.labels(task.model, task.name, "error").inc()
            _throttled.warning(
                "judge_failed", key=task.name, item=job.item_id, task=task.name, error=str(exc)
            )
            return
        if label is None:
            counts.labels(task.model, task.name, "unusable").inc()
            return
        counts.labels(task.model, task.name, "acceptable" if label else "not_acceptable").inc()
        judgement = Judgement(job.item_id, task.model, task.name, job.sampled_at, label)
        try:
            seq = await self.calibration.store.save_judgement(judgement)
        except StoreError as exc:  # the label is lost, the item goes on
            log.warning("judgement_not_stored", item=job.item_id, error=str(exc))
            return
        self.calibration.judged_here(replace(judgement, seq=seq))

    async def _score(
        self, job: Job, consensus: Consensus, pi: float, reviewed: bool, started: float
    ) -> float:
        """Serve the sets, count the item, and route it to review if drawn; returns the
        size of the set served at the task's target."""
        task = job.task
        model = task.model
        snap = self.calibration.snapshot(model, task.name, max_age_s=1.0)
        sizes = {a: set_size(consensus, "rank", snap.thresholds[a]) for a in task.alphas}
        state = self.calibration.state(model, task)
        aci_threshold = None
        if state.aci_alpha is not None:  # the served set follows alpha_t
            aci_threshold = state.window.threshold_at(state.aci_alpha, self.clock.time())
            sizes[task.target_alpha] = set_size(consensus, "rank", aci_threshold)
        self.metrics.samples_per_item.labels(model, task.name).observe(consensus.k)
        if job.served is not None:
            self.metrics.served.count(model, task.name, top=job.served == consensus.mode)
        self.metrics.set_size.labels(model, task.name).observe(sizes[task.target_alpha])
        self.metrics.items.labels(model, task.name, "scored").inc()
        self.metrics.item_duration.labels(model, task.name).observe(
            self.clock.monotonic() - started
        )
        self.stats.scored += 1
        if reviewed:
            item = self.reviews.review_item(
                job,
                consensus,
                inclusion_probability=pi,
                thresholds=tuple((a, snap.thresholds[a]) for a in task.alphas),
                aci_threshold=aci_threshold,
            )
            if await self.reviews.route(item):
                self.stats.reviewed += 1
        return sizes[task.target_alpha]

    def _log_item(
        self,
        job: Job,
        consensus: Consensus,
        set_size_served: float,
        reviewed: bool,
        started: float,
    ) -> None:
        """The one summary line of an item: ids and a keyed hash of the query, never its
        text unless ``log_prompts``."""
        task, event = job.task, job.event
        log.info(
            "item",
            item=job.item_id,
            task=task.name,
            model=task.model,
            source=job.source,
            api=event.api,
            query=(
                query_text(event.request, task.api(event))
                if self.log_prompts
                else query_hash(query_text(event.request, task.api(event)), self.query_hash_key)
            ),
            k=consensus.k,
            classes=len(consensus.classes),
            strength=round(consensus.strength, 3),
            margin=round(consensus.margin, 3),
            set_size=set_size_served,
            reviewed=reviewed,
            served=(
                None if job.served is None else "top" if job.served == consensus.mode else "other"
            ),
            served_drawn=job.served_drawn,
            seconds=round(self.clock.monotonic() - started, 3),
            **({"answer": consensus.classes[0]} if self.log_prompts else {}),
        )


def served_is_draw(job: Job, api: WireApi, route: Route) -> bool:
    """Whether the served answer is one of the item's draws: the re-ask is the production
    request unchanged (no field dropped, raised or set; relmon's own ``n`` and ``stream``
    aside; none its span did not record) and goes to the model production asked (a
    task's ``endpoint.model`` that differs shows in the changes, or, where the model is in
    the path, in the route)."""
    if job.event.response_text is None or job.reask_changes or job.event.unrecorded:
        return False
    model = job.task.settings.endpoint.model
    if model is None or api.rules.model is not None:
        return True
    try:
        production = api.route(job.event.request, job.event.path, None)
    except InputError:  # no model of its own: only the task's
        return False
    return production.path == route.path


async def _served_class(
    job: Job, answer: str, *, seen: list[str], classes: list[str], context: QueryContext
) -> str | None:
    """The class of a served answer that is not a draw (``answer``, redacted if the draws
    were). A joint canonicalizer groups it with the draws (their classes stay as ranked):
    the class of the first draw grouped with it, else its own. None (logged) when it
    cannot be canonicalized: the item goes on without a served answer."""
    canon = job.task.canonicalizer
    try:
        if per_answer(canon):
            return (await canon.canonicalize_many([answer], context))[0]
        joint = await canon.canonicalize_many([*seen, answer], context)
    except (ModelCallError, InputError) as exc:
        _throttled.warning(
            "served_answer_not_canonicalized",
            key=job.task.name,
            item=job.item_id,
            task=job.task.name,
            error=str(exc),
        )
        return None
    mates = [c for c, j in zip(classes, joint, strict=False) if j == joint[-1]]
    return mates[0] if mates else joint[-1]
