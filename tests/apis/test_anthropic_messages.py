"""Anthropic's Messages API (monitor.core.apis.anthropic_messages), against the SDK's types."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import (
    InputJSONDelta,
    Message,
    MessageDeltaUsage,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    RedactedThinkingBlock,
    ServerToolUseBlock,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
    Usage,
    WebSearchToolResultBlock,
)
from anthropic.types.raw_message_delta_event import Delta
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from monitor.core.apis.anthropic_messages import AnthropicMessages
from monitor.core.apis.base import WireApi
from monitor.core.apis.openai_chat import OpenAIChat
from monitor.core.apis.sse import sse_payloads
from monitor.core.canon.base import INVALID
from monitor.core.canon.toolcall import REFUSAL, ToolCallCanonicalizer, is_marked, refusal_answer
from monitor.core.errors import InputError
from monitor.core.reask import ReaskPolicy, override_fields, reask_request

API = AnthropicMessages()
CANON = ToolCallCanonicalizer()


# --- fixtures built from the SDK's types ------------------------------------------------


def text(value: str) -> TextBlock:
    return TextBlock(type="text", text=value)


def tool_use(name: str = "get_weather", input_: Any = None, n: int = 1) -> ToolUseBlock:
    return ToolUseBlock(
        type="tool_use", id=f"toolu_{n}", name=name, input=input_ or {"city": "Paris"}
    )


def thinking(value: str = "The user wants the capital of France.") -> ThinkingBlock:
    return ThinkingBlock(type="thinking", thinking=value, signature="sig-abc")


def message(*content: Any, stop_reason: str | None = "end_turn", **extra: Any) -> Message:
    return Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-sonnet-4-5",
        content=list(content),
        stop_reason=stop_reason,  # type: ignore[arg-type]
        stop_sequence=None,
        usage=Usage(input_tokens=12, output_tokens=34),
        **extra,
    )


def dumped(m: Message) -> dict[str, Any]:
    return m.model_dump(mode="json")


def sdk_text(m: Message) -> str:
    """The text blocks joined, as the SDK's ``MessageStream.get_final_text()`` joins them."""
    return "".join(block.text for block in m.content if block.type == "text")


def _chunks(value: str, size: int = 4) -> list[str]:
    return [value[i : i + size] for i in range(0, len(value), size)]


def stream_of(final: Message, *, ended: bool = True) -> list[dict[str, Any]]:
    """The SSE payloads the API streams for ``final`` (``event:``/``data:`` lines through
    :func:`sse_payloads`, with ``ping`` events between), or only those before its
    ``message_delta`` when not ``ended``."""
    start = final.model_copy(
        update={"content": [], "stop_reason": None, "stop_sequence": None, "stop_details": None}
    )
    events: list[Any] = [RawMessageStartEvent(type="message_start", message=start)]
    for i, block in enumerate(final.content):
        events.extend(_block_events(i, block))
    if ended:
        events.append(
            RawMessageDeltaEvent(
                type="message_delta",
                delta=Delta(
                    stop_reason=final.stop_reason,
                    stop_sequence=final.stop_sequence,
                    stop_details=final.stop_details,
                ),
                usage=MessageDeltaUsage(output_tokens=final.usage.output_tokens),
            )
        )
        events.append(RawMessageStopEvent(type="message_stop"))
    frames = [f"event: {e.type}\ndata: {json.dumps(e.model_dump(mode='json'))}\n\n" for e in events]
    wire = 'event: ping\ndata: {"type": "ping"}\n\n'.join(frames)
    return sse_payloads(wire)


