"""The traffic port's classification of a request by its head (adapters.traffic.intake):
the same API as each API's own ``recognises`` (monitor.core.apis), for any path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.traffic.intake import Intake, api_of_target
from monitor.core.apis.registry import api_for_path, get_api
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission

ENDINGS = [
    "/chat/completions",
    "/completions",
    "/responses",
    "/responses/resp_1",
    "/responses/resp_1/cancel",
    "/v1/messages",
    "/messages",
    "/v1/messages/count_tokens",
    "/threads/t1/messages",
    "/models/gemini-2.0-flash:generateContent",
    "/models/gemini-2.0-flash:streamGenerateContent",
    "/tunedModels/mine:generateContent",
    ":generateContent",
    "/models/g:countTokens",
    "/models",
    "/embeddings",
    "",
]
PREFIXES = ["", "/v1", "/v1beta", "/openai/v1", "/openai/deployments/gpt-4o", "/x/y"]


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("tail", ["", "/", "?alt=sse", "?key=secret&alt=sse", "/?a=1"])
def test_the_head_check_names_the_api_each_api_recognises(
    prefix: str, ending: str, tail: str
) -> None:
    target = prefix + ending + tail
    expected = api_for_path(target.split("?", 1)[0])
    assert api_of_target(target.encode()) == (expected.name if expected is not None else None)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(["v1", "chat", "completions", "responses", "messages", "models", "x"]),
        max_size=5,
    ),
    st.sampled_from(["", ":generateContent", ":streamGenerateContent", "/", "?q=1"]),
)
def test_any_path_is_classified_as_its_api_recognises(parts: list[str], end: str) -> None:
    raw = "/" + "/".join(parts) + end
    path = raw.split("?", 1)[0]
    expected = api_for_path(path)
    assert api_of_target(raw.encode()) == (expected.name if expected is not None else None)


def test_classify_counts_every_request_by_api_and_only_posts_are_events() -> None:
    seen: list[tuple[str, str]] = []

    def sink(event: TrafficEvent, source: str) -> Admission:
        return Admission("sampled")

    intake = Intake(
        "proxy",
        sink=sink,
        reject=lambda source, reason: None,
        task_resolver=lambda headers, path, body: None,
        skip=None,
        seen=lambda source, api: seen.append((source, api)),
        generic=[("/agent/", get_api("generic", {"query_path": "q", "answer_path": "a"}))],
    )
    assert intake.classify(b"POST", b"/v1/messages")
    assert intake.classify(b"POST", b"/agent/run?x=1")
    assert intake.classify(b"POST", b"/agent/v1/chat/completions")  # the task's prefix first
    assert not intake.classify(b"GET", b"/v1/chat/completions")
    assert not intake.classify(b"POST", b"/v1/embeddings")
    assert seen == [
        ("proxy", "anthropic.messages"),
        ("proxy", "generic"),
        ("proxy", "generic"),
        ("proxy", "unmonitored"),
        ("proxy", "unmonitored"),
    ]
    assert intake.api_of("/agent/run") is not None and intake.api_of("/agent/run").name == "generic"
