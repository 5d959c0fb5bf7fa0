"""Tool calls are answers: the ``tool_call`` canonicalizer, and how a choice that
calls tools (or refuses) travels as an answer string.

An agent's answer is often not text but the tools it calls. The model client turns a
choice into one answer string (:func:`choice_answer`): its text content; or, when the
message holds ``tool_calls``, a marked JSON list of them; or, when it has no content
but a ``refusal``, a marked refusal. The marks start with NUL, which no model text
holds, so a marked answer cannot be confused with text.

``tool_call`` maps a tool-call answer to the sorted list of its calls, each the function
name and its parsed arguments (keys sorted; call ids, whitespace and text content beside
the calls ignored); arguments that are not valid JSON make the answer :data:`INVALID`.
A refusal is a class of its own (``refusal``), and a text answer is canonicalized as
``text``. Under every other canonicalizer a tool-call or refusal answer is
:data:`INVALID` (:class:`PlainAnswersOnly`, which the service wraps them in).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from monitor.core.canon.base import INVALID, AsyncCanonicalizer, QueryContext, per_answer
from monitor.core.canon.text import TextCanonicalizer

__all__ = [
    "REFUSAL",
    "PlainAnswersOnly",
    "ToolCallCanonicalizer",
    "choice_answer",
    "is_marked",
    "refusal_answer",
    "tool_calls_answer",
]

_TOOL_CALLS: Final = "\x00tool_calls:"
_REFUSAL: Final = "\x00refusal:"
REFUSAL: Final = "refusal"
"""The class of every refusal under ``tool_call``."""


def is_marked(answer: str) -> bool:
    """Whether ``answer`` is a tool-call or refusal answer, not text."""
    return answer.startswith(("\x00tool_calls:", "\x00refusal:"))


def choice_answer(message: Mapping[str, Any]) -> str | None:
    """One chat-completion choice's ``message`` as an answer string; None when it has
    neither tool calls, nor a refusal, nor string or null content."""
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        return _TOOL_CALLS + json.dumps(calls, separators=(",", ":"), allow_nan=False)
    content = message.get("content")
    refusal = message.get("refusal")
    if content is None and isinstance(refusal, str) and refusal:
        return _REFUSAL + refusal
    if content is None:
        return ""
    return content if isinstance(content, str) else None


def tool_calls_answer(calls: Sequence[tuple[str, Any]]) -> str:
    """The one tool-call answer form for calls of any wire API: ``(name, arguments)``
    pairs, the arguments a JSON string (OpenAI) or an object (Anthropic ``input``,
    Gemini ``args``); call ids are not kept."""
    listed = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return _TOOL_CALLS + json.dumps(listed, separators=(",", ":"), allow_nan=False)


def refusal_answer(text: str) -> str:
    """A refusal as an answer string (a class of its own under ``tool_call``)."""
    return _REFUSAL + text


def _call(call: Any) -> dict[str, Any] | None:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        return None
    name = function.get("name")
    arguments = function.get("arguments", {})
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return None
    return {"name": name, "arguments": arguments}


def _calls(raw: str) -> str:
    try:
        calls = json.loads(raw)
    except (ValueError, RecursionError):
        return INVALID
    if not isinstance(calls, list) or not calls:
        return INVALID
    parsed = [_call(c) for c in calls]
    if any(p is None for p in parsed):
        return INVALID
    forms = sorted(json.dumps(p, sort_keys=True, separators=(",", ":")) for p in parsed)
    return "[" + ",".join(forms) + "]"


class ToolCallCanonicalizer:
    """The ``tool_call`` canonicalizer (see the module docstring)."""

    def __init__(self, *, articles: bool = True) -> None:
        self._text = TextCanonicalizer(articles=articles)

    @property
    def name(self) -> str:
        return "tool_call"

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        if answer.startswith(_TOOL_CALLS):
            return _calls(answer[len(_TOOL_CALLS) :])
        if answer.startswith(_REFUSAL):
            return REFUSAL
        return self._text.canonicalize(answer, context)


class PlainAnswersOnly:
    """Any canonicalizer but ``tool_call``, with tool-call and refusal answers mapped to
    :data:`INVALID` before it sees them."""

    def __init__(self, inner: AsyncCanonicalizer) -> None:
        self._inner = inner
        self.per_answer = per_answer(inner)  # a marked answer is INVALID on its own

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def redact_canonical_only(self) -> bool:
        return bool(getattr(self._inner, "redact_canonical_only", False))

    async def canonicalize_many(
        self, answers: Sequence[str], context: QueryContext | None = None
    ) -> list[str]:
        plain = [i for i, a in enumerate(answers) if not is_marked(a)]
        classes = [INVALID] * len(answers)
        if plain:
            inner = await self._inner.canonicalize_many([answers[i] for i in plain], context)
            for i, c in zip(plain, inner, strict=True):
                classes[i] = c
        return classes

    async def warm_up(self) -> None:
        """Prepare ``inner`` now if it can (an embedding model loads)."""
        warm = getattr(self._inner, "warm_up", None)
        if warm is not None:
            await warm()

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()
