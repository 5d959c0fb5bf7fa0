"""A recorded call (:mod:`.recorded`) rebuilt as a request of a wire API
(:mod:`monitor.core.apis`), with the answer production served and the answer-shaping
fields the span could not hold. No I/O.

The request keeps what the span recorded and nothing more: its turns (system first), its
tool definitions when recorded, and its parameters in the API's own field names
(:data:`FIELDS`). An answer-shaping field the API has that the span's shape cannot
record (and did not) is *unrecorded*: ``tools`` when the definitions were not recorded,
``response_format`` in every shape but OpenInference's, … — except the fields a re-ask
drops anyway (``seed`` in Chat Completions). The served answer is the first choice's
text, or its tool calls as the one tool-call answer form
(:func:`~monitor.core.canon.toolcall.tool_calls_answer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from monitor.core.apis.registry import get_api
from monitor.core.canon.toolcall import tool_calls_answer
from monitor.core.traces.recorded import FOREIGN, Message, Recorded, ToolDef, UnreadableSpanError

__all__ = ["FIELDS", "Rebuilt", "rebuild"]

_SAME: Final = ("temperature", "top_p", "max_tokens", "stop", "seed", "frequency_penalty")
FIELDS: Final[dict[str, dict[str, str]]] = {
    "openai.chat": {
        **{n: n for n in _SAME},
        "presence_penalty": "presence_penalty",
        "response_format": "response_format",
        "tool_choice": "tool_choice",
        "reasoning_effort": "reasoning_effort",
    },
    "openai.responses": {
        "temperature": "temperature",
        "top_p": "top_p",
        "max_tokens": "max_output_tokens",
        "response_format": "text.format",
        "tool_choice": "tool_choice",
        "reasoning_effort": "reasoning.effort",
    },
    "anthropic.messages": {
        "temperature": "temperature",
        "top_p": "top_p",
        "top_k": "top_k",
        "max_tokens": "max_tokens",
        "stop": "stop_sequences",
        "tool_choice": "tool_choice",
    },
    "gemini.generate_content": {
        "temperature": "generationConfig.temperature",
        "top_p": "generationConfig.topP",
        "top_k": "generationConfig.topK",
        "max_tokens": "generationConfig.maxOutputTokens",
        "stop": "generationConfig.stopSequences",
        "seed": "generationConfig.seed",
        "frequency_penalty": "generationConfig.frequencyPenalty",
        "presence_penalty": "generationConfig.presencePenalty",
        "response_format": "generationConfig.responseSchema",
        "tool_choice": "toolConfig",
    },
    "openai.completions": {**{n: n for n in _SAME}, "presence_penalty": "presence_penalty"},
}
"""Each API's answer-shaping fields: canonical parameter name -> the API's field."""
_SYSTEM: Final = ("system", "developer")


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """A request body of the API, the served answer and the unrecorded fields."""

    request: dict[str, Any]
    served: str | None
    served_tool_call: bool
    unrecorded: tuple[str, ...]


def _put(body: dict[str, Any], name: str, value: object) -> None:
    """``body[name] = value``, ``name`` a dotted path (objects made on the way)."""
    *parents, last = name.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _arguments_text(arguments: object) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps({} if arguments is None else arguments, separators=(",", ":"))


def _arguments_object(arguments: object) -> object:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise UnreadableSpanError(FOREIGN, "tool call arguments") from None
    return {} if arguments is None else arguments


def _content(m: Message, part: str = "text") -> Any:
    if len(m.texts) == 1:
        return m.texts[0]
    return [{"type": part, "text": t} for t in m.texts]


def _chat(rec: Recorded) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for m in rec.messages:
        if m.role == "tool":
            messages.append(
                {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": _content(m)}
            )
            continue
        content = _content(m) if m.texts else (None if m.tool_calls else "")
        message: dict[str, Any] = {"role": _role(m.role), "content": content}
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id or f"call_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments_text(c.arguments)},
                }
                for i, c in enumerate(m.tool_calls)
            ]
        messages.append(message)
    body: dict[str, Any] = {"messages": messages}
    if rec.tools:
        body["tools"] = [
            {"type": "function", "function": _tool(t, "parameters")} for t in rec.tools
        ]
    return body


def _role(role: str) -> str:
    return "assistant" if role == "model" else role


def _tool(t: ToolDef, schema: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": t.name}
    if t.description is not None:
        out["description"] = t.description
    if t.parameters is not None:
        out[schema] = t.parameters
    return out


def _responses(rec: Recorded) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for m in rec.messages:
        if m.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.tool_call_id or "",
                    "output": "\n".join(m.texts),
                }
            )
            continue
        role = _role(m.role)
        if m.texts or not m.tool_calls:
            part = "output_text" if role == "assistant" else "input_text"
            items.append({"role": role, "content": _content(m, part) if m.texts else ""})
        items.extend(
            {
                "type": "function_call",
                "call_id": c.id or f"call_{i}",
                "name": c.name,
                "arguments": _arguments_text(c.arguments),
            }
            for i, c in enumerate(m.tool_calls)
        )
    body: dict[str, Any] = {"input": items}
    if rec.tools:
        body["tools"] = [{"type": "function", **_tool(t, "parameters")} for t in rec.tools]
    return body


def _anthropic(rec: Recorded) -> dict[str, Any]:
    system = [t for m in rec.messages if m.role in _SYSTEM for t in m.texts]
    messages: list[dict[str, Any]] = []
    for m in rec.messages:
        if m.role in _SYSTEM:
            continue
        if m.role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id or "",
                "content": "\n".join(m.texts),
            }
            messages.append({"role": "user", "content": [result]})
            continue
        blocks: list[dict[str, Any]] = [{"type": "text", "text": t} for t in m.texts]
        blocks += [
            {
                "type": "tool_use",
                "id": c.id or f"toolu_{i}",
                "name": c.name,
                "input": _arguments_object(c.arguments),
            }
            for i, c in enumerate(m.tool_calls)
        ]
        content: Any = m.texts[0] if len(blocks) == 1 and m.texts else blocks
        messages.append({"role": _role(m.role), "content": content})
    body: dict[str, Any] = {"messages": messages}
    if system:
        body["system"] = (
            system[0] if len(system) == 1 else [{"type": "text", "text": t} for t in system]
        )
    if rec.tools:
        body["tools"] = [
            {**_tool(t, "input_schema"), "input_schema": t.parameters or {"type": "object"}}
            for t in rec.tools
        ]
    return body


def _gemini(rec: Recorded) -> dict[str, Any]:
    system = [{"text": t} for m in rec.messages if m.role in _SYSTEM for t in m.texts]
    names: dict[str | None, str] = {}
    contents: list[dict[str, Any]] = []
    for m in rec.messages:
        if m.role in _SYSTEM:
            continue
        if m.role == "tool":
            name = names.get(m.tool_call_id) or names.get(None)
            if name is None:
                raise UnreadableSpanError(FOREIGN, "a tool result answers no recorded call")
            answer = _arguments_object("\n".join(m.texts)) if _is_json(m.texts) else None
            response = answer if isinstance(answer, dict) else {"result": "\n".join(m.texts)}
            contents.append(
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"name": name, "response": response}}],
                }
            )
            continue
        parts: list[dict[str, Any]] = [{"text": t} for t in m.texts]
        for c in m.tool_calls:
            names[c.id] = names[None] = c.name
            parts.append({"functionCall": {"name": c.name, "args": _arguments_object(c.arguments)}})
        contents.append(
            {"role": "model" if _role(m.role) == "assistant" else m.role, "parts": parts}
        )
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    if rec.tools:
        body["tools"] = [{"functionDeclarations": [_tool(t, "parameters") for t in rec.tools]}]
    return body


def _is_json(texts: tuple[str, ...]) -> bool:
    try:
        json.loads("\n".join(texts))
    except ValueError:
        return False
    return True


def _completions(rec: Recorded) -> dict[str, Any]:
    turns = [m for m in rec.messages if not m.empty]
    if len(turns) != 1 or turns[0].role != "user" or len(turns[0].texts) != 1:
        raise UnreadableSpanError(FOREIGN, "a completion span records one prompt")
    return {"prompt": turns[0].texts[0]}


_BUILDERS: Final[dict[str, Callable[[Recorded], dict[str, Any]]]] = {
    "openai.chat": _chat,
    "openai.responses": _responses,
    "anthropic.messages": _anthropic,
    "gemini.generate_content": _gemini,
    "openai.completions": _completions,
}


def _served(output: tuple[Message, ...]) -> tuple[str | None, bool]:
    if not output or output[0].empty:
        return None, False
    first = output[0]
    if first.tool_calls:
        return tool_calls_answer([(c.name, c.arguments) for c in first.tool_calls]), True
    return "".join(first.texts), False


def rebuild(rec: Recorded, api: str) -> Rebuilt:
    """``rec`` as a request of ``api`` (one of :data:`FIELDS`' keys), with its served
    answer and unrecorded fields (see the module); :class:`UnreadableSpanError` when the
    recorded turns cannot be a request of that API."""
    body = _BUILDERS[api](rec)
    fields = FIELDS[api]
    for name, value in rec.params.items():
        if name in fields:
            _put(body, fields[name], value)
    if api != "gemini.generate_content":
        for name, value in rec.native.items():
            body.setdefault(name, value)
    rules = get_api(api).rules
    skipped = {*rules.dropped, *rules.own}
    unrecorded = [
        field
        for name, field in fields.items()
        if name not in rec.params
        and name not in rec.recordable
        and field not in skipped
        and field.split(".")[0] not in rec.native
    ]
    if rec.tools is None and api != "openai.completions":
        unrecorded.insert(0, "tools")
    served, tool_call = _served(rec.output)
    return Rebuilt(body, served, tool_call, tuple(unrecorded))
