"""The inline proxy's own metrics (docs/metrics.md), registered once in the registry
passed in. The hot path only adds to plain ints and floats (no lock; the bucket found by a
few compiled float comparisons); the Prometheus families are built from them when scraped.

``relmon_proxy_requests_total{status_class}``: answers relayed from the upstream, by the
class of the upstream's status (``2xx``, ``3xx``, ``4xx``, ``5xx``).
``relmon_proxy_added_latency_seconds``: the time a relayed request spent in relmon
itself: from the whole request received to its last byte written upstream, plus from
the upstream's last byte to the client's (the upstream's own time excluded).
``relmon_proxy_upstream_failures_total{reason}``: requests the upstream did not answer:
``connect_error`` (502), ``timeout`` (connect or read; 504, or a cut answer),
``reset`` (closed before the answer ended) and ``invalid_response`` (not HTTP).
``relmon_proxy_client_send_timeouts_total``: client connections cut because the client
took no byte of its answer for the send timeout (the client's doing, not the upstream's).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = [
    "ADDED_LATENCY_BUCKETS",
    "FAILURE_REASONS",
    "STATUS_CLASSES",
    "ProxyCounts",
    "ProxyMetrics",
]

ProxyCounts = tuple[list[int], list[int], list[int], float, int]
"""What :meth:`ProxyMetrics.take` hands over: counts by status class (index
``status // 100``), by failure reason (in :data:`FAILURE_REASONS` order), by latency
bucket (not cumulative), the latency sum, and the clients cut by the send timeout."""

STATUS_CLASSES: Final = ("2xx", "3xx", "4xx", "5xx")
FAILURE_REASONS: Final = ("connect_error", "timeout", "reset", "invalid_response")
# The bounds as a list of floats, searched in place: compiled, handing a Final tuple to
# ``bisect`` boxed it anew (a tuple and ten floats) on every call.
_BOUNDS: Final[list[float]] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
]  # fmt: skip
ADDED_LATENCY_BUCKETS: Final[tuple[float, ...]] = tuple(_BOUNDS)
_LAST: Final = len(_BOUNDS)


def bucket_of(added_s: float) -> int:
    """The histogram bucket of ``added_s``: the first bound at or above it (``bisect_left``
    of the bounds), :data:`ADDED_LATENCY_BUCKETS`'s length past the last."""
    i = 0
    while i < _LAST and _BOUNDS[i] < added_s:
        i += 1
    return i


class ProxyMetrics(Collector):
    """The proxy's counters and histogram (a private registry when none is given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # Index: status // 100, clamped to 5 (a 1xx final status cannot reach here).
        self._by_class = [0] * 6
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        # One count per bucket (the last: over the largest bound), not cumulative.
        self._buckets = [0] * (len(ADDED_LATENCY_BUCKETS) + 1)
        self._sum = 0.0
        self._client_timeouts = 0
        registry = registry if registry is not None else CollectorRegistry()
        registry.register(self)

    def answered(self, status: int, added_s: float) -> None:
        """An answer relayed whole: its status and the time relmon added."""
        self._by_class[min(status // 100, 5)] += 1
        self._buckets[bucket_of(added_s)] += 1
        self._sum += added_s

    def failed(self, reason: str) -> None:
        """An upstream failure (one of :data:`FAILURE_REASONS`)."""
        self._failures[reason] += 1

    def client_send_timeout(self) -> None:
        """A client connection cut: the client took no byte for the send timeout."""
        self._client_timeouts += 1

    def take(self) -> ProxyCounts | None:
        """What was counted since the last take (None: nothing), zeroed here: the traffic
        data plane's own process sends it to the main process, which :meth:`merge`-s it."""
        if (
            not any(self._buckets)
            and not any(self._failures.values())
            and not self._client_timeouts
        ):
            return None
        counts = (
            self._by_class,
            list(self._failures.values()),
            self._buckets,
            self._sum,
            self._client_timeouts,
        )
        self._by_class = [0] * 6
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        self._buckets = [0] * (len(ADDED_LATENCY_BUCKETS) + 1)
        self._sum = 0.0
        self._client_timeouts = 0
        return counts

    def merge(self, counts: ProxyCounts) -> None:
        """Add counts :meth:`take`-n from another process's ``ProxyMetrics``."""
        by_class, failures, buckets, total, client_timeouts = counts
        self._client_timeouts += client_timeouts
        for i, n in enumerate(by_class[: len(self._by_class)]):
            self._by_class[i] += n
        for reason, n in zip(FAILURE_REASONS, failures, strict=False):
            self._failures[reason] += n
        for i, n in enumerate(buckets[: len(self._buckets)]):
            self._buckets[i] += n
        self._sum += total

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        return self._families()

    def _families(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "relmon_proxy_requests",
            "Answers the proxy relayed from the upstream, by upstream status class.",
            labels=["status_class"],
        )
        by_class = self._by_class
        counts = (by_class[0] + by_class[1] + by_class[2], *by_class[3:])
        for status_class, count in zip(STATUS_CLASSES, counts, strict=True):
            requests.add_metric([status_class], count)
        yield requests
        bounds = [*map(floatToGoString, ADDED_LATENCY_BUCKETS), "+Inf"]
        cumulative = list(accumulate(self._buckets))
        yield HistogramMetricFamily(
            "relmon_proxy_added_latency_seconds",
            "Time a relayed request spent in relmon itself, the upstream's time excluded.",
            buckets=list(zip(bounds, cumulative, strict=True)),
            sum_value=self._sum,
        )
        failures = CounterMetricFamily(
            "relmon_proxy_upstream_failures",
            "Requests the upstream did not answer, by reason.",
            labels=["reason"],
        )
        for reason, count in self._failures.items():
            failures.add_metric([reason], count)
        yield failures
        yield CounterMetricFamily(
            "relmon_proxy_client_send_timeouts",
            "Client connections cut: the client took no byte of its answer for the send timeout.",
            value=self._client_timeouts,
        )
