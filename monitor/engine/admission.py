"""Admission: which task an event belongs to, whether it is sampled, and whether there
is budget and queue room for it, decided at once (a source never waits on relmon).

An event is ``skipped`` (no task, or not hash-sampled), a ``duplicate`` (its item was
admitted before, or its review item exists), ``sampled`` (queued for a worker), or,
without room, ``dropped`` (mirror, proxy) or ``busy`` (a source that may wait: Kafka).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from monitor.core.events import TrafficEvent
from monitor.core.sampler import CallBudget, sampled
from monitor.engine.metrics import Metrics
from monitor.engine.ports import Admission, CalibrationStore, Clock
from monitor.engine.runtime import Job, ServiceStats, TaskRuntime, item_id

__all__ = ["RECENT_ITEM_IDS", "AdmissionControl", "HeaderTaskResolver", "TaskRouter"]

log = structlog.get_logger("relmon")

RECENT_ITEM_IDS = 100_000
"""How many admitted item ids are remembered to recognise a repeated event."""


class TaskRouter:
    """The task of an event: named in it, else by its model, else the catch-all task
    (the first with no match condition)."""

    def __init__(self, tasks: Mapping[str, TaskRuntime]) -> None:
        self.tasks = tasks
        # Computed once: resolve runs for every offered event.
        self._catch_all = next(
            (
                t
                for t in tasks.values()
                if t.settings.match.model is None
                and t.settings.match.header is None
                and t.settings.match.path_prefix is None
            ),
            None,
        )
        # The tasks an event whose task follows from its model may get: those matched by
        # model, and the catch-all one; their (name, sampling rate), read by
        # skip_unsampled_any_model for every such event.
        candidates = [t for t in tasks.values() if t.settings.match.model is not None]
        if self._catch_all is not None:
            candidates.append(self._catch_all)
        self.candidate_rates = [(t.name, t.settings.sampling_rate) for t in candidates]
        # The match rules as lookups, the first task in order winning each.
        self._by_header: dict[str, str] = {}
        self._by_model: dict[str, TaskRuntime] = {}
        for t in tasks.values():
            m = t.settings.match
            for value in (m.header, t.name):
                if value is not None:
                    self._by_header.setdefault(value, t.name)
            if m.model is not None:
                self._by_model.setdefault(m.model, t)
        self._by_prefix = [
            (t.settings.match.path_prefix, t.name)
            for t in tasks.values()
            if t.settings.match.path_prefix is not None
        ]

    def resolve(self, event: TrafficEvent) -> TaskRuntime | None:
        return self.resolve_fields(event.task, event.model)

    def resolve_fields(self, task_name: str | None, model: str | None) -> TaskRuntime | None:
        """The task of an event with these fields (before the whole event is parsed)."""
        if task_name is not None:
            return self.tasks.get(task_name)
        task = self._by_model.get(model) if model is not None else None
        return task if task is not None else self._catch_all

    def resolve_name(
        self, headers: Mapping[str, str], path: str, body: Mapping[str, Any], header_name: str
    ) -> str | None:
        """Task for an HTTP request: header value, then path prefix, then model."""
        value = headers.get(header_name)
        if value is not None:
            name = self._by_header.get(value)
            if name is not None:
                return name
        for prefix, name in self._by_prefix:
            if path.startswith(prefix):
                return name
        model = body.get("model")
        task = self._by_model.get(model) if isinstance(model, str) else None
        return task.name if task is not None else None


class HeaderTaskResolver:
    """``(headers, path, body) -> task name``, for the traffic port:
    :meth:`TaskRouter.resolve_name` with the task header's name bound (one compiled call
    per request, where a ``functools.partial`` built keyword arguments every time)."""

    def __init__(self, router: TaskRouter, header_name: str) -> None:
        self.router = router
        self.header_name = header_name

    def __call__(
        self, headers: Mapping[str, str], path: str, body: Mapping[str, Any]
    ) -> str | None:
        return self.router.resolve_name(headers, path, body, self.header_name)


class AdmissionControl:
    """Decides :meth:`offer` and counts every decision."""

    def __init__(
        self,
        router: TaskRouter,
        *,
        store: CalibrationStore,
        metrics: Metrics,
        clock: Clock,
        budget: CallBudget,
        queue: asyncio.Queue[Job],
        stats: ServiceStats,
    ) -> None:
        self.router = router
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.budget = budget
        self.queue = queue
        self.stats = stats
        self.accepting = True
        self._admitted: OrderedDict[str, asyncio.Future[None] | None] = OrderedDict()

    def count(self, source: str, decision: str) -> None:
        self.metrics.traffic_events.add(source, decision)  # plain ints: no lock, no labels()
        self.stats.by_decision[decision] += 1

    def reject(self, source: str, reason: str) -> None:
        """A malformed event a source could not parse (already dead-lettered by it)."""
        self.count(source, "rejected")
        log.warning("event_rejected", source=source, reason=reason)

    def offer(self, event: TrafficEvent, source: str, *, wait: bool = False) -> Admission:
        """Admit or not; never blocks, never raises for a bad event (see the module)."""
        task = self.router.resolve(event)
        if task is None or not sampled(task.name, event.id, task.settings.sampling_rate):
            self.count(source, "skipped")
            return Admission("skipped")
        key = item_id(task.name, event.id)
        if key in self._admitted or self.store.has_review_item(key):
            self.count(source, "duplicate")
            earlier = self._admitted.get(key)
            return Admission("duplicate", earlier if earlier and not earlier.done() else None)
        now = self.clock.monotonic()
        reserve = task.settings.k_max
        if not self.accepting or not self.budget.try_reserve(reserve, now):
            return self._no_room(source, wait)
        loop = asyncio.get_running_loop()
        job = Job(event, task, source, self.clock.time(), reserve, loop.create_future())
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            self.budget.refund(reserve, now)
            return self._no_room(source, wait)
        self.remember(key, job.done)
        self.count(source, "sampled")
        return Admission("sampled", job.done)

    def skip_unsampled(
        self, source: str, task_name: str | None, model: str | None, event_id: str
    ) -> bool:
        """True, counting the event ``skipped``, when :meth:`offer` would skip it: a
        source's fast path, deciding from a few fields before it parses the whole event.
        False: the source parses the event and offers it (which decides again)."""
        task = self.router.resolve_fields(task_name, model)
        if task is not None and sampled(task.name, event_id, task.settings.sampling_rate):
            return False
        self.count(source, "skipped")
        return True

    def skip_unsampled_any_model(self, source: str, event_id: str) -> bool:
        """:meth:`skip_unsampled` for an event whose task follows from its model, not yet
        read: True (counted ``skipped``) when it would be skipped whatever the model,
        that is, not sampled by any task a model can select (those matched by model,
        and the catch-all task)."""
        for name, rate in self.router.candidate_rates:
            if sampled(name, event_id, rate):
                return False
        self.count(source, "skipped")
        return True

    def skip_by_head(self, source: str, task_name: str | None, event_id: str) -> bool:
        """The traffic port's fast path, decided from a request's head: by its task when
        the head names one, else whatever its model (:meth:`skip_unsampled_any_model`)."""
        if task_name is not None:
            return self.skip_unsampled(source, task_name, None, event_id)
        return self.skip_unsampled_any_model(source, event_id)

    def _no_room(self, source: str, wait: bool) -> Admission:
        if wait:
            return Admission("busy")
        self.count(source, "dropped")
        return Admission("dropped")

    def remember(self, key: str, done: asyncio.Future[None] | None) -> None:
        """Keep the item id of an admitted item (the last ``RECENT_ITEM_IDS`` of them)."""
        admitted = self._admitted
        admitted[key] = done
        admitted.move_to_end(key)
        if len(admitted) > RECENT_ITEM_IDS:
            admitted.popitem(last=False)

    def forget(self, key: str) -> None:
        """An item whose review item was not published: a later delivery of the same
        event must not count as a duplicate of it."""
        self._admitted.pop(key, None)

    def remember_all(self, keys: Sequence[str]) -> None:
        """Item ids handled before a restart (recognised as duplicates)."""
        for key in keys:
            self.remember(key, None)
