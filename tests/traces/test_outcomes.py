"""Spans relmon does not read as calls, and why: content capture off, not an inference,
messages cut at an attribute length limit, another schema; and the provider -> API table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from monitor.core.traces.otlp_json import decode_traces
from monitor.core.traces.shapes import SpanCall, is_inference, provider_api, read_span
from tests.traces.otlp import span, traces_doc

CHAT = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4o",
}


def _read(attributes: Mapping[str, object], events: list[Any] | None = None) -> SpanCall:
    [decoded] = decode_traces(traces_doc(span(attributes, events=events)))
    return read_span(decoded)


@pytest.mark.parametrize(
    ("attributes", "shape"),
    [
        (CHAT, "genai"),
        (
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o",
                "llm.token_count.total": 40,
            },
            "openinference",
        ),
        (
            {
                "llm.request.type": "chat",
                "gen_ai.system": "Anthropic",
                "gen_ai.request.model": "claude",
            },
            "openllmetry",
        ),
    ],
)
def test_content_capture_off_is_no_content(attributes: dict[str, object], shape: str) -> None:
    call = _read({**attributes, "gen_ai.usage.input_tokens": 12})
    assert (call.outcome, call.shape, call.request) == ("no_content", shape, None)


def test_the_older_events_without_content_are_no_content() -> None:
    events = [
        {"timeUnixNano": "1", "name": "gen_ai.user.message", "attributes": []},
        {
            "timeUnixNano": "2",
            "name": "gen_ai.choice",
            "attributes": [{"key": "index", "value": {"intValue": "0"}}],
        },
    ]
    call = _read(CHAT, events)
    assert (call.outcome, call.shape) == ("no_content", "genai_events")


@pytest.mark.parametrize(
    ("attributes", "shape"),
    [
        ({"http.request.method": "POST", "url.full": "https://api.example.com/v1/pay"}, "other"),
        ({"db.system.name": "postgresql", "db.query.text": "SELECT 1"}, "other"),
        (
            {
                "gen_ai.operation.name": "embeddings",
                "gen_ai.request.model": "text-embedding-3-small",
            },
            "genai",
        ),
        ({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather"}, "genai"),
        ({"openinference.span.kind": "CHAIN", "input.value": "hi"}, "openinference"),
        ({"gen_ai.request.model": "gpt-4o"}, "genai"),  # no operation, no messages
    ],
)
def test_other_spans_are_not_inference(attributes: dict[str, object], shape: str) -> None:
    call = _read(attributes)
    assert (call.outcome, call.shape) == ("not_inference", shape)


def test_no_operation_but_a_model_and_messages_is_an_inference() -> None:
    messages = [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    attributes = {"gen_ai.request.model": "gpt-4o", "gen_ai.input.messages": json.dumps(messages)}
    assert is_inference(attributes) is None
    assert _read(attributes).outcome == "read"


def _long_messages() -> str:
    turns = [
        {"role": "user", "parts": [{"type": "text", "content": f"Question {i}: " + "x" * 90}]}
        for i in range(20)
    ]
    return json.dumps(turns)


@pytest.mark.parametrize(
    "attribute", ["gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions"]
)
def test_a_value_cut_at_1024_characters_is_rejected_truncated(attribute: str) -> None:
    cut = _long_messages()[:1024]
    call = _read({**CHAT, "gen_ai.input.messages": _long_messages(), attribute: cut})
    assert (call.outcome, call.reason, call.request) == ("rejected", "truncated", None)


def test_cut_flattened_values_are_truncated_too() -> None:
    attributes = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "m",
        "llm.invocation_parameters": '{"temperature": 0.5, "max_tok',
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "hi",
    }
    assert (_read(attributes).outcome, _read(attributes).reason) == ("rejected", "truncated")


@pytest.mark.parametrize(
    "value",
    [
        json.dumps([{"role": "user", "content": "hi"}]),  # OpenAI's shape, not semconv's parts
        json.dumps({"prompt": "hi"}),
        json.dumps(
            [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}]
        ),  # text, not content
        "Tell me a joke",
        json.dumps([{"role": "user", "parts": [{"type": "mystery"}]}]),
    ],
)
def test_another_schema_is_rejected_foreign(value: str) -> None:
    call = _read({**CHAT, "gen_ai.input.messages": value})
    assert (call.outcome, call.reason) == ("rejected", "foreign")


def test_an_image_in_the_question_is_rejected_not_dropped() -> None:
    parts = [
        {"type": "text", "content": "What is this?"},
        {"type": "uri", "modality": "image", "uri": "https://x/y.png"},
    ]
    call = _read({**CHAT, "gen_ai.input.messages": json.dumps([{"role": "user", "parts": parts}])})
    assert (call.outcome, call.reason) == ("rejected", "media")


def test_a_read_span_without_a_model_is_rejected() -> None:
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])
    call = _read({"gen_ai.operation.name": "chat", "gen_ai.input.messages": messages})
    assert (call.outcome, call.reason) == ("rejected", "no_model")


def test_output_only_is_not_a_request_the_api_accepts() -> None:
    outputs = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}])
    call = _read({**CHAT, "gen_ai.output.messages": outputs})
    assert (call.outcome, call.reason, call.api) == ("rejected", "foreign", "openai.chat")


@pytest.mark.parametrize(
    ("attributes", "api"),
    [
        ({"gen_ai.provider.name": "openai"}, "openai.chat"),
        ({"gen_ai.provider.name": "openai", "openai.api.type": "responses"}, "openai.responses"),
        ({"gen_ai.provider.name": "openai", "openai.api.type": "chat_completions"}, "openai.chat"),
        (
            {"gen_ai.system": "openai", "gen_ai.operation.name": "text_completion"},
            "openai.completions",
        ),
        ({"gen_ai.provider.name": "anthropic"}, "anthropic.messages"),
        ({"gen_ai.system": "Anthropic"}, "anthropic.messages"),
        ({"gen_ai.provider.name": "gcp.gemini"}, "gemini.generate_content"),
        ({"gen_ai.provider.name": "gcp.vertex_ai"}, "gemini.generate_content"),
        ({"llm.provider": "google"}, "gemini.generate_content"),
        ({"gen_ai.provider.name": "aws.bedrock"}, "openai.chat"),
        ({"gen_ai.provider.name": "azure.ai.openai"}, "openai.chat"),
        ({"gen_ai.provider.name": "mistral_ai"}, "openai.chat"),
        ({}, "openai.chat"),
        ({"gen_ai.provider.name": "anthropic", "gen_ai.system": "openai"}, "anthropic.messages"),
    ],
)
def test_provider_to_wire_api(attributes: dict[str, object], api: str) -> None:
    assert provider_api(attributes) == api
