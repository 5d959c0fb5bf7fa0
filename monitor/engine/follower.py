"""Following a shared store: every replica reads the verdicts the others stored, in the
store's order, at most ``sync_s`` seconds late, so that all replicas hold one calibration
and export the same level, bound and thresholds.

:class:`VerdictFollower` is a :class:`~monitor.engine.ports.Source` (source name
``store``): the app supervises it like the Kafka sources, and ``/readyz`` says when it
cannot reach the store.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from monitor.core.errors import RelmonError, StateError
from monitor.engine.calibration import Calibration
from monitor.engine.ports import SharedStore

__all__ = ["VerdictFollower"]

log = structlog.get_logger("relmon")


class VerdictFollower:
    """Reads ``records_after(last seq)`` when the store announces a verdict
    (:meth:`~monitor.engine.ports.SharedStore.listen`, PostgreSQL's LISTEN/NOTIFY), and
    every ``sync_s`` whatever happens to the notices, and applies what is new."""

    source_name = "store"

    def __init__(self, store: SharedStore, calibration: Calibration, *, sync_s: float) -> None:
        self._store = store
        self._calibration = calibration
        self._sync_s = sync_s
        self._last = 0
        self._judged_last = 0
        self._started = False
        self._closed = False
        self._failed = False
        self._wake = asyncio.Event()
        self.followed = 0
        """Verdicts of other replicas applied here."""
        self.notices = 0
        """Wake-ups by the store's notices (and one per listener connection)."""

    @property
    def connected(self) -> bool:
        return self._started and not self._closed and not self._failed

    @property
    def stopped(self) -> bool:
        return self._closed

    @property
    def paused(self) -> bool:
        return False

    @property
    def topic(self) -> str | None:
        return None

    def start(self, last_seq: int) -> None:
        """Follow from ``last_seq`` (the highest number the loaded windows hold)."""
        self._last = last_seq
        self._judged_last = self._calibration.judged_through  # the labels loaded
        self._started = True

    async def sync(self) -> int:
        """Apply the verdicts stored since the last sync; how many were new here."""
        new = 0
        for record in await self._store.records_after(self._last):
            if await self._calibration.follow(record, self._store):
                new += 1
            self._last = max(self._last, record.order[0] if record.order else self._last)
        self.followed += new
        # Judge labels (tasks[].judge): every replica's, for the prediction-powered level.
        if self._calibration.judges:
            # Its own cursor: a label stored here may be numbered after one of another
            # replica's that this has not read yet.
            for judgement in await self._store.judgements_after(self._judged_last):
                self._calibration.note_judgement(judgement)
                self._judged_last = max(self._judged_last, judgement.seq)
        # The shared queue's depth: every replica's review items, waiting.
        self._calibration.set_pending(await self._store.pending_counts())
        return new

    async def run(self) -> None:
        if not self._started:
            raise StateError("VerdictFollower is not started")
        listener = asyncio.create_task(self._listen(), name="relmon-store-listen")
        try:
            while not self._closed:
                self._wake.clear()  # before reading: a notice during the read wakes again
                try:
                    await self.sync()
                except RelmonError:
                    self._failed = True
                    raise
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._sync_s)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _listen(self) -> None:
        """Wake the loop on the store's notices; polling goes on if they fail."""
        try:
            await self._store.listen(self.wake)
        except Exception as exc:  # the listener's own failures: polling is the fallback
            log.warning("store_listen_stopped", error=f"{type(exc).__name__}: {exc}")

    def wake(self) -> None:
        """Read the store now (a verdict was announced)."""
        self.notices += 1
        self._wake.set()

    async def restart(self) -> None:
        await self.sync()  # raises while the store is still unreachable
        self._failed = False

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._closed = True
        self._wake.set()
