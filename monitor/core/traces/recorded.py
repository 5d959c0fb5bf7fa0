"""What a span recorded of a model call, in one form whatever its shape: the turns, the
tool definitions and the request parameters (canonical names), before they are rebuilt
into a wire API's request (:mod:`.wire`). No I/O.

A recorded value that is JSON text is parsed here (:func:`recorded_json`): text cut
mid-value (an SDK's attribute length limit) is :data:`TRUNCATED`, anything else that does
not parse, or parses to another schema, is :data:`FOREIGN`; neither is ever guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from monitor.core.errors import InputError

__all__ = [
    "FOREIGN",
    "MEDIA",
    "PARAMS",
    "TRUNCATED",
    "Message",
    "Recorded",
    "ToolCall",
    "ToolDef",
    "UnreadableSpanError",
    "canonical_params",
    "recorded_json",
    "tool_def",
]

TRUNCATED: Final = "truncated"
FOREIGN: Final = "foreign"
MEDIA: Final = "media"
"""A message holds an image, audio or file the span does not carry: a re-ask without it
would ask another question."""

PARAMS: Final[dict[str, str]] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "topP": "top_p",
    "top_k": "top_k",
    "topK": "top_k",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "max_output_tokens": "max_tokens",
    "maxOutputTokens": "max_tokens",
    "stop": "stop",
    "stop_sequences": "stop",
    "stopSequences": "stop",
    "seed": "seed",
    "frequency_penalty": "frequency_penalty",
    "frequencyPenalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "presencePenalty": "presence_penalty",
    "response_format": "response_format",
    "tool_choice": "tool_choice",
    "reasoning_effort": "reasoning_effort",
}
"""Request parameters by the names the APIs and instrumentations give them, to the one
canonical name :mod:`.wire` writes back in each API's own field name."""


class UnreadableSpanError(InputError):
    """A span whose recorded call cannot be read as it was made; ``reason`` is
    :data:`TRUNCATED`, :data:`FOREIGN` or :data:`MEDIA`."""

    def __init__(self, reason: str, what: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model asked for: ``arguments`` as recorded (JSON text or an object)."""

    name: str
    arguments: object
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One turn. ``role``: ``system`` (or ``developer``), ``user``, ``assistant``,
    ``tool`` (a tool's answer to the call ``tool_call_id``)."""

    role: str
    texts: tuple[str, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    @property
    def empty(self) -> bool:
        """Whether the turn holds nothing (content capture off)."""
        return not self.texts and not self.tool_calls


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A function tool the request offered."""

    name: str
    description: str | None = None
    parameters: object = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """A span's call as recorded (see the module). ``tools`` is None when the shape
    did not record the tool definitions; ``recordable`` names the canonical parameters
    the shape records whenever the request sent them (absent: not sent); ``native``
    holds parameters recorded under API names :data:`PARAMS` does not know."""

    shape: str
    messages: tuple[Message, ...]
    output: tuple[Message, ...] = ()
    tools: tuple[ToolDef, ...] | None = None
    params: dict[str, object] = field(default_factory=dict)
    native: dict[str, object] = field(default_factory=dict)
    recordable: frozenset[str] = frozenset()

    @property
    def has_messages(self) -> bool:
        """Whether any turn holds content."""
        return any(not m.empty for m in (*self.messages, *self.output))


def recorded_json(value: object, what: str) -> object:
    """A recorded value: JSON text parsed, a structured value as it is
    (:class:`UnreadableSpanError` for text that does not parse: see the module)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        text = value.rstrip()
        cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 6
        opened = text[:1] in ("[", "{")
        raise UnreadableSpanError(TRUNCATED if opened and cut else FOREIGN, what) from None
    except (ValueError, RecursionError):
        raise UnreadableSpanError(FOREIGN, what) from None


def canonical_params(values: Mapping[str, Any]) -> tuple[dict[str, object], dict[str, object]]:
    """``(canonical, native)``: the parameters :data:`PARAMS` knows under their canonical
    names, and the others as they were named."""
    canonical: dict[str, object] = {}
    native: dict[str, object] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in PARAMS:
            canonical[PARAMS[name]] = list(value) if isinstance(value, tuple) else value
        else:
            native[name] = value
    return canonical, native


def tool_def(value: object, what: str) -> ToolDef:
    """A tool definition in any of the forms instrumentations record: OpenAI chat's
    ``{"type": "function", "function": {…}}``, the flat ``{name, description,
    parameters}`` (Responses, semconv), Anthropic's ``input_schema``, Gemini's
    ``parametersJsonSchema``."""
    obj = recorded_json(value, what)
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise UnreadableSpanError(FOREIGN, what)
    description = obj.get("description")
    schema = next(
        (obj[k] for k in ("parameters", "input_schema", "parametersJsonSchema") if k in obj), None
    )
    if isinstance(schema, str):
        schema = recorded_json(schema, what)
    return ToolDef(
        name=obj["name"],
        description=description if isinstance(description, str) else None,
        parameters=schema,
    )
