"""Spans of the OpenTelemetry GenAI conventions read into wire-API requests: the latest
attributes (JSON text and structured values), the OpenAI v2 instrumentation's older
events as log records joined by ids, the same events on the span, and the semconv 1.37
``gen_ai.client.inference.operation.details`` event."""

from __future__ import annotations

import json
from collections.abc import Mapping

from monitor.core.apis.registry import get_api
from monitor.core.traces.join import LogJoiner
from monitor.core.traces.otlp_json import decode_logs, decode_traces
from monitor.core.traces.shapes import read_span
from monitor.core.traces.spans import Span
from tests.traces.otlp import attr, log_record, logs_doc, span, traces_doc

SYSTEM = [{"type": "text", "content": "You are a support agent for ACME."}]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _one(attributes: Mapping[str, object], events: list[dict[str, object]] | None = None) -> Span:
    [decoded] = decode_traces(traces_doc(span(attributes, events=events)))
    return decoded


def test_latest_semconv_with_json_text_values_is_an_openai_chat_call() -> None:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.request.temperature": 0.3,
        "gen_ai.request.max_tokens": 300,
        "gen_ai.request.stop_sequences": ["\n\n"],
        "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
        "gen_ai.system_instructions": json.dumps(SYSTEM),
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "Where is my order 1234?"}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [
                {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": "It ships today."}],
                    "finish_reason": "stop",
                },
                {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": "Second choice"}],
                    "finish_reason": "stop",
                },
            ]
        ),
        "gen_ai.tool.definitions": json.dumps([WEATHER]),
    }
    call = read_span(_one(attributes))
    assert (call.outcome, call.shape, call.api, call.model) == (
        "read",
        "genai",
        "openai.chat",
        "gpt-4o-mini",
    )
    assert call.request == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a support agent for ACME."},
            {"role": "user", "content": "Where is my order 1234?"},
        ],
        "tools": [
            {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
        ],
        "temperature": 0.3,
        "max_tokens": 300,
        "stop": ["\n\n"],
    }
    assert call.served == "It ships today." and not call.served_tool_call
    assert call.unrecorded == ("response_format", "tool_choice", "reasoning_effort")
    assert call.start_ns == 1732000000000000000
    assert "Where is my order 1234?" in get_api("openai.chat").query(call.request)


def test_structured_values_with_a_tool_round_are_an_anthropic_call() -> None:
    inputs = [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "arguments": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "toolu_01", "response": "18C, sunny"}],
        },
    ]
    outputs = [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Sunny, 18C."}],
            "finish_reason": "end_turn",
        }
    ]
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.request.max_tokens": 1024,
        "gen_ai.request.top_k": 40,
        "gen_ai.system_instructions": SYSTEM,
        "gen_ai.input.messages": inputs,
        "gen_ai.output.messages": outputs,
    }
    call = read_span(_one(attributes))
    assert (call.outcome, call.api, call.model) == (
        "read",
        "anthropic.messages",
        "claude-sonnet-4-5",
    )
    assert call.request == {
        "model": "claude-sonnet-4-5",
        "system": "You are a support agent for ACME.",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny"}
                ],
            },
        ],
        "max_tokens": 1024,
        "top_k": 40,
    }
    assert call.served == "Sunny, 18C."
    assert call.unrecorded == ("tools", "tool_choice")  # definitions not recorded (opt-in)
    assert get_api("anthropic.messages").query(call.request).endswith("18C, sunny")


def test_a_gemini_span_keeps_the_model_in_the_path() -> None:
    attributes = {
        "gen_ai.operation.name": "generate_content",
        "gen_ai.provider.name": "gcp.gemini",
        "gen_ai.request.model": "gemini-2.5-flash",
        "gen_ai.request.temperature": 0.0,
        "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "2+2?"}]}],
        "gen_ai.output.messages": [{"role": "model", "parts": [{"type": "text", "content": "4"}]}],
    }
    call = read_span(_one(attributes))
    assert call.api == "gemini.generate_content" and call.served == "4"
    assert call.request == {
        "contents": [{"role": "user", "parts": [{"text": "2+2?"}]}],
        "generationConfig": {"temperature": 0.0},
    }
    assert call.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert get_api(call.api).model(call.request, call.path) == "gemini-2.5-flash"


