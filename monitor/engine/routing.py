"""Routing: which task an event belongs to, and whether the traffic port's fast path
skips it (not hash-sampled by any task it can belong to), decided from the settings
alone. Kept apart from :mod:`.admission` (budget, queue, metrics), so that the traffic
listener's own process (``traffic.data_plane: process``) loads no statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from monitor.config import TaskSettings
from monitor.core.apis.registry import DEFAULT_API
from monitor.core.events import TrafficEvent
from monitor.core.sampler import SampleKey, sampled

__all__ = ["HeadSkip", "HeaderTaskResolver", "Routed", "RoutedTask", "TaskRouter"]


class Routed(Protocol):
    """What routing reads of a task: its name and settings (a :class:`TaskRuntime`, or
    a :class:`RoutedTask` where only routing is needed: the traffic data plane's own
    process)."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> TaskSettings: ...


class RoutedTask:
    """A task as routing sees it: its settings alone."""

    def __init__(self, settings: TaskSettings) -> None:
        self._settings = settings

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def settings(self) -> TaskSettings:
        return self._settings


T = TypeVar("T", bound=Routed)


class TaskRouter(Generic[T]):
    """The task of an event: named in it, else (a span's event) the first task whose
    ``match.attributes`` it has, else by its model, else the catch-all task (the first
    with no match condition). A task matched by attributes takes spans' events only (no
    other source's event has attributes), and only those whose model and API its match
    names too, if it names them."""

    def __init__(self, tasks: Mapping[str, T]) -> None:
        self.tasks = tasks
        # Computed once: resolve runs for every offered event.
        self._catch_all = next(
            (
                t
                for t in tasks.values()
                if t.settings.match.model is None
                and t.settings.match.header is None
                and t.settings.match.path_prefix is None
                and t.settings.match.api is None
                and t.settings.match.attributes is None
            ),
            None,
        )
        # The tasks an event whose task follows from its model may get: those matched by
        # model, and the catch-all one; their (name, sampling rate), read by
        # skip_unsampled_any_model for every such event.
        candidates = [
            t
            for t in tasks.values()
            if (t.settings.match.model is not None or t.settings.match.api is not None)
            and t.settings.match.attributes is None
        ]
        if self._catch_all is not None:
            candidates.append(self._catch_all)
        self.candidate_rates = [(t.name, t.settings.sampling_rate) for t in candidates]
        # The highest rate of any task: a draw at or above it is skipped, whatever the task.
        self.max_rate = max((t.settings.sampling_rate for t in tasks.values()), default=0.0)
        # The match rules as lookups, the first task in order winning each.
        self._by_header: dict[str, str] = {}
        self._by_model: dict[str, T] = {}
        self._by_api: dict[str, T] = {}
        self._by_attributes = [t for t in tasks.values() if t.settings.match.attributes]
        self.attribute_keys = frozenset(
            key for t in self._by_attributes for key in t.settings.match.attributes or {}
        )
        """The attributes some task matches on: the ones a span's event carries."""
        for t in tasks.values():
            m = t.settings.match
            if m.attributes:
                continue  # spans' events only: resolve_attributes
            for value in (m.header, t.name):
                if value is not None:
                    self._by_header.setdefault(value, t.name)
            if m.model is not None:
                self._by_model.setdefault(m.model, t)
            if m.api is not None:
                self._by_api.setdefault(m.api, t)
        self._by_prefix = [
            (t.settings.match.path_prefix, t.name)
            for t in tasks.values()
            if t.settings.match.path_prefix is not None and not t.settings.match.attributes
        ]

    def resolve(self, event: TrafficEvent) -> T | None:
        if event.attributes is not None and event.task is None:
            task = self.resolve_attributes(event.attributes, event.model, event.api)
            if task is not None:
                return task
        return self.resolve_fields(event.task, event.model, event.api)

    def resolve_attributes(
        self, attributes: Mapping[str, object], model: str, api: str
    ) -> T | None:
        """The first task whose ``match.attributes`` all equal the event's, and whose
        ``match.model`` and ``match.api``, when given, are the event's."""
        for t in self._by_attributes:
            m = t.settings.match
            if (m.model is None or m.model == model) and (m.api is None or m.api == api):
                wanted = m.attributes or {}
                if all(_equal(attributes.get(k), v) for k, v in wanted.items()):
                    return t
        return None

    def resolve_fields(
        self, task_name: str | None, model: str | None, api: str | None = None
    ) -> T | None:
        """The task of an event with these fields (before the whole event is parsed):
        named, else by its model, else by its API, else the catch-all task."""
        if task_name is not None:
            return self.tasks.get(task_name)
        task = self._by_model.get(model) if model is not None else None
        if task is None and api is not None and self._by_api:
            task = self._by_api.get(api)
        return task if task is not None else self._catch_all

    def unsampled(
        self, task_name: str | None, model: str | None, key: SampleKey, api: str = DEFAULT_API
    ) -> bool:
        """Whether an event with these fields and sampling key (its id, or its draw) is
        skipped: no task, or not sampled."""
        task = self.resolve_fields(task_name, model, api)
        return task is None or not sampled(task.name, key, task.settings.sampling_rate)

    def unsampled_any_model(self, key: SampleKey) -> bool:
        """Whether an event whose task follows from its model (not yet read) is skipped
        whatever that model: not sampled by any task a model can select (those matched
        by model, and the catch-all task)."""
        return all(not sampled(name, key, rate) for name, rate in self.candidate_rates)

    def unsampled_by_head(self, task_name: str | None, key: SampleKey) -> bool:
        """The traffic port's fast path, from a request's head: by its task when the
        head names one, else whatever its model."""
        if isinstance(key, float) and key >= self.max_rate:  # not sampled by any task
            return True
        if task_name is not None:
            return self.unsampled(task_name, None, key)
        return self.unsampled_any_model(key)

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


def _equal(value: object, wanted: object) -> bool:
    """An attribute's value equal to a configured one (``True`` is not ``1``)."""
    if isinstance(value, bool) or isinstance(wanted, bool):
        return value is wanted
    return value == wanted


class HeaderTaskResolver:
    """``(headers, path, body) -> task name``, for the traffic port:
    :meth:`TaskRouter.resolve_name` with the task header's name bound (one compiled call
    per request, where a ``functools.partial`` built keyword arguments every time)."""

    def __init__(self, router: TaskRouter[Any], header_name: str) -> None:
        self.router = router
        self.header_name = header_name

    def __call__(
        self, headers: Mapping[str, str], path: str, body: Mapping[str, Any]
    ) -> str | None:
        return self.router.resolve_name(headers, path, body, self.header_name)


class HeadSkip:
    """The traffic port's fast path where no service runs (the data plane's own
    process): ``skip(source, task or None, event id)`` as
    :meth:`~monitor.engine.admission.AdmissionControl.skip_by_head` decides it, the
    skipped events counted here by source until :meth:`take`-n (and sent to the
    service, which counts them)."""

    def __init__(self, router: TaskRouter[Any]) -> None:
        self.router = router
        self.counts: dict[str, int] = {}

    def __call__(self, source: str, task_name: str | None, key: SampleKey) -> bool:
        if not self.router.unsampled_by_head(task_name, key):
            return False
        counts = self.counts
        counts[source] = counts.get(source, 0) + 1
        return True

    def take(self) -> dict[str, int]:
        """The skipped events counted since the last take, by source."""
        counts, self.counts = self.counts, {}
        return counts
