"""OpenTelemetry export through the app, into an OTLP/HTTP receiver that decodes the
protobuf payloads as a Collector would: the ``gen_ai.evaluation.result`` events of
stored verdicts (names, attributes, no prompt text) and the reliability gauges (the same
values as the Prometheus gauges)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from prometheus_client import CollectorRegistry

from adapters.otel.exporter import OtelExporter
from monitor.app.runner import Running, start_service
from monitor.app.validation import validate_settings
from monitor.config import load_settings
from monitor.config.otel import OtelSettings, parse_otlp_headers
from monitor.core.errors import ConfigError
from monitor.core.review import ReviewItem, Verdict
from monitor.engine.ports import Judgement
from tests.ports import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SECRET_QUERY = "What is the capital of Atlantis, asked by patient 4711?"


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Receiver:
    port: int
    events: list[dict[str, Any]] = field(default_factory=list)
    gauges: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)
    headers: list[dict[str, str]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)

    async def logs(self, request: web.Request) -> web.Response:
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        assert request.content_type == "application/x-protobuf"
        payload = ExportLogsServiceRequest.FromString(await request.read())
        for resource_logs in payload.resource_logs:
            self.resources.append(
                {a.key: _value(a.value) for a in resource_logs.resource.attributes}
            )
            for scope in resource_logs.scope_logs:
                for record in scope.log_records:
                    attrs = {a.key: _value(a.value) for a in record.attributes}
                    self.events.append({"event_name": record.event_name, **attrs})
        body = ExportLogsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def metrics(self, request: web.Request) -> web.Response:
        payload = ExportMetricsServiceRequest.FromString(await request.read())
        for resource_metrics in payload.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    points = self.gauges.setdefault(metric.name, [])
                    for point in metric.gauge.data_points:
                        attrs = {a.key: _value(a.value) for a in point.attributes}
                        points.append((point.as_double, attrs))
        body = ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    app = web.Application()
    rec = Receiver(port=free_port())
    app.add_routes([web.post("/v1/logs", rec.logs), web.post("/v1/metrics", rec.metrics)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", rec.port)
    await site.start()
    try:
        yield rec
    finally:
        await runner.cleanup()


def _settings(tmp_path: Path, otel: str, *, log_prompts: bool = False) -> Any:
    path = tmp_path / "relmon.yaml"
    path.write_text(
        f"""tasks:
  - name: arith
    canonicalizer: numeric
    review_rate: 1.0
    endpoint: {{model: sim-1, base_url: "http://127.0.0.1:9/v1"}}
