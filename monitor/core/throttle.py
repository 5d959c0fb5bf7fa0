"""Rate limits for lines that a client or an outage can trigger: at most one line per key
per interval, and the next line that is let through says how many were held back.

Pure (the time is passed in). :class:`monitor.engine.logs.ThrottledLog` logs through it;
the Kafka adapter filters the client library's own lines with it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LOG_INTERVAL_S", "LineThrottle"]

DEFAULT_LOG_INTERVAL_S = 10.0
"""The interval of one line per key, unless said otherwise."""


@dataclass
class _Key:
    last: float
    held: int = 0


class LineThrottle:
    """One line per key per ``interval_s``; at most ``max_keys`` keys remembered (the
    oldest forgotten first, so a flood of distinct keys costs bounded memory)."""

    def __init__(self, interval_s: float = DEFAULT_LOG_INTERVAL_S, *, max_keys: int = 1024):
        if interval_s < 0:
            raise ValueError("interval_s must be >= 0")
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._keys: dict[object, _Key] = {}
        self.suppressed_total = 0
        """Lines held back since the start, every key together."""

    @property
    def pending(self) -> int:
        """Lines held back that no line let through has reported yet, every key together."""
        return sum(state.held for state in self._keys.values())

    def admit(self, key: object, now: float) -> int | None:
        """``None`` when a line of ``key`` at ``now`` is held back; else the number of its
        lines held back since the last one let through (0 for the first)."""
        state = self._keys.get(key)
        if state is None:
            if len(self._keys) >= self.max_keys:
                del self._keys[next(iter(self._keys))]
            self._keys[key] = _Key(now)
            return 0
        if now - state.last < self.interval_s:
            state.held += 1
            self.suppressed_total += 1
            return None
        held, state.held, state.last = state.held, 0, now
        # Keep the dict in order of last admission, so the oldest is forgotten first.
        self._keys[key] = self._keys.pop(key)
        return held
