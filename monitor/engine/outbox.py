"""The review outbox: a scored item whose review write fails waits here, in order, until
the review queue takes writes again; an outage of the store loses no scored item.

A review item is written to the review queue (SQLite, PostgreSQL, the Kafka review
topic) as soon as it is scored. When that write fails (or takes longer than
:data:`REVIEW_WRITE_TIMEOUT_S`), the item goes into the outbox, and so does every item
scored while the outbox holds any (the queue gets them in the order they were scored).
A drainer writes the oldest one again and again, :data:`DRAIN_RETRY_S` apart at first,
then at most :data:`DRAIN_RETRY_MAX_S`, so the outbox empties within seconds of the
store's return. A write may have landed although it failed (a timeout): writing it
again is harmless, every review queue keeps an item once by its id.

The outbox is bounded (``review.outbox_max_items``): an item scored while it is full is
dropped (the newest: the waiting ones keep their order), counted in
``relmon_review_outbox_dropped_total`` and forgotten, so a later delivery of its event is
monitored again. With an :class:`~monitor.engine.ports.OutboxStorage` (a directory under
``state_dir``) every item is on disk before the worker goes on, and a restart of relmon
writes what waited; without one (``state_dir`` not writable), the outbox is in memory
and a restart during the outage loses what waits in it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import structlog

from monitor.core.review import ReviewItem
from monitor.engine.logs import ThrottledLog
from monitor.engine.metrics import Metrics
from monitor.engine.ports import OutboxEntry, OutboxStorage, ReviewQueue

__all__ = [
    "DEFAULT_OUTBOX_MAX_ITEMS",
    "DRAIN_RETRY_MAX_S",
    "DRAIN_RETRY_S",
    "REVIEW_WRITE_TIMEOUT_S",
    "ReviewOutbox",
    "within",
]

log = structlog.get_logger("relmon")
_T = TypeVar("_T")

DEFAULT_OUTBOX_MAX_ITEMS = 10_000
"""A 10-minute store outage at 10 reviewed items a second is 6,000 items."""
REVIEW_WRITE_TIMEOUT_S = 5.0
"""One write of a review item that takes longer failed (a store that stopped answering
without closing its connections); the item waits in the outbox."""
DRAIN_RETRY_S = 0.2
"""The drainer's first wait after a failed write (doubled after each next failure)."""
DRAIN_RETRY_MAX_S = 1.0
"""The drainer's longest wait between writes while the queue refuses them: the outbox
starts emptying within about a second of the store's return."""


