"""The one rule from a verdict to a calibration record.

A verdict scores its review item (:func:`monitor.core.review.verdict_score`: the
smallest accepted rank, ``inf`` for none); the record carries that score with the item's
model, task, inclusion probability, sampling time, ACI step, whether it accepted the
served answer (:func:`monitor.core.review.served_acceptable`) and its segment value.
The service applies it live; the Kafka store replays it from the topics at a restart;
both call
:func:`calibration_record` with a :class:`VerdictScorer`, so the two cannot differ.
"""

from __future__ import annotations

from collections.abc import Mapping

from monitor.core.canon.base import QueryContext
from monitor.core.redaction import Redactor
from monitor.core.review import (
    ReviewItem,
    Verdict,
    aci_miss,
    served_acceptable,
    verdict_score,
)
from monitor.engine.ports import CalibrationRecord
from monitor.engine.runtime import TaskRuntime

__all__ = ["VerdictScorer", "calibration_record", "ranks_beyond_candidates"]


def ranks_beyond_candidates(item: ReviewItem, verdict: Verdict) -> bool:
    """A verdict that accepts a rank the item never showed is invalid."""
    return any(r > len(item.candidates) for r in verdict.accepted_ranks)


class VerdictScorer:
    """``scorer(item, verdict)``: the item's score under the task's canonicalizer (for a
    typed correct answer), redacted as the item's candidates were."""

    def __init__(self, tasks: Mapping[str, TaskRuntime], redactor: Redactor) -> None:
        self._tasks = tasks
        self._redactor = redactor

    def __call__(self, item: ReviewItem, verdict: Verdict) -> float:
        task = self._tasks.get(item.task)
        canonicalizer = self._redactor.for_verdicts(task.sync_canonicalizer if task else None)
        return verdict_score(item, verdict, canonicalizer, QueryContext(query=item.query))

    def served(self, item: ReviewItem, verdict: Verdict, score: float) -> bool | None:
        """Whether ``verdict`` (scoring the item ``score``) accepted the served answer's
        class, a typed correct answer canonicalized as for the score."""
        task = self._tasks.get(item.task)
        canonicalizer = self._redactor.for_verdicts(task.sync_canonicalizer if task else None)
        context = QueryContext(query=item.query)
        return served_acceptable(item, verdict, score, canonicalizer, context)


def calibration_record(
    item: ReviewItem,
    score: float,
    *,
    order: tuple[int, ...] = (),
    served: bool | None = None,
) -> CalibrationRecord:
    """The calibration record of ``item`` scored ``score`` (``order``: its persisted
    position among the verdicts, ``()`` before it is saved; ``served``: whether the
    verdict accepted the served answer, :meth:`VerdictScorer.served`)."""
    return CalibrationRecord(
        model=item.model,
        task=item.task,
        item_id=item.item_id,
        score=score,
        inclusion_probability=item.inclusion_probability,
        sampled_at=item.sampled_at,
        order=order,
        aci_miss=aci_miss(item, score),
        served_acceptable=served if item.served_rank is not None else None,
        segment=item.segment,
    )
