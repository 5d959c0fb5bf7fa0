"""Readers of the shapes that flatten messages into indexed span attributes. No I/O.

- ``openinference`` (Arize OpenInference): ``llm.input_messages.{i}.message.{role,
  content, contents.{j}.message_content.{type,text}, tool_calls.{j}.tool_call.{id,
  function.name, function.arguments}, tool_call_id}``, ``llm.output_messages…``, the
  request's own parameters as ``llm.invocation_parameters`` (JSON, every parameter the
  call sent) and its tools as ``llm.tools.{i}.tool.json_schema``;
- ``openllmetry`` (Traceloop OpenLLMetry): ``gen_ai.prompt.{i}.{role, content,
  tool_call_id, tool_calls.{j}.{id,name,arguments}}``, ``gen_ai.completion.{i}…``,
  ``llm.request.functions.{i}.{name, description, parameters}``, the parameters as
  ``gen_ai.request.*`` and ``llm.*_penalty`` attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from monitor.core.traces.genai import JoinedEvent, request_params
from monitor.core.traces.recorded import (
    FOREIGN,
    MEDIA,
    PARAMS,
    Message,
    Recorded,
    ToolCall,
    ToolDef,
    UnreadableSpanError,
    canonical_params,
    recorded_json,
    tool_def,
)

__all__ = ["indexed", "read_openinference", "read_openllmetry"]

_LLM_PARAMS: Final[dict[str, str]] = {
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.request.max_tokens": "max_tokens",
    "llm.top_k": "top_k",
    "llm.frequency_penalty": "frequency_penalty",
    "llm.presence_penalty": "presence_penalty",
}
_SET_BY_BUILDER: Final = frozenset(
    {"messages", "model", "system", "instructions", "input", "contents", "tools", "prompt"}
)
"""Invocation parameters the request is rebuilt from otherwise, never copied."""


def indexed(attrs: Mapping[str, object], prefix: str) -> list[dict[str, object]]:
    """The entries ``{prefix}{i}.{rest}``: one dict of ``rest -> value`` per index ``i``,
    in index order."""
    found: dict[int, dict[str, object]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".")
        if index.isdigit() and rest:
            found.setdefault(int(index), {})[rest] = value
    return [found[i] for i in sorted(found)]


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise UnreadableSpanError(FOREIGN, what)
    return value


def _oi_message(entry: Mapping[str, object], what: str) -> Message:
    role = entry.get("message.role")
    if not isinstance(role, str):
        raise UnreadableSpanError(FOREIGN, what)
    texts: list[str] = []
    if entry.get("message.content") is not None:
        texts.append(_text(entry["message.content"], what))
    for part in indexed(entry, "message.contents."):
        kind = part.get("message_content.type", "text")
        if kind != "text":
            raise UnreadableSpanError(MEDIA, what)
        texts.append(_text(part.get("message_content.text"), what))
    calls = tuple(
        ToolCall(
            _text(call.get("tool_call.function.name"), what),
            call.get("tool_call.function.arguments"),
            _id(call.get("tool_call.id")),
        )
        for call in indexed(entry, "message.tool_calls.")
    )
    return Message(role, tuple(texts), calls, _id(entry.get("message.tool_call_id")))


def _id(value: object) -> str | None:
    return value if isinstance(value, str) else None


def read_openinference(
    attrs: Mapping[str, object], events: Sequence[JoinedEvent]
) -> Recorded | None:
    """The ``openinference`` shape (see the module)."""
    inputs = indexed(attrs, "llm.input_messages.")
    outputs = indexed(attrs, "llm.output_messages.")
    if not inputs and not outputs:
        return None
    what = "llm.invocation_parameters"
    raw = attrs.get(what)
    invocation = {} if raw is None else recorded_json(raw, what)
    if not isinstance(invocation, dict):
        raise UnreadableSpanError(FOREIGN, what)
    params, native = canonical_params(
        {k: v for k, v in invocation.items() if k not in _SET_BY_BUILDER}
    )
    schemas = indexed(attrs, "llm.tools.")
    tools = tuple(tool_def(t.get("tool.json_schema"), "llm.tools") for t in schemas)
    if not tools and isinstance(invocation.get("tools"), list):
        tools = tuple(tool_def(t, what) for t in invocation["tools"])
    return Recorded(
        shape="openinference",
        messages=tuple(_oi_message(m, "llm.input_messages") for m in inputs),
        output=tuple(_oi_message(m, "llm.output_messages") for m in outputs[:1]),
        tools=tools,  # recorded whenever the call sent tools
        params=params,
        native=native,
        recordable=frozenset(PARAMS.values()) if raw is not None else frozenset(),
    )


def _content(value: object, what: str) -> tuple[str, ...]:
    """OpenLLMetry's content: text, or the JSON text of a list of content parts."""
    if value is None:
        return ()
    text = _text(value, what)
    if text.startswith("[{"):
        try:
            parts = recorded_json(text, what)
        except UnreadableSpanError:
            return (text,)
        if isinstance(parts, list) and all(isinstance(p, dict) and "type" in p for p in parts):
            if any(p.get("type") != "text" for p in parts):
                raise UnreadableSpanError(MEDIA, what)
            return tuple(_text(p.get("text"), what) for p in parts)
    return (text,)


def _ll_message(entry: Mapping[str, object], what: str, default_role: str) -> Message:
    role = entry.get("role", default_role)
    if not isinstance(role, str):
        raise UnreadableSpanError(FOREIGN, what)
    calls = [
        ToolCall(_text(c.get("name"), what), c.get("arguments"), _id(c.get("id")))
        for c in indexed(entry, "tool_calls.")
    ]
    if isinstance(entry.get("function_call.name"), str):  # the older functions API
        name, arguments = str(entry["function_call.name"]), entry.get("function_call.arguments")
        calls.append(ToolCall(name, arguments))
    texts = _content(entry.get("content", entry.get("user")), what)  # .user: a completion
    return Message(role, texts, tuple(calls), _id(entry.get("tool_call_id")))


def _functions(attrs: Mapping[str, object]) -> tuple[ToolDef, ...]:
    what = "llm.request.functions"
    out = []
    for entry in indexed(attrs, "llm.request.functions."):
        parameters = entry.get("parameters")
        out.append(
            tool_def(
                {
                    "name": entry.get("name"),
                    "description": entry.get("description"),
                    "parameters": None if parameters is None else recorded_json(parameters, what),
                },
                what,
            )
        )
    return tuple(out)


def read_openllmetry(attrs: Mapping[str, object], events: Sequence[JoinedEvent]) -> Recorded | None:
    """The ``openllmetry`` shape (see the module)."""
    prompts = indexed(attrs, "gen_ai.prompt.")
    completions = indexed(attrs, "gen_ai.completion.")
    if not prompts and not completions:
        return None
    return Recorded(
        shape="openllmetry",
        messages=tuple(_ll_message(m, "gen_ai.prompt", "user") for m in prompts),
        output=tuple(_ll_message(m, "gen_ai.completion", "assistant") for m in completions[:1]),
        tools=_functions(attrs),  # recorded whenever the call sent tools
        params=request_params(attrs, _LLM_PARAMS),
        recordable=frozenset(_LLM_PARAMS.values()),
    )
