"""The client's limits on calls: a consecutive-failure circuit breaker with a single
half-open trial, and a token-bucket rate limit (see :mod:`adapters.model.client`)."""

from __future__ import annotations

from monitor.engine.ports import CircuitState, Clock

__all__ = ["CircuitBreaker", "TokenBucket"]


class CircuitBreaker:
    """Consecutive-failure circuit breaker with a single half-open trial."""

    def __init__(self, threshold: int, cooldown_s: float, clock: Clock) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_busy = False

    @property
    def state(self) -> CircuitState:
        if self._opened_at is None:
            return "closed"
        if self._trial_busy or self._clock.monotonic() - self._opened_at >= self._cooldown_s:
            return "half_open"
        return "open"

    def admit(self) -> tuple[bool, bool]:
        """(allowed, is_trial)."""
        if self._opened_at is None:
            return True, False
        if self._trial_busy or self._clock.monotonic() - self._opened_at < self._cooldown_s:
            return False, False
        self._trial_busy = True
        return True, True

    def record(self, ok: bool, trial: bool) -> None:
        if trial:
            self._trial_busy = False
        if ok:
            self._failures = 0
            self._opened_at = None
            return
        self._failures += 1
        if trial or self._failures >= self._threshold:
            self._opened_at = self._clock.monotonic()

    def release(self, trial: bool) -> None:
        """A call ended without a result (cancelled): free the trial slot."""
        if trial:
            self._trial_busy = False


class TokenBucket:
    """Reservation-based token bucket: ``rate`` per second, bursts up to max(1, rate)."""

    def __init__(self, rate: float, clock: Clock) -> None:
        self._rate = rate
        self._capacity = max(1.0, rate)
        self._tokens = self._capacity
        self._clock = clock
        self._stamp: float | None = None

    def reserve(self) -> float:
        """Take a token; the seconds to wait before using it."""
        now = self._clock.monotonic()
        elapsed = 0.0 if self._stamp is None else now - self._stamp
        self._stamp = now
        self._tokens = min(self._capacity, self._tokens + elapsed * self._rate) - 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate
