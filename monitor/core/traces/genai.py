"""Readers of the OpenTelemetry GenAI semantic conventions' shapes. No I/O.

- ``genai`` (semconv >= 1.37): the span's ``gen_ai.input.messages``,
  ``gen_ai.output.messages`` and ``gen_ai.system_instructions`` (JSON text or structured
  values), parts ``text``, ``tool_call``, ``tool_call_response``;
- ``genai_events``: the older per-message events (``gen_ai.system.message``,
  ``gen_ai.user.message``, ``gen_ai.assistant.message``, ``gen_ai.tool.message``,
  ``gen_ai.choice``; body ``content``, ``tool_calls``, ``message``), as span events or
  as log records joined to the span, and the semconv >= 1.37 event
  ``gen_ai.client.inference.operation.details`` whose attributes hold the ``genai``
  attributes.

Both take the request parameters from the span's ``gen_ai.request.*`` attributes and the
tool definitions from ``gen_ai.tool.definitions`` (opt-in: absent, they are unrecorded).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from monitor.core.traces.recorded import (
    FOREIGN,
    MEDIA,
    Message,
    Recorded,
    ToolCall,
    ToolDef,
    UnreadableSpanError,
    recorded_json,
    tool_def,
)

__all__ = [
    "DETAILS_EVENT",
    "MESSAGE_EVENTS",
    "REQUEST_PARAMS",
    "JoinedEvent",
    "read_genai",
    "read_genai_events",
    "read_operation_details",
    "request_params",
    "tool_definitions",
]

REQUEST_PARAMS: Final[dict[str, str]] = {
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.request.top_k": "top_k",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.stop_sequences": "stop",
    "gen_ai.request.seed": "seed",
    "gen_ai.request.frequency_penalty": "frequency_penalty",
    "gen_ai.request.presence_penalty": "presence_penalty",
}
"""``gen_ai.request.*`` attributes, to their canonical parameter names."""
_RECORDABLE: Final = frozenset(REQUEST_PARAMS.values())
MESSAGE_EVENTS: Final[dict[str, str]] = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
    "gen_ai.choice": "choice",
}
DETAILS_EVENT: Final = "gen_ai.client.inference.operation.details"
_MEDIA_PARTS: Final = ("blob", "file", "uri")


@dataclass(frozen=True, slots=True)
class JoinedEvent:
    """A span event, or a log record joined to the span: its name, time, body (None for
    a span event) and attributes."""

    name: str
    time_ns: int
    body: object = None
    attributes: Mapping[str, object] = field(default_factory=dict)


def request_params(attrs: Mapping[str, object], names: Mapping[str, str]) -> dict[str, object]:
    """The parameters ``attrs`` record under ``names`` (attribute -> canonical name)."""
    out: dict[str, object] = {}
    for attribute, name in names.items():
        value = attrs.get(attribute)
        if value is not None:
            out[name] = value
    return out


def tool_definitions(value: object, what: str) -> tuple[ToolDef, ...] | None:
    """``gen_ai.tool.definitions`` (a list, or its JSON text); None when not recorded."""
    if value is None:
        return None
    listed = recorded_json(value, what)
    if not isinstance(listed, list):
        raise UnreadableSpanError(FOREIGN, what)
    return tuple(tool_def(t, what) for t in listed)


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UnreadableSpanError(FOREIGN, what)
    return value


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _message(obj: object, what: str, *, output: bool) -> list[Message]:
    """One semconv message; a message of several tool results is one turn per result."""
    if not isinstance(obj, dict) or not isinstance(obj.get("role"), str):
        raise UnreadableSpanError(FOREIGN, what)
    parts = obj.get("parts")
    if not isinstance(parts, list):
        raise UnreadableSpanError(FOREIGN, what)
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise UnreadableSpanError(FOREIGN, what)
        if kind == "text":
            texts.append(_text(part.get("content"), what))
        elif kind == "tool_call":
            arguments = part.get("arguments")
            calls.append(ToolCall(_text(part.get("name"), what), arguments, part.get("id")))
        elif kind == "tool_call_response":
            response = part.get("response", part.get("result"))
            results.append(Message("tool", (_as_text(response),), tool_call_id=part.get("id")))
        elif kind in _MEDIA_PARTS and not output:
            raise UnreadableSpanError(MEDIA, what)
        elif kind != "reasoning" and not output:
            raise UnreadableSpanError(FOREIGN, what)
    turn = Message(obj["role"], tuple(texts), tuple(calls))
    return results if results and turn.empty else [turn, *results]


def _messages(value: object, what: str, *, output: bool = False) -> tuple[Message, ...]:
    listed = recorded_json(value, what)
    if not isinstance(listed, list):
        raise UnreadableSpanError(FOREIGN, what)
    return tuple(m for obj in listed for m in _message(obj, what, output=output))


def _system(value: object) -> tuple[Message, ...]:
    what = "gen_ai.system_instructions"
    parts = recorded_json(value, what)
    if parts is None:
        return ()
    if not isinstance(parts, list):
        raise UnreadableSpanError(FOREIGN, what)
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text":
            raise UnreadableSpanError(FOREIGN, what)
        texts.append(_text(part.get("content"), what))
    return (Message("system", tuple(texts)),) if texts else ()


def _from_attributes(
    holder: Mapping[str, object], span: Mapping[str, object], shape: str
) -> Recorded | None:
    inputs = holder.get("gen_ai.input.messages")
    outputs = holder.get("gen_ai.output.messages")
    if inputs is None and outputs is None:
        return None
    messages = _system(holder.get("gen_ai.system_instructions"))
    if inputs is not None:
        messages += _messages(inputs, "gen_ai.input.messages")
    output = () if outputs is None else _messages(outputs, "gen_ai.output.messages", output=True)
    tools = holder.get("gen_ai.tool.definitions", span.get("gen_ai.tool.definitions"))
    return Recorded(
        shape=shape,
        messages=messages,
        output=output[:1],
        tools=tool_definitions(tools, "gen_ai.tool.definitions"),
        params=request_params(span, REQUEST_PARAMS),
        recordable=_RECORDABLE,
    )


def read_genai(attrs: Mapping[str, object], events: Sequence[JoinedEvent]) -> Recorded | None:
    """The ``genai`` shape: the span's own message attributes."""
    return _from_attributes(attrs, attrs, "genai")


