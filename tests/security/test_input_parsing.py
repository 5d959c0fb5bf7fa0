"""The pure parsers every source shares (HTTP mirror/proxy, Kafka traffic and verdict
topics): hostile JSON is an InputError with a short reason, never another exception."""

from __future__ import annotations

import json

import pytest

from adapters.kafka.source import parse_event_bytes
from monitor.core.errors import InputError
from monitor.core.events import is_text, parse_event, query_text
from monitor.core.review import parse_verdict

GOOD = {"id": "e1", "model": "m", "request": {"messages": [{"role": "user", "content": "q"}]}}


def _event(**changes: object) -> bytes:
    return json.dumps(GOOD | changes).encode()


HOSTILE_EVENTS = [
    b'{"id": "e1", "model": "m", "n": ' + b"9" * 5000 + b', "request": {"messages": []}}',
    b'{"id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    _event(id="\ud800"),
    _event(model="bad \udfff"),
    _event(task="\ud800"),
    _event(request={"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    _event(request={"messages": [{"role": "user", "content": [{"text": None}]}]}),
    _event(request={"messages": [{"role": "user", "content": ["part"]}]}),
    _event(request={"messages": [{"role": "user", "content": {"text": "x"}}]}),
    _event(request={"messages": [{"role": "user", "content": "\ud800"}]}),
    _event(response={"choices": [{"message": {"content": "\udfff"}}]}),
]


@pytest.mark.parametrize("raw", HOSTILE_EVENTS)
def test_hostile_events_are_input_errors_on_every_path(raw: bytes) -> None:
    with pytest.raises(InputError):
        parse_event(raw)
    with pytest.raises(InputError):
        parse_event_bytes(raw)


def test_content_parts_with_text_still_parse() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]
    event = parse_event(_event(request={"messages": [{"role": "user", "content": parts}]}))
    assert query_text(event.request) == "a"
    assert parse_event(_event(request={"messages": [{"role": "assistant", "content": None}]}))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"item_id": "i", "accepted_ranks": [' + b"1" * 5000 + b"]}",
        b"[" * 50_000 + b"]" * 50_000,
        b'{"item_id": "\\ud800", "accepted_ranks": [1]}',
        b'{"item_id": "i", "none_of_these": true, "correct_answer": "\\udfff"}',
        b'{"item_id": "i", "none_of_these": true, "reviewer": "\\ud800"}',
        b"\xff\xfe",
    ],
)
def test_hostile_verdicts_are_input_errors(raw: bytes) -> None:
    with pytest.raises(InputError):
        parse_verdict(raw)


def test_is_text() -> None:
    assert is_text("ok ü") and not is_text("\ud800") and not is_text(b"x") and not is_text(None)


INVALID_UTF8_IN_A_STRING = (
    b'{"id":"k2","model":"m","request":{"messages":'
    b'[{"role":"user","content":"What is 2 plus \xff 3?"}]}}'
)


def test_invalid_utf8_inside_a_json_string_is_an_input_error() -> None:
    """The 0xff byte sits inside a JSON string: msgspec raises UnicodeDecodeError (not
    its DecodeError) there, which once killed the Kafka source."""
    for parse in (parse_event, parse_event_bytes):
        with pytest.raises(InputError, match="not UTF-8"):
            parse(INVALID_UTF8_IN_A_STRING)


def test_an_escaped_nul_in_a_json_string_is_valid_input() -> None:
    raw = b'{"id":"n\\u0000","model":"m","request":{"messages":[{"role":"user",'
    raw += b'"content":"a\\u0000b"}]},"response":{"choices":[{"message":{"content":"\\u0000"}}]}}'
    for parse in (parse_event, parse_event_bytes):
        event = parse(raw)
        assert event.id == "n\x00"
        assert query_text(event.request) == "a\x00b"
        assert event.response_text == "\x00"
