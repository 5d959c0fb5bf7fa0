"""Admission: which task an event belongs to, whether it is sampled, and whether there
is budget and queue room for it, decided at once (a source never waits on relmon).

An event is ``skipped`` (no task, or not hash-sampled), a ``duplicate`` (its item was
admitted before, or its review item exists), ``sampled`` (queued for a worker), or,
without room, ``dropped`` (mirror, proxy) or ``busy`` (a source that may wait: Kafka).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from monitor.core.apis.generic import GenericApi
from monitor.core.apis.paths import UNSAFE_PATH
from monitor.core.apis.registry import DEFAULT_API, path_refused
from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent
from monitor.core.reask import TOOLS_UNRECORDED
from monitor.core.sampler import CallBudget, SampleKey, sampled
from monitor.engine.logs import ThrottledLog
from monitor.engine.metrics import UNMONITORED, Metrics
from monitor.engine.ports import Admission, CalibrationStore, Clock
from monitor.engine.routing import TaskRouter
from monitor.engine.runtime import Job, ServiceStats, TaskRuntime, item_id

__all__ = ["HEAD_COUNTED", "RECENT_ITEM_IDS", "AdmissionControl"]

_throttled = ThrottledLog()
"""The lines a client's requests trigger (a rejection, a request not re-asked):
rate-limited per reason, with the count held back."""

HEAD_COUNTED: Final = ("mirror", "proxy")
"""Sources whose requests the traffic port counts by API from their head (every other
source's events are counted by API when offered or skipped by its fast path)."""
RECENT_ITEM_IDS = 100_000
"""How many admitted item ids are remembered to recognise a repeated event."""


class AdmissionControl:
    """Decides :meth:`offer` and counts every decision."""

    def __init__(
        self,
        router: TaskRouter[TaskRuntime],
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
        # Held here: the fast path counts most requests, and these are two lookups less.
        self._events = metrics.traffic_events
        self._requests = metrics.traffic_requests
        self._by_decision = stats.by_decision
        self.accepting = True
        self._admitted: OrderedDict[str, asyncio.Future[None] | None] = OrderedDict()

    def count(self, source: str, decision: str) -> None:
        self._events.add(source, decision, 1)  # plain ints: no lock, no labels()
        by_decision = self._by_decision
        by_decision[decision] = by_decision.get(decision, 0) + 1

    def count_api(self, source: str, api: str, n: int = 1) -> None:
        """``n`` requests or events of ``source`` in wire API ``api`` (``unmonitored``:
        relayed, but no API relmon reads; also counted as that decision)."""
        self._requests.add(source, api, n)
        if api == UNMONITORED:
            self.count_many(source, UNMONITORED, n)

    def reject(self, source: str, reason: str) -> None:
        """A malformed event a source could not parse (already dead-lettered by it)."""
        self.count(source, "rejected")
        _throttled.warning("event_rejected", key=(source, reason), source=source, reason=reason)

    def offer(self, event: TrafficEvent, source: str, *, wait: bool = False) -> Admission:
        """Admit or not; never blocks, never raises for a bad event (see the module)."""
        if source not in HEAD_COUNTED:  # the traffic port counted it by its path already
            self._requests.add(source, event.api, 1)
        task = self.router.resolve(event)
        by = event.id if event.draw is None else event.draw  # the sampling key
        if task is None or not sampled(task.name, by, task.settings.sampling_rate):
            self.count(source, "skipped")
            return Admission("skipped")
        key = item_id(task.name, event.id)
        if key in self._admitted or self.store.has_review_item(key):
            self.count(source, "duplicate")
            earlier = self._admitted.get(key)
            return Admission("duplicate", earlier if earlier and not earlier.done() else None)
        refused = self._not_reasked(event, task, source)
        if refused is not None:
            return refused
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

    def _not_reasked(self, event: TrafficEvent, task: TaskRuntime, source: str) -> Admission | None:
        """A sampled event whose API the task cannot re-ask in, or that its task's API
        refuses (a generic ``query_path`` that finds no text, a Gemini model name that is
        not one path segment, no model at all): rejected; one that must not
        be re-asked (``not_reasked``, by reason: a target a client shaped to go
        elsewhere, :func:`~monitor.core.apis.paths.unsafe_path`, or, generic, a path
        outside the task's ``match.path_prefix``; a conversation, a provider-run tool; a
        span's tool-call answer to tools it did not record); None: it may be."""
        try:
            api = task.api(event)
            if isinstance(api, GenericApi):  # its rules are its task's: checked here
                api.check_request(event.request)
            refused = path_refused(api, event.path)
            if not refused:  # a model the API's path cannot hold: refused here, not later
                api.route(event.request, event.path, task.settings.endpoint.model)
        except InputError as exc:  # counted by the source, which rejects it its way
            return Admission("rejected", reason=str(exc))
        if refused:
            reason: str | None = UNSAFE_PATH
        else:
            reason = api.not_reasked(event.request, task.server_tools)
        if reason is None and event.served_tool_call and "tools" in event.unrecorded:
            reason = TOOLS_UNRECORDED
        if reason is None:
            return None
        self.count(source, "not_reasked")
        self.metrics.not_reasked.labels(task.model, task.name, reason).inc()
        _throttled.info(
            "event_not_reasked",
            key=(task.name, reason),
            source=source,
            task=task.name,
            api=api.name,
            reason=reason,
        )
        return Admission("not_reasked")

    def skip_unsampled(
        self, source: str, task_name: str | None, model: str | None, event_id: str
    ) -> bool:
        """True, counting the event ``skipped``, when :meth:`offer` would skip it: a
        source's fast path, deciding from a few fields before it parses the whole event.
        False: the source parses the event and offers it (which decides again)."""
        if not self.router.unsampled(task_name, model, event_id):
            return False
        self._requests.add(source, DEFAULT_API, 1)  # the fast path reads chat events only
        self.count(source, "skipped")
        return True

    def skip_unsampled_any_model(self, source: str, event_id: str) -> bool:
        """:meth:`skip_unsampled` for an event whose task follows from its model, not yet
        read: True (counted ``skipped``) when it would be skipped whatever the model
        (:meth:`TaskRouter.unsampled_any_model`)."""
        if not self.router.unsampled_any_model(event_id):
            return False
        self.count(source, "skipped")
        return True

    def skip_by_head(self, source: str, task_name: str | None, key: SampleKey) -> bool:
        """The traffic port's fast path, decided from a request's head and the event's
        sampling key, its id or its draw (:meth:`TaskRouter.unsampled_by_head`), counted
        ``skipped`` when True."""
        if not self.router.unsampled_by_head(task_name, key):
            return False
        self.count(source, "skipped")
        return True

    def count_many(self, source: str, decision: str, n: int) -> None:
        """``n`` events of ``source`` decided ``decision`` elsewhere (the traffic data
        plane's process counts its skipped events and sends the sums)."""
        self._events.add(source, decision, n)
        by_decision = self._by_decision
        by_decision[decision] = by_decision.get(decision, 0) + n

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