def _block_events(i: int, block: Any) -> list[Any]:
    def delta(d: Any) -> RawContentBlockDeltaEvent:
        return RawContentBlockDeltaEvent(type="content_block_delta", index=i, delta=d)

    if isinstance(block, TextBlock):
        empty: Any = block.model_copy(update={"text": ""})
        deltas = [delta(TextDelta(type="text_delta", text=p)) for p in _chunks(block.text)]
    elif isinstance(block, ToolUseBlock | ServerToolUseBlock):
        empty = block.model_copy(update={"input": {}})
        raw = json.dumps(block.input)
        deltas = [
            delta(InputJSONDelta(type="input_json_delta", partial_json=p)) for p in _chunks(raw)
        ]
    elif isinstance(block, ThinkingBlock):
        empty = block.model_copy(update={"thinking": "", "signature": ""})
        deltas = [
            *(
                delta(ThinkingDelta(type="thinking_delta", thinking=p))
                for p in _chunks(block.thinking)
            ),
            delta(SignatureDelta(type="signature_delta", signature=block.signature)),
        ]
    else:  # redacted thinking, server tool results: whole in their start event
        empty, deltas = block, []
    return [
        RawContentBlockStartEvent(type="content_block_start", index=i, content_block=empty),
        *deltas,
        RawContentBlockStopEvent(type="content_block_stop", index=i),
    ]


def sdk_accumulated(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message the SDK's own stream accumulator builds from ``events``."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for event in events:
        if event["type"] == "ping":
            continue
        snapshot = accumulate_event(
            event=event,  # type: ignore[arg-type]
            current_snapshot=snapshot,
            json_bufs=buffers,
        )
    assert snapshot is not None
    return snapshot.model_dump(mode="json")


def chat_completion_calling(name: str, arguments: str) -> dict[str, Any]:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_764_000_000,
            "model": "gpt-4.1",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_abc",
                                "type": "function",
                                "function": {"name": name, "arguments": arguments},
                            }
                        ],
                    },
                }
            ],
        }
    ).model_dump(mode="json")


# --- the port --------------------------------------------------------------------------


def test_it_is_a_wire_api_drawing_one_answer_a_call() -> None:
    api: WireApi = API
    assert api.name == "anthropic.messages"
    assert api.auth == "x-api-key"
    assert api.max_draws_per_call == 1
    route = api.route({"model": "m"}, "/v1/messages", "claude-sonnet-4-5")
    assert (route.api, route.path, route.headers) == ("anthropic.messages", "/v1/messages", ())
    assert api.model({"model": "claude-sonnet-4-5", "messages": []}, None) == "claude-sonnet-4-5"
    assert api.model({"messages": []}, "/v1/messages") is None


@pytest.mark.parametrize(
    "path", ["/v1/messages", "/v1/messages/", "/anthropic/v1/messages", "/gw/x/v1/messages"]
)
def test_it_recognises_the_create_call(path: str) -> None:
    assert API.recognises(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/messages/count_tokens",
        "/v1/messages/batches",
        "/v1/messages/batches/msgbatch_1/cancel",
        "/v1/threads/thread_abc/messages",
        "/messages",
        "/v1/chat/completions",
        "/v1/responses",
        "/v2/messages",
    ],
)
def test_it_does_not_recognise_other_paths(path: str) -> None:
    assert not API.recognises(path)


# --- requests --------------------------------------------------------------------------

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"c": "P"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "18°C, sunny"}],
            },
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}},
            {"type": "text", "text": "And tomorrow?"},
        ],
    },
]


