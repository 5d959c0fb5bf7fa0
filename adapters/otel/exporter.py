"""OpenTelemetry export: evaluation results as GenAI events, reliability gauges as metrics.

Every verdict this replica stores becomes one ``gen_ai.evaluation.result`` event (the
OpenTelemetry GenAI semantic convention for evaluations) sent over OTLP/HTTP to
``<endpoint>/v1/logs``, and so does every judge label it stores (``tasks[].judge``:
``relmon.evaluator`` ``llm_judge``, the same name, score and label; no rank). A verdict's:

- ``gen_ai.evaluation.name``: ``relmon.top_answer_acceptable``;
- ``gen_ai.evaluation.score.value``: 1.0 when the human accepted the top-ranked answer,
  else 0.0; ``gen_ai.evaluation.score.label``: ``acceptable`` / ``not_acceptable``;
- ``gen_ai.evaluation.explanation``: which rank the reviewer accepted, in words;
- ``gen_ai.request.model``, ``relmon.task``, ``relmon.item_id``, ``relmon.evaluator``
  (``human``), ``relmon.accepted_rank`` (0: none of the candidates),
  ``relmon.conformal_score`` and ``relmon.inclusion_probability``.

No prompt or answer text is in any attribute unless ``log_prompts`` is on (then
``relmon.top_answer``). The gauges of :data:`BRIDGED` are read from the Prometheus
registry right after the service refreshed them and exported every
``otel.export_interval_s`` to ``<endpoint>/v1/metrics`` under dotted names
(``relmon.reliability_level``: a Collector's Prometheus exporter turns it back into
``relmon_reliability_level``), with the same labels as attributes.

The OTLP exporters are blocking HTTP clients: the metrics export runs in a worker thread,
the events go through the SDK's batch processor (its own thread), so neither ever holds
up the event loop, and a receiver that is down costs a logged export error, no verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable

import structlog
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from monitor.config.otel import OtelSettings
from monitor.core.review import ReviewItem, Verdict
from monitor.engine.ports import CalibrationRecord, Judgement

__all__ = [
    "BRIDGED",
    "EVALUATION_EVENT",
    "EVALUATION_NAME",
    "OtelExporter",
    "evaluation_attributes",
]

log = structlog.get_logger("relmon")

EVALUATION_EVENT = "gen_ai.evaluation.result"
EVALUATION_NAME = "relmon.top_answer_acceptable"

BRIDGED: tuple[str, ...] = (
    "relmon_reliability_level",
    "relmon_reliability_lower_bound",
    "relmon_reliability_target",
    "relmon_conformal_threshold",
    "relmon_calibration_items",
    "relmon_calibration_effective_items",
    "relmon_reliability_alarm",
    "relmon_review_queue_depth",
)
"""The Prometheus gauges exported as OTel gauges (``relmon_x`` as ``relmon.x``)."""


def evaluation_attributes(
    item: ReviewItem, record: CalibrationRecord, *, log_prompts: bool
) -> dict[str, str | float | int]:
    """The attributes of one ``gen_ai.evaluation.result`` event."""
    acceptable = record.score <= 1
    # The score is the rank of the first acceptable candidate (inf: none was).
    rank = int(record.score) if math.isfinite(record.score) else 0
    explanation = (
        "human review: none of the candidates acceptable"
        if rank == 0
        else f"human review: first acceptable answer at rank {rank} of {len(item.candidates)}"
    )
    attributes: dict[str, str | float | int] = {
        "gen_ai.evaluation.name": EVALUATION_NAME,
        "gen_ai.evaluation.score.value": 1.0 if acceptable else 0.0,
        "gen_ai.evaluation.score.label": "acceptable" if acceptable else "not_acceptable",
        "gen_ai.evaluation.explanation": explanation,
        "gen_ai.request.model": item.model,
        "relmon.task": item.task,
        "relmon.item_id": item.item_id,
        "relmon.evaluator": "human",
        "relmon.accepted_rank": rank,
        "relmon.conformal_score": float(record.score),
        "relmon.inclusion_probability": item.inclusion_probability,
    }
    if log_prompts and item.candidates:
        attributes["relmon.top_answer"] = item.candidates[0][0]
    return attributes


def judgement_attributes(judgement: Judgement) -> dict[str, str | float | int]:
    """The attributes of the ``gen_ai.evaluation.result`` event of one judge label."""
    acceptable = judgement.acceptable
    return {
        "gen_ai.evaluation.name": EVALUATION_NAME,
        "gen_ai.evaluation.score.value": 1.0 if acceptable else 0.0,
        "gen_ai.evaluation.score.label": "acceptable" if acceptable else "not_acceptable",
        "gen_ai.evaluation.explanation": "LLM judge (tasks[].judge) on the top-ranked answer",
        "gen_ai.request.model": judgement.model,
        "relmon.task": judgement.task,
        "relmon.item_id": judgement.item_id,
        "relmon.evaluator": "llm_judge",
    }


class OtelExporter:
    """Sends evaluation events as they come and the gauges every interval."""

    def __init__(
        self,
        settings: OtelSettings,
        registry: CollectorRegistry,
        *,
        refresh: Callable[[], None],
        log_prompts: bool = False,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.refresh = refresh
        self.log_prompts = log_prompts
        headers = settings.resolved_headers()
        resource = Resource.create({"service.name": settings.service_name})
        self._logs = LoggerProvider(resource=resource)
        self._logs.add_log_record_processor(
            BatchLogRecordProcessor(
                OTLPLogExporter(
                    endpoint=f"{settings.endpoint}/v1/logs",
                    headers=headers,
                    timeout=settings.timeout_s,
                )
            )
        )
        self._logger = self._logs.get_logger("relmon")
        # No timer thread of the reader's own (an infinite interval): run() collects right
        # after the service refreshed the gauges, on the event loop's schedule.
        self._reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(
                endpoint=f"{settings.endpoint}/v1/metrics",
                headers=headers,
                timeout=settings.timeout_s,
            ),
            export_interval_millis=math.inf,
        )
        self._meters = MeterProvider(resource=resource, metric_readers=[self._reader])
        meter = self._meters.get_meter("relmon")
        self._values: dict[str, list[tuple[float, dict[str, str]]]] = {}
        for name in BRIDGED:
            meter.create_observable_gauge(
                "relmon." + name.removeprefix("relmon_"), callbacks=[self._observer(name)]
            )
        self._task: asyncio.Task[None] | None = None

    def verdict(self, item: ReviewItem, verdict: Verdict, record: CalibrationRecord) -> None:
        """A stored verdict (a :data:`monitor.engine.calibration.VerdictListener`)."""
        self._logger.emit(
            event_name=EVALUATION_EVENT,
            attributes=evaluation_attributes(item, record, log_prompts=self.log_prompts),
        )

    def judgement(self, judgement: Judgement) -> None:
        """A judge label this replica stored (a ``JudgementListener``)."""
        self._logger.emit(event_name=EVALUATION_EVENT, attributes=judgement_attributes(judgement))

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, labels) for value, labels in self._values.get(name, ())]

        return observe

    def snapshot(self) -> None:
        """Copy the bridged gauges (on the event loop, where they are written)."""
        values: dict[str, list[tuple[float, dict[str, str]]]] = {}
        for family in self.registry.collect():
            if family.name in BRIDGED:
                values[family.name] = [
                    (s.value, dict(s.labels)) for s in family.samples if s.name == family.name
                ]
        self._values = values

    async def export_metrics(self) -> None:
        """Refresh, copy and export the gauges once (the export in a worker thread)."""
        self.refresh()
        self.snapshot()
        await asyncio.to_thread(self._reader.collect, timeout_millis=self.settings.timeout_s * 1000)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.export_interval_s)
            try:
                await self.export_metrics()
            except Exception as exc:  # an exporter bug: log it, try again next time
                log.error("otel_export_failed", error=repr(exc))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="relmon-otel")

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Send the events still batched (blocking: call it in a thread)."""
        return self._logs.force_flush(int(timeout_s * 1000))

    async def aclose(self) -> None:
        """A last export of both, then shut the providers down."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.export_metrics()
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._logs.shutdown()
        self._meters.shutdown()
