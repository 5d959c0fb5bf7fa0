"""Prometheus metrics, built in one place from a registry that is passed in.

Names and labels are a contract (docs/metrics.md). No prompt or answer text ever goes into a label:
label values are model names, task names, alphas, sources and fixed enumerations.
``relmon_set_size`` observes the set size at the task's target level
alpha = 1 - reliability_target (one histogram per model and task, as §3 fixes).

Every counter's known label values exist from the start at 0 (:meth:`Metrics.init_task`,
:meth:`Metrics.init_source`): an alert on a series that does not exist cannot fire.
The level and its lower bound are gauges of an estimate: they do not exist before the
first verdict of their (model, task) (a 0 would read as "reliability 0", and alert).
A verdict that names no known item has no model or task: it is counted in
``relmon_verdicts_rejected_total{reason}``, never under made-up empty labels.
No ``*_created`` series are exported.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor.core.apis.registry import API_NAMES
from monitor.core.ppi import PPIEstimate
from monitor.core.reask import CHANGED, TOOLS_UNRECORDED
from monitor.core.window import WindowSnapshot
from monitor.engine.kafka_metrics import KafkaMetrics
from monitor.engine.otlp_metrics import OtlpMetrics
from monitor.engine.outbox_metrics import ReviewOutboxMetrics
from monitor.engine.segment_metrics import SegmentMetrics
from monitor.engine.served import ServedAnswerMetrics

__all__ = [
    "ITEM_OUTCOMES",
    "JUDGE_OUTCOMES",
    "NOT_REASKED_REASONS",
    "REJECTED_VERDICT_REASONS",
    "TOP_ANSWER_OUTCOMES",
    "TRAFFIC_APIS",
    "TRAFFIC_DECISIONS",
    "UNMONITORED",
    "VERDICT_KINDS",
    "EventCounts",
    "Metrics",
]

TRAFFIC_DECISIONS: Final = (
    "sampled",
    "skipped",
    "duplicate",
    "dropped",
    "rejected",
    "not_reasked",
    "unmonitored",
)
"""``relmon_traffic_events_total{decision}`` values (see :data:`monitor.engine.ports.Decision`)."""
UNMONITORED: Final = "unmonitored"
NOT_REASKED_REASONS: Final = ("conversation", "server_tool", "unsafe_path", TOOLS_UNRECORDED)
"""``relmon_not_reasked_total{reason}`` values (``unsafe_path``:
:data:`monitor.core.apis.paths.UNSAFE_PATH`; ``tools_unrecorded``: a span's)."""
TRAFFIC_APIS: Final = (*API_NAMES, UNMONITORED)
"""``relmon_traffic_requests_total{api}`` values: every wire API, and ``unmonitored``."""
ITEM_OUTCOMES: Final = ("scored", "abandoned", "interrupted")
"""``relmon_items_total{outcome}`` values."""
JUDGE_OUTCOMES: Final = ("acceptable", "not_acceptable", "unusable", "error")
"""``relmon_judge_labels_total{outcome}`` values."""
VERDICT_KINDS: Final = ("accepted", "none", "duplicate", "invalid")
"""``relmon_reviews_total{verdict}`` values: verdicts on a known item, under its labels."""
REJECTED_VERDICT_REASONS: Final = ("unknown", "invalid")
"""``relmon_verdicts_rejected_total{reason}`` values: verdicts that name no known item
(``unknown``) or cannot be read (``invalid``), so have no model or task."""
TOP_ANSWER_OUTCOMES: Final = ("accepted", "rejected")
"""``relmon_top_answers_total{outcome}`` values."""

disable_created_metrics()  # type: ignore[no-untyped-call]


class EventCounts(Collector):
    """``relmon_traffic_events_total{source,decision}`` as plain ints: every traffic
    event adds one (a dict update, no lock: a locked Prometheus counter cost a proxied
    request more than a microsecond), read when the registry is collected. With other
    names and values, ``relmon_traffic_requests_total{source,api}`` the same way."""

    NAME: Final = "relmon_traffic_events"
    HELP: Final = "Traffic events by source and what relmon did with them."

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        name: str = NAME,
        help_text: str = HELP,
        label: str = "decision",
        values: Sequence[str] = TRAFFIC_DECISIONS,
    ) -> None:
        # By source, then decision: two lookups by strings (their hashes kept), where a
        # (source, decision) key built a tuple and hashed it for every event.
        self.counts: dict[str, dict[str, int]] = {}
        self._name = name
        self._help = help_text
        self._labels = ["source", label]
        self._values = tuple(values)
        registry.register(self)

    def add(self, source: str, decision: str, n: int = 1) -> None:
        by_decision = self.counts.get(source)
        if by_decision is None:
            by_decision = self.counts[source] = {}
        by_decision[decision] = by_decision.get(decision, 0) + n

    def init(self, source: str) -> None:
        """Every decision of ``source`` at 0 (kept if already counted)."""
        by_decision = self.counts.setdefault(source, {})
        for decision in self._values:
            by_decision.setdefault(decision, 0)

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self._name, self._help, labels=self._labels)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._help, labels=self._labels)
        for source, by_decision in list(self.counts.items()):  # copies: one C call each
            for decision, count in list(by_decision.items()):
                family.add_metric([source, decision], count)
        yield family