@pytest.mark.parametrize(
    "request_",
    [
        {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": MESSAGES},
        {"messages": MESSAGES, "system": "Be brief."},
        {
            "messages": MESSAGES,
            "system": [
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
            ],
        },
    ],
)
def test_it_accepts_requests_of_the_api(request_: dict[str, Any]) -> None:
    API.check_request(request_)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        ({"model": "claude"}, "'messages'"),
        ({"messages": []}, "'messages'"),
        ({"messages": "secret prompt"}, "'messages'"),
        ({"messages": ["secret prompt"]}, "'messages'"),
        ({"messages": [{"content": "secret prompt"}]}, "'messages'"),
        ({"messages": [{"role": "user", "content": 3}]}, "'content'"),
        ({"messages": [{"role": "user", "content": ["secret prompt"]}]}, "'content'"),
        ({"messages": [{"role": "user", "content": "hi"}], "system": 1}, "'system'"),
        ({"messages": [{"role": "user", "content": "hi"}], "system": None}, "'system'"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "system": ["secret prompt"]},
            "'system'",
        ),
        ({"messages": [{"role": "user", "content": "secret prompt \ud800"}]}, "Unicode"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "Unicode",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "system": "\ud800"}, "Unicode"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": "\ud800"}
                        ],
                    }
                ]
            },
            "Unicode",
        ),
    ],
)
def test_it_rejects_what_it_cannot_monitor_with_a_short_reason(
    request_: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InputError, match=reason) as raised:
        API.check_request(request_)
    assert "secret prompt" not in str(raised.value)


def test_the_query_is_the_system_then_the_messages_text() -> None:
    assert API.query({"messages": [{"role": "user", "content": "2+2?"}]}) == "2+2?"
    assert API.query({"messages": MESSAGES, "system": "Be brief."}) == "\n".join(
        [
            "Be brief.",
            "What is the weather in Paris?",
            "Let me check.",
            "18°C, sunny",
            "And tomorrow?",
        ]
    )
    system = [{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}]
    assert API.query({"messages": MESSAGES[:1], "system": system}) == (
        "Rule one.\nRule two.\nWhat is the weather in Paris?"
    )


# --- answers ---------------------------------------------------------------------------


def test_the_answer_is_the_text_blocks_joined() -> None:
    final = message(text("The capital "), text("is Paris."))
    assert API.answer(dumped(final)) == sdk_text(final) == "The capital is Paris."
    assert API.answers(dumped(final)) == [sdk_text(final)]


def test_thinking_never_counts() -> None:
    final = message(
        thinking("secret chain of thought"),
        RedactedThinkingBlock(type="redacted_thinking", data="opaque"),
        text("42"),
    )
    assert API.answer(dumped(final)) == "42"
    spent = message(thinking(), stop_reason="max_tokens")
    assert API.answer(dumped(spent)) is None
    with pytest.raises(InputError, match="no answer"):
        API.answers(dumped(spent))


def test_server_tool_blocks_never_count() -> None:
    final = message(
        ServerToolUseBlock(
            type="server_tool_use", id="srvtoolu_1", name="web_search", input={"query": "q"}
        ),
        WebSearchToolResultBlock(
            type="web_search_tool_result", tool_use_id="srvtoolu_1", content=[]
        ),
        text("It is sunny."),
    )
    assert API.answer(dumped(final)) == "It is sunny."


def test_a_tool_use_is_the_same_tool_call_as_in_chat() -> None:
    final = message(
        thinking(),
        tool_use("get_weather", {"unit": "celsius", "city": "Paris"}),
        stop_reason="tool_use",
    )
    answer = API.answer(dumped(final))
    assert answer is not None and is_marked(answer)
    chat = OpenAIChat().answer(
        chat_completion_calling("get_weather", '{"city": "Paris", "unit": "celsius"}')
    )
    assert chat is not None
    assert CANON.canonicalize(answer) == CANON.canonicalize(chat)
    assert CANON.canonicalize(answer) == (
        '[{"arguments":{"city":"Paris","unit":"celsius"},"name":"get_weather"}]'
    )


def test_tool_calls_win_over_text_beside_them_and_keep_every_call() -> None:
    final = message(
        text("Checking both."),
        tool_use("get_weather", {"city": "Paris"}, n=1),
        tool_use("get_weather", {"city": "Rome"}, n=2),
        stop_reason="tool_use",
    )
    answer = API.answer(dumped(final))
    assert answer is not None
    assert CANON.canonicalize(answer) == (
        '[{"arguments":{"city":"Paris"},"name":"get_weather"},'
        '{"arguments":{"city":"Rome"},"name":"get_weather"}]'
    )


