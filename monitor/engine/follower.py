"""Following a shared store: every replica reads the verdicts the others stored, in the
store's order, at most ``sync_s`` seconds late, so that all replicas hold one calibration
and export the same level, bound and thresholds.

:class:`VerdictFollower` is a :class:`~monitor.engine.ports.Source` (source name
``store``): the app supervises it like the Kafka sources, and ``/readyz`` says when it
cannot reach the store. While the store cannot be read (stopped, restarting, not
answering within :data:`SYNC_TIMEOUT_S`) the follower keeps running: it says so
(:attr:`VerdictFollower.unreachable`, logged rate-limited) and reads again every
:data:`UNREACHABLE_RETRY_S`, so it is following again within about a second of the
store's return.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

import structlog

from monitor.core.errors import RelmonError, StateError, StoreError
from monitor.engine.calibration import Calibration
from monitor.engine.logs import ThrottledLog
from monitor.engine.outbox import within
from monitor.engine.ports import SharedStore

__all__ = ["SYNC_TIMEOUT_S", "UNREACHABLE_RETRY_S", "VerdictFollower"]

log = structlog.get_logger("relmon")

SYNC_TIMEOUT_S = 5.0
"""A read of the store that takes longer failed: the store is not answering."""
UNREACHABLE_RETRY_S = 1.0
"""How often the store is read again while it cannot be (at most ``sync_s``)."""


class VerdictFollower:
    """Reads ``records_after(last seq)`` when the store announces a verdict
    (:meth:`~monitor.engine.ports.SharedStore.listen`, PostgreSQL's LISTEN/NOTIFY), and
    every ``sync_s`` whatever happens to the notices, and applies what is new."""

    source_name = "store"

    def __init__(
        self,
        store: SharedStore,
        calibration: Calibration,
        *,
        sync_s: float,
        store_name: str = "PostgreSQL store",
        waiting: Callable[[], Mapping[tuple[str, str], int]] | None = None,
        sync_timeout_s: float = SYNC_TIMEOUT_S,
    ) -> None:
        self._store = store
        self._calibration = calibration
        self._sync_s = sync_s
        self.store_name = store_name
        """The store in messages (``/readyz``: "PostgreSQL store unreachable")."""
        self._waiting = waiting
        """The review items of this replica not in the store yet (its review outbox):
        waiting for review all the same."""
        self._sync_timeout_s = sync_timeout_s
        self.unreachable: str | None = None
        """Why the store cannot be read now (None: it can)."""
        self._throttled = ThrottledLog()
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
        return self._started and not self._closed and not self._failed and not self.unreachable

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
        # The shared queue's depth: every replica's review items, waiting (and this one's
        # in its outbox).
        pending = dict(await self._store.pending_counts())
        if self._waiting is not None:
            for key, n in self._waiting().items():
                pending[key] = pending.get(key, 0) + n
        self._calibration.set_pending(pending)
        return new

    async def run(self) -> None:
        if not self._started:
            raise StateError("VerdictFollower is not started")
        listener = asyncio.create_task(self._listen(), name="relmon-store-listen")
        try:
            while not self._closed:
                self._wake.clear()  # before reading: a notice during the read wakes again
                try:
                    await within(self.sync(), self._sync_timeout_s)
                except (StoreError, TimeoutError) as exc:
                    self._down(exc)
                    await asyncio.sleep(min(UNREACHABLE_RETRY_S, self._sync_s))
                    continue
                except RelmonError:
                    self._failed = True
                    raise
                self._up()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._sync_s)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    def _down(self, exc: Exception) -> None:
        error = (
            f"no answer in {self._sync_timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else type(exc).__name__
        )
        self.unreachable = error
        self._throttled.warning(
            "store_unreachable", key=self.store_name, store=self.store_name, error=str(exc) or error
        )

    def _up(self) -> None:
        if self.unreachable is not None:
            self.unreachable = None
            log.info("store_reachable", store=self.store_name)

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
