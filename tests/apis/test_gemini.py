"""Gemini generateContent (monitor.core.apis.gemini), against the google-genai SDK's own
types: fixtures are SDK objects dumped as the REST API sends them (camel case), and what
relmon reads is compared with what the SDK computes (``response.text``,
``response.function_calls``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from google.genai import types

from monitor.core.apis.gemini import BLOCKED_REASONS, GeminiGenerateContent, server_tools
from monitor.core.canon.toolcall import REFUSAL, ToolCallCanonicalizer, choice_answer
from monitor.core.errors import ConfigError, InputError
from monitor.core.reask import ReaskPolicy, override_fields, reask_request

API = GeminiGenerateContent()
CANON = ToolCallCanonicalizer()


def wire(model: Any) -> dict[str, Any]:
    """An SDK object as the REST API carries it: camel case, no nulls."""
    out: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def response(parts: list[types.Part], **candidate: Any) -> types.GenerateContentResponse:
    return types.GenerateContentResponse(
        candidates=[
            types.Candidate(
                content=types.Content(role="model", parts=parts),
                index=0,
                finish_reason=candidate.pop("finish_reason", types.FinishReason.STOP),
                **candidate,
            )
        ]
    )


USER = types.Content(role="user", parts=[types.Part(text="What is the capital of France?")])
SYSTEM = types.Content(parts=[types.Part(text="Answer in one word.")])
WEATHER = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            parameters=types.Schema(
                type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}
            ),
        )
    ]
)


def request(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "contents": [wire(USER)],
        "systemInstruction": wire(SYSTEM),
        "generationConfig": wire(
            types.GenerationConfig(temperature=0.0, seed=7, candidate_count=2, top_k=40)
        ),
    }
    body.update(extra)
    return body


def test_the_fixtures_are_the_rest_api_s_camel_case() -> None:
    body = request()
    assert set(body["generationConfig"]) == {"temperature", "seed", "candidateCount", "topK"}
    assert wire(types.Tool(google_search=types.GoogleSearch())) == {"googleSearch": {}}
    assert "functionCall" in wire(types.Part(function_call=types.FunctionCall(name="f")))


# --- recognises and model ---------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1beta/models/gemini-2.0-flash:generateContent",
        "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
        "/v1/models/gemini-2.5-pro:generateContent",
        "/v1beta/tunedModels/my-tuned-1:generateContent",
        "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.0-flash"
        ":generateContent",
        "/gateway/v1beta/models/gemini-2.0-flash:generateContent/",
    ],
)
def test_recognises_generate_content_paths(path: str) -> None:
    assert API.recognises(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1beta/models/gemini-2.0-flash:countTokens",
        "/v1beta/models/gemini-2.0-flash:embedContent",
        "/v1beta/models/gemini-2.0-flash:batchGenerateContent",
        "/v1beta/models/gemini-2.0-flash",
        "/v1beta/models/:generateContent",
        "/v1beta/models/a/b:generateContent",
        "/v1beta/cachedContents/x:generateContent",
    ],
)
def test_does_not_recognise_other_paths(path: str) -> None:
    assert not API.recognises(path)


def test_the_model_is_the_path_s_else_the_body_s() -> None:
    assert API.model({}, "/v1beta/models/gemini-2.0-flash:generateContent") == "gemini-2.0-flash"
    assert API.model({}, "/v1beta/tunedModels/t-1:streamGenerateContent") == "t-1"
    assert API.model({"model": "models/gemini-2.0-flash"}, None) == "gemini-2.0-flash"
    assert API.model({"model": "gemini-pro"}, "/v1/other") == "gemini-pro"
    assert API.model({"model": 3}, None) is None


# --- check_request and query ------------------------------------------------------------


def test_a_well_formed_request_passes() -> None:
    API.check_request(request())
    API.check_request({"contents": [{"parts": [{"text": "hi"}]}]})  # role is optional
    snake = {"contents": [wire(USER)], "system_instruction": wire(SYSTEM)}
    API.check_request(snake)
    image = types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG"))
    API.check_request({"contents": [wire(types.Content(role="user", parts=[image]))]})
    # snake-case generation_config holding nothing the rules change is resent as sent
    API.check_request({"contents": [wire(USER)], "generation_config": {"top_k": 3}})


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, "'contents' must be a non-empty list"),
        ({"contents": []}, "'contents' must be a non-empty list"),
        ({"contents": "What is 2+2?"}, "a bare string as this list"),
        ({"contents": {"parts": [{"text": "hi"}]}}, "'contents' must be a non-empty list"),
        ({"contents": [{"role": "user"}]}, "'parts' must be a list"),
        ({"contents": [{"role": "user", "parts": "hi"}]}, "'parts' must be a list"),
        ({"contents": [{"role": 1, "parts": []}]}, "'contents' must be"),
        ({"contents": [{"parts": ["hi"]}]}, "'parts' must be a list of objects"),
        ({"contents": [{"parts": [{"text": "\ud800"}]}]}, "'text' is text"),
        ({"contents": [{"parts": [{"text": 3}]}]}, "'text' is text"),
        (
            {"contents": [wire(USER)], "systemInstruction": "Be brief."},
            "'systemInstruction' must be",
        ),
        (
            {"contents": [wire(USER)], "system_instruction": {"parts": [{"text": "\udfff"}]}},
            "'systemInstruction' must be",
        ),
        (
            {"contents": [wire(USER)], "generation_config": {"temperature": 0}},
            "'generation_config' (snake case) holds temperature",
        ),
        (
            {"contents": [wire(USER)], "generation_config": {"seed": 1, "candidate_count": 2}},
            "holds candidate_count, seed",
        ),
    ],
)
def test_check_request_refuses_with_a_reason(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(InputError) as exc:
        API.check_request(body)
    assert reason in str(exc.value)
    assert "\ud800" not in str(exc.value)


def test_the_query_is_the_system_instruction_then_the_turns() -> None:
    history = [
        wire(USER),
        wire(types.Content(role="model", parts=[types.Part(text="Paris.")])),
        wire(
            types.Content(
                role="user",
                parts=[
                    types.Part(text="And of Italy?"),
                    types.Part(inline_data=types.Blob(mime_type="image/png", data=b"x")),
                    types.Part(text="One word."),
                ],
            )
        ),
    ]
    body = request(contents=history)
    assert API.query(body) == (
        "Answer in one word.\nWhat is the capital of France?\nParis.\nAnd of Italy?\nOne word."
    )
    snake = {"contents": [wire(USER)], "system_instruction": wire(SYSTEM)}
    assert API.query(snake) == "Answer in one word.\nWhat is the capital of France?"
    assert API.query({"contents": [wire(USER)]}) == "What is the capital of France?"


# --- answer and stream_answer -----------------------------------------------------------


def test_the_answer_is_the_sdk_s_text_thoughts_left_out() -> None:
    sdk = response(
        [
            types.Part(text="Let me think about capitals.", thought=True),
            types.Part(text="The capital "),
            types.Part(text="is Paris."),
            types.Part(text="(double-checked)", thought=True),
        ]
    )
    answer = API.answer(wire(sdk))
    assert answer == sdk.text == "The capital is Paris."


def test_an_empty_text_part_is_the_empty_answer_as_in_the_sdk() -> None:
    sdk = response([types.Part(text="")])
    assert API.answer(wire(sdk)) == sdk.text == ""


def test_the_answer_is_the_first_candidate_s() -> None:
    sdk = types.GenerateContentResponse(
        candidates=[
            types.Candidate(
                content=types.Content(role="model", parts=[types.Part(text=t)]), index=i
            )
            for i, t in enumerate(["Paris", "Lyon"])
        ]
    )
    assert API.answer(wire(sdk)) == sdk.text == "Paris"


def test_function_calls_are_a_tool_call_answer_equal_to_the_chat_form() -> None:
    sdk = response(
        [
            types.Part(text="I'll look it up."),
            types.Part(function_call=types.FunctionCall(name="f", args={"a": 1}, id="call-9")),
        ]
    )
    answer = API.answer(wire(sdk))
    assert answer is not None
    chat = choice_answer(
        {
            "content": None,
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        }
    )
    assert chat is not None
    assert (
        CANON.canonicalize(answer)
        == CANON.canonicalize(chat)
        == '[{"arguments":{"a":1},"name":"f"}]'
    )
    # the call is the SDK's
    assert sdk.function_calls is not None
    listed = json.loads(answer.split(":", 1)[1])
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in listed] == [
        (c.name, c.args) for c in sdk.function_calls
    ]


def test_several_calls_compare_in_any_order_and_args_may_be_absent() -> None:
    one = response(
        [
            types.Part(function_call=types.FunctionCall(name="g")),
            types.Part(function_call=types.FunctionCall(name="f", args={"b": 2, "a": [1]})),
        ]
    )
    two = response(
        [
            types.Part(function_call=types.FunctionCall(name="f", args={"a": [1], "b": 2})),
            types.Part(function_call=types.FunctionCall(name="g", args={})),
        ]
    )
    first, second = API.answer(wire(one)), API.answer(wire(two))
    assert first is not None and second is not None
    assert CANON.canonicalize(first) == CANON.canonicalize(second)


@pytest.mark.parametrize("reason", sorted(BLOCKED_REASONS))
def test_a_candidate_a_filter_stopped_is_a_refusal(reason: str) -> None:
    raw = {"candidates": [{"finishReason": reason, "index": 0}]}
    sdk = types.GenerateContentResponse.model_validate(raw)
    assert sdk.text is None  # the SDK has no text; relmon has a refusal answer
    answer = API.answer(wire(sdk))
    assert answer is not None
    assert CANON.canonicalize(answer) == REFUSAL


def test_a_finished_candidate_without_text_is_the_empty_answer() -> None:
    # thinking used the whole budget: content without parts, finishReason MAX_TOKENS
    sdk = types.GenerateContentResponse(
        candidates=[
            types.Candidate(
                content=types.Content(role="model"),
                finish_reason=types.FinishReason.MAX_TOKENS,
                index=0,
            )
        ]
    )
    assert API.answer(wire(sdk)) == ""
    thoughts_only = response([types.Part(text="Hmm.", thought=True)])
    assert thoughts_only.text is None
    assert API.answer(wire(thoughts_only)) == ""


def test_no_answer_when_the_response_holds_none() -> None:
    assert API.answer({}) is None
    assert API.answer({"candidates": []}) is None
    blocked = types.GenerateContentResponse(
        prompt_feedback=types.GenerateContentResponsePromptFeedback(
            block_reason=types.BlockedReason.SAFETY
        )
    )
    assert API.answer(wire(blocked)) is None
    assert API.answer({"candidates": [{"index": 0}]}) is None  # not finished, no content
    assert API.answer({"candidates": ["x"]}) is None
    nan = {
        "candidates": [
            {"content": {"parts": [{"functionCall": {"name": "f", "args": {"a": float("nan")}}}]}}
        ]
    }
    assert API.answer(nan) is None


def chunks(*pieces: types.Part, finish: types.FinishReason | None = None) -> list[dict[str, Any]]:
    """A streamed response: one chunk a part, the last with the finish reason."""
    out = []
    for i, part in enumerate(pieces):
        last = i == len(pieces) - 1
        out.append(
            wire(
                types.GenerateContentResponse(
                    candidates=[
                        types.Candidate(
                            content=types.Content(role="model", parts=[part]),
                            index=0,
                            finish_reason=finish if last else None,
                        )
                    ],
                    model_version="gemini-2.0-flash",
                )
            )
        )
    return out


def test_the_stream_answer_is_the_same_answer() -> None:
    parts = [
        types.Part(text="Thinking...", thought=True),
        types.Part(text="The capital "),
        types.Part(text="is "),
        types.Part(text="Paris."),
    ]
    whole = API.answer(wire(response(parts)))
    assert whole == "The capital is Paris."
    streamed = chunks(*parts, finish=types.FinishReason.STOP)
    streamed.append({"usageMetadata": {"totalTokenCount": 12}})  # a last chunk without candidates
    assert API.stream_answer(streamed) == whole


def test_streamed_function_calls_are_gathered_across_chunks() -> None:
    calls = [
        types.Part(function_call=types.FunctionCall(name="f", args={"a": 1})),
        types.Part(function_call=types.FunctionCall(name="g", args={"b": "x"})),
    ]
    streamed = API.stream_answer(chunks(types.Part(text="Calling."), *calls))
    assert streamed == API.answer(wire(response(calls)))


def test_a_stream_a_filter_stopped_is_a_refusal_and_an_empty_stream_no_answer() -> None:
    blocked = [{"candidates": [{"index": 0, "finishReason": "SAFETY"}]}]
    answer = API.stream_answer(blocked)
    assert answer is not None and CANON.canonicalize(answer) == REFUSAL
    assert API.stream_answer([]) is None
    assert (
        API.stream_answer([{"candidates": [{"index": 1, "content": {"parts": [{"text": "b"}]}}]}])
        is None
    )


# --- not_reasked ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tool",
    [
        types.Tool(google_search=types.GoogleSearch()),
        types.Tool(code_execution=types.ToolCodeExecution()),
        types.Tool(url_context=types.UrlContext()),
        types.Tool(google_search_retrieval=types.GoogleSearchRetrieval()),
    ],
)
def test_a_request_with_a_server_tool_is_not_reasked(tool: types.Tool) -> None:
    body = request(tools=[wire(WEATHER), wire(tool)])
    assert API.not_reasked(body, frozenset()) == "server_tool"
    (name,) = server_tools(body)
    assert API.not_reasked(body, frozenset({name})) is None


def test_server_tools_are_allowed_by_camel_or_snake_name() -> None:
    snake = request(tools=[{"google_search": {}}, {"code_execution": {}}])
    assert server_tools(snake) == ["googleSearch", "codeExecution"]
    assert API.not_reasked(snake, frozenset({"googleSearch"})) == "server_tool"
    assert API.not_reasked(snake, frozenset({"googleSearch", "code_execution"})) is None
    camel = request(tools=[{"urlContext": {}}])
    assert API.not_reasked(camel, frozenset({"url_context"})) is None


def test_function_tools_are_reasked_and_an_unknown_tool_kind_is_not() -> None:
    assert API.not_reasked(request(tools=[wire(WEATHER)]), frozenset()) is None
    assert (
        API.not_reasked({"contents": [], "tools": [{"function_declarations": []}]}, frozenset())
        is None
    )
    assert API.not_reasked(request(), frozenset()) is None
    assert API.not_reasked(request(tools=[{"computerUse": {}}]), frozenset()) == "server_tool"


# --- the re-ask -------------------------------------------------------------------------


def test_the_reask_drops_the_seed_raises_the_temperature_and_keeps_the_rest() -> None:
    production = request(tools=[wire(WEATHER)], safetySettings=[{"category": "X"}])
    before = copy.deepcopy(production)
    reask = reask_request(production, ReaskPolicy(), API.rules)
    config = reask.body["generationConfig"]
    assert config == {"temperature": 0.5, "topK": 40}  # seed dropped, candidateCount removed
    assert reask.changes == {
        "generationConfig.seed": {"from": 7},
        "generationConfig.temperature": {"from": 0.0, "to": 0.5},
    }
    assert reask.body["contents"] == production["contents"]
    assert reask.body["tools"] == production["tools"]
    assert reask.body["safetySettings"] == production["safetySettings"]
    assert production == before  # the production request is never changed


def test_a_reask_sends_no_field_production_did_not_send() -> None:
    production = {"contents": [wire(USER)]}
    reask = reask_request(production, ReaskPolicy(model="gemini-2.5-pro"), API.rules)
    assert reask.body == production  # the model is in the path, not the body
    assert reask.changes == {}


def test_the_rules_fields_are_counted() -> None:
    fields = override_fields(ReaskPolicy(), [API.rules])
    assert "generationConfig.seed" in fields
    assert "generationConfig.temperature" in fields


def test_the_route_is_the_production_path_never_streaming() -> None:
    body = request()
    stream = "/v1beta/models/gemini-2.0-flash:streamGenerateContent"
    route = API.route(body, stream, None)
    assert (route.api, route.path) == (API.name, "/v1beta/models/gemini-2.0-flash:generateContent")
    assert route.headers == ()
    v1 = "/v1/models/gemini-2.0-flash:generateContent"
    assert API.route(body, v1, "gemini-2.5-pro").path == "/v1/models/gemini-2.5-pro:generateContent"
    assert API.route(body, v1, "models/gemini-2.5-pro").path == (
        "/v1/models/gemini-2.5-pro:generateContent"
    )
    tuned = "/v1beta/tunedModels/t-1:streamGenerateContent"
    assert API.route(body, tuned, None).path == "/v1beta/tunedModels/t-1:generateContent"
    vertex = "/v1/projects/p/locations/l/publishers/google/models/gemini-2.0-flash:generateContent"
    assert API.route(body, vertex, None).path == vertex


def test_without_a_production_path_the_route_is_v1beta() -> None:
    body = request()
    assert API.route(body, None, "gemini-2.0-flash").path == (
        "/v1beta/models/gemini-2.0-flash:generateContent"
    )
    assert API.route({**body, "model": "models/gemini-pro"}, None, None).path == (
        "/v1beta/models/gemini-pro:generateContent"
    )
    assert API.route(body, "/somewhere/else", "m-1").path == "/v1beta/models/m-1:generateContent"
    assert API.route(body, None, "tunedModels/t-2").path == (
        "/v1beta/tunedModels/t-2:generateContent"
    )
    with pytest.raises(InputError, match="needs a model"):
        API.route(body, None, None)
    for bad in ("../../v1/files", "a/b/c", "gemini pro", "x?key=y"):
        with pytest.raises(InputError):
            API.route(body, None, bad)


def test_answers_are_one_a_candidate() -> None:
    sdk = types.GenerateContentResponse(
        candidates=[
            types.Candidate(
                content=types.Content(role="model", parts=[types.Part(text="Paris")]), index=0
            ),
            types.Candidate(
                content=types.Content(
                    role="model",
                    parts=[
                        types.Part(text="hmm", thought=True),
                        types.Part(text="Par"),
                        types.Part(text="is."),
                    ],
                ),
                index=1,
            ),
            types.Candidate(
                content=types.Content(
                    role="model",
                    parts=[types.Part(function_call=types.FunctionCall(name="f", args={"a": 1}))],
                ),
                index=2,
            ),
            types.Candidate(finish_reason=types.FinishReason.SAFETY, index=3),
        ]
    )
    answers = API.answers(wire(sdk))
    assert answers[:2] == ["Paris", "Paris."]
    assert [CANON.canonicalize(a) for a in answers[2:]] == [
        '[{"arguments":{"a":1},"name":"f"}]',
        REFUSAL,
    ]
    assert answers[0] == API.answer(wire(sdk))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, "no non-empty 'candidates'"),
        ({"candidates": []}, "no non-empty 'candidates'"),
        ({"candidates": "x"}, "no non-empty 'candidates'"),
        ({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}, "blocked (PROHIBITED_CONTENT)"),
        ({"candidates": [{"index": 0}]}, "a candidate holds no"),
        ({"candidates": [{"content": {"parts": [{"text": "a"}]}}, None]}, "a candidate holds no"),
        ({"candidates": [{"finishReason": "OTHER"}]}, "a candidate holds no"),
    ],
)
def test_answers_refuse_a_response_without_answers(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(InputError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        API.answers(body)


def test_with_draws_asks_for_candidate_count_without_changing_the_body() -> None:
    body = reask_request(request(), ReaskPolicy(), API.rules).body
    before = copy.deepcopy(body)
    assert API.with_draws(body, 5)["generationConfig"] == {
        "temperature": 0.5,
        "topK": 40,
        "candidateCount": 5,
    }
    assert API.with_draws(body, 1)["generationConfig"] == {"temperature": 0.5, "topK": 40}
    assert body == before
    plain = {"contents": [wire(USER)]}
    assert API.with_draws(plain, 1) == plain
    assert API.with_draws(plain, 8)["generationConfig"] == {"candidateCount": 8}
    # a snake-case count is relmon's own too; a snake-case parent stays the parent
    snake = {"contents": [], "generation_config": {"candidate_count": 3, "top_k": 2}}
    assert API.with_draws(snake, 2) == {
        "contents": [],
        "generation_config": {"top_k": 2, "candidateCount": 2},
    }
    for n in (0, 9):
        with pytest.raises(ConfigError):
            API.with_draws(body, n)


def test_the_api_s_constants() -> None:
    assert API.name == "gemini.generate_content"
    assert API.auth == "x-goog-api-key"
    assert API.max_draws_per_call == 8
    assert API.rules.dropped == ("generationConfig.seed",)
    assert API.rules.own == ("generationConfig.candidateCount",)
    assert API.rules.temperature == "generationConfig.temperature"
    assert API.rules.model is None and API.rules.built is None