metrics: {{port: {free_port()}}}
review: {{port: {free_port()}, token: tok-otel-123456}}
traffic: {{mode: "off"}}
otel: {otel}
log_prompts: {str(log_prompts).lower()}
state_dir: "{tmp_path / "state"}"
query_hash_key: "0123456789abcdef0123456789abcdef"
""",
        encoding="utf-8",
    )
    return load_settings(path)


def _item(n: int) -> ReviewItem:
    return ReviewItem(
        item_id=f"arith:req-{n}",
        model="sim-1",
        task="arith",
        query=SECRET_QUERY,
        candidates=(("Poseidonia", 5), ("Atlantica", 2), ("Nowhere", 1)),
        k=8,
        inclusion_probability=0.5,
        sampled_at=time.time(),
    )


async def _verdicts(running: Running, more: int = 0) -> None:
    """Three verdicts (top answer, second, none), then ``more`` accepting the top one."""
    given = [((1,), False), ((2,), False), ((), True)] + [((1,), False)] * more
    for n, (ranks, none_of_these) in enumerate(given):
        item = _item(n)
        await running.store.save_review_item(item)
        verdict = Verdict(item.item_id, ranks, none_of_these)
        assert (await running.service.apply_verdict(verdict)).status == "applied"


async def test_verdicts_and_gauges_reach_an_otlp_receiver(
    tmp_path: Path, receiver: Receiver
) -> None:
    headers = tmp_path / "otel-headers"
    headers.write_text("authorization=Bearer otel-secret-1\n# a comment\nx-tenant=team-a\n")
    otel = (
        f"{{enabled: true, endpoint: 'http://127.0.0.1:{receiver.port}', "
        f"headers_file: '{headers}', export_interval_s: 0.2, service_name: relmon-test}}"
    )
    running = await start_service(_settings(tmp_path, otel))
    try:
        await _verdicts(running, more=27)
        await wait_until(
            lambda: "relmon.reliability_level" in receiver.gauges,
            timeout_s=30,
            what="a gauge export",
        )
        snapshot = running.service.snapshot("sim-1", "arith")
        labels = {"model": "sim-1", "task": "arith"}
        registry_level = running.registry.get_sample_value("relmon_reliability_level", labels)
        registry_thresholds = {
            s.labels["alpha"]: s.value
            for family in running.registry.collect()
            if family.name == "relmon_conformal_threshold"
            for s in family.samples
        }
    finally:
        await running.close(1)  # flushes the batched events
    assert [e["gen_ai.evaluation.score.label"] for e in receiver.events] == [
        "acceptable",
        "not_acceptable",
        "not_acceptable",
    ] + ["acceptable"] * 27
    first, second, third = receiver.events[:3]
    assert first["event_name"] == "gen_ai.evaluation.result"
    assert first["gen_ai.evaluation.name"] == "relmon.top_answer_acceptable"
    assert (
        first["gen_ai.evaluation.score.value"] == 1.0
        and second["gen_ai.evaluation.score.value"] == 0.0
    )
    assert first["gen_ai.request.model"] == "sim-1" and first["relmon.task"] == "arith"
    assert first["relmon.item_id"] == "arith:req-0" and first["relmon.evaluator"] == "human"
    assert (
        first["relmon.accepted_rank"],
        second["relmon.accepted_rank"],
        third["relmon.accepted_rank"],
    ) == (1, 2, 0)
    assert math.isinf(third["relmon.conformal_score"])
    assert (
        second["gen_ai.evaluation.explanation"]
        == "human review: first acceptable answer at rank 2 of 3"
    )
    assert first["relmon.inclusion_probability"] == 0.5
    everything = repr(receiver.events)
    assert "Atlantis" not in everything and "Poseidonia" not in everything  # no prompt text
    assert receiver.headers[0]["authorization"] == "Bearer otel-secret-1"
    assert receiver.headers[0]["x-tenant"] == "team-a"
    assert receiver.resources[0]["service.name"] == "relmon-test"
    # The last export carries the gauges as the Prometheus registry has them.
    levels = [
        v for v, attrs in receiver.gauges["relmon.reliability_level"] if attrs["task"] == "arith"
    ]
    # (the decay of a few seconds moves it in the 7th digit)
    assert levels[-1] == pytest.approx(snapshot.reliability_level, abs=1e-5)
    assert registry_level == pytest.approx(snapshot.reliability_level, abs=1e-5)
    # Thresholds: the finite ones as they are; +Inf (no finite set certified for that
    # alpha) is not sent, as OpenTelemetry drops non-finite measurements.
    exported = {a["alpha"]: v for v, a in receiver.gauges["relmon.conformal_threshold"]}
    finite = {a: v for a, v in registry_thresholds.items() if math.isfinite(v)}
    assert finite and len(finite) < len(registry_thresholds)  # both kinds in this window
    assert exported == finite
    assert "relmon.reliability_lower_bound" in receiver.gauges


async def test_prompt_text_only_when_asked(tmp_path: Path, receiver: Receiver) -> None:
    otel = f"{{enabled: true, endpoint: 'http://127.0.0.1:{receiver.port}', export_interval_s: 60}}"
    running = await start_service(_settings(tmp_path, otel, log_prompts=True))
    try:
        await _verdicts(running)
    finally:
        await running.close(1)
    assert [e.get("relmon.top_answer") for e in receiver.events] == ["Poseidonia"] * 3


async def test_a_receiver_that_is_down_costs_no_verdict(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    otel = f"{{enabled: true, endpoint: '{down}', export_interval_s: 0.1, timeout_s: 0.5}}"
    running = await start_service(_settings(tmp_path, otel))
    try:
        await _verdicts(running)
        await asyncio.sleep(0.3)  # exports fail meanwhile, in their threads
        assert running.service.snapshot("sim-1", "arith").n == 3
    finally:
        started = time.monotonic()
        await running.close(1)
    assert time.monotonic() - started < 15


def test_otel_settings_are_checked(tmp_path: Path) -> None:
    assert OtelSettings().enabled is False  # off by default
    with pytest.raises(ValueError, match="http"):
        OtelSettings(endpoint="grpc://collector:4317")
    assert parse_otlp_headers("a=1, b = two\n#c\n", "x") == {"a": "1", "b": "two"}
    with pytest.raises(ConfigError) as info:
        parse_otlp_headers("a=1,secret-token-without-equals", "otel.headers_file")
    assert "entry 2" in str(info.value) and "secret-token" not in str(info.value)


def test_check_config_reads_the_headers_file(tmp_path: Path) -> None:
    otel = f"{{enabled: true, headers_file: '{tmp_path / 'missing'}'}}"
    with pytest.raises(ConfigError, match=r"otel\.headers_file: cannot read"):
        validate_settings(_settings(tmp_path, otel))
    bad = tmp_path / "bad"
    bad.write_text("Bearer abc\n")
    with pytest.raises(ConfigError, match=r"otel\.headers_file: expected key=value"):
        validate_settings(_settings(tmp_path, f"{{enabled: true, headers_file: '{bad}'}}"))
    assert (
        validate_settings(_settings(tmp_path, f"{{enabled: false, headers_file: '{bad}'}}")) == []
    )


async def test_judge_labels_are_evaluation_events_too(receiver: Receiver) -> None:
    settings = OtelSettings(enabled=True, endpoint=f"http://127.0.0.1:{receiver.port}")
    exporter = OtelExporter(settings, CollectorRegistry(), refresh=lambda: None)
    exporter.judgement(Judgement("arith:req-7", "sim-1", "arith", 1.0, acceptable=False))
    exporter.judgement(Judgement("arith:req-8", "sim-1", "arith", 2.0, acceptable=True))
    await exporter.aclose()
    assert [(e["relmon.item_id"], e["gen_ai.evaluation.score.label"]) for e in receiver.events] == [
        ("arith:req-7", "not_acceptable"),
        ("arith:req-8", "acceptable"),
    ]
    first = receiver.events[0]
    assert first["event_name"] == "gen_ai.evaluation.result"
    assert first["relmon.evaluator"] == "llm_judge"
    assert first["gen_ai.evaluation.name"] == "relmon.top_answer_acceptable"
    assert first["gen_ai.evaluation.score.value"] == 0.0
