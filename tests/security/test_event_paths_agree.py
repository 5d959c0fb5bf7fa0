"""A proxied or mirrored request becomes an event without building the event document
(:func:`event_from_request`, on the proxy's live path for a sampled request); it must
accept and refuse exactly what :func:`parse_event` does with that document, with the
same reason. The proxy's answer text is read by msgspec, falling back to Python's json:
the same text as json alone gives."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.traffic.messages import json_response_text
from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent, event_from_request, parse_event

TEXT = st.one_of(st.text(max_size=6), st.sampled_from(["\ud800", "x\udfff", "", " "]))
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), TEXT)
CONTENT = st.one_of(
    LEAF,
    st.lists(st.one_of(LEAF, st.dictionaries(st.sampled_from(["text", "type"]), LEAF)), max_size=3),
    st.dictionaries(st.sampled_from(["text"]), LEAF, max_size=1),
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.one_of(TEXT, st.integers()), "content": CONTENT}),
    st.fixed_dictionaries({"role": TEXT}),
    LEAF,
)
VALID_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system"]), "content": st.one_of(st.none(), st.text())}
)
BODY = st.one_of(  # about half of them valid, so that each later check is reached
    st.fixed_dictionaries(
        {
            "model": st.one_of(st.sampled_from(["m", "gpt-x"]), LEAF),
            "messages": st.lists(VALID_MESSAGE, min_size=1),
        }
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.one_of(LEAF, st.just("m")),
            "messages": st.one_of(LEAF, st.lists(MESSAGE, max_size=3)),
            "temperature": LEAF,
        },
    ),
)


def _outcome(make: object) -> TrafficEvent | str:
    try:
        return make()  # type: ignore[operator, no-any-return]
    except InputError as exc:
        return f"rejected: {exc}"


@settings(max_examples=400, deadline=None)
@given(
    rid=st.one_of(st.just("req-1"), TEXT, st.text(min_size=500, max_size=520)),
    body=BODY,
    task=st.one_of(st.none(), TEXT),
    text=st.one_of(st.none(), TEXT),
    draw=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
)
def test_the_direct_path_agrees_with_the_event_document(
    rid: str, body: dict[str, object], task: str | None, text: str | None, draw: float | None
) -> None:
    document: dict[str, object] = {"id": rid, "model": body.get("model"), "task": task}
    document["request"] = dict(body)
    if text is not None:
        document["response"] = {"choices": [{"message": {"content": text}}]}
    direct = _outcome(
        lambda: event_from_request(rid, body, task=task, response_text=text, draw=draw)
    )
    expected = _outcome(lambda: parse_event(document))
    if isinstance(expected, TrafficEvent):
        assert isinstance(direct, TrafficEvent)
        assert direct.draw == draw
        assert (direct.id, direct.model, direct.task, direct.response_text, direct.ts) == (
            expected.id,
            expected.model,
            expected.task,
            expected.response_text,
            expected.ts,
        )
        assert direct.request == expected.request and direct.request is not body
    else:
        assert direct == expected


@pytest.mark.parametrize(
    "body",
    [
        b'{"choices": [{"message": {"content": "42"}}]}',
        b'{"choices": [{"message": {"content": "\\ud800"}}]}',  # msgspec refuses, json reads
        b'{"score": NaN, "choices": [{"message": {"content": "nan-bearing"}}]}',
        b'{"big": 1e400, "choices": [{"message": {"content": "inf-bearing"}}]}',
        json.dumps({"choices": [{"message": {"content": "utf-16"}}]}).encode("utf-16"),
        b'{"choices": [{"message": {"content": 5}}]}',
        b'{"choices": []}',
        b'{"choices": {"0": 1}}',
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe{",
        b"[" * 5000 + b"]" * 5000,
        b"garbage",
    ],
)
def test_the_answer_text_is_what_json_alone_reads(body: bytes) -> None:
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
        expected = content if isinstance(content, str) else None
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        expected = None
    assert json_response_text(body) == expected
