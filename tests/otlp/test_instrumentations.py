"""The published instrumentations' own output, read by a running relmon: an application
calls the upstream fixture with the official OpenAI or Anthropic SDK (relmon is not in
its path), instrumented by OpenTelemetry's ``opentelemetry-instrumentation-openai-v2``,
Arize's OpenInference or Traceloop's OpenLLMetry, and exports its spans and log records
with the OTel SDK's OTLP/HTTP exporters to relmon's receiver. Each call becomes a scored
review item of the app's question and the upstream's answer, in the right API, counted
under the shape the instrumentation emits; with content capture off it is counted
unmonitored. Each test makes its own providers and uninstruments after its call."""

from __future__ import annotations

import asyncio
import importlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from openinference.instrumentation.anthropic import AnthropicInstrumentor as OIAnthropic
from openinference.instrumentation.openai import OpenAIInstrumentor as OIOpenAI
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation._semconv import _OpenTelemetrySemanticConventionStability
from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor as LLAnthropic
from opentelemetry.instrumentation.openai import OpenAIInstrumentor as LLOpenAI
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as OTelOpenAI
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic.warnings import PydanticDeprecatedSince20

from monitor.core.review import ReviewItem
from tests.apis_e2e.conftest import APIS, MODELS, PROD_KEY, TASK_KEYS
from tests.apis_e2e.upstream import Upstream
from tests.otlp.harness import OtlpRelmon, otlp_relmon, spans_total
from tests.waiting import wait_until

QUESTION = "What is the capital of France?"
SYSTEM = "Answer with the city's name only."
CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"

pytestmark = pytest.mark.integration

with warnings.catch_warnings():  # OpenLLMetry's OpenAI module, loaded by instrument(),
    # declares a pydantic model with a class-based config: pydantic warns at its import.
    warnings.simplefilter("ignore", PydanticDeprecatedSince20)
    importlib.import_module("opentelemetry.instrumentation.openai.v1")


def _call(api: str, up_url: str) -> str:
    """The application's own call (production's key, straight to the upstream)."""
    if api == "messages":
        with anthropic.Anthropic(base_url=up_url, api_key=PROD_KEY) as claude:
            message = claude.messages.create(
                model=MODELS["messages"],
                max_tokens=64,
                system=SYSTEM,
                messages=[{"role": "user", "content": QUESTION}],
            )
            block = message.content[0]
            assert block.type == "text"
            return block.text
    with openai.OpenAI(base_url=f"{up_url}/v1", api_key=PROD_KEY) as gpt:
        completion = gpt.chat.completions.create(
            model=MODELS["chat"],
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        )
        return completion.choices[0].message.content or ""


def _app(instrumentor: Any, api: str, relmon_url: str, up_url: str) -> tuple[str, str]:
    """Instrument, call, uninstrument, flush both exporters (log records first: a span
    waits ``join_s`` for them); the answer and the model call's span id
    (``trace-span``)."""
    resource = Resource.create({"service.name": "capitals"})
    tracer_provider = TracerProvider(resource=resource)
    seen = InMemorySpanExporter()
    tracer_provider.add_span_processor(SimpleSpanProcessor(seen))
    spans = OTLPSpanExporter(endpoint=f"{relmon_url}/v1/traces")
    tracer_provider.add_span_processor(BatchSpanProcessor(spans))
    logger_provider = LoggerProvider(resource=resource)
    records = OTLPLogExporter(endpoint=f"{relmon_url}/v1/logs")
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(records))
    instrumentor.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    try:
        answer = _call(api, up_url)
    finally:
        instrumentor.uninstrument()
        logger_provider.shutdown()
        tracer_provider.shutdown()
    [span] = seen.get_finished_spans()
    assert span.context is not None
    return answer, f"{span.context.trace_id:032x}-{span.context.span_id:016x}"


