"""Review routing: a scored item chosen for review becomes a review item, redacted,
written durably to the review queue (retried), and counted as waiting.

The served answer's class is always among the item's candidates (so that the verdict
judges it): its rank when the re-asks drew it, else offered after the ranked candidates
with count 0, never ranked (:class:`monitor.core.review.ReviewItem`). Which candidate it
is stays in the item's data (``served_rank``); the review page does not mark it, so that
"what the user saw" does not anchor the reviewer (docs/review.md)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import structlog

from monitor.core.consensus import Consensus
from monitor.core.events import query_text
from monitor.core.redaction import Redactor
from monitor.core.review import ReviewItem
from monitor.engine.calibration import Calibration
from monitor.engine.metrics import Metrics
from monitor.engine.ports import CalibrationStore, ReviewQueue
from monitor.engine.runtime import Job

__all__ = ["REVIEW_SUBMIT_ATTEMPTS", "REVIEW_SUBMIT_BACKOFF_S", "ReviewRouter"]

log = structlog.get_logger("relmon")

REVIEW_SUBMIT_ATTEMPTS = 3
"""Writes of one review item (the review queue: SQLite, or the Kafka review topic whose
producer retries within each attempt), 1 s then 2 s apart, before it is given up."""
REVIEW_SUBMIT_BACKOFF_S = 1.0
"""The wait before the second write of a review item (doubled before each next one)."""


class ReviewRouter:
    """Writes review items and keeps the waiting count of their window."""

    def __init__(
        self,
        *,
        store: CalibrationStore,
        review_queue: ReviewQueue,
        calibration: Calibration,
        metrics: Metrics,
        redactor: Redactor,
        forget: Callable[[str], None],
    ) -> None:
        self.store = store
        self.review_queue = review_queue
        self.calibration = calibration
        self.metrics = metrics
        self.redactor = redactor
        self._forget = forget
        """Forgets an admitted item id (an unpublished item is not a duplicate later)."""

    def review_item(
        self,
        job: Job,
        consensus: Consensus,
        *,
        inclusion_probability: float,
        thresholds: tuple[tuple[float, float], ...] = (),
        aci_threshold: float | None = None,
    ) -> ReviewItem:
        """The review item of ``job``: redacted query and candidates, the thresholds in
        force now (the live check of the guarantee compares its score with them)."""
        task = job.task
        shown, served = self._shown(consensus, job.served)
        return ReviewItem.from_consensus(
            item_id=job.item_id,
            model=task.model,
            task=task.name,
            query=self.redactor.redact(query_text(job.event.request, job.task.api(job.event))),
            consensus=shown,
            inclusion_probability=inclusion_probability,
            sampled_at=job.sampled_at,
            thresholds=thresholds,
            aci_threshold=aci_threshold,
            reask_changes=job.reask_changes,
            api=job.event.api,
            served=served,
            segment=job.segment,
        )

    def _shown(self, consensus: Consensus, served: str | None) -> tuple[Consensus, str | None]:
        """The candidates as the reviewer sees them (redacted, distinct), and the served
        class as shown: its candidate's text, or its own (told apart from the candidates'
        as two candidates that redact alike are) when the re-asks never drew it."""
        if served is None:
            return self.redactor.redact_consensus(consensus), None
        rank = consensus.rank(served)
        if math.isfinite(rank):
            shown = self.redactor.redact_consensus(consensus)
            return shown, shown.classes[int(rank) - 1]
        counts = (*consensus.counts, 1)  # a count for the redaction only, never shown
        both = self.redactor.redact_consensus(Consensus((*consensus.classes, served), counts))
        shown = Consensus(both.classes[:-1], consensus.counts)
        return shown, both.classes[-1]

    async def route(self, item: ReviewItem) -> bool:
        """Store and publish ``item``; False (counted, logged) if it could not be written."""
        store: object = self.store
        if store is not self.review_queue:  # the SQLite store is both
            await self.store.save_review_item(item)
        if not await self._submit(item):
            self._forget(item.item_id)
            self.store.discard_review_item(item.item_id)
            return False
        self.calibration.note_review_item(item)
        return True

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