def test_a_refusal_stop_is_a_refusal_whatever_came_before() -> None:
    partial = message(text("Here is how to"), stop_reason="refusal")
    assert API.answer(dumped(partial)) == refusal_answer("Here is how to")
    bare = message(
        stop_reason="refusal",
        stop_details={"type": "refusal", "category": "cyber", "explanation": "Policy."},
    )
    answer = API.answer(dumped(bare))
    assert answer == refusal_answer("Policy.")
    assert CANON.canonicalize(answer) == REFUSAL
    assert API.answer(dumped(message(stop_reason="refusal"))) == refusal_answer("")


@pytest.mark.parametrize("stop_reason", ["end_turn", "stop_sequence", "tool_use"])
def test_an_ended_turn_with_nothing_in_it_is_the_empty_answer(stop_reason: str) -> None:
    final = message(stop_reason=stop_reason)
    assert API.answers(dumped(final)) == [""]
    assert API.answer(dumped(final)) == ""


def test_a_turn_cut_at_max_tokens_with_text_is_that_text() -> None:
    cut = message(thinking(), text("The capital is"), stop_reason="max_tokens")
    assert API.answers(dumped(cut)) == ["The capital is"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, "not a message"),
        ({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}, "not a message"),
        ({"type": "message"}, "'content'"),
        ({"type": "message", "content": "Paris"}, "'content'"),
        (dumped(message(thinking(), stop_reason="pause_turn")), "no answer"),
        (dumped(message(stop_reason="model_context_window_exceeded")), "no answer"),
        ({"type": "message", "content": [], "stop_reason": None}, "no answer"),
    ],
)
def test_a_body_without_an_answer_is_an_input_error(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(InputError, match=reason):
        API.answers(body)
    assert API.answer(body) is None


# --- streaming -------------------------------------------------------------------------

STREAMED = [
    pytest.param(message(thinking(), text("The capital "), text("is Paris.")), id="text"),
    pytest.param(
        message(
            text("Checking."),
            tool_use("get_weather", {"city": "Paris", "days": [1, 2]}, n=1),
            tool_use("get_time", {"tz": "Europe/Paris"}, n=2),
            stop_reason="tool_use",
        ),
        id="tool_calls",
    ),
    pytest.param(message(text("Sure, here"), stop_reason="refusal"), id="refusal"),
    pytest.param(
        message(RedactedThinkingBlock(type="redacted_thinking", data="x"), text("ok")),
        id="redacted",
    ),
    pytest.param(message(stop_reason="end_turn"), id="empty"),
]


@pytest.mark.parametrize("final", STREAMED)
def test_a_stream_gives_the_answer_of_the_message(final: Message) -> None:
    events = stream_of(final)
    assert API.stream_answer(events) == API.answer(dumped(final))
    assert API.stream_answer(events) is not None


@pytest.mark.parametrize("final", STREAMED)
def test_a_stream_reads_as_the_sdk_accumulates_it(final: Message) -> None:
    events = stream_of(final)
    rebuilt = sdk_accumulated(events)
    assert API.stream_answer(events) == API.answer(rebuilt)
    assert sdk_text(Message.model_validate(rebuilt)) == sdk_text(final)


def test_a_stream_cut_before_its_end_is_read_as_far_as_the_client_read_it() -> None:
    final = message(text("The capital "), text("is Paris."))
    assert API.stream_answer(stream_of(final, ended=False)) == "The capital is Paris."
    assert API.stream_answer(stream_of(message(thinking()), ended=False)) is None


def test_a_stream_with_broken_tool_json_is_an_invalid_tool_call() -> None:
    events = stream_of(message(tool_use("f", {"a": 1}), stop_reason="tool_use"))
    for e in events:
        if e.get("delta", {}).get("type") == "input_json_delta":
            e["delta"]["partial_json"] = e["delta"]["partial_json"].replace("}", "")
    answer = API.stream_answer(events)
    assert answer is not None and is_marked(answer)
    assert CANON.canonicalize(answer) == INVALID


def test_a_stream_with_nothing_has_no_answer() -> None:
    assert API.stream_answer([]) is None
    assert API.stream_answer([{"type": "ping"}]) is None


# --- what is never re-asked ------------------------------------------------------------

CLIENT_TOOL = {
    "name": "get_weather",
    "description": "Weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SERVER_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    {"type": "web_search_20260209", "name": "web_search"},
    {"type": "web_fetch_20250910", "name": "web_fetch"},
    {"type": "code_execution_20250522", "name": "code_execution"},
    {"type": "code_execution_20250825", "name": "code_execution"},
    {"type": "computer_20250124", "name": "computer", "display_width_px": 1024},
    {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
    {"type": "mcp_toolset", "mcp_server_name": "crm"},
    {"type": "a_tool_from_next_year", "name": "future"},
]


@pytest.mark.parametrize("tool", SERVER_TOOLS, ids=lambda t: str(t["type"]))
def test_a_request_with_a_server_tool_is_not_reasked(tool: dict[str, Any]) -> None:
    request = {"messages": MESSAGES, "tools": [CLIENT_TOOL, tool]}
    assert API.not_reasked(request, frozenset()) == "server_tool"
    assert API.not_reasked(request, frozenset({"get_weather"})) == "server_tool"


@pytest.mark.parametrize(
    ("tool", "allowed"),
    [
        ({"type": "web_search_20250305", "name": "web_search"}, "web_search"),
        ({"type": "web_search_20250305", "name": "web_search"}, "web_search_20250305"),
        ({"type": "web_fetch_20250910", "name": "web_fetch"}, "web_fetch"),
        ({"type": "mcp_toolset", "mcp_server_name": "crm"}, "crm"),
    ],
)
def test_a_task_allows_read_only_server_tools_by_name_or_type(
    tool: dict[str, Any], allowed: str
) -> None:
    request = {"messages": MESSAGES, "tools": [CLIENT_TOOL, tool]}
    assert API.not_reasked(request, frozenset({allowed})) is None
    assert API.not_reasked(request, frozenset({"other"})) == "server_tool"


def test_mcp_servers_are_not_reasked_unless_allowed_by_name() -> None:
    servers = [
        {"type": "url", "url": "https://docs.example.com/sse", "name": "docs"},
        {"type": "url", "url": "https://pay.example.com/sse", "name": "payments"},
    ]
    request = {"messages": MESSAGES, "mcp_servers": servers}
    assert API.not_reasked(request, frozenset()) == "server_tool"
    assert API.not_reasked(request, frozenset({"docs"})) == "server_tool"
    assert API.not_reasked(request, frozenset({"docs", "payments"})) is None
    assert API.not_reasked({"messages": MESSAGES, "mcp_servers": []}, frozenset()) is None


def test_client_tools_are_safe_to_reask() -> None:
    tools = [
        CLIENT_TOOL,
        {**CLIENT_TOOL, "name": "lookup", "type": "custom"},
        {**CLIENT_TOOL, "name": "search", "type": None},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "memory_20250818", "name": "memory"},
    ]
    assert API.not_reasked({"messages": MESSAGES, "tools": tools}, frozenset()) is None
    assert API.not_reasked({"messages": MESSAGES}, frozenset()) is None


# --- the re-ask ------------------------------------------------------------------------


def test_a_reask_keeps_the_request_but_what_it_must_not_resend() -> None:
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "Be brief.",
        "messages": MESSAGES,
        "tools": [CLIENT_TOOL],
        "tool_choice": {"type": "auto"},
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["\n\nHuman:"],
        "temperature": 0,
        "metadata": {"user_id": "user-42"},
        "service_tier": "standard_only",
        "stream": True,
    }
    reask = reask_request(request, ReaskPolicy(), API.rules)
    kept = [
        "model",
        "max_tokens",
        "system",
        "messages",
        "tools",
        "tool_choice",
        "top_p",
        "top_k",
        "stop_sequences",
    ]
    assert {k: reask.body[k] for k in kept} == {k: request[k] for k in kept}
    assert "metadata" not in reask.body and "service_tier" not in reask.body
    assert reask.changes["metadata"] == {"from": "<object, 1 keys>"}
    assert reask.changes["service_tier"] == {"from": "<text, 13 chars>"}
    assert "stream" not in reask.body and "stream" not in reask.changes
    assert reask.body["temperature"] == 0.5
    assert reask.changes["temperature"] == {"from": 0, "to": 0.5}
    assert set(reask.changes) == {"metadata", "service_tier", "temperature"}
    assert "store" not in reask.body