async def within(awaitable: Awaitable[_T], timeout_s: float) -> _T:
    """``awaitable``'s result, or :class:`TimeoutError` after ``timeout_s`` without
    waiting for it to end: unlike :func:`asyncio.wait_for`, which waits for the
    cancelled call to finish, and a database client's cancellation may itself need an
    answer from a server that has stopped answering. The call is cancelled and left to
    end in the background (its outcome discarded)."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_discard)
    raise TimeoutError


def _discard(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: never "exception was never retrieved"


class ReviewOutbox:
    """Review items waiting for the review queue, in the order they were scored.

    ``name`` names the queue in messages (``PostgreSQL store``); ``on_dropped`` is called
    with an item dropped because the outbox was full."""

    def __init__(
        self,
        queue: ReviewQueue,
        metrics: Metrics,
        *,
        storage: OutboxStorage | None = None,
        max_items: int = DEFAULT_OUTBOX_MAX_ITEMS,
        name: str = "review queue",
        on_dropped: Callable[[ReviewItem], None] | None = None,
        write_timeout_s: float = REVIEW_WRITE_TIMEOUT_S,
        retry_s: float = DRAIN_RETRY_S,
        retry_max_s: float = DRAIN_RETRY_MAX_S,
    ) -> None:
        self._queue = queue
        self._metrics = metrics
        self._storage = storage
        self.max_items = max_items
        self.name = name
        self._on_dropped = on_dropped
        self._write_timeout_s = write_timeout_s
        self._retry_s = retry_s
        self._retry_max_s = min(retry_max_s, max(retry_s, retry_max_s))
        self._entries: deque[OutboxEntry] = deque()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._next_seq = 1
        self._added = asyncio.Event()
        self._saving = asyncio.Lock()
        self._drainer: asyncio.Task[None] | None = None
        self.failing = False
        """The last write to the queue failed (cleared by the next that works)."""
        self.written = 0
        """Items the drainer wrote from the outbox."""
        self.dropped = 0
        """Items dropped because the outbox was full."""
        self._throttled = ThrottledLog()

    # -- state ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def durable(self) -> bool:
        """Whether the waiting items survive a restart (kept on disk)."""
        return self._storage is not None

    @property
    def where(self) -> str:
        return "memory" if self._storage is None else self._storage.where

    def counts(self) -> Mapping[tuple[str, str], int]:
        """The items waiting per ``(model, task)``."""
        return {key: n for key, n in self._counts.items() if n > 0}

    def items(self) -> list[ReviewItem]:
        """The waiting items, oldest first."""
        return [e.item for e in self._entries]

    def problem(self) -> str | None:
        """Why monitoring is impaired (for ``/readyz``): the queue refuses writes."""
        if not self.failing:
            return None
        n = len(self._entries)
        return f"{self.name} not taking review items: {n} waiting in the review outbox"

    # -- start ---------------------------------------------------------------------

    async def load(self) -> list[ReviewItem]:
        """The items a previous run left waiting (to be written, in their order);
        records that cannot be read are counted and set aside, never raised."""
        if self._storage is None:
            return []
        entries, unreadable = await self._storage.load()
        if unreadable:
            self._metrics.outbox.unreadable.inc(unreadable)
            log.warning("review_outbox_unreadable", records=unreadable, where=self.where)
        for entry in entries:
            self._append(entry)
            self._next_seq = max(self._next_seq, entry.seq + 1)
        if entries:
            log.info("review_outbox_loaded", items=len(entries), where=self.where)
        return [e.item for e in entries]

    def start(self) -> None:
        """Start the drainer (it writes what :meth:`load` found first)."""
        if self._drainer is None:
            self._drainer = asyncio.create_task(self.run(), name="relmon-review-outbox")

    async def stop(self) -> None:
        """Stop the drainer; what waits stays on disk (or, in memory, is lost: logged)."""
        if self._drainer is not None:
            self._drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer
            self._drainer = None
        if self._entries and self._storage is None:
            log.error("review_outbox_lost", items=len(self._entries), where="memory")

    # -- items ---------------------------------------------------------------------

    async def submit(self, item: ReviewItem) -> bool:
        """Write ``item`` to the queue, or keep it in the outbox: True either way (it will
        reach the reviewers), False if it was dropped because the outbox is full."""
        if not self._entries:
            error = await self._write(item)
            if error is None:
                self.failing = False
                return True
            self.failing = True
            self._throttled.warning(
                "review_item_kept", key=self.name, queue=self.name, error=error, where=self.where
            )
        self._metrics.review_submit_failures.labels(item.model, item.task).inc()
        return await self._put(item)

    async def _write(self, item: ReviewItem) -> str | None:
        """One write of ``item``; None when it is durable, else the error."""
        try:
            await within(self._queue.submit(item), self._write_timeout_s)
        except TimeoutError:
            return f"no answer in {self._write_timeout_s:g} s"
        except Exception as exc:  # any failure of the queue's backend
            return f"{type(exc).__name__}: {exc}"
        return None

    async def _put(self, item: ReviewItem) -> bool:
        async with self._saving:  # on disk in the order they come, then in the deque
            return await self._keep(item)

    async def _keep(self, item: ReviewItem) -> bool:
        if len(self._entries) >= self.max_items:
            self.dropped += 1
            self._metrics.outbox.dropped.labels(item.model, item.task).inc()
            self._throttled.error(
                "review_item_dropped",
                key=(item.model, item.task),
                item=item.item_id,
                model=item.model,
                task=item.task,
                outbox_max_items=self.max_items,
            )
            if self._on_dropped is not None:
                self._on_dropped(item)
            return False
        entry = OutboxEntry(self._next_seq, item)
        self._next_seq += 1
        if self._storage is not None:
            try:
                await self._storage.save(entry)
            except OSError as exc:  # kept in memory all the same
                self._throttled.warning(
                    "review_outbox_not_saved", key="save", where=self.where, error=str(exc)
                )
        self._append(entry)
        return True

    def _append(self, entry: OutboxEntry) -> None:
        self._entries.append(entry)
        self._count(entry.item, 1)
        self._added.set()

    def _count(self, item: ReviewItem, delta: int) -> None:
        key = (item.model, item.task)
        self._counts[key] += delta
        self._metrics.outbox.items.labels(*key).set(self._counts[key])

    # -- drainer -------------------------------------------------------------------

    async def run(self) -> None:
        """Write the waiting items in order, each again until it is written."""
        delay = self._retry_s
        while True:
            if not self._entries:
                self._added.clear()
                await self._added.wait()
                continue
            entry = self._entries[0]
            error = await self._write(entry.item)
            if error is not None:
                self.failing = True
                self._throttled.warning(
                    "review_outbox_write_failed",
                    key=self.name,
                    queue=self.name,
                    waiting=len(self._entries),
                    error=error,
                )
                await asyncio.sleep(delay)
                delay = min(2 * delay, self._retry_max_s)
                continue
            delay = self._retry_s
            self.failing = False
            await self._done(entry)

    async def _done(self, entry: OutboxEntry) -> None:
        """``entry`` is in the queue: out of the outbox (memory, then disk)."""
        self._entries.popleft()
        self._count(entry.item, -1)
        self.written += 1
        if not self._entries:
            log.info("review_outbox_empty", queue=self.name, written=self.written)
        if self._storage is not None:
            try:
                await self._storage.remove(entry.seq)
            except OSError as exc:  # written again after a restart: harmless
                self._throttled.warning(
                    "review_outbox_not_removed", key="remove", where=self.where, error=str(exc)
                )