def _rank_buckets(k_max: int) -> list[float]:
    return [float(b) for b in range(1, k_max + 1)]


class Metrics:
    """Every relmon metric, in groups: the calibration (level, bound, thresholds), the
    items (sets, samples, durations, model calls), traffic and reviews, the live checks
    and health (SLI, coverage, alarm, breaker, sources), the budget (its use, the items
    waiting), the judge, the served answer (``served``) and the segments (``segments``)."""

    def __init__(self, registry: CollectorRegistry, *, k_max: int = 20) -> None:
        self._calibration_metrics(registry)
        self._item_metrics(registry, k_max)
        self._traffic_and_review_metrics(registry)
        self._check_and_health_metrics(registry)
        self._budget_metrics(registry)
        self._judge_metrics(registry)
        self.served = ServedAnswerMetrics(registry)
        self.outbox = ReviewOutboxMetrics(registry)
        self.segments = SegmentMetrics(registry)
        self.otlp = OtlpMetrics(registry)  # created at 0 when traffic.otlp runs

    def _judge_metrics(self, registry: CollectorRegistry) -> None:
        """Judge-assisted calibration (``tasks[].judge``): absent for tasks without one."""
        mt = ("model", "task")
        self.reliability_level_ppi = Gauge(
            "relmon_reliability_level_ppi",
            "Prediction-powered estimate of P(top answer acceptable): the judge's labels of "
            "every scored item corrected by the human verdicts (valid whatever the judge's bias).",
            mt,
            registry=registry,
        )
        self.reliability_lower_bound_ppi = Gauge(
            "relmon_reliability_lower_bound_ppi",
            "One-sided 95% prediction-powered lower bound on P(top answer acceptable).",
            mt,
            registry=registry,
        )
        self.judge_agreement = Gauge(
            "relmon_judge_agreement",
            "Share of human-reviewed items (weighted 1/pi) where the judge agreed with the human.",
            mt,
            registry=registry,
        )
        self.judge_labels = Counter(
            "relmon_judge_labels",
            "Items the judge was asked about, by outcome: acceptable, not_acceptable, "
            "unusable (a reply that says neither), error (the call failed).",
            (*mt, "outcome"),
            registry=registry,
        )

    def _calibration_metrics(self, registry: CollectorRegistry) -> None:
        mt = ("model", "task")
        self.reliability_level = Gauge(
            "relmon_reliability_level",
            "Weighted conformal reliability level 1 - alpha*: mass of calibration items whose "
            "top answer was accepted.",
            mt,
            registry=registry,
        )
        self.reliability_lower_bound = Gauge(
            "relmon_reliability_lower_bound",
            "One-sided Clopper-Pearson lower bound (95%) on P(top answer acceptable) from the "
            "effective calibration counts.",
            mt,
            registry=registry,
        )
        self.reliability_target = Gauge(
            "relmon_reliability_target",
            "The task's configured reliability target (SLO).",
            mt,
            registry=registry,
        )
        self.conformal_threshold = Gauge(
            "relmon_conformal_threshold",
            "Conformal threshold M* at level alpha: the top-M* answers cover an acceptable one "
            "with probability >= 1 - alpha (+Inf: no finite set does).",
            (*mt, "alpha"),
            registry=registry,
        )
        self.calibration_items = Gauge(
            "relmon_calibration_items",
            "Scored verdicts in the calibration window.",
            mt,
            registry=registry,
        )
        self.calibration_effective_items = Gauge(
            "relmon_calibration_effective_items",
            "Effective size (sum w)^2 / sum w^2 of the decayed, inclusion-weighted window.",
            mt,
            registry=registry,
        )

    def _item_metrics(self, registry: CollectorRegistry, k_max: int) -> None:
        mt = ("model", "task")
        self.set_size = Histogram(
            "relmon_set_size",
            "Prediction set size at the task's target alpha, per monitored item.",
            mt,
            buckets=_rank_buckets(k_max),
            registry=registry,
        )
        self.samples_per_item = Histogram(
            "relmon_samples_per_item",
            "Model samples used per monitored item (sequential stopping).",
            mt,
            buckets=_rank_buckets(k_max),
            registry=registry,
        )
        self.max_samples_per_item = Gauge(
            "relmon_max_samples_per_item",
            "K_max: the most model samples one item may use (the cost per item without "
            "sequential stopping).",
            mt,
            registry=registry,
        )
        self.item_duration = Histogram(
            "relmon_item_duration_seconds",
            "Wall time to re-ask the model and score one item (all of its model calls).",
            mt,
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
            registry=registry,
        )
        self.not_reasked = Counter(
            "relmon_not_reasked",
            "Sampled requests relmon must not repeat, by reason: conversation (a re-ask "
            "would append to the user's conversation), server_tool (a tool the provider "
            "runs would run again; reask.server_tools lists read-only ones), unsafe_path, "
            "tools_unrecorded (a span's tool-call answer, its tool definitions not recorded).",
            (*mt, "reason"),
            registry=registry,
        )
        self.reask_overrides = Counter(
            "relmon_reask_overrides",
            "Sampled items whose re-ask differs from the production request in this field, "
            "once per item, field and change: changed (dropped, raised or set; "
            "docs/cost.md) or unrecorded (a span that did not record it).",
            (*mt, "field", "change"),
            registry=registry,
        )
        self.model_calls = Counter(
            "relmon_model_calls",
            "Calls to the model endpoint by outcome.",
            (*mt, "outcome"),
            registry=registry,
        )

    def _traffic_and_review_metrics(self, registry: CollectorRegistry) -> None:
        mt = ("model", "task")
        self.traffic_events = EventCounts(registry)
        self.traffic_requests = EventCounts(
            registry,
            name="relmon_traffic_requests",
            help_text="Requests and events a source saw, by wire API (unmonitored: relayed "
            "by the traffic port, but no API relmon reads).",
            label="api",
            values=TRAFFIC_APIS,
        )
        self.items = Counter(
            "relmon_items",
            "Sampled items by outcome: scored; abandoned after failed model calls; "
            "interrupted: admitted but not finished when the service stopped (SIGTERM).",
            (*mt, "outcome"),
            registry=registry,
        )
        self.review_queue_depth = Gauge(
            "relmon_review_queue_depth",
            "Review items waiting for a verdict.",
            mt,
            registry=registry,
        )
        self.reviews = Counter(
            "relmon_reviews",
            "Verdicts on a known review item: accepted (a candidate), none (none of these), "
            "duplicate (the item already had one), invalid (a rank beyond its candidates).",
            (*mt, "verdict"),
            registry=registry,
        )
        self.verdicts_rejected = Counter(
            "relmon_verdicts_rejected",
            "Verdicts that could not be attributed to a model and task: unknown (no such "
            "review item) or invalid (not a readable verdict).",
            ("reason",),
            registry=registry,
        )
        for reason in REJECTED_VERDICT_REASONS:
            self.verdicts_rejected.labels(reason)

    def _budget_metrics(self, registry: CollectorRegistry) -> None:
        """The call budget's use and the admitted items not started yet."""
        self.budget_utilization = Gauge(
            "relmon_budget_utilization",
            "Share of the calls-per-minute budget reserved by admitted items (0..1).",
            registry=registry,
        )
        self.items_waiting = Gauge(
            "relmon_items_waiting",
            "Admitted items not started yet: waiting for a worker, or with budget.pace for "
            "their turn.",
            registry=registry,
        )

    def _check_and_health_metrics(self, registry: CollectorRegistry) -> None:
        """The SLI, the live self-check, the alarm and health (docs/metrics.md)."""
        mt = ("model", "task")
        self.top_answers = Counter(
            "relmon_top_answers",
            "Reviewed items whose top answer was accepted or rejected, each counted with "
            "weight 1/pi (inverse inclusion probability): an unbiased SLI of the traffic.",
            (*mt, "outcome"),
            registry=registry,
        )
        self.coverage_checks = Counter(
            "relmon_coverage_checks",
            "Applied verdicts checked against the threshold M*(alpha) in force when the item "
            "was scored, each weighted 1/pi (its inverse inclusion probability).",
            (*mt, "alpha"),
            registry=registry,
        )
        self.coverage_misses = Counter(
            "relmon_coverage_misses",
            "Applied verdicts whose score exceeded the threshold M*(alpha) in force when the "
            "item was scored (the served set missed), weighted 1/pi. Realised coverage = "
            "1 - misses/checks.",
            (*mt, "alpha"),
            registry=registry,
        )
        self.coverage_target = Gauge(
            "relmon_coverage_target",
            "The promised coverage 1 - alpha of the conformal set at level alpha (a constant "
            "per alpha, so that rules and dashboards can compare realised coverage with it).",
            (*mt, "alpha"),
            registry=registry,
        )
        self.reliability_alarm_evalue = Gauge(
            "relmon_reliability_alarm_evalue",
            "E-detector statistic for 'reliability below target' (anytime-valid; the alarm "
            "fires at 1/alpha_alarm).",
            mt,
            registry=registry,
        )
        self.reliability_alarm = Gauge(
            "relmon_reliability_alarm",
            "1 while the anytime-valid reliability alarm is raised, else 0.",
            mt,
            registry=registry,
        )
        self.circuit_open = Gauge(
            "relmon_circuit_open",
            "1 while the model endpoint's circuit breaker is not closed (open, or half-open "
            "until a trial call succeeds): items are not re-asked, monitoring has stopped. "
            "Else 0.",
            mt,
            registry=registry,
        )
        self.review_submit_failures = Counter(
            "relmon_review_submit_failures",
            "Review items whose write to the review queue (SQLite, PostgreSQL or the Kafka "
            "review topic) failed when they were scored: kept in the review outbox and "
            "written when the queue takes writes again.",
            mt,
            registry=registry,
        )
        self.source_restarts = Counter(
            "relmon_source_restarts",
            "Restarts of a source after it failed: the Kafka traffic source (kafka) and the "
            "verdict follower (verdicts). The mirror and proxy listeners are never restarted.",
            ("source",),
            registry=registry,
        )
        self.kafka = KafkaMetrics(registry)
        self.kafka_consumer_lag = self.kafka.consumer_lag

    def init_task(
        self,
        model: str,
        task: str,
        alphas: Sequence[float],
        call_outcomes: Sequence[str] = (),
        reask_fields: Sequence[str] = (),
    ) -> None:
        """Create every known label combination of one (model, task) at 0.

        An empty window's values: items 0, every threshold +Inf (k > n); no level and no
        lower bound (they appear at the first verdict, see :meth:`publish`).
        """
        self.calibration_items.labels(model, task)
        self.calibration_effective_items.labels(model, task)
        self.set_size.labels(model, task)
        self.samples_per_item.labels(model, task)
        self.item_duration.labels(model, task)
        for outcome in call_outcomes:
            self.model_calls.labels(model, task, outcome)
        for name in reask_fields:
            self.reask_overrides.labels(model, task, name, CHANGED)
        for reason in NOT_REASKED_REASONS:
            self.not_reasked.labels(model, task, reason)
        for outcome in ITEM_OUTCOMES:
            self.items.labels(model, task, outcome)
        for kind in VERDICT_KINDS:
            self.reviews.labels(model, task, kind)
        for outcome in TOP_ANSWER_OUTCOMES:
            self.top_answers.labels(model, task, outcome)
        for alpha in alphas:
            self.conformal_threshold.labels(model, task, f"{alpha:g}").set(math.inf)
            self.coverage_target.labels(model, task, f"{alpha:g}").set(1.0 - alpha)
            self.coverage_checks.labels(model, task, f"{alpha:g}")
            self.coverage_misses.labels(model, task, f"{alpha:g}")
        self.review_queue_depth.labels(model, task)
        self.reliability_alarm_evalue.labels(model, task).set(1.0)
        self.reliability_alarm.labels(model, task)
        self.circuit_open.labels(model, task)
        self.review_submit_failures.labels(model, task)
        self.outbox.init(model, task)
        self.served.init(model, task)

    def init_judge(self, model: str, task: str) -> None:
        """A judged task's label counters at 0."""
        for outcome in JUDGE_OUTCOMES:
            self.judge_labels.labels(model, task, outcome)

    def publish_ppi(self, model: str, task: str, estimate: PPIEstimate | None) -> None:
        """The prediction-powered gauges; absent while there is no estimate (too few
        reviewed items with a judge label)."""
        gauges = (
            self.reliability_level_ppi,
            self.reliability_lower_bound_ppi,
            self.judge_agreement,
        )
        if estimate is None:
            for gauge in gauges:
                with contextlib.suppress(KeyError):
                    gauge.remove(model, task)
            return
        self.reliability_level_ppi.labels(model, task).set(estimate.level)
        self.reliability_lower_bound_ppi.labels(model, task).set(estimate.lower_bound)
        self.judge_agreement.labels(model, task).set(estimate.agreement)

    def init_source(self, source: str, *, traffic: bool = True) -> None:
        """Create one configured source's series at 0: its ``relmon_source_restarts_total``
        and, for a traffic source (not the verdict follower), every
        ``relmon_traffic_events_total`` decision."""
        self.source_restarts.labels(source)
        if traffic:
            self.traffic_events.init(source)
            self.traffic_requests.init(source)

    def publish(
        self, model: str, task: str, snapshot: WindowSnapshot, alphas: Sequence[float]
    ) -> None:
        """Set the window gauges of one (model, task). The level and the bound exist only
        while the window holds a verdict: an empty window has no estimate, not a 0."""
        if snapshot.n > 0:
            self.reliability_level.labels(model, task).set(snapshot.reliability_level)
            self.reliability_lower_bound.labels(model, task).set(snapshot.reliability_lower_bound)
        else:
            for gauge in (self.reliability_level, self.reliability_lower_bound):
                with contextlib.suppress(KeyError):
                    gauge.remove(model, task)
        self.calibration_items.labels(model, task).set(snapshot.n)
        self.calibration_effective_items.labels(model, task).set(snapshot.n_eff)
        for alpha in alphas:
            value = snapshot.thresholds.get(alpha, math.inf)
            self.conformal_threshold.labels(model, task, f"{alpha:g}").set(value)
