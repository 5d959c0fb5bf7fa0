"""``anthropic.messages``: Anthropic's Messages API, ``POST …/v1/messages``
(docs/apis/anthropic-messages.md).

The answer is read from ``content[]``: its ``text`` blocks joined with nothing between
them (the text the client shows); its ``tool_use`` blocks are a tool-call answer (name
and ``input`` object), which wins over text beside it; ``thinking`` and
``redacted_thinking`` blocks, and the blocks of server tools, never count. A message
that stopped with ``stop_reason: "refusal"`` is a refusal answer, whatever it said before
(its text travels with it; with none, ``stop_details.explanation``, if any). Streamed,
the message is rebuilt from its events (``message_start``, ``content_block_start``, the
``text_delta`` and ``input_json_delta`` pieces of ``content_block_delta``,
``message_delta``'s ``stop_reason``) and read the same way.

A message with no text and no tool call is the answer ``""`` when the turn ended
(``end_turn``, ``stop_sequence``, ``tool_use``), and no answer otherwise (``max_tokens``
spent on thinking, ``pause_turn``, a stream cut before its end).
:meth:`AnthropicMessages.answer` is :meth:`AnthropicMessages.answers`'s one answer, or
None where that raises.

The re-ask keeps every field but ``metadata`` and ``service_tier`` (dropped);
``stream`` is relmon's own; a raised ``temperature`` never exceeds 1.0, the API's
maximum. One answer a call: K calls.

Never re-asked: a request with a tool Anthropic runs (:func:`server_tools`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from monitor.core.apis.base import AuthScheme, Route, is_text, joined_text, require
from monitor.core.canon.toolcall import refusal_answer, tool_calls_answer
from monitor.core.errors import InputError
from monitor.core.reask import FieldRules

__all__ = [
    "MESSAGES_RULES",
    "AnthropicMessages",
    "message_answer",
    "messages_answers",
    "messages_texts",
    "server_tools",
    "streamed_message",
]

MESSAGES_RULES: Final = FieldRules(
    dropped=("metadata", "service_tier"),
    own=("stream",),
    forced=(),
    temperature="temperature",
    max_temperature=1.0,
    model="model",
    built=None,
)
"""The re-ask rules of the Messages API (see the module)."""

CLIENT_TOOL_TYPES: Final = ("custom", "text_editor_", "bash_", "memory_")
"""Tool types (or type prefixes) the client runs: the model only proposes their calls.
A tool with no ``type`` is a client tool too (and an entry that is not an object is
no tool: the API refuses the request)."""
_ENDED: Final = ("end_turn", "stop_sequence", "tool_use")
"""Stop reasons of a finished turn: with nothing in it, the answer is ``""``."""
_MESSAGES_REASON: Final = "'request' must have a non-empty 'messages' list of role + content"


def _block_texts(blocks: Any) -> list[str]:
    """The text of a content list: ``text`` blocks, and the text of ``tool_result``
    blocks (as a chat request's ``tool`` messages count)."""
    if isinstance(blocks, str):
        return [blocks]
    texts: list[str] = []
    for block in blocks if isinstance(blocks, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_result":
            text = joined_text(block.get("content"))  # text, or its text blocks
            if text is not None:
                texts.append(text)
    return texts


def messages_texts(request: Mapping[str, Any]) -> list[str]:
    """Every text of the question, in order: ``system``, then each message's."""
    texts = _block_texts(request.get("system"))
    messages = request.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            texts.extend(_block_texts(message.get("content")))
    return texts


def _check_messages(request: Mapping[str, Any]) -> None:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError(_MESSAGES_REASON)
    for m in messages:
        require(isinstance(m, dict) and isinstance(m.get("role"), str), _MESSAGES_REASON)
        content = m.get("content")
        require(
            isinstance(content, str)
            or (isinstance(content, list) and all(isinstance(b, dict) for b in content)),
            "a message's 'content' must be text or a list of blocks",
        )
    system = request.get("system", "")
    require(
        isinstance(system, str)
        or (
            isinstance(system, list)
            and all(isinstance(b, dict) and isinstance(b.get("text"), str) for b in system)
        ),
        "'system' must be text or a list of text blocks",
    )


def _explanation(details: Any) -> str:
    """A refusal's ``stop_details.explanation`` (Anthropic's words), or ``""``."""
    explanation = details.get("explanation") if isinstance(details, dict) else None
    return explanation if isinstance(explanation, str) else ""


def message_answer(message: Mapping[str, Any]) -> str | None:
    """The answer a message holds (see the module); None when it holds none
    (:class:`ValueError`: a call's ``input`` holds NaN, which JSON cannot)."""
    content = message.get("content")
    if not isinstance(content, list):
        return None
    texts: list[str] = []
    calls: list[tuple[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use" and isinstance(block.get("name"), str):
            calls.append((block["name"], block.get("input", {})))
    stop_reason = message.get("stop_reason")
    if stop_reason == "refusal":
        return refusal_answer("".join(texts) or _explanation(message.get("stop_details")))
    if calls:
        return tool_calls_answer(calls)
    if texts:
        return "".join(texts)
    return "" if stop_reason in _ENDED else None


def messages_answers(response: Mapping[str, Any]) -> list[str]:
    """The one answer of a message, in a list (see the module); :class:`InputError` when
    it is not a message or holds no answer."""
    require(response.get("type") == "message", "body is not a message ('type' is not 'message')")
    require(isinstance(response.get("content"), list), "body has no 'content' list")
    try:
        answer = message_answer(response)
    except ValueError:
        raise InputError("a tool call's input is not JSON") from None
    if answer is None:
        raise InputError("the message has no answer (its turn did not end)")
    return [answer]


def _parsed_input(block: dict[str, Any], pieces: list[str]) -> None:
    """A streamed ``tool_use`` block's ``input``: its JSON pieces joined and parsed; kept
    as the string when it is not JSON (the canonicalizer then finds it invalid)."""
    raw = "".join(pieces)
    if not raw.strip():
        return
    try:
        block["input"] = json.loads(raw)
    except (ValueError, RecursionError):
        block["input"] = raw


def streamed_message(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The message a stream's events build (see the module); None when they hold none."""
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    pieces: dict[int, list[str]] = {}
    for event in events:
        kind = event.get("type")
        index = event.get("index")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = dict(event["message"])
        elif kind == "content_block_start" and isinstance(index, int):
            block = event.get("content_block")
            if isinstance(block, dict):
                blocks[index] = dict(block)
        elif kind == "content_block_delta" and isinstance(index, int) and index in blocks:
            delta = event.get("delta")
            if not isinstance(delta, dict):
                continue
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                blocks[index]["text"] = str(blocks[index].get("text", "")) + delta["text"]
            elif delta.get("type") == "input_json_delta" and isinstance(
                delta.get("partial_json"), str
            ):
                pieces.setdefault(index, []).append(delta["partial_json"])
        elif kind == "message_delta" and isinstance(event.get("delta"), dict):
            message = {} if message is None else message
            for key in ("stop_reason", "stop_details"):
                if key in event["delta"]:
                    message[key] = event["delta"][key]
    if message is None and not blocks:
        return None
    for index, parts in pieces.items():
        _parsed_input(blocks[index], parts)
    out = dict(message or {})
    out["content"] = [blocks[i] for i in sorted(blocks)]
    return out


def server_tools(request: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The tools of ``request`` Anthropic runs, each as the names a task may allow it
    by: a tool's ``name`` and ``type`` (and an ``mcp_toolset``'s ``mcp_server_name``),
    an ``mcp_servers`` entry's ``name``.

    A tool with no ``type`` (or ``null``), or of type ``custom``, is the client's; so are
    the Anthropic-defined tools the client carries out (``text_editor_*``, ``bash_*``,
    ``memory_*``). Every other type counts, unknown ones included: ``web_search_*``,
    ``web_fetch_*``, ``code_execution_*`` run on Anthropic's side, and ``computer_*``,
    though the client carries out its actions, acts on a machine: it counts too."""
    found: list[tuple[str, ...]] = []
    tools = request.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind is None or (isinstance(kind, str) and kind.startswith(CLIENT_TOOL_TYPES)):
            continue
        keys = ("name", "type", "mcp_server_name")
        found.append(tuple(v for k in keys if isinstance(v := tool.get(k), str)))
    servers = request.get("mcp_servers")
    for server in servers if isinstance(servers, list) else ():
        name = server.get("name") if isinstance(server, dict) else None
        found.append((name,) if isinstance(name, str) else ())
    return found


class AnthropicMessages:
    """The ``anthropic.messages`` API (see the module)."""

    name: Final = "anthropic.messages"
    auth: Final[AuthScheme] = "x-api-key"
    max_draws_per_call: Final = 1
    rules: Final[FieldRules] = MESSAGES_RULES

    def recognises(self, path: str) -> bool:
        # Not any ``…/messages``: OpenAI's Assistants API posts to
        # ``/v1/threads/{id}/messages``; ``/v1/messages/count_tokens`` and
        # ``/v1/messages/batches`` end otherwise.
        return path.rstrip("/").endswith("/v1/messages")

    def check_request(self, request: Mapping[str, Any]) -> None:
        _check_messages(request)
        require(
            all(is_text(t) for t in messages_texts(request)),
            "the request's text is not valid Unicode",
        )

    def model(self, request: Mapping[str, Any], path: str | None) -> str | None:
        model = request.get("model")
        return model if isinstance(model, str) else None

    def query(self, request: Mapping[str, Any]) -> str:
        return "\n".join(messages_texts(request))

    def answer(self, response: Mapping[str, Any]) -> str | None:
        try:
            return messages_answers(response)[0]
        except InputError:
            return None

    def stream_answer(self, events: Sequence[Mapping[str, Any]]) -> str | None:
        message = streamed_message(events)
        if message is None:
            return None
        try:
            return message_answer(message)
        except ValueError:
            return None

    def not_reasked(self, request: Mapping[str, Any], allowed_tools: frozenset[str]) -> str | None:
        for names in server_tools(request):
            if not allowed_tools.intersection(names):
                return "server_tool"
        return None

    def route(self, request: Mapping[str, Any], path: str | None, model: str | None) -> Route:
        return Route(self.name, "/v1/messages")

    def answers(self, response: Mapping[str, Any]) -> list[str]:
        return messages_answers(response)

    def with_draws(self, body: Mapping[str, Any], n: int) -> dict[str, Any]:
        if n != 1:
            raise ValueError(f"{self.name} draws one answer a call, not {n}")
        out = {k: v for k, v in body.items() if k not in self.rules.own}
        out["stream"] = False
        return out
