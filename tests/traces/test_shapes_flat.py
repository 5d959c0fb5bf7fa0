"""OpenInference and OpenLLMetry spans (indexed attributes) read into wire-API
requests, and which shape wins where a span carries two."""

from __future__ import annotations

import json
from collections.abc import Mapping

from monitor.core.apis.registry import get_api
from monitor.core.traces.otlp_json import decode_traces
from monitor.core.traces.shapes import SpanCall, read_span
from tests.traces.otlp import span, traces_doc

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _read(attributes: Mapping[str, object]) -> SpanCall:
    [decoded] = decode_traces(traces_doc(span(attributes, name="ChatCompletion")))
    return read_span(decoded)


OPENINFERENCE_OPENAI = {
    "openinference.span.kind": "LLM",
    "llm.system": "openai",
    "llm.provider": "openai",
    "llm.model_name": "gpt-4o-2024-08-06",
    "llm.invocation_parameters": json.dumps(
        {
            "model": "gpt-4o",
            "temperature": 0.7,
            "max_tokens": 256,
            "response_format": {"type": "json_object"},
        }
    ),
    "input.value": "{}",
    "input.mime_type": "application/json",
    "llm.input_messages.0.message.role": "system",
    "llm.input_messages.0.message.content": "Answer in JSON.",
    "llm.input_messages.1.message.role": "user",
    "llm.input_messages.1.message.contents.0.message_content.type": "text",
    "llm.input_messages.1.message.contents.0.message_content.text": "Weather in Oslo?",
    "llm.output_messages.0.message.role": "assistant",
    "llm.output_messages.0.message.content": '{"answer": "cold"}',
    "llm.tools.0.tool.json_schema": json.dumps(TOOL),
    "llm.token_count.prompt": 31,
}


def test_openinference_openai() -> None:
    call = _read(OPENINFERENCE_OPENAI)
    assert (call.outcome, call.shape, call.api, call.model) == (
        "read",
        "openinference",
        "openai.chat",
        "gpt-4o-2024-08-06",
    )
    assert call.request == {
        "model": "gpt-4o-2024-08-06",
        "messages": [
            {"role": "system", "content": "Answer in JSON."},
            {"role": "user", "content": "Weather in Oslo?"},
        ],
        "tools": [TOOL],
        "temperature": 0.7,
        "max_tokens": 256,
        "response_format": {"type": "json_object"},
    }
    assert call.served == '{"answer": "cold"}'
    assert call.unrecorded == ()  # the invocation parameters hold every parameter sent


def test_openinference_anthropic_tool_call_answer() -> None:
    attributes = {
        "openinference.span.kind": "LLM",
        "llm.provider": "anthropic",
        "llm.system": "anthropic",
        "llm.model_name": "claude-3-5-haiku-20241022",
        "llm.invocation_parameters": json.dumps(
            {"max_tokens": 512, "thinking": {"type": "disabled"}}
        ),
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "Weather in Oslo?",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "toolu_1",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "get_weather",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": (
            '{"city": "Oslo"}'
        ),
        "llm.tools.0.tool.json_schema": json.dumps(
            {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
        ),
    }
    call = _read(attributes)
    assert call.api == "anthropic.messages" and call.served_tool_call
    assert call.request == {
        "model": "claude-3-5-haiku-20241022",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [
            {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
        ],
        "max_tokens": 512,
        "thinking": {"type": "disabled"},
    }
    assert call.served is not None and "get_weather" in call.served and "Oslo" in call.served


OPENLLMETRY = {
    "llm.request.type": "chat",
    "gen_ai.system": "OpenAI",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.request.temperature": 0.2,
    "gen_ai.request.max_tokens": 100,
    "llm.presence_penalty": 0.5,
    "llm.is_streaming": False,
    "gen_ai.openai.api_base": "https://api.openai.com/v1/",
    "gen_ai.prompt.0.role": "system",
    "gen_ai.prompt.0.content": "You route tickets.",
    "gen_ai.prompt.1.role": "user",
    "gen_ai.prompt.1.content": json.dumps([{"type": "text", "text": "My card was charged twice."}]),
    "gen_ai.completion.0.role": "assistant",
    "gen_ai.completion.0.finish_reason": "stop",
    "gen_ai.completion.0.content": "billing",
    "llm.request.functions.0.name": "route",
    "llm.request.functions.0.description": "Route a ticket",
    "llm.request.functions.0.parameters": json.dumps({"type": "object", "properties": {}}),
}


def test_openllmetry_openai() -> None:
    call = _read(OPENLLMETRY)
    assert (call.outcome, call.shape, call.api, call.model) == (
        "read",
        "openllmetry",
        "openai.chat",
        "gpt-4o",
    )
    assert call.request == {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You route tickets."},
            {"role": "user", "content": "My card was charged twice."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "route",
                    "description": "Route a ticket",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
        "temperature": 0.2,
        "max_tokens": 100,
        "presence_penalty": 0.5,
    }
    assert call.served == "billing"
    assert call.unrecorded == ("stop", "response_format", "tool_choice", "reasoning_effort")


def test_openllmetry_tool_calls_and_a_completion() -> None:
    attributes = {
        "llm.request.type": "chat",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "Weather?",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "call_1",
        "gen_ai.completion.0.tool_calls.0.name": "get_weather",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"city":"Rome"}',
    }
    call = _read(attributes)
    assert call.served_tool_call and call.served is not None and "Rome" in call.served
    legacy = {
        "llm.request.type": "completion",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-3.5-turbo-instruct",
        "gen_ai.prompt.0.user": "Say this is a test",
        "gen_ai.completion.0.content": "This is a test",
    }
    completion = _read(legacy)
    assert (completion.api, completion.request, completion.served) == (
        "openai.completions",
        {"model": "gpt-3.5-turbo-instruct", "prompt": "Say this is a test"},
        "This is a test",
    )
    assert get_api("openai.completions").query(completion.request or {}) == "Say this is a test"


def test_the_first_shape_holding_messages_wins() -> None:
    both = {
        **OPENINFERENCE_OPENAI,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "A"}]}]
        ),
    }
    call = _read(both)
    assert call.shape == "genai" and call.request is not None
    assert call.request["messages"] == [{"role": "user", "content": "A"}]
    empty_genai = {**both, "gen_ai.input.messages": "[]"}  # holds no message: the next shape reads
    assert _read(empty_genai).shape == "openinference"
    assert _read({**OPENLLMETRY, **OPENINFERENCE_OPENAI}).shape == "openinference"
