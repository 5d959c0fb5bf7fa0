"""The OpenAI Responses API (monitor.core.apis.openai_responses), against the SDK's types."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCall,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseRefusalDeltaEvent,
    ResponseRefusalDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from openai.types.responses.response_reasoning_item import Summary

from monitor.core.apis.base import WireApi
from monitor.core.apis.openai_chat import OpenAIChat
from monitor.core.apis.openai_responses import OpenAIResponses
from monitor.core.apis.sse import sse_payloads
from monitor.core.canon.toolcall import REFUSAL, ToolCallCanonicalizer, is_marked
from monitor.core.errors import InputError
from monitor.core.reask import ReaskPolicy, override_fields, reask_request

API = OpenAIResponses()
CANON = ToolCallCanonicalizer()
WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'


# --- fixtures built from the SDK's types ------------------------------------------------


def message(*parts: ResponseOutputText | ResponseOutputRefusal, id_: str = "msg_1") -> Any:
    return ResponseOutputMessage(
        id=id_, type="message", role="assistant", status="completed", content=list(parts)
    )


def text(value: str) -> ResponseOutputText:
    return ResponseOutputText(type="output_text", text=value, annotations=[])


def reasoning(summary: str = "The user wants the capital.") -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id="rs_1", type="reasoning", summary=[Summary(type="summary_text", text=summary)]
    )


def function_call(name: str = "get_weather", arguments: str = WEATHER_ARGS, n: int = 1) -> Any:
    return ResponseFunctionToolCall(
        type="function_call",
        id=f"fc_{n}",
        call_id=f"call_{n}",
        name=name,
        arguments=arguments,
        status="completed",
    )


def response(*output: Any, status: str = "completed", **extra: Any) -> Response:
    return Response(
        id="resp_1",
        object="response",
        created_at=1_764_000_000,
        model="gpt-4.1-2025-04-14",
        status=status,  # type: ignore[arg-type]
        output=list(output),
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
        **extra,
    )


def dumped(r: Response) -> dict[str, Any]:
    return r.model_dump(mode="json", exclude_none=True)


def _chunks(value: str, size: int = 3) -> list[str]:
    return [value[i : i + size] for i in range(0, len(value), size)] or [""]


def stream_of(final: Response, *, terminal: bool = True) -> list[dict[str, Any]]:
    """The SSE payloads the API streams for ``final`` (as a client reads them off the
    wire: ``event:``/``data:`` lines through :func:`sse_payloads`), with or without its
    ``response.completed`` (or ``.incomplete``/``.failed``) event at the end."""
    seq = iter(range(10_000))
    start = final.model_copy(update={"status": "in_progress", "output": []})
    events: list[Any] = [
        ResponseCreatedEvent(type="response.created", sequence_number=next(seq), response=start)
    ]
    for i, item in enumerate(final.output):
        events.extend(_item_events(i, item, seq))
    if terminal:
        kind = {"completed": ResponseCompletedEvent, "incomplete": ResponseIncompleteEvent}.get(
            str(final.status), ResponseFailedEvent
        )
        events.append(
            kind(type=f"response.{final.status}", sequence_number=next(seq), response=final)  # type: ignore[arg-type]
        )
    wire = "".join(
        f"event: {e.type}\ndata: {json.dumps(e.model_dump(mode='json', exclude_none=True))}\n\n"
        for e in events
    )
    return sse_payloads(wire)


def _item_events(i: int, item: ResponseOutputItem, seq: Any) -> list[Any]:
    empty: Any
    if isinstance(item, ResponseOutputMessage):
        empty = item.model_copy(update={"content": [], "status": "in_progress"})
    elif isinstance(item, ResponseFunctionToolCall):
        empty = item.model_copy(update={"arguments": "", "status": "in_progress"})
    else:
        empty = item
    events: list[Any] = [
        ResponseOutputItemAddedEvent(
            type="response.output_item.added", output_index=i, sequence_number=next(seq), item=empty
        )
    ]
    if isinstance(item, ResponseOutputMessage):
        for j, part in enumerate(item.content):
            common = {"item_id": item.id, "output_index": i, "content_index": j}
            blank = part.model_copy(
                update={"text": ""} if isinstance(part, ResponseOutputText) else {"refusal": ""}
            )
            events.append(
                ResponseContentPartAddedEvent(
                    type="response.content_part.added",
                    sequence_number=next(seq),
                    part=blank,
                    **common,
                )
            )
            if isinstance(part, ResponseOutputText):
                events.extend(
                    ResponseTextDeltaEvent(
                        type="response.output_text.delta",
                        sequence_number=next(seq),
                        delta=piece,
                        logprobs=[],
                        **common,
                    )
                    for piece in _chunks(part.text)
                )
                events.append(
                    ResponseTextDoneEvent(
                        type="response.output_text.done",
                        sequence_number=next(seq),
                        text=part.text,
                        logprobs=[],
                        **common,
                    )
                )
            else:
                events.extend(
                    ResponseRefusalDeltaEvent(
                        type="response.refusal.delta",
                        sequence_number=next(seq),
                        delta=piece,
                        **common,
                    )
                    for piece in _chunks(part.refusal)
                )
                events.append(
                    ResponseRefusalDoneEvent(
                        type="response.refusal.done",
                        sequence_number=next(seq),
                        refusal=part.refusal,
                        **common,
                    )
                )
            events.append(
                ResponseContentPartDoneEvent(
                    type="response.content_part.done",
                    sequence_number=next(seq),
                    part=part,
                    **common,
                )
            )
    elif isinstance(item, ResponseFunctionToolCall):
        common = {"item_id": item.id or "", "output_index": i}
        events.extend(
            ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta",
                sequence_number=next(seq),
                delta=piece,
                **common,
            )
            for piece in _chunks(item.arguments)
        )
        events.append(
            ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done",
                sequence_number=next(seq),
                arguments=item.arguments,
                **common,
            )
        )
    elif isinstance(item, ResponseReasoningItem):
        events.extend(
            ResponseReasoningSummaryTextDeltaEvent(
                type="response.reasoning_summary_text.delta",
                sequence_number=next(seq),
                item_id=item.id,
                output_index=i,
                summary_index=0,
                delta=piece,
            )
            for piece in _chunks(item.summary[0].text)
        )
    events.append(
        ResponseOutputItemDoneEvent(
            type="response.output_item.done", output_index=i, sequence_number=next(seq), item=item
        )
    )
    return events


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
    assert api.name == "openai.responses"
    assert api.auth == "bearer"
    assert api.max_draws_per_call == 1
    assert api.route({"model": "m"}, "/v1/responses", "gpt-4.1").path == "/responses"
    assert api.route({}, None, None).api == "openai.responses"
    assert api.model({"model": "gpt-4.1", "input": "hi"}, None) == "gpt-4.1"
    assert api.model({"input": "hi"}, None) is None


@pytest.mark.parametrize(
    "path",
    ["/v1/responses", "/responses", "/v1/responses/", "/openai/v1/responses", "/gw/v1/responses"],
)
def test_it_recognises_the_create_call(path: str) -> None:
    assert API.recognises(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/responses/resp_123",
        "/v1/responses/resp_123/cancel",
        "/v1/responses/resp_123/input_items",
        "/v1/responses/input_tokens",
        "/v1/responses/compact",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/myresponses",
        "/v1/messages",
    ],
)
def test_it_does_not_recognise_other_paths(path: str) -> None:
    assert not API.recognises(path)


# --- requests --------------------------------------------------------------------------

LIST_INPUT: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer in one word."},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is the capital of France?"},
            {"type": "input_image", "image_url": "https://example.com/map.png"},
        ],
    },
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_0",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Paris.", "annotations": []}],
    },
    {"type": "reasoning", "id": "rs_0", "summary": []},
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "population: 2.1M"},
    {"role": "user", "content": "And its population?"},
]


@pytest.mark.parametrize(
    "request_",
    [
        {"model": "gpt-4.1", "input": "Hi"},
        {"model": "gpt-4.1", "input": LIST_INPUT, "instructions": "Be brief."},
        {"model": "gpt-4.1", "input": LIST_INPUT, "instructions": None},
        {"input": [{"type": "item_reference", "id": "msg_0"}], "previous_response_id": "r"},
    ],
)
def test_it_accepts_requests_of_the_api(request_: dict[str, Any]) -> None:
    API.check_request(request_)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        ({"model": "gpt-4.1"}, "'input'"),
        ({"input": ""}, "'input'"),
        ({"input": []}, "'input'"),
        ({"input": 42}, "'input'"),
        ({"input": ["secret prompt"]}, "item must be an object"),
        ({"input": [{"role": "user", "content": 7}]}, "'content'"),
        ({"input": [{"role": "user", "content": ["secret prompt"]}]}, "'content'"),
        ({"input": "hi", "instructions": ["secret prompt"]}, "'instructions'"),
        ({"input": "secret prompt \ud800"}, "Unicode"),
        ({"input": [{"role": "user", "content": "secret prompt \udfff"}]}, "Unicode"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "\ud800"}]}]},
            "Unicode",
        ),
        ({"input": "hi", "instructions": "secret prompt \ud800"}, "Unicode"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "\ud800"}]},
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


def test_the_query_is_the_instructions_then_the_input_text() -> None:
    assert API.query({"input": "What is 2+2?"}) == "What is 2+2?"
    assert API.query({"input": "What is 2+2?", "instructions": "Be brief."}) == (
        "Be brief.\nWhat is 2+2?"
    )
    assert API.query({"input": LIST_INPUT, "instructions": "Be brief."}) == "\n".join(
        [
            "Be brief.",
            "Answer in one word.",
            "What is the capital of France?",
            "Paris.",
            "population: 2.1M",
            "And its population?",
        ]
    )


# --- answers ---------------------------------------------------------------------------


def test_the_answer_is_the_sdk_output_text() -> None:
    final = response(
        reasoning(),
        message(text("The capital "), text("is Paris."), id_="msg_1"),
        message(text(" Population: 2.1M."), id_="msg_2"),
    )
    assert final.output_text == "The capital is Paris. Population: 2.1M."
    assert API.answer(dumped(final)) == final.output_text
    assert API.answers(dumped(final)) == [final.output_text]


def test_reasoning_never_counts() -> None:
    final = response(reasoning("secret chain of thought"), message(text("42")))
    assert API.answer(dumped(final)) == "42"
    only_reasoning = response(
        reasoning(), status="incomplete", incomplete_details={"reason": "max_output_tokens"}
    )
    assert only_reasoning.output_text == ""
    assert API.answer(dumped(only_reasoning)) is None
    with pytest.raises(InputError, match="incomplete"):
        API.answers(dumped(only_reasoning))


def test_a_function_call_is_the_same_tool_call_as_in_chat() -> None:
    final = response(reasoning(), function_call("get_weather", WEATHER_ARGS))
    answer = API.answer(dumped(final))
    assert answer is not None and is_marked(answer)
    chat = OpenAIChat().answer(
        chat_completion_calling("get_weather", '{"unit":"celsius","city":"Paris"}')
    )
    assert chat is not None
    assert CANON.canonicalize(answer) == CANON.canonicalize(chat)
    assert CANON.canonicalize(answer) == (
        '[{"arguments":{"city":"Paris","unit":"celsius"},"name":"get_weather"}]'
    )


def test_tool_calls_win_over_text_beside_them_and_keep_every_call() -> None:
    final = response(
        message(text("Let me check both.")),
        function_call("get_weather", '{"city": "Paris"}', n=1),
        function_call("get_weather", '{"city": "Rome"}', n=2),
    )
    answer = API.answer(dumped(final))
    assert answer is not None
    assert CANON.canonicalize(answer) == (
        '[{"arguments":{"city":"Paris"},"name":"get_weather"},'
        '{"arguments":{"city":"Rome"},"name":"get_weather"}]'
    )


def test_a_custom_tool_call_is_a_tool_call_with_its_input() -> None:
    call = ResponseCustomToolCall(
        type="custom_tool_call", call_id="c1", name="run_sql", input="SELECT 1"
    )
    answer = API.answer(dumped(response(call)))
    assert answer is not None
    assert CANON.canonicalize(answer) == '[{"arguments":{"input":"SELECT 1"},"name":"run_sql"}]'


def test_a_namespaced_call_is_named_with_its_namespace() -> None:
    call = function_call("lookup", "{}").model_copy(update={"namespace": "crm"})
    answer = API.answer(dumped(response(call)))
    assert answer is not None
    assert CANON.canonicalize(answer) == '[{"arguments":{},"name":"crm.lookup"}]'


def test_a_refusal_is_a_refusal_unless_there_is_text() -> None:
    refused = response(message(ResponseOutputRefusal(type="refusal", refusal="I can't help.")))
    answer = API.answer(dumped(refused))
    assert answer is not None and is_marked(answer)
    assert CANON.canonicalize(answer) == REFUSAL
    both = response(message(text("Partly: "), ResponseOutputRefusal(type="refusal", refusal="no")))
    assert API.answer(dumped(both)) == "Partly: "


def test_an_empty_completed_response_is_the_empty_answer() -> None:
    empty = response()
    assert empty.output_text == ""
    assert API.answers(dumped(empty)) == [""]
    assert API.answer(dumped(empty)) == ""


def test_an_incomplete_response_with_text_is_that_text() -> None:
    cut = response(
        message(text("The capital is")),
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
    )
    assert API.answers(dumped(cut)) == [cut.output_text]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, "'output'"),
        ({"output": "Paris"}, "'output'"),
        ({"object": "error", "error": {"message": "bad"}}, "'output'"),
        (dumped(response(message(text("partial")), status="failed")), "failed"),
        (dumped(response(status="cancelled")), "cancelled"),
        (dumped(response(status="queued")), "queued"),
        (dumped(response(status="in_progress")), "in_progress"),
        ({"output": [], "status": "mystery"}, "no answer"),
        ({"output": [{"type": "web_search_call"}], "status": "incomplete"}, "incomplete"),
    ],
)
def test_a_body_without_an_answer_is_an_input_error(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(InputError, match=reason):
        API.answers(body)
    assert API.answer(body) is None


@pytest.mark.parametrize("body", [{}, {"output": None}, {"output": [1, "x", None]}])
def test_the_answer_of_a_malformed_body_is_none_or_empty_never_a_crash(
    body: dict[str, Any],
) -> None:
    assert API.answer(body) in (None, "")


# --- streaming -------------------------------------------------------------------------

STREAMED = [
    pytest.param(
        response(reasoning(), message(text("The capital "), text("is Paris."))), id="text"
    ),
    pytest.param(
        response(
            message(text("Checking.")),
            function_call("get_weather", '{"city": "Paris"}', n=1),
            function_call("get_time", '{"tz": "Europe/Paris"}', n=2),
        ),
        id="tool_calls",
    ),
    pytest.param(
        response(message(ResponseOutputRefusal(type="refusal", refusal="I can't help."))),
        id="refusal",
    ),
]


@pytest.mark.parametrize("final", STREAMED)
def test_a_stream_gives_the_answer_of_its_completed_event(final: Response) -> None:
    events = stream_of(final)
    assert events[-1]["type"] == "response.completed"
    assert API.stream_answer(events) == API.answer(dumped(final))
    assert API.stream_answer(events) is not None


@pytest.mark.parametrize("final", STREAMED)
def test_a_stream_cut_before_completion_gives_the_deltas_joined(final: Response) -> None:
    events = stream_of(final, terminal=False)
    assert all(e["type"] != "response.completed" for e in events)
    assert API.stream_answer(events) == API.answer(dumped(final))


def test_streamed_text_deltas_join_to_the_sdk_output_text() -> None:
    final = response(message(text("Bonjour, "), text("le monde")), message(text("!"), id_="m2"))
    assert API.stream_answer(stream_of(final, terminal=False)) == final.output_text


def test_an_incomplete_or_failed_stream() -> None:
    cut = response(
        message(text("The capital")),
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
    )
    assert API.stream_answer(stream_of(cut)) == "The capital"
    failed = response(message(text("partial")), status="failed")
    assert API.stream_answer(stream_of(failed)) is None


def test_a_stream_with_nothing_has_no_answer() -> None:
    assert API.stream_answer([]) is None
    assert API.stream_answer(stream_of(response(reasoning()), terminal=False)) is None


# --- what is never re-asked ------------------------------------------------------------

FUNCTION_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SERVER_TOOLS = [
    {"type": "mcp", "server_label": "crm", "server_url": "https://mcp.example.com"},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "computer_use_preview", "display_width": 1024, "display_height": 768},
    {"type": "computer"},
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "image_generation"},
    {"type": "local_shell"},
    {"type": "shell"},
    {"type": "apply_patch"},
    {"type": "tool_search"},
    {"type": "programmatic_tool_calling"},
    {"type": "a_tool_from_next_year"},
    {"name": "no_type"},
]


def test_a_request_with_a_conversation_is_never_reasked() -> None:
    for conversation in ("conv_123", {"id": "conv_123"}):
        request = {"input": "hi", "conversation": conversation}
        assert API.not_reasked(request, frozenset()) == "conversation"
        assert API.not_reasked(request, frozenset({"conv_123", "conversation"})) == ("conversation")
    assert API.not_reasked({"input": "hi", "conversation": None}, frozenset()) is None


@pytest.mark.parametrize("tool", SERVER_TOOLS, ids=lambda t: str(t.get("type", "untyped")))
def test_a_request_with_a_provider_run_tool_is_not_reasked(tool: dict[str, Any]) -> None:
    request = {"input": "hi", "tools": [FUNCTION_TOOL, tool]}
    assert API.not_reasked(request, frozenset()) == "server_tool"
    assert API.not_reasked(request, frozenset({"get_weather"})) == "server_tool"


@pytest.mark.parametrize(
    ("tool", "allowed"),
    [
        ({"type": "web_search"}, "web_search"),
        ({"type": "file_search", "vector_store_ids": ["vs_1"]}, "file_search"),
        ({"type": "mcp", "server_label": "docs", "server_url": "https://x"}, "docs"),
        ({"type": "mcp", "server_label": "docs", "server_url": "https://x"}, "mcp"),
    ],
)
def test_a_task_allows_read_only_provider_tools_by_name(tool: dict[str, Any], allowed: str) -> None:
    request = {"input": "hi", "tools": [FUNCTION_TOOL, tool]}
    assert API.not_reasked(request, frozenset({allowed})) is None
    assert API.not_reasked(request, frozenset({"something_else"})) == "server_tool"


def test_an_allowed_mcp_server_does_not_allow_another() -> None:
    request = {
        "input": "hi",
        "tools": [
            {"type": "mcp", "server_label": "docs", "server_url": "https://a"},
            {"type": "mcp", "server_label": "payments", "server_url": "https://b"},
        ],
    }
    assert API.not_reasked(request, frozenset({"docs"})) == "server_tool"
    assert API.not_reasked(request, frozenset({"docs", "payments"})) is None


def test_client_tools_are_safe_to_reask() -> None:
    tools = [
        FUNCTION_TOOL,
        {"type": "custom", "name": "run_sql", "description": "SQL"},
        {
            "type": "namespace",
            "name": "crm",
            "description": "CRM",
            "tools": [{"type": "function", "name": "lookup"}, {"type": "custom", "name": "q"}],
        },
        {"type": "tool_search", "execution": "client"},
    ]
    assert API.not_reasked({"input": "hi", "tools": tools}, frozenset()) is None
    assert API.not_reasked({"input": "hi"}, frozenset()) is None
    hosted = {"type": "namespace", "name": "n", "description": "", "tools": [{"type": "mcp"}]}
    assert API.not_reasked({"input": "hi", "tools": [hosted]}, frozenset()) == "server_tool"


# --- the re-ask ------------------------------------------------------------------------


def test_store_is_always_sent_false_and_shown_when_it_changes() -> None:
    sent_true = reask_request({"input": "hi", "store": True}, ReaskPolicy(), API.rules)
    assert sent_true.body["store"] is False
    assert sent_true.changes["store"] == {"from": True, "to": False}
    defaulted = reask_request({"input": "hi"}, ReaskPolicy(), API.rules)
    assert defaulted.body["store"] is False
    assert defaulted.changes["store"] == {"to": False}
    sent_false = reask_request({"input": "hi", "store": False}, ReaskPolicy(), API.rules)
    assert sent_false.body["store"] is False
    assert "store" not in sent_false.changes


def test_a_reask_keeps_the_request_but_what_it_must_not_resend() -> None:
    request = {
        "model": "gpt-4.1",
        "input": LIST_INPUT,
        "instructions": "Be brief.",
        "previous_response_id": "resp_0",
        "tools": [FUNCTION_TOOL],
        "tool_choice": "auto",
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": "low"},
        "max_output_tokens": 500,
        "prompt_cache_key": "k1",
        "temperature": 0,
        "top_p": 1,
        "metadata": {"tenant": "acme"},
        "user": "user-42",
        "safety_identifier": "hash-42",
        "service_tier": "priority",
        "stream": True,
        "stream_options": {"include_obfuscation": False},
        "background": True,
        "store": True,
    }
    reask = reask_request(request, ReaskPolicy(), API.rules)
    kept = [
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "max_output_tokens",
        "prompt_cache_key",
        "top_p",
    ]
    assert {k: reask.body[k] for k in kept} == {k: request[k] for k in kept}
    for gone in ("metadata", "user", "safety_identifier", "service_tier"):
        assert gone not in reask.body
        assert "to" not in reask.changes[gone]
    for own in ("stream", "stream_options", "background"):
        assert own not in reask.body
        assert own not in reask.changes
    assert reask.body["temperature"] == 0.5
    assert reask.changes["temperature"] == {"from": 0, "to": 0.5}
    assert reask.changes["user"] == {"from": "<text, 7 chars>"}
    assert set(reask.changes) == {
        "metadata",
        "user",
        "safety_identifier",
        "service_tier",
        "store",
        "temperature",
    }
    assert request["store"] is True and request["stream"] is True  # the request is untouched


def test_the_changed_fields_are_known_at_start() -> None:
    fields = override_fields(ReaskPolicy(), [API.rules])
    assert {"metadata", "user", "safety_identifier", "service_tier", "store"} <= set(fields)
    assert "temperature" in fields


def test_a_reask_is_one_call_without_streaming_or_storing() -> None:
    body = {"input": "hi", "stream": True, "stream_options": {}, "background": True}
    assert API.with_draws(body, 1) == {"input": "hi", "stream": False, "store": False}
    assert body["stream"] is True
    with pytest.raises(ValueError, match="one answer a call"):
        API.with_draws(body, 2)


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
        "refusal",
        "name",
        "arguments",
        "input",
        "namespace",
        "output",
        "status",
        "delta",
        "item",
        "response",
        "tools",
        "server_label",
        "execution",
        "conversation",
        "instructions",
    ]
)
SHAPED = st.dictionaries(KEYS, JSON | st.sampled_from(["message", "function_call", "completed"]))


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
    assert API.not_reasked(request_, frozenset({"web_search"})) in (
        None,
        "conversation",
        "server_tool",
    )