def test_a_raised_temperature_never_exceeds_one() -> None:
    request = {"messages": MESSAGES, "temperature": 0.2}
    reask = reask_request(request, ReaskPolicy(min_temperature=1.5), API.rules)
    assert reask.body["temperature"] == 1.0
    assert reask.changes["temperature"] == {"from": 0.2, "to": 1.0}
    at_one = reask_request(
        {"messages": MESSAGES, "temperature": 1}, ReaskPolicy(min_temperature=1.5), API.rules
    )
    assert at_one.body["temperature"] == 1 and "temperature" not in at_one.changes
    unsent = reask_request({"messages": MESSAGES}, ReaskPolicy(min_temperature=1.5), API.rules)
    assert "temperature" not in unsent.body and unsent.changes == {}


def test_the_task_model_replaces_the_request_model() -> None:
    request = {"model": "claude-sonnet-4-5", "messages": MESSAGES, "max_tokens": 10}
    reask = reask_request(request, ReaskPolicy(model="claude-haiku-4-5"), API.rules)
    assert reask.body["model"] == "claude-haiku-4-5"
    assert reask.changes["model"] == {"from": "claude-sonnet-4-5", "to": "claude-haiku-4-5"}


def test_the_changed_fields_are_known_at_start() -> None:
    fields = override_fields(ReaskPolicy(), [API.rules])
    assert {"metadata", "service_tier", "temperature", "model"} <= set(fields)


