"""OpenAI legacy Completions (monitor.core.apis.openai_completions), against the openai
SDK's own types: responses and stream chunks are ``openai.types.Completion`` objects,
requests are ``CompletionCreateParams``."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from openai.types import Completion, CompletionChoice
from openai.types.completion_create_params import CompletionCreateParamsNonStreaming

from monitor.core.apis.openai_completions import OpenAICompletions, completion_prompt
from monitor.core.errors import ConfigError, InputError
from monitor.core.reask import ReaskPolicy, override_fields, reask_request

API = OpenAICompletions()


def completion(*texts: str) -> Completion:
    return Completion(
        id="cmpl-1",
        object="text_completion",
        created=1_700_000_000,
        model="gpt-3.5-turbo-instruct",
        choices=[
            CompletionChoice(index=i, text=t, finish_reason="stop", logprobs=None)
            for i, t in enumerate(texts)
        ],
    )


def wire(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return out


def request(**extra: Any) -> dict[str, Any]:
    body: CompletionCreateParamsNonStreaming = {
        "model": "gpt-3.5-turbo-instruct",
        "prompt": "Q: What is the capital of France?\nA:",
        "max_tokens": 16,
        "temperature": 0,
        "seed": 42,
        "user": "user-1234",
        "stop": ["\n"],
    }
    out: dict[str, Any] = dict(body)
    out.update(extra)
    return out


@pytest.mark.parametrize(
    "path", ["/v1/completions", "/completions", "/openai/v1/completions", "/v1/completions/"]
)
def test_recognises_completions(path: str) -> None:
    assert API.recognises(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/chat/completions/",
        "/v1/responses",
        "/v1/completion",
        "/v1/completions/x",
        "/v1beta/models/m:generateContent",
    ],
)
def test_does_not_recognise_other_paths(path: str) -> None:
    assert not API.recognises(path)


def test_a_one_prompt_request_passes() -> None:
    API.check_request(request())
    API.check_request(request(prompt=["Say hi."]))
    API.check_request(request(suffix="\nThe end.", echo=False))
    assert completion_prompt(request(prompt=["Say hi."])) == "Say hi."


@pytest.mark.parametrize(
    ("prompt", "reason"),
    [
        (None, "'prompt' must be a non-empty string"),
        ("", "'prompt' must be a non-empty string"),
        ([], "'prompt' must be a non-empty string"),
        ([""], "'prompt' must be a non-empty string"),
        ({"text": "hi"}, "'prompt' must be a non-empty string"),
        (["a", "b"], "a batch of 2 prompts"),
        ([1212, 318, 257], "token-id"),
        ([[1212, 318], [257]], "token-id"),
        ([[1212, 318]], "token-id"),
        ("\ud800 lone", "not valid Unicode"),
    ],
)
def test_check_request_refuses_with_a_reason(prompt: Any, reason: str) -> None:
    body = request()
    if prompt is None:
        del body["prompt"]
    else:
        body["prompt"] = prompt
    with pytest.raises(InputError, match=reason):
        API.check_request(body)


def test_echo_and_a_bad_suffix_are_refused() -> None:
    with pytest.raises(InputError, match="'echo' puts the prompt in the answer"):
        API.check_request(request(echo=True))
    with pytest.raises(InputError, match="'suffix'"):
        API.check_request(request(suffix=3))
    with pytest.raises(InputError, match="'suffix'"):
        API.check_request(request(suffix="\udfff"))


def test_the_query_is_the_prompt_then_the_suffix() -> None:
    assert API.query(request()) == "Q: What is the capital of France?\nA:"
    assert API.query(request(prompt=["def f(x):"], suffix="    return y")) == (
        "def f(x):\n    return y"
    )
    assert API.query(request(suffix="")) == "Q: What is the capital of France?\nA:"


def test_the_model_is_the_body_s() -> None:
    assert API.model(request(), "/v1/completions") == "gpt-3.5-turbo-instruct"
    assert API.model({}, None) is None


def test_the_answer_is_the_first_choice_s_text() -> None:
    sdk = completion(" Paris", " Lyon")
    assert API.answer(wire(sdk)) == sdk.choices[0].text == " Paris"
    assert API.answer(wire(completion(""))) == ""
    assert API.answer({}) is None
    assert API.answer({"choices": []}) is None
    assert API.answer({"choices": [{"text": None}]}) is None
    assert API.answer({"choices": ["x"]}) is None


def test_the_stream_answer_is_the_same_answer() -> None:
    pieces = [" The", " capital", " is", " Paris."]
    chunks = [wire(completion(p)) for p in pieces]
    chunks.append({**wire(completion("")), "usage": {"total_tokens": 9}})
    assert API.stream_answer(chunks) == API.answer(wire(completion("".join(pieces))))
    # choice 1 of a stream with n=2 is not the answer
    other = wire(completion("x"))
    other["choices"][0]["index"] = 1
    assert API.stream_answer([*chunks, other]) == " The capital is Paris."
    assert API.stream_answer([]) is None
    assert API.stream_answer([{"error": {"message": "x"}}]) is None


def test_answers_are_every_choice_s_text() -> None:
    sdk = completion(" Paris", " Paris.", " Lyon")
    assert API.answers(wire(sdk)) == [c.text for c in sdk.choices]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({}, "no non-empty 'choices'"),
        ({"choices": []}, "no non-empty 'choices'"),
        ({"choices": {"text": "a"}}, "no non-empty 'choices'"),
        ({"choices": [{"text": "a"}, {"text": None}]}, "a NoneType, not a string"),
        ({"choices": [{"index": 0}]}, "a NoneType, not a string"),
        ({"choices": [{"text": 3}]}, "a int, not a string"),
        ({"choices": ["a"]}, "not a string"),
    ],
)
def test_answers_refuse_a_malformed_response(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(InputError, match=reason):
        API.answers(body)


def test_the_reask_keeps_the_request_but_seed_user_and_relmon_s_own() -> None:
    production = request(
        n=3,
        best_of=5,
        stream=True,
        stream_options={"include_usage": True},
        echo=False,
        logprobs=2,
        suffix="!",
        top_p=0.9,
        logit_bias={"50256": -100},
        top_k=40,
    )
    before = copy.deepcopy(production)
    reask = reask_request(production, ReaskPolicy(model="my-instruct"), API.rules)
    assert reask.body == {
        "model": "my-instruct",
        "prompt": production["prompt"],
        "max_tokens": 16,
        "temperature": 0.5,
        "stop": ["\n"],
        "suffix": "!",
        "top_p": 0.9,
        "logit_bias": {"50256": -100},
        "top_k": 40,
    }
    assert reask.changes == {
        "seed": {"from": 42},
        "user": {"from": "<text, 9 chars>"},
        "model": {"from": "gpt-3.5-turbo-instruct", "to": "my-instruct"},
        "temperature": {"from": 0, "to": 0.5},
    }
    assert production == before
    assert {"seed", "user", "temperature", "model"} <= set(
        override_fields(ReaskPolicy(), [API.rules])
    )


def test_a_request_of_a_prompt_only_gets_no_defaults() -> None:
    production = {"model": "m", "prompt": "Hi"}
    policy = ReaskPolicy(default_temperature=0.7, default_max_tokens=256)
    assert reask_request(production, policy, API.rules).body == production


def test_with_draws_and_route() -> None:
    body = reask_request(request(), ReaskPolicy(), API.rules).body
    before = copy.deepcopy(body)
    drawn = API.with_draws({**body, "stream": True, "n": 2}, 5)
    assert drawn == {**body, "stream": False, "n": 5}
    assert API.with_draws(body, 1) == {**body, "stream": False}
    assert body == before
    for n in (0, 129):
        with pytest.raises(ConfigError):
            API.with_draws(body, n)
    route = API.route(body, "/openai/v1/completions", "m")
    assert (route.api, route.path, route.headers) == ("openai.completions", "/completions", ())


def test_the_api_s_constants() -> None:
    assert API.name == "openai.completions"
    assert API.auth == "bearer"
    assert API.max_draws_per_call == 128
    assert API.not_reasked(request(), frozenset()) is None
    assert API.rules.dropped == ("seed", "user")
    assert API.rules.own == ("n", "best_of", "stream", "stream_options", "echo", "logprobs")
