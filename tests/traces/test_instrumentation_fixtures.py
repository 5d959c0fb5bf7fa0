"""The span reader on the published instrumentations' real output: OTLP JSON exported by
``opentelemetry-instrumentation-openai-v2`` 2.4b0 (semconv 1.30 log records, and the
latest conventions on the span or in an operation-details record), OpenInference's
OpenAI 0.1.66 and Anthropic 3.1.0, and OpenLLMetry's OpenAI and Anthropic 0.62.4
(attributes, and its per-message log records), each for one call of the official SDK
(``fixtures/``: the spans and log records as the OTLP exporters sent them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.core.traces.otlp_json import decode_logs, decode_traces
from monitor.core.traces.shapes import read_span

FIXTURES = Path(__file__).parent / "fixtures"
QUESTION = "What is the capital of France?"
SYSTEM = "Answer briefly."
CHAT = {
    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
    "temperature": 0.2,
    "model": "gpt-4.1",
}
MESSAGES = {
    "messages": [{"role": "user", "content": QUESTION}],
    "system": SYSTEM,
    "max_tokens": 64,
    "model": "claude-haiku-4-5",
}


@pytest.mark.parametrize(
    ("fixture", "shape", "api", "request_body", "unrecorded"),
    [
        ("openai_v2_legacy_events", "genai_events", "openai.chat", CHAT, "tools"),
        ("openai_v2_span_only", "genai", "openai.chat", CHAT, "tools"),
        ("openai_v2_event_only", "genai_events", "openai.chat", CHAT, "tools"),
        ("openinference_openai", "openinference", "openai.chat", CHAT, None),
        ("openinference_anthropic", "openinference", "anthropic.messages", MESSAGES, None),
        ("openllmetry_openai", "genai", "openai.chat", CHAT, "tools"),
        ("openllmetry_openai_events", "genai_events", "openai.chat", CHAT, "tools"),
        ("openllmetry_anthropic", "genai", "anthropic.messages", MESSAGES, "tools"),
    ],
)
def test_real_instrumentation_output_is_read(
    fixture: str, shape: str, api: str, request_body: dict[str, object], unrecorded: str | None
) -> None:
    doc = json.loads((FIXTURES / f"{fixture}.json").read_text(encoding="utf-8"))
    [span] = decode_traces(doc["traces"])
    records = decode_logs(doc["logs"]) if doc["logs"] is not None else []
    assert all((r.trace_id, r.span_id) == (span.trace_id, span.span_id) for r in records)
    call = read_span(span, records)
    assert (call.outcome, call.shape, call.api) == ("read", shape, api)
    assert call.request == request_body
    assert call.served == "Paris"
    # OpenInference records every parameter the call sent, so nothing is unrecorded; the
    # GenAI conventions record tool definitions only on opt-in.
    assert (unrecorded in call.unrecorded) if unrecorded else call.unrecorded == ()


def test_the_same_span_without_its_log_records_has_no_content() -> None:
    """The official instrumentation's semconv 1.30 span holds no messages itself."""
    doc = json.loads((FIXTURES / "openai_v2_legacy_events.json").read_text(encoding="utf-8"))
    [span] = decode_traces(doc["traces"])
    assert (read_span(span).outcome, read_span(span).shape) == ("no_content", "genai")
