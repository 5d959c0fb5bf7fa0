"""``openai.chat``: OpenAI Chat Completions, ``POST …/chat/completions`` (docs/apis/openai-chat.md).

The answer is ``choices[0].message``: its ``content``, or its ``tool_calls`` (a tool-call
answer), or its ``refusal``; streamed, the ``choices[0].delta`` pieces joined. The re-ask
keeps every field but :data:`~monitor.core.reask.DROPPED_FIELDS`; ``n`` draws per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from monitor.core.apis.base import AuthScheme, Route, is_text, require
from monitor.core.canon.toolcall import choice_answer, tool_calls_answer
from monitor.core.errors import InputError
from monitor.core.reask import CHAT_RULES, FieldRules

__all__ = ["OpenAIChat", "chat_answers", "chat_query", "check_messages"]

_MESSAGES_REASON: Final = "'request' must be a chat request with a non-empty 'messages' list"


def _content_ok(content: Any) -> bool:
    """A message's content: text, null, or a list of parts whose ``text`` is text."""
    if content is None:
        return True
    if isinstance(content, str):
        return is_text(content)
    if not isinstance(content, list):
        return False
    for part in content:
        if not isinstance(part, dict):
            return False
        if "text" in part and not is_text(part["text"]):
            return False
    return True


def check_messages(request: Mapping[str, Any]) -> None:
    """A chat request's ``messages``: a non-empty list of role + content messages."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError(_MESSAGES_REASON)
    for m in messages:
        require(
            isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m,
            _MESSAGES_REASON,
        )
        require(
            _content_ok(m["content"]),
            "a message's 'content' must be text, null or a list of parts whose 'text' is text",
        )


def chat_query(request: Mapping[str, Any]) -> str:
    """The text of every message, in order (string content, or the text parts)."""
    parts = []
    messages = request.get("messages")
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # content parts
            parts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return "\n".join(parts)


def chat_answers(response: Mapping[str, Any]) -> list[str]:
    """The answers of a chat completion's choices, in order (see the module)."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise InputError("body has no non-empty 'choices' list")
    texts: list[str] = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or not (
            "content" in message or "tool_calls" in message or "refusal" in message
        ):
            raise InputError("a choice has no 'message.content'")
        try:
            text = choice_answer(message)
        except ValueError:  # NaN in a call's arguments
            raise InputError("a choice's tool calls are not JSON") from None
        if text is None:
            kind = type(message.get("content")).__name__
            raise InputError(f"a choice's content is a {kind}, not a string")
        texts.append(text)
    return texts


def _stream_tool_calls(calls: dict[int, list[str]], deltas: Any) -> None:
    """Stream deltas of ``tool_calls`` gathered by index: ``[name, arguments]``."""
    if not isinstance(deltas, list):
        return
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        index = delta.get("index", 0)
        function = delta.get("function")
        if not isinstance(index, int) or not isinstance(function, dict):
            continue
        call = calls.setdefault(index, ["", ""])
        if isinstance(function.get("name"), str):
            call[0] += function["name"]
        if isinstance(function.get("arguments"), str):
            call[1] += function["arguments"]


class OpenAIChat:
    """The ``openai.chat`` API (see the module)."""

    name: Final = "openai.chat"
    auth: Final[AuthScheme] = "bearer"
    max_draws_per_call: Final = 128
    rules: Final[FieldRules] = CHAT_RULES

    def recognises(self, path: str) -> bool:
        return path.rstrip("/").endswith("/chat/completions")

    def check_request(self, request: Mapping[str, Any]) -> None:
        check_messages(request)

    def model(self, request: Mapping[str, Any], path: str | None) -> str | None:
        model = request.get("model")
        return model if isinstance(model, str) else None

    def query(self, request: Mapping[str, Any]) -> str:
        return chat_query(request)

    def answer(self, response: Mapping[str, Any]) -> str | None:
        try:
            message = response["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            return None
        if not isinstance(message, dict):
            return None
        nothing = not (message.get("tool_calls") or message.get("refusal"))
        if message.get("content") is None and nothing:
            return None  # production got no answer relmon could compare
        try:
            return choice_answer(message)
        except ValueError:
            return None

    def stream_answer(self, events: Sequence[Mapping[str, Any]]) -> str | None:
        parts: list[str] = []
        calls: dict[int, list[str]] = {}
        refusal: list[str] = []
        for event in events:
            choices = event.get("choices")
            if not isinstance(choices, list):
                continue
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    continue
                if isinstance(delta.get("content"), str):
                    parts.append(delta["content"])
                if isinstance(delta.get("refusal"), str):
                    refusal.append(delta["refusal"])
                _stream_tool_calls(calls, delta.get("tool_calls"))
        if calls:
            return tool_calls_answer([(calls[i][0], calls[i][1]) for i in sorted(calls)])
        if not parts and refusal:
            return choice_answer({"content": None, "refusal": "".join(refusal)})
        return "".join(parts) if parts else None

    def not_reasked(self, request: Mapping[str, Any], allowed_tools: frozenset[str]) -> str | None:
        return None  # chat has no tools the provider runs

    def route(self, request: Mapping[str, Any], path: str | None, model: str | None) -> Route:
        return Route(self.name, "/chat/completions")

    def answers(self, response: Mapping[str, Any]) -> list[str]:
        return chat_answers(response)

    def with_draws(self, body: Mapping[str, Any], n: int) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k not in ("n", "stream", "stream_options")}
        out["stream"] = False
        if n > 1:
            out["n"] = n
        return out