def test_a_reask_is_one_call_without_streaming() -> None:
    body = {"messages": MESSAGES, "max_tokens": 10, "stream": True}
    assert API.with_draws(body, 1) == {"messages": MESSAGES, "max_tokens": 10, "stream": False}
    assert body["stream"] is True
    with pytest.raises(ValueError, match="one answer a call"):
        API.with_draws(body, 3)


# --- any JSON: an InputError or an answer, never a crash -------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
KEYS = st.sampled_from(
    [
        "type",
        "role",
        "content",
        "text",
        "name",
        "input",
        "stop_reason",
        "stop_details",
        "explanation",
        "index",
        "delta",
        "message",
        "content_block",
        "partial_json",
        "tools",
        "mcp_servers",
        "system",
        "messages",
    ]
)
SHAPED = st.dictionaries(
    KEYS, JSON | st.sampled_from(["text", "tool_use", "content_block_delta", "end_turn"])
)


@settings(max_examples=50)
@given(
    request_=st.dictionaries(KEYS, JSON | st.lists(SHAPED, max_size=3)),
    body=st.dictionaries(KEYS, JSON | st.lists(SHAPED, max_size=3)),
    events=st.lists(SHAPED, max_size=4),
)
def test_any_json_is_an_input_error_or_read_never_a_crash(
    request_: dict[str, Any], body: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    with contextlib.suppress(InputError):
        API.check_request(request_)
    with contextlib.suppress(InputError):
        API.answers(body)
    assert isinstance(API.query(request_), str)
    assert API.answer(body) is None or isinstance(API.answer(body), str)
    assert API.stream_answer(events) is None or isinstance(API.stream_answer(events), str)
    assert API.not_reasked(request_, frozenset({"web_search"})) in (None, "server_tool")