@pytest.fixture
def latest_genai(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` as a process started
    with it sees it (OTel reads it once per process); the default again afterwards."""
    stability = _OpenTelemetrySemanticConventionStability
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    monkeypatch.setattr(stability, "_initialized", False)
    monkeypatch.setattr(stability, "_OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING", {})
    stability._initialize()
    yield


async def _scored(r: OtlpRelmon, api: str, event_id: str) -> ReviewItem:
    found: list[ReviewItem] = []

    async def stored() -> bool:
        item = await r.running.store.get_review_item(f"{api}:{event_id}")
        found.extend([item] if item is not None else [])
        return item is not None

    await wait_until(stored, timeout_s=30, what=f"review item of span {event_id}")
    return found[-1]


async def _monitored(
    tmp_path: Path, up: Upstream, instrumentor: Any, api: str, shape: str
) -> ReviewItem:
    """The app's call read by relmon: its item scored in ``api`` (a task's name), its
    span counted read under ``shape``; the app's call the only one with production's key
    (relmon was not in its path)."""
    async with otlp_relmon(tmp_path, up, api=api, join_s=1.0) as r:
        answer, event_id = await asyncio.to_thread(_app, instrumentor, api, r.url, up.url)
        assert answer == "Paris"
        item = await _scored(r, api, event_id)
        assert (item.api, item.model) == (APIS[api], MODELS[api])
        assert item.query.endswith(QUESTION)
        assert item.candidates[0][0] == answer.lower()  # the task canonicalizes case
        assert item.served_rank == 1  # the span's served answer, and the re-asks agree
        assert spans_total(r, shape, "read") == 1
        assert len(up.received(key=PROD_KEY)) == 1
        assert up.received(key=TASK_KEYS[api])  # the re-asks
    return item


async def test_official_openai_v2_log_records(
    tmp_path: Path, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Semconv 1.30 (the default): one log record per message, joined to the span."""
    monkeypatch.delenv(OPT_IN, raising=False)
    monkeypatch.setenv(CAPTURE, "true")
    await _monitored(tmp_path, upstream, OTelOpenAI(), "chat", "genai_events")


@pytest.mark.parametrize(
    ("mode", "shape"), [("span_only", "genai"), ("event_only", "genai_events")]
)
@pytest.mark.usefixtures("latest_genai")
async def test_official_openai_v2_latest_conventions(
    tmp_path: Path, upstream: Upstream, monkeypatch: pytest.MonkeyPatch, mode: str, shape: str
) -> None:
    """The latest conventions: messages on the span (``span_only``), or in one
    ``gen_ai.client.inference.operation.details`` log record (``event_only``)."""
    monkeypatch.setenv(CAPTURE, mode)
    await _monitored(tmp_path, upstream, OTelOpenAI(), "chat", shape)


@pytest.mark.parametrize(("instrumentor", "api"), [(OIOpenAI, "chat"), (OIAnthropic, "messages")])
async def test_openinference(
    tmp_path: Path, upstream: Upstream, instrumentor: Callable[[], Any], api: str
) -> None:
    await _monitored(tmp_path, upstream, instrumentor(), api, "openinference")


@pytest.mark.parametrize(
    ("instrumentor", "api", "shape"),
    [
        (LLOpenAI, "chat", "genai"),
        (LLAnthropic, "messages", "genai"),
        (lambda: LLOpenAI(use_attributes=False), "chat", "genai_events"),
    ],
)
async def test_openllmetry(
    tmp_path: Path, upstream: Upstream, instrumentor: Callable[[], Any], api: str, shape: str
) -> None:
    """OpenLLMetry writes the GenAI conventions' span attributes (``use_attributes=True``,
    its default) or per-message log records (``use_attributes=False``)."""
    await _monitored(tmp_path, upstream, instrumentor(), api, shape)


async def test_content_capture_off_is_counted_unmonitored(
    tmp_path: Path, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each instrumentation with its content off: an inference span without messages."""
    monkeypatch.delenv(OPT_IN, raising=False)
    monkeypatch.delenv(CAPTURE, raising=False)  # the official instrumentation's default
    monkeypatch.setenv("OPENINFERENCE_HIDE_INPUTS", "true")
    monkeypatch.setenv("OPENINFERENCE_HIDE_OUTPUTS", "true")
    monkeypatch.setenv("TRACELOOP_TRACE_CONTENT", "false")
    async with otlp_relmon(tmp_path, upstream, join_s=0.5) as r:
        for instrumentor in (OTelOpenAI(), OIOpenAI(), LLOpenAI()):
            answer, _ = await asyncio.to_thread(_app, instrumentor, "chat", r.url, upstream.url)
            assert answer == "Paris"

        async def counted() -> bool:
            events = "relmon_traffic_events_total"
            return r.value(events, source="otlp", decision="unmonitored") == 3

        await wait_until(counted, timeout_s=30, what="three spans without content counted")
        # The official one still writes its per-message log records, without content.
        assert spans_total(r, "genai_events", "no_content") == 1
        assert spans_total(r, "genai", "no_content") == 1  # OpenLLMetry's
        assert spans_total(r, "openinference", "no_content") == 1
        assert r.value("relmon_traffic_events_total", source="otlp", decision="sampled") == 0
        assert upstream.received(key=TASK_KEYS["chat"]) == []  # nothing re-asked
