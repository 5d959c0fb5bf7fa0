"""The Kafka client library's own log lines, rate-limited.

aiokafka logs through the standard library (``aiokafka``, ``aiokafka.conn``,
``aiokafka.consumer.fetcher``, …) and, while a broker is unreachable, repeats the same
few lines at every retry: about 3,000 lines in 25 s under one ``relmon run``.
:func:`throttle_client_logs` puts one :class:`ClientLogThrottle` on each of those
loggers: a line goes out at most once per interval per logger and message template
(``record.msg``, the cause, not the formatted arguments that name a node or an
errno), and the next one let through carries ``suppressed``, the count held back
since the previous one (relmon's JSON lines show it as a field).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from monitor.core.throttle import DEFAULT_LOG_INTERVAL_S, LineThrottle

__all__ = ["CLIENT_LOGGERS", "ClientLogThrottle", "throttle_client_logs"]

CLIENT_LOGGERS = (
    "aiokafka",
    "aiokafka.admin.client",
    "aiokafka.client",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.consumer.subscription_state",
    "aiokafka.coordinator.assignors.abstract",
    "aiokafka.coordinator.assignors.range",
    "aiokafka.coordinator.assignors.roundrobin",
    "aiokafka.coordinator.assignors.sticky.partition_movements",
    "aiokafka.coordinator.assignors.sticky.sticky_assignor",
    "aiokafka.helpers",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
)
"""The loggers aiokafka logs to (a filter on a logger does not see its children's
records, so each gets the filter)."""


class ClientLogThrottle(logging.Filter):
    """Lets a record through at most once per ``interval_s`` per (logger, template);
    the record let through gets the attribute ``suppressed`` (the count held back)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_LOG_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._throttle = LineThrottle(interval_s)
        self._clock = clock

    @property
    def suppressed_total(self) -> int:
        """Records held back since the start."""
        return self._throttle.suppressed_total

    @property
    def pending(self) -> int:
        """Records held back that no record let through has reported yet."""
        return self._throttle.pending

    def filter(self, record: logging.LogRecord) -> bool:
        held = self._throttle.admit((record.name, str(record.msg)), self._clock())
        if held is None:
            return False
        if held:
            record.suppressed = held
        return True


_THROTTLE = ClientLogThrottle()
"""One for the process, as the loggers are."""


def throttle_client_logs() -> ClientLogThrottle:
    """Put the process's :class:`ClientLogThrottle` on every aiokafka logger (again on
    each call, which is cheap: a logger keeps one copy of a filter)."""
    names = set(CLIENT_LOGGERS) | {
        name for name in logging.Logger.manager.loggerDict if name.startswith("aiokafka.")
    }
    for name in names:
        logging.getLogger(name).addFilter(_THROTTLE)
    return _THROTTLE
