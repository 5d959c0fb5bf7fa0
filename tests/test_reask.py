"""A re-ask is the request production made (monitor.core.reask)."""

from __future__ import annotations

import copy

import pytest

from monitor.core.errors import ConfigError
from monitor.core.reask import (
    DROPPED_FIELDS,
    FieldRules,
    ReaskPolicy,
    override_fields,
    reask_request,
    shown_value,
)

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
SHAPING = {
    "tools": TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "response_format": {"type": "json_object"},
    "max_tokens": 2000,
    "max_completion_tokens": 2000,
    "top_p": 0.9,
    "stop": ["\n\n"],
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "logit_bias": {"50256": -100},
    "reasoning_effort": "low",
    "top_k": 40,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "guided_json": {"type": "object"},
    "temperature": 0.8,
}


def test_every_answer_shaping_field_goes_out_as_sent() -> None:
    request = {"model": "gpt-x", "messages": MESSAGES, **SHAPING}
    reask = reask_request(request, ReaskPolicy())
    assert reask.body == request
    assert reask.changes == {}


def test_dropped_and_own_fields() -> None:
    request = {
        "model": "gpt-x",
        "messages": MESSAGES,
        "seed": 7,
        "user": "alice@example.com",
        "store": True,
        "metadata": {"customer": "acme"},
        "service_tier": "flex",
        "logprobs": True,
        "top_logprobs": 5,
        "n": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.7,
    }
    reask = reask_request(request, ReaskPolicy())
    assert reask.body == {"model": "gpt-x", "messages": MESSAGES, "temperature": 0.7}
    assert set(reask.changes) == set(DROPPED_FIELDS)
    assert all("to" not in change for change in reask.changes.values())
    # Values are summarised: no user id or metadata leaves through the changes.
    assert reask.changes["user"] == {"from": "<text, 17 chars>"}
    assert reask.changes["metadata"] == {"from": "<object, 1 keys>"}
    assert reask.changes["seed"] == {"from": 7}


@pytest.mark.parametrize(
    ("sent", "expected", "changed"),
    [(0.0, 0.5, True), (0.2, 0.5, True), (0.5, 0.5, False), (1.3, 1.3, False)],
)
def test_a_low_temperature_is_raised(sent: float, expected: float, changed: bool) -> None:
    reask = reask_request(
        {"messages": MESSAGES, "temperature": sent, "top_p": 1}, ReaskPolicy(min_temperature=0.5)
    )
    assert reask.body["temperature"] == expected
    assert ("temperature" in reask.changes) is changed
    if changed:
        assert reask.changes["temperature"] == {"from": sent, "to": 0.5}


def test_an_unsent_field_stays_unsent_unless_relmon_builds_the_request() -> None:
    policy = ReaskPolicy(default_temperature=0.7, default_max_tokens=256)
    sent = {"messages": MESSAGES, "top_p": 0.5}
    assert reask_request(sent, policy).body == sent  # the server's defaults, as in production
    built = reask_request({"messages": MESSAGES}, policy)
    assert built.body == {"messages": MESSAGES, "temperature": 0.7, "max_tokens": 256}
    assert built.changes == {"temperature": {"to": 0.7}, "max_tokens": {"to": 256}}


def test_the_task_model_replaces_the_request_model() -> None:
    reask = reask_request({"model": "alias", "messages": MESSAGES}, ReaskPolicy(model="m-7b"))
    assert reask.body["model"] == "m-7b"
    assert reask.changes["model"] == {"from": "alias", "to": "m-7b"}
    same = reask_request({"model": "m-7b", "messages": MESSAGES, "top_p": 1}, ReaskPolicy("m-7b"))
    assert same.changes == {}


def test_set_and_drop() -> None:
    policy = ReaskPolicy(set={"temperature": 0.0, "max_tokens": 64}, drop=["tools", "stop"])
    request = {"messages": MESSAGES, "temperature": 0.9, "tools": TOOLS, "top_p": 1}
    reask = reask_request(request, policy)
    # set wins over the raise: the task asked for it.
    assert reask.body == {"messages": MESSAGES, "temperature": 0.0, "max_tokens": 64, "top_p": 1}
    assert reask.changes["temperature"] == {"from": 0.9, "to": 0.0}
    assert reask.changes["max_tokens"] == {"to": 64}
    assert reask.changes["tools"] == {"from": "<list, 1 items>"}
    assert "stop" not in reask.changes  # not sent, nothing dropped