def read_operation_details(
    attrs: Mapping[str, object], events: Sequence[JoinedEvent]
) -> Recorded | None:
    """The ``gen_ai.client.inference.operation.details`` event (the first one)."""
    for event in events:
        if event.name == DETAILS_EVENT:
            holder = dict(event.body) if isinstance(event.body, dict) else {}
            holder.update(event.attributes)
            return _from_attributes(holder, attrs, "genai_events")
    return None


def _payload(event: JoinedEvent) -> dict[str, Any]:
    """An event's fields: its body (a log record), else its attributes (a span event)."""
    return dict(event.body) if isinstance(event.body, dict) else dict(event.attributes)


def _event_turn(role: str, body: Mapping[str, Any], what: str) -> Message:
    content = body.get("content")
    if isinstance(content, list):  # content parts (multimodal)
        if any(not isinstance(p, dict) or p.get("type") not in ("text", None) for p in content):
            raise UnreadableSpanError(MEDIA, what)
        texts: tuple[str, ...] = tuple(_text(p.get("text"), what) for p in content)
    elif content is None:
        texts = ()
    else:
        texts = (_text(content, what),)
    calls = recorded_json(body.get("tool_calls") or [], what)
    if not isinstance(calls, list):
        raise UnreadableSpanError(FOREIGN, what)
    parsed = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise UnreadableSpanError(FOREIGN, what)
        parsed.append(ToolCall(function["name"], function.get("arguments"), call.get("id")))
    named = body.get("role")
    turn_id = body.get("id") if role == "tool" else None
    return Message(named if isinstance(named, str) else role, texts, tuple(parsed), turn_id)


def read_genai_events(
    attrs: Mapping[str, object], events: Sequence[JoinedEvent]
) -> Recorded | None:
    """The older per-message events, in time order (the first choice is the answer)."""
    mine = sorted((e for e in events if e.name in MESSAGE_EVENTS), key=lambda e: e.time_ns)
    if not mine:
        return None
    messages: list[Message] = []
    choices: list[tuple[int, Message]] = []
    for event in mine:
        body = _payload(event)
        if MESSAGE_EVENTS[event.name] != "choice":
            messages.append(_event_turn(MESSAGE_EVENTS[event.name], body, event.name))
            continue
        message = recorded_json(body.get("message") or {}, event.name)
        if not isinstance(message, dict):
            raise UnreadableSpanError(FOREIGN, event.name)
        index = body.get("index", 0)
        order = index if isinstance(index, int) else len(choices)
        choices.append((order, _event_turn("assistant", message, event.name)))
    choices.sort(key=lambda c: c[0])
    return Recorded(
        shape="genai_events",
        messages=tuple(messages),
        output=tuple(m for _, m in choices[:1]),
        tools=tool_definitions(attrs.get("gen_ai.tool.definitions"), "gen_ai.tool.definitions"),
        params=request_params(attrs, REQUEST_PARAMS),
        recordable=_RECORDABLE,
    )
