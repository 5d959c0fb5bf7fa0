"""Review routing: a scored item chosen for review becomes a review item, redacted,
written durably to the review queue (or kept in the review outbox until the queue takes
it: :mod:`monitor.engine.outbox`), and counted as waiting.

The served answer's class is always among the item's candidates (so that the verdict
judges it): its rank when the re-asks drew it, else offered after the ranked candidates
with count 0, never ranked (:class:`monitor.core.review.ReviewItem`). Which candidate it
is stays in the item's data (``served_rank``); the review page does not mark it, so that
"what the user saw" does not anchor the reviewer (docs/review.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from monitor.core.consensus import Consensus
from monitor.core.events import query_text
from monitor.core.redaction import Redactor
from monitor.core.review import ReviewItem
from monitor.engine.calibration import Calibration
from monitor.engine.metrics import Metrics
from monitor.engine.outbox import DEFAULT_OUTBOX_MAX_ITEMS, ReviewOutbox
from monitor.engine.ports import CalibrationStore, OutboxStorage, ReviewQueue
from monitor.engine.runtime import Job

__all__ = ["OutboxSettings", "ReviewRouter"]


@dataclass(frozen=True, slots=True)
class OutboxSettings:
    """The review outbox of a router (:class:`~monitor.engine.outbox.ReviewOutbox`):
    where it keeps items (None: memory), its bound, and the queue's name in messages."""

    storage: OutboxStorage | None = None
    max_items: int = DEFAULT_OUTBOX_MAX_ITEMS
    name: str = "review queue"


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
        outbox: OutboxSettings | None = None,
    ) -> None:
        self.store = store
        self.review_queue = review_queue
        self.calibration = calibration
        self.metrics = metrics
        self.redactor = redactor
        self._forget = forget
        """Forgets an admitted item id (an unpublished item is not a duplicate later)."""
        settings = outbox or OutboxSettings()
        self.outbox = ReviewOutbox(
            review_queue,
            metrics,
            storage=settings.storage,
            max_items=settings.max_items,
            name=settings.name,
            on_dropped=self._dropped,
        )

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
        """Store and publish ``item``, or keep it in the review outbox until the queue
        takes it (:mod:`monitor.engine.outbox`): either way it waits for review (never
        re-asked). False (counted, logged) only if the outbox was full."""
        store: object = self.store
        if store is not self.review_queue:  # the SQLite and PostgreSQL stores are both
            await self.store.save_review_item(item)
        if not await self.outbox.submit(item):
            return False  # dropped: forgotten by _dropped
        self.calibration.note_review_item(item)
        return True

    async def load(self) -> list[ReviewItem]:
        """The items a previous run left in the on-disk outbox: known to the store again
        and counted as waiting (the drainer writes them once :meth:`start` ran)."""
        loaded = await self.outbox.load()
        store: object = self.store
        for item in loaded:
            if store is not self.review_queue:
                await self.store.save_review_item(item)
            self.calibration.note_review_item(item)
        return loaded

    def start(self) -> None:
        self.outbox.start()

    async def stop(self) -> None:
        await self.outbox.stop()

    def _dropped(self, item: ReviewItem) -> None:
        """An item the full outbox could not keep: a later delivery of its event is
        monitored again, not called a duplicate."""
        self._forget(item.item_id)
        self.store.discard_review_item(item.item_id)