OPENAI_V2_SPAN = {
    "gen_ai.operation.name": "chat",
    "gen_ai.system": "openai",
    "gen_ai.request.model": "gpt-4o-mini",
    "gen_ai.request.temperature": 0.7,
    "gen_ai.response.finish_reasons": ["tool_calls"],
    "server.address": "api.openai.com",
}
CALL = {
    "id": "call_9",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": '{"order_id": "1234"}'},
}


def test_the_openai_v2_events_as_log_records_joined_by_ids() -> None:
    records = decode_logs(
        logs_doc(
            log_record("gen_ai.system.message", {"content": "Be brief."}, time_ns=1),
            log_record("gen_ai.user.message", {"content": "Status of 1234?"}, time_ns=2),
            log_record(
                "gen_ai.choice",
                {
                    "index": 1,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "other"},
                },
                time_ns=3,
            ),
            log_record(
                "gen_ai.choice",
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {"role": "assistant", "tool_calls": [CALL]},
                },
                time_ns=3,
            ),
            log_record(
                "gen_ai.user.message", {"content": "someone else's"}, span_id="00f067aa0ba902b7"
            ),
        )
    )
    joiner = LogJoiner(join_s=5.0, max_spans=100)
    for record in records[:2]:  # records may come before their span
        joiner.add_record(record, now=0.0)
    assert joiner.add_span(_one(OPENAI_V2_SPAN), now=0.5) == []
    for record in records[2:]:
        joiner.add_record(record, now=1.0)
    assert joiner.release(now=5.0) == []
    [joined] = joiner.release(now=5.5)
    assert len(joined.records) == 4
    call = read_span(joined.span, joined.records)
    assert (call.outcome, call.shape, call.api) == ("read", "genai_events", "openai.chat")
    assert call.request == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Status of 1234?"},
        ],
        "temperature": 0.7,
    }
    assert call.served_tool_call and call.served is not None
    assert json.loads(call.served.split(":", 1)[1])[0]["function"]["name"] == "lookup_order"
    assert call.unrecorded[0] == "tools"  # a tool call whose definitions were not recorded


def test_the_older_events_on_the_span_itself() -> None:
    def event(name: str, fields: dict[str, object], t: int) -> dict[str, object]:
        return {"timeUnixNano": str(t), "name": name, "attributes": attr(fields)}

    events = [
        event("gen_ai.user.message", {"content": "Hello"}, 1),
        event("gen_ai.assistant.message", {"tool_calls": json.dumps([CALL])}, 2),
        event("gen_ai.tool.message", {"content": "shipped", "id": "call_9"}, 3),
        event("gen_ai.choice", {"index": 0, "message": json.dumps({"content": "It shipped."})}, 4),
    ]
    call = read_span(_one(OPENAI_V2_SPAN, events=events))
    assert call.outcome == "read" and call.served == "It shipped."
    assert call.request is not None and call.request["messages"] == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_9", "content": "shipped"},
    ]


def test_the_operation_details_event_of_semconv_1_37() -> None:
    details = log_record("gen_ai.client.inference.operation.details", None)
    details["attributes"] = attr(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": [
                {"role": "user", "parts": [{"type": "text", "content": "Hi"}]}
            ],
            "gen_ai.output.messages": [
                {"role": "assistant", "parts": [{"type": "text", "content": "Hello!"}]}
            ],
        }
    )
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4.1",
        "openai.api.type": "responses",
    }
    call = read_span(_one(attributes), decode_logs(logs_doc(details)))
    assert (call.outcome, call.shape, call.api) == ("read", "genai_events", "openai.responses")
    assert call.request == {"model": "gpt-4.1", "input": [{"role": "user", "content": "Hi"}]}
    assert call.served == "Hello!"
    assert call.unrecorded == ("tools", "text.format", "tool_choice", "reasoning.effort")