def test_the_request_is_not_modified() -> None:
    request = {"messages": MESSAGES, "seed": 1, "temperature": 0.0}
    before = dict(request)
    reask_request(request, ReaskPolicy(drop=["messages_extra"]))
    assert request == before


def test_override_label_values_are_known_at_start() -> None:
    fields = override_fields(ReaskPolicy(set={"top_k": 1}, drop=["tools"]))
    assert {*DROPPED_FIELDS, "model", "temperature", "max_tokens", "top_k", "tools"} == set(fields)
    assert list(fields) == sorted(fields)


@pytest.mark.parametrize(
    "policy",
    [
        {"min_temperature": -0.1},
        {"set": {"n": 2}},
        {"drop": ["stream"]},
        {"drop": ["messages"]},
    ],
)
def test_bad_policies(policy: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ReaskPolicy(**policy)  # type: ignore[arg-type]


def test_shown_values() -> None:
    assert shown_value("temperature", 0.2) == 0.2
    assert shown_value("model", "gpt-x") == "gpt-x"
    assert shown_value("user", "bob") == "<text, 3 chars>"
    assert shown_value("stop", ["a", "b"]) == "<list, 2 items>"
    assert shown_value("store", True) is True


# -- per-API field rules (monitor.core.apis: FieldRules) ---------------------------------

GEMINI_LIKE = FieldRules(
    dropped=("generationConfig.seed",),
    own=("generationConfig.candidateCount", "stream"),
    temperature="generationConfig.temperature",
    model=None,
    built=None,
)


def test_dotted_fields_are_dropped_raised_and_the_production_request_is_untouched() -> None:
    config = {"seed": 7, "temperature": 0.0, "candidateCount": 4, "topK": 40}
    request = {"contents": [{"parts": [{"text": "q"}]}], "generationConfig": config}
    before = copy.deepcopy(request)
    reask = reask_request(request, ReaskPolicy(model="g-2"), GEMINI_LIKE)
    assert reask.body["generationConfig"] == {"temperature": 0.5, "topK": 40}
    assert reask.changes == {
        "generationConfig.seed": {"from": 7},
        "generationConfig.temperature": {"from": 0.0, "to": 0.5},
    }
    assert request == before  # nested objects copied, never changed in place
    assert "model" not in reask.body  # the model lives in the path for this API


def test_set_and_drop_take_dotted_paths_and_create_missing_parents() -> None:
    request = {"contents": [], "generationConfig": {"topK": 40}}
    policy = ReaskPolicy(
        set={"generationConfig.maxOutputTokens": 64}, drop=["generationConfig.topK"]
    )
    reask = reask_request(request, policy, GEMINI_LIKE)
    assert reask.body["generationConfig"] == {"maxOutputTokens": 64}
    assert reask.changes["generationConfig.maxOutputTokens"] == {"to": 64}
    assert reask.changes["generationConfig.topK"] == {"from": 40}
    bare = reask_request({"contents": []}, policy, GEMINI_LIKE)
    assert bare.body == {"contents": [], "generationConfig": {"maxOutputTokens": 64}}


@pytest.mark.parametrize(
    ("sent", "change"),
    [
        (True, {"from": True, "to": False}),
        (None, {"to": False}),
        (False, None),
        (0, {"from": 0, "to": False}),
    ],
)
def test_a_forced_field_is_always_sent_and_shown_when_it_differs(
    sent: object, change: dict[str, object] | None
) -> None:
    rules = FieldRules(dropped=(), forced=(("store", False),), built=None)
    request = {"input": "q"} | ({} if sent is None else {"store": sent})
    reask = reask_request(request, ReaskPolicy(), rules)
    assert reask.body["store"] is False
    assert reask.changes.get("store") == change


@pytest.mark.parametrize(
    ("minimum", "sent", "to"), [(0.5, 0.2, 0.5), (1.5, 0.2, 1.0), (1.5, 1.2, None)]
)
def test_a_raised_temperature_never_passes_the_apis_maximum(
    minimum: float, sent: float, to: float | None
) -> None:
    rules = FieldRules(max_temperature=1.0, built=None)
    reask = reask_request({"temperature": sent}, ReaskPolicy(min_temperature=minimum), rules)
    assert reask.body["temperature"] == (sent if to is None else to)
    assert ("temperature" in reask.changes) == (to is not None)


def test_override_fields_of_several_apis_are_known_at_start() -> None:
    fields = override_fields(ReaskPolicy(), (FieldRules(), GEMINI_LIKE))
    assert {"seed", "generationConfig.seed", "generationConfig.temperature", "temperature"} <= set(
        fields
    )
