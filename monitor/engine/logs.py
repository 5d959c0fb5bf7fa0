"""Log lines that a client or an outage can trigger, rate-limited (docs/operations.md,
"Logs"): at most one line per event and key per interval; the line let through carries
``suppressed``, the count held back since the previous one.

    log = ThrottledLog()
    log.warning("request_rejected", key=reason, reason=reason)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from monitor.core.throttle import DEFAULT_LOG_INTERVAL_S, LineThrottle

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """A structlog logger whose lines are rate-limited per ``(event, key)``."""

    def __init__(
        self,
        interval_s: float = DEFAULT_LOG_INTERVAL_S,
        *,
        name: str = "relmon",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = structlog.get_logger(name)
        self._throttle = LineThrottle(interval_s)
        self._clock = clock

    @property
    def suppressed_total(self) -> int:
        """Lines held back since the start."""
        return self._throttle.suppressed_total

    def _emit(self, level: str, event: str, key: object, fields: dict[str, Any]) -> bool:
        held = self._throttle.admit((event, key), self._clock())
        if held is None:
            return False
        if held:
            fields["suppressed"] = held
        getattr(self._log, level)(event, **fields)
        return True

    def info(self, event: str, *, key: object = None, **fields: Any) -> bool:
        """Log ``event`` unless a line of ``(event, key)`` went out within the interval;
        True if it was logged."""
        return self._emit("info", event, key, fields)

    def warning(self, event: str, *, key: object = None, **fields: Any) -> bool:
        return self._emit("warning", event, key, fields)

    def error(self, event: str, *, key: object = None, **fields: Any) -> bool:
        return self._emit("error", event, key, fields)
