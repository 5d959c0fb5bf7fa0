"""The engine's shared vocabulary: a configured task with its live parts, an admitted
job, the running counts, and the one rule for item ids.

Names (docs/glossary.md): the **event id** is the id a traffic event carries (an
``X-Request-Id``, a Kafka event's ``id``); the **item id** is ``task:event id``, the id
of the item re-asked, reviewed and calibrated (:func:`item_id`).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any

from monitor.config import TaskSettings
from monitor.core.apis.base import WireApi
from monitor.core.apis.registry import API_NAMES, GENERIC, get_api
from monitor.core.canon.base import AsyncCanonicalizer, Canonicalizer
from monitor.core.consensus import Consensus
from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent
from monitor.core.judging import DEFAULT_JUDGE_TEMPLATE
from monitor.core.priority import prioritised_inclusion_probability
from monitor.core.reask import FieldRules, ReaskPolicy
from monitor.core.stopping import StoppingRule, fewest_samples
from monitor.engine.metrics import TRAFFIC_DECISIONS
from monitor.engine.ports import ModelClient
from monitor.engine.segments import TaskSegments

__all__ = ["Job", "ServiceStats", "TaskRuntime", "item_id", "item_seed_key", "reask_policy"]


def reask_policy(task: TaskSettings) -> ReaskPolicy:
    """How ``task`` re-asks a request (``tasks[].reask``, the endpoint's model and the
    defaults for a request relmon builds itself); ``check-config --probe`` re-asks by it too."""
    return ReaskPolicy(
        model=task.endpoint.model,
        min_temperature=task.reask.min_temperature,
        default_temperature=task.endpoint.temperature,
        default_max_tokens=task.endpoint.max_tokens,
        set=dict(task.reask.set),
        drop=tuple(task.reask.drop),
    )


def item_id(task_name: str, event_id: str) -> str:
    """The item id of event ``event_id`` under task ``task_name``: ``task:event id``.

    The one place this is built: review items, verdicts, duplicates and the calibration
    window all use it.
    """
    return f"{task_name}:{event_id}"


def item_seed_key(task_name: str, event_id: str) -> str:
    """The key of the item's own random generator (ties in the ranking, the review
    draw): the same for a re-delivered event, so that it is ranked the same way."""
    return f"{task_name}\x00{event_id}"


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
    judge: ModelClient | None = None
    """The LLM judge of ``tasks[].judge`` (judge-assisted level), if any."""
    judge_template: str = DEFAULT_JUDGE_TEMPLATE

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def model(self) -> str:
        """The ``model`` label: always the task's configured model, never a request's.

        A client-supplied model name is unbounded (one series per distinct value), so a
        request is counted under the model of the task it resolved to.
        """
        s = self.settings
        return s.endpoint.model or s.match.model or self.name

    @functools.cached_property
    def fewest_calls(self) -> int:
        """The fewest model calls an item of this task can use (its rule's fewest
        samples): what the workers pace item starts by (:class:`WorkerPool`)."""
        return fewest_samples(self.rule)

    @functools.cached_property
    def reask(self) -> ReaskPolicy:
        """How this task re-asks a request (:func:`reask_policy`)."""
        return reask_policy(self.settings)

    @functools.cached_property
    def server_tools(self) -> frozenset[str]:
        """Provider-run tools this task lists as read-only (``reask.server_tools``)."""
        return frozenset(self.settings.reask.server_tools)

    @functools.cached_property
    def generic(self) -> WireApi | None:
        """The task's ``generic`` API (``endpoint.api: generic``), built once."""
        s = self.settings
        return get_api(GENERIC, s.generic_options) if s.endpoint.api == GENERIC else None

    def api(self, event: TrafficEvent) -> WireApi:
        """The API ``event`` is read and re-asked in: the event's own; :class:`InputError`
        when the task's endpoint speaks another (never re-asked in another API)."""
        wanted = self.settings.endpoint.api
        if wanted is not None and wanted != event.api:
            raise InputError(
                f"a {event.api} event, but task {self.name}'s endpoint.api is {wanted}: "
                "never re-asked in another API"
            )
        if event.api == GENERIC:
            if self.generic is None:
                raise InputError(f"a generic event, but task {self.name}'s endpoint is not generic")
            return self.generic
        return get_api(event.api)

    @functools.cached_property
    def field_rules(self) -> tuple[FieldRules, ...]:
        """The re-ask rules of every API this task may re-ask in (for the label values of
        ``relmon_reask_overrides_total{field}``, known at start)."""
        wanted = self.settings.endpoint.api
        if wanted == GENERIC:
            return (self.generic.rules,) if self.generic is not None else ()
        names = [wanted] if wanted is not None else [n for n in API_NAMES if n != GENERIC]
        return tuple(get_api(n).rules for n in names)

    @functools.cached_property
    def segments(self) -> TaskSegments | None:
        """The task's segments and their label table (``tasks[].segments``), if any."""
        spec = self.settings.segment_spec
        return None if spec is None else TaskSegments(spec)

    @property
    def target_alpha(self) -> float:
        return round(1.0 - self.settings.reliability_target, 10)

    @property
    def alphas(self) -> tuple[float, ...]:
        return tuple(sorted({*self.settings.alphas, self.target_alpha}))

    def inclusion_probability(self, consensus: Consensus) -> float:
        """The item's inclusion probability pi (its chance to go to review): the task's
        review rate, or by uncertainty with a floor. A segment's minimum review rate may
        raise it (:mod:`monitor.engine.review_minimum`, applied by the worker)."""
        s = self.settings
        if s.review_priority == "uniform":
            return s.review_rate
        return prioritised_inclusion_probability(
            consensus, floor=s.review_floor, ceiling=s.review_rate
        )


@dataclass
class Job:
    """An admitted event on its way through a worker."""

    event: TrafficEvent
    task: TaskRuntime
    source: str
    sampled_at: float
    reserved: int
    """Model calls reserved from the budget (settled with the calls used)."""
    done: asyncio.Future[None]
    reask_changes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """How the re-ask differs from the request production sent (set by the worker)."""
    served: str | None = None
    """The class of the answer production served (set by the worker; None: unknown)."""
    served_drawn: bool = False
    """Whether that answer was one of the item's draws (the re-ask was the request)."""
    segment: str | None = None
    """The item's segment value (set by the worker once the item is ranked, before its
    inclusion probability is decided; None: its task has no segments)."""

    @property
    def item_id(self) -> str:
        return item_id(self.task.name, self.event.id)


@dataclass
class ServiceStats:
    """Running counts of this process (the metrics carry the same, labelled)."""

    scored: int = 0
    abandoned: int = 0
    interrupted: int = 0
    reviewed: int = 0
    verdicts: int = 0
    calls: int = 0
    by_decision: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRAFFIC_DECISIONS, 0))
    """Events by decision, every decision from 0 (a plain dict: the traffic port's fast
    path adds to it for most requests)."""
