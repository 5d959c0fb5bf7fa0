"""Which live events get monitored, and the call budget. No I/O; the clock is passed in.

Sampling is a deterministic hash of (task, event id): the same event is sampled the same
way by every replica and after a restart, and a Kafka replay does not re-sample
differently. An event with no id of its own (a mirrored or proxied request without
``X-Request-Id``, whose id relmon makes up) can never be seen again: it is sampled by a
fresh uniform draw instead (its *key* is that float), which the traffic port makes
without hashing or resolving the task of the 99 % it skips.

The budget is a token bucket of model calls per minute: an item reserves
its worst case (K_max calls) when admitted and gets back what it did not use, so the
budget is never exceeded and admission never waits. :meth:`CallBudget.utilization` is
the share of the per-minute budget in use: calls made in the last minute plus the calls
held by items still in flight, over ``per_minute``.
"""

from __future__ import annotations

import hashlib
import importlib
from collections import deque
from collections.abc import Callable
from typing import Any

from monitor.core.errors import ConfigError

__all__ = ["CallBudget", "SampleKey", "hash_fraction", "sampled"]

SampleKey = str | float
"""What an event is sampled by: its id (hashed with the task), or its draw in [0, 1)."""


def _builtin_sha256() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 (the same digest as hashlib's OpenSSL one, which sets up an
    OpenSSL context per call: a fifth slower on a key this short); hashlib's where the
    interpreter has none."""
    try:
        return importlib.import_module("_sha256").sha256  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        return hashlib.sha256


_sha256 = _builtin_sha256()


def hash_fraction(task: str, item_id: str) -> float:
    """A uniform number in [0, 1) that depends only on (task, item_id)."""
    digest = _sha256(f"{task}\x00{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def sampled(task: str, key: SampleKey, rate: float) -> bool:
    """Whether an event of ``task`` with this key (its id, or its draw) is sampled."""
    if isinstance(key, float):
        return key < rate
    return hash_fraction(task, key) < rate


class CallBudget:
    """A token bucket of model calls: ``per_minute`` capacity, refilled continuously."""

    def __init__(self, per_minute: int, now: float) -> None:
        if per_minute < 1:
            raise ConfigError("per_minute must be >= 1")
        self.capacity = float(per_minute)
        self.tokens = float(per_minute)
        self.rate = per_minute / 60.0
        self._last = now
        self._held = 0  # reserved by items in flight, not yet settled
        self._spent: deque[tuple[float, int]] = deque()  # (time, calls) of settled items
        self._spent_total = 0

    def _refill(self, now: float) -> None:
        if now > self._last:
            self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.rate)
            self._last = now

    def try_reserve(self, calls: int, now: float) -> bool:
        """Take ``calls`` tokens if they are there; never waits."""
        self._refill(now)
        if self.tokens >= calls:
            self.tokens -= calls
            self._held += calls
            return True
        return False

    def refund(self, calls: int, now: float) -> None:
        """Give back ``calls`` tokens of a reservation that was never used at all."""
        self._refill(now)
        self.tokens = min(self.capacity, self.tokens + max(0, calls))
        self._held = max(0, self._held - max(0, calls))

    def settle(self, reserved: int, used: int, now: float) -> None:
        """An item that reserved ``reserved`` calls is done after ``used``: refund the rest."""
        used = min(max(0, used), reserved)
        self.refund(reserved - used, now)
        self._held = max(0, self._held - used)
        if used:
            self._spent.append((now, used))
            self._spent_total += used
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._spent and self._spent[0][0] <= now - 60.0:
            self._spent_total -= self._spent.popleft()[1]

    def utilization(self, now: float) -> float:
        """(calls settled in the last 60 s + calls held in flight) / per_minute, at most 1."""
        self._forget(now)
        return min(1.0, (self._spent_total + self._held) / self.capacity)
