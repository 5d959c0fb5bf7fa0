"""The inline proxy's own metrics (docs/metrics.md), registered once in the registry
passed in. The hot path only adds to plain ints and floats (no lock; the bucket found by a
few compiled float comparisons); the Prometheus families are built from them when scraped.

Every family but the last two carries ``route``: the route's name or index in
``traffic.routes``, ``default`` for ``traffic.upstream_url`` (bounded by the config).

``relmon_proxy_requests_total{route, status_class}``: answers relayed from the upstream, by
the class of the upstream's status (``2xx``, ``3xx``, ``4xx``, ``5xx``).
``relmon_proxy_added_latency_seconds``: the time a relayed request spent in relmon
itself: from the whole request received to its last byte written upstream, plus from
the upstream's last byte to the client's (the upstream's own time excluded).
``relmon_proxy_upstream_failures_total{route, reason}``: requests the upstream did not answer:
``connect_error`` (502), ``timeout`` (connect or read; 504, or a cut answer),
``reset`` (closed before the answer ended) and ``invalid_response`` (not HTTP).
``relmon_proxy_client_send_timeouts_total``: client connections cut because the client
took no byte of its answer for the send timeout (the client's doing, not the upstream's).
``relmon_proxy_unrouted_requests_total``: requests no route took, when there is no
``traffic.upstream_url`` to take them (relmon answered 404).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from monitor.config.traffic import DEFAULT_ROUTE

__all__ = [
    "ADDED_LATENCY_BUCKETS",
    "DEFAULT_ROUTE",
    "FAILURE_REASONS",
    "STATUS_CLASSES",
    "ProxyCounts",
    "ProxyMetrics",
    "RouteCounts",
    "RouteMetrics",
]

RouteCounts = tuple[list[int], list[int], list[int], float]
"""One route's counts as :meth:`RouteMetrics.take` hands them over: by status class (index
``status // 100``), by failure reason (in :data:`FAILURE_REASONS` order), by latency
bucket (not cumulative), and the latency sum."""
ProxyCounts = tuple[dict[str, RouteCounts], int, int]
"""What :meth:`ProxyMetrics.take` hands over: the routes' counts by route label, the
clients cut by the send timeout, and the requests no route took."""

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


class RouteMetrics:
    """One route's counters: the hot path adds to plain ints and floats."""

    __slots__ = ("buckets", "by_class", "failures", "sum")

    def __init__(self) -> None:
        self.by_class: list[int] = []
        self.failures: dict[str, int] = {}
        self.buckets: list[int] = []
        self.sum = 0.0
        self._zero()

    def _zero(self) -> None:
        # Index: status // 100, clamped to 5 (a 1xx final status cannot reach here).
        self.by_class = [0] * 6
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        # One count per bucket (the last: over the largest bound), not cumulative.
        self.buckets = [0] * (len(ADDED_LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def answered(self, status: int, added_s: float) -> None:
        """An answer relayed whole: its status and the time relmon added."""
        self.by_class[min(status // 100, 5)] += 1
        self.buckets[bucket_of(added_s)] += 1
        self.sum += added_s

    def failed(self, reason: str) -> None:
        """An upstream failure (one of :data:`FAILURE_REASONS`)."""
        self.failures[reason] += 1

    def counted(self) -> bool:
        return any(self.buckets) or any(self.failures.values())

    def take(self) -> RouteCounts:
        """The counts, zeroed here."""
        counts = (self.by_class, list(self.failures.values()), self.buckets, self.sum)
        self._zero()
        return counts

    def merge(self, counts: RouteCounts) -> None:
        by_class, failures, buckets, total = counts
        for i, n in enumerate(by_class[: len(self.by_class)]):
            self.by_class[i] += n
        for reason, n in zip(FAILURE_REASONS, failures, strict=False):
            self.failures[reason] += n
        for i, n in enumerate(buckets[: len(self.buckets)]):
            self.buckets[i] += n
        self.sum += total


class ProxyMetrics(Collector):
    """The proxy's counters and histogram, by route (a private registry when none is
    given). ``routes``: the route labels, exported from the start (0 until counted)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, routes: Sequence[str] = (DEFAULT_ROUTE,)
    ) -> None:
        self._routes = {name: RouteMetrics() for name in routes}
        self._client_timeouts = 0
        self._unrouted = 0
        registry = registry if registry is not None else CollectorRegistry()
        registry.register(self)

    def route(self, name: str) -> RouteMetrics:
        """The counters of the route labelled ``name`` (the hot path holds them)."""
        metrics = self._routes.get(name)
        if metrics is None:
            metrics = self._routes[name] = RouteMetrics()
        return metrics

    def client_send_timeout(self) -> None:
        """A client connection cut: the client took no byte for the send timeout."""
        self._client_timeouts += 1

    def unrouted(self) -> None:
        """A request no route took (answered 404 by relmon)."""
        self._unrouted += 1

    def take(self) -> ProxyCounts | None:
        """What was counted since the last take (None: nothing), zeroed here: the traffic
        data plane's own process sends it to the main process, which :meth:`merge`-s it."""
        routes = {name: m.take() for name, m in self._routes.items() if m.counted()}
        if not routes and not self._client_timeouts and not self._unrouted:
            return None
        counts = (routes, self._client_timeouts, self._unrouted)
        self._client_timeouts = self._unrouted = 0
        return counts

    def merge(self, counts: ProxyCounts) -> None:
        """Add counts :meth:`take`-n from another process's ``ProxyMetrics``."""
        routes, client_timeouts, unrouted = counts
        self._client_timeouts += client_timeouts
        self._unrouted += unrouted
        for name, route_counts in routes.items():
            self.route(name).merge(route_counts)

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        return self._families()

    def _families(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "relmon_proxy_requests",
            "Answers the proxy relayed from the upstream, by route and upstream status class.",
            labels=["route", "status_class"],
        )
        latency = HistogramMetricFamily(
            "relmon_proxy_added_latency_seconds",
            "Time a relayed request spent in relmon itself, the upstream's time excluded.",
            labels=["route"],
        )
        failures = CounterMetricFamily(
            "relmon_proxy_upstream_failures",
            "Requests the upstream did not answer, by route and reason.",
            labels=["route", "reason"],
        )
        bounds = [*map(floatToGoString, ADDED_LATENCY_BUCKETS), "+Inf"]
        for name, m in self._routes.items():
            by_class = m.by_class
            counts = (by_class[0] + by_class[1] + by_class[2], *by_class[3:])
            for status_class, count in zip(STATUS_CLASSES, counts, strict=True):
                requests.add_metric([name, status_class], count)
            cumulative = list(accumulate(m.buckets))
            latency.add_metric([name], list(zip(bounds, cumulative, strict=True)), m.sum)
            for reason, count in m.failures.items():
                failures.add_metric([name, reason], count)
        yield requests
        yield latency
        yield failures
        yield CounterMetricFamily(
            "relmon_proxy_client_send_timeouts",
            "Client connections cut: the client took no byte of its answer for the send timeout.",
            value=self._client_timeouts,
        )
        yield CounterMetricFamily(
            "relmon_proxy_unrouted_requests",
            "Requests no traffic.routes entry took, with no traffic.upstream_url: answered 404.",
            value=self._unrouted,
        )
