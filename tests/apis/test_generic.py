"""An agent service's own endpoint (monitor.core.apis.generic): JMESPath paths to the
question and the answer, the body resent as it is."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from monitor.core.apis.generic import GenericApi, json_answer
from monitor.core.errors import ConfigError, InputError
from monitor.core.reask import ReaskPolicy, reask_request

API = GenericApi(query_path="input.question", answer_path="result.answer")
REQUEST: dict[str, Any] = {
    "session": "s-1",
    "input": {"question": "Book me a table for two?", "locale": "en"},
    "options": {"temperature": 0},
}
RESPONSE: dict[str, Any] = {"result": {"answer": "Done: table for two at 8pm.", "steps": 3}}


@pytest.mark.parametrize("expression", ["foo[", "a..b", "`x", "foo | | bar", "@@"])
def test_a_path_that_does_not_compile_is_a_config_error_naming_it(expression: str) -> None:
    with pytest.raises(ConfigError) as exc:
        GenericApi(query_path=expression, answer_path="answer")
    message = str(exc.value)
    assert message.startswith("query_path: ")
    assert repr(expression) in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"^answer_path: "):
        GenericApi(query_path="q", answer_path=expression)


@pytest.mark.parametrize("expression", ["", "  ", None, 3])
def test_a_path_that_is_no_expression_is_a_config_error(expression: Any) -> None:
    with pytest.raises(ConfigError, match="answer_path: must be a JMESPath expression"):
        GenericApi(query_path="q", answer_path=expression)


def test_the_api_s_constants() -> None:
    assert API.name == "generic"
    assert API.auth == "bearer"
    assert API.max_draws_per_call == 1
    assert (API.query_path, API.answer_path) == ("input.question", "result.answer")
    assert not API.recognises("/agent/ask")
    assert not API.recognises("/v1/chat/completions")
    assert API.not_reasked(REQUEST, frozenset()) is None
    rules = API.rules
    assert (rules.dropped, rules.own, rules.forced) == ((), (), ())
    assert rules.temperature is None and rules.model is None and rules.built is None


def test_check_request_wants_an_object_where_the_query_path_finds_something() -> None:
    API.check_request(REQUEST)
    with pytest.raises(InputError, match="must be a JSON object"):
        API.check_request(["a"])  # type: ignore[arg-type]
    bodies: list[dict[str, Any]] = [{}, {"input": {}}, {"input": {"question": None}}, {"input": 1}]
    for body in bodies:
        with pytest.raises(InputError, match=r"query_path 'input.question' found no text"):
            API.check_request(body)
    with pytest.raises(InputError, match="not valid Unicode"):
        API.check_request({"input": {"question": "\ud800"}})


@pytest.mark.parametrize(
    "question", [None, [], {}, "", "  \n", [None, ""], {"text": None}, [[], {"a": " "}]]
)
def test_a_query_path_that_finds_no_text_is_refused(question: Any) -> None:
    with pytest.raises(InputError, match=r"query_path 'input.question' found no text"):
        API.check_request({"input": {"question": question}})


@pytest.mark.parametrize("question", ["Capital?", ["", "Capital?"], {"q": "Capital?"}, 0, False])
def test_any_text_is_a_question(question: Any) -> None:
    API.check_request({"input": {"question": question}})


def test_a_path_whose_function_does_not_apply_finds_nothing() -> None:
    api = GenericApi(query_path="length(input)", answer_path="answer")
    with pytest.raises(InputError, match="found no text"):
        api.check_request({"input": 5})  # length() of a number: a JMESPath type error
    assert api.query({"input": 5}) == ""


def test_the_query_as_text() -> None:
    assert API.query(REQUEST) == "Book me a table for two?"
    chat = GenericApi(query_path="messages[].content", answer_path="reply")
    body = {"messages": [{"role": "system", "content": "Be kind."}, {"content": "Hi"}, {}]}
    chat.check_request(body)
    assert chat.query(body) == "Be kind.\nHi"
    with pytest.raises(InputError, match="found no text"):
        chat.check_request({"messages": [{"role": "user"}]})  # an empty projection
    whole = GenericApi(query_path="@", answer_path="@")  # the configuration's default
    whole.check_request(REQUEST)
    assert json.loads(whole.query(REQUEST)) == REQUEST
    assert whole.query({"b": 1, "a": "é"}) == '{"a":"é","b":1}'


def test_the_answer() -> None:
    assert API.answer(RESPONSE) == "Done: table for two at 8pm."
    assert API.answer({"result": {"answer": ""}}) == ""
    assert API.answer({"result": {"answer": None}}) is None
    assert API.answer({}) is None
    assert API.answer({"result": {"answer": 42}}) == "42"
    assert API.answer({"result": {"answer": True}}) == "true"
    assert API.answer({"result": {"answer": [1, "a"]}}) == '[1,"a"]'


def test_equal_structures_are_one_answer_whatever_their_key_order() -> None:
    api = GenericApi(query_path="q", answer_path="booking")
    one = {"booking": {"time": "20:00", "people": 2, "extras": {"b": 1, "a": 2}}}
    two = {"booking": {"extras": {"a": 2, "b": 1}, "people": 2, "time": "20:00"}}
    assert api.answer(one) == api.answer(two)
    assert api.answer(one) == '{"extras":{"a":2,"b":1},"people":2,"time":"20:00"}'
    assert json_answer({"x": "ü"}) == '{"x":"ü"}'


def test_the_stream_answer_is_the_last_event_that_has_one() -> None:
    api = GenericApi(query_path="q", answer_path="answer")
    events: list[dict[str, Any]] = [
        {"type": "start"},
        {"type": "step", "answer": "draft"},
        {"type": "done", "answer": "Paris"},
        {"type": "usage", "tokens": 12},
    ]
    assert api.stream_answer(events) == "Paris"
    assert api.stream_answer(events[-1:]) is None
    assert api.stream_answer([]) is None
    final_only = GenericApi(query_path="q", answer_path="type == 'done' && answer || null")
    assert final_only.stream_answer(events[:2]) is None
    assert final_only.stream_answer(events) == "Paris"


def test_answers_are_one_answer_or_an_error() -> None:
    assert API.answers(RESPONSE) == ["Done: table for two at 8pm."]
    with pytest.raises(InputError, match=r"answer_path 'result.answer' found no answer"):
        API.answers({"error": "x"})


def test_the_reask_is_the_body_as_sent() -> None:
    production = copy.deepcopy(REQUEST)
    reask = reask_request(production, ReaskPolicy(model="another-model"), API.rules)
    assert reask.body == REQUEST  # nothing dropped, raised or replaced
    assert reask.changes == {}
    assert production == REQUEST
    drawn = API.with_draws(reask.body, 1)
    assert drawn == REQUEST and drawn is not reask.body
    with pytest.raises(ConfigError, match="one answer a call"):
        API.with_draws(reask.body, 2)


def test_the_task_s_set_and_drop_still_apply() -> None:
    policy = ReaskPolicy(set={"options.temperature": 0.7}, drop=["session"])
    reask = reask_request(REQUEST, policy, API.rules)
    assert reask.body == {"input": REQUEST["input"], "options": {"temperature": 0.7}}
    assert reask.changes == {
        "options.temperature": {"from": 0, "to": 0.7},
        "session": {"from": "<text, 3 chars>"},
    }
    assert REQUEST["options"] == {"temperature": 0}


def test_the_route_is_the_production_path() -> None:
    route = API.route(REQUEST, "/agent/ask", "m")
    assert (route.api, route.path, route.headers) == ("generic", "/agent/ask", ())
    assert API.route(REQUEST, None, None).path == "/"


def test_the_model_is_the_body_s_when_it_names_one() -> None:
    assert API.model({"model": "agent-v3"}, "/agent/ask") == "agent-v3"
    assert API.model(REQUEST, "/agent/ask") is None
