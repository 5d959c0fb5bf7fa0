"""``openai.responses``: the OpenAI Responses API, ``POST …/responses``
(docs/apis/openai-responses.md).

The answer is read from ``output[]``: the ``output_text`` parts of its ``message`` items
joined with nothing between them (what the SDK's ``Response.output_text`` shows); its
``function_call`` items (and ``custom_tool_call`` items, the calls of client-run custom
tools, their free-form ``input`` as the arguments ``{"input": …}``) are a tool-call
answer, which wins over text beside it; a ``refusal`` part with no
``output_text`` is a refusal answer; ``reasoning`` items, and the calls of tools the
provider runs, never count. Streamed, the ``response.completed`` event's response is read
the same way (or ``response.incomplete``'s, or ``response.failed``'s: no answer); without
one, the ``response.output_text.delta`` pieces joined, with the function calls of the
``response.output_item.done`` events.

A response that holds no answer:

- ``status: "completed"`` (or none) with nothing in ``output``: the answer ``""`` (the
  model said nothing, as a chat completion's ``content: null``);
- ``"incomplete"`` (``max_output_tokens`` spent, often on reasoning) with no text: no
  answer; with text, the text so far (a chat completion cut at ``length`` is one too);
- ``"failed"``, ``"cancelled"``, ``"queued"``, ``"in_progress"``: never an answer.

:meth:`OpenAIResponses.answer` is :meth:`OpenAIResponses.answers`'s one answer, or None
where that raises.

The re-ask keeps every field (``previous_response_id`` too: it reads stored state and,
with ``store: false``, writes none) but ``metadata``, ``user``, ``safety_identifier`` and
``service_tier`` (dropped: who production's caller is, and what tier it paid for, are not
ours to resend). ``prompt_cache_key`` is kept: it changes neither the answer nor whom the
call is attributed to, and sends the K re-asks to the cache production warmed.
``stream``, ``stream_options`` and ``background`` are relmon's own; ``store`` is always
sent ``false`` (its default is ``true``: K stored responses would be K writes into the
user's account). One answer a call: K calls.

Never re-asked: a request with a ``conversation`` (each re-ask would append its turns to
the user's conversation), and one with a tool the provider runs (:func:`server_tools`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from monitor.core.apis.base import AuthScheme, Route, is_text, joined_text, require
from monitor.core.canon.toolcall import refusal_answer, tool_calls_answer
from monitor.core.errors import InputError
from monitor.core.reask import FieldRules

__all__ = [
    "RESPONSES_RULES",
    "OpenAIResponses",
    "output_answer",
    "responses_answers",
    "responses_texts",
    "server_tools",
]

RESPONSES_RULES: Final = FieldRules(
    dropped=("metadata", "user", "safety_identifier", "service_tier"),
    own=("stream", "stream_options", "background"),
    forced=(("store", False),),
    temperature="temperature",
    model="model",
    built=None,
)
"""The re-ask rules of the Responses API (see the module)."""

# Tuples, not sets: a value read from the JSON may be a list or an object, which is no
# set member (``in`` would raise).
CLIENT_TOOLS: Final = ("function", "custom")
"""Tool types whose calls the client runs: the model only proposes them."""
_TEXT_PARTS: Final = ("input_text", "output_text", "text")
_TOOL_OUTPUTS: Final = ("function_call_output", "custom_tool_call_output")
_NEVER_ANSWERS: Final = ("failed", "cancelled", "queued", "in_progress")
_INPUT_REASON: Final = "'request' must have an 'input': a non-empty string or list of items"


def _message_texts(content: Any) -> list[str]:
    """A message item's text: its string content, or its text parts' ``text``."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        p["text"]
        for p in content
        if isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
    ]


def responses_texts(request: Mapping[str, Any]) -> list[str]:
    """Every text of the question, in order: ``instructions``, then each message item's
    text and each tool output's text (as a chat request's ``tool`` messages count)."""
    texts: list[str] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str):
        texts.append(instructions)
    items = request.get("input")
    if isinstance(items, str):
        texts.append(items)
        return texts
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        if "role" in item and item.get("type", "message") == "message":
            texts.extend(_message_texts(item.get("content")))
        elif item.get("type") in _TOOL_OUTPUTS:
            text = joined_text(item.get("output"))
            if text is not None:
                texts.append(text)
    return texts


def _check_input(request: Mapping[str, Any]) -> None:
    items = request.get("input")
    if isinstance(items, str):
        require(bool(items), _INPUT_REASON)
        return
    if not isinstance(items, list) or not items:
        raise InputError(_INPUT_REASON)
    for item in items:
        require(isinstance(item, dict), "each 'input' item must be an object")
        if "role" in item and item.get("type", "message") == "message":
            content = item.get("content")
            require(
                isinstance(content, str)
                or (isinstance(content, list) and all(isinstance(p, dict) for p in content)),
                "a message's 'content' must be text or a list of parts",
            )


def output_answer(output: Sequence[Any]) -> str | None:
    """The answer an ``output`` list holds (see the module); None when it holds none
    (:class:`ValueError`: a call's arguments hold NaN)."""
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[tuple[str, Any]] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message" and isinstance(item.get("content"), list):
            for part in item["content"]:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                    refusals.append(part["refusal"])
        elif kind == "function_call" and isinstance(item.get("name"), str):
            calls.append((_call_name(item), item.get("arguments", "")))
        elif kind == "custom_tool_call" and isinstance(item.get("name"), str):
            calls.append((_call_name(item), {"input": item.get("input")}))
    return _answer_of(texts, refusals, calls)


def _call_name(item: Mapping[str, Any]) -> str:
    """A call's name, ``namespace.name`` for a tool of a ``namespace`` tool (two
    namespaces may each hold a function of one name)."""
    namespace = item.get("namespace")
    name = str(item["name"])
    return f"{namespace}.{name}" if isinstance(namespace, str) and namespace else name


def _answer_of(texts: list[str], refusals: list[str], calls: list[tuple[str, Any]]) -> str | None:
    """Tool calls first, then text, then a refusal (:class:`ValueError`: a call's
    arguments hold NaN, which JSON cannot)."""
    if calls:
        return tool_calls_answer(calls)
    if texts:
        return "".join(texts)
    if refusals:
        return refusal_answer("".join(refusals))
    return None


def responses_answers(response: Mapping[str, Any]) -> list[str]:
    """The one answer of a response object, in a list (see the module); :class:`InputError`
    when it is not a response or holds no answer."""
    output = response.get("output")
    if not isinstance(output, list):
        raise InputError("body has no 'output' list")
    status = response.get("status")
    if status in _NEVER_ANSWERS:
        raise InputError(f"the response is {status}, not completed")
    try:
        answer = output_answer(output)
    except ValueError:
        raise InputError("a function call's arguments are not JSON") from None
    if answer is None:
        if status == "incomplete":
            raise InputError("the response is incomplete with no answer")
        require(status in (None, "completed"), "the response has no answer and is not completed")
        answer = ""
    return [answer]


def _client_tool(tool: Mapping[str, Any]) -> bool:
    """A tool whose calls the client runs: ``function``, ``custom``, a ``namespace`` of
    those, a ``tool_search`` the client executes."""
    kind = tool.get("type")
    if kind == "namespace":
        inner = tool.get("tools")
        return isinstance(inner, list) and all(
            isinstance(t, dict) and t.get("type") in CLIENT_TOOLS for t in inner
        )
    if kind == "tool_search":
        return tool.get("execution") == "client"
    return kind in CLIENT_TOOLS


def server_tools(request: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The tools of ``request`` the provider runs, each as the names a task may allow it
    by: its ``type`` (``web_search``), and an ``mcp`` tool's ``server_label`` too.

    Every type but ``function`` and ``custom`` (alone or grouped in a ``namespace``, and
    a ``tool_search`` with ``execution: "client"``) counts, unknown ones included:
    ``mcp``, ``code_interpreter``, ``web_search`` (``web_search_preview``),
    ``file_search``, ``image_generation``, ``tool_search``, ``programmatic_tool_calling``
    act or read on the provider's side. ``computer`` (``computer_use_preview``),
    ``local_shell``, ``shell`` and ``apply_patch`` are carried out by the client, but
    their calls are actions on a machine, not an answer relmon reads: they count too, to
    be safe, and a task allows them by name like the others."""
    tools = request.get("tools")
    found: list[tuple[str, ...]] = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict) or _client_tool(tool):
            continue
        names = [v for k in ("type", "server_label") if isinstance(v := tool.get(k), str)]
        found.append(tuple(names))
    return found


class OpenAIResponses:
    """The ``openai.responses`` API (see the module)."""

    name: Final = "openai.responses"
    auth: Final[AuthScheme] = "bearer"
    max_draws_per_call: Final = 1
    rules: Final[FieldRules] = RESPONSES_RULES

    def recognises(self, path: str) -> bool:
        return path.rstrip("/").endswith("/responses")

    def check_request(self, request: Mapping[str, Any]) -> None:
        _check_input(request)
        instructions = request.get("instructions")
        require(
            instructions is None or isinstance(instructions, str),
            "'instructions' must be text or null",
        )
        require(
            all(is_text(t) for t in responses_texts(request)),
            "the request's text is not valid Unicode",
        )

    def model(self, request: Mapping[str, Any], path: str | None) -> str | None:
        model = request.get("model")
        return model if isinstance(model, str) else None

    def query(self, request: Mapping[str, Any]) -> str:
        return "\n".join(responses_texts(request))

    def answer(self, response: Mapping[str, Any]) -> str | None:
        try:
            return responses_answers(response)[0]
        except InputError:
            return None

    def stream_answer(self, events: Sequence[Mapping[str, Any]]) -> str | None:
        for event in reversed(events):
            if event.get("type") in (
                "response.completed",
                "response.incomplete",
                "response.failed",
            ) and isinstance(event.get("response"), dict):
                return self.answer(event["response"])
        texts: list[str] = []
        refusals: list[str] = []
        calls: list[dict[str, Any]] = []  # the output items of the calls, when done
        for event in events:
            kind = event.get("type")
            if kind == "response.output_text.delta" and isinstance(event.get("delta"), str):
                texts.append(event["delta"])
            elif kind == "response.refusal.delta" and isinstance(event.get("delta"), str):
                refusals.append(event["delta"])
            elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
                item = event["item"]
                if item.get("type") in ("function_call", "custom_tool_call"):
                    calls.append(item)
        try:
            done = output_answer(calls)
        except ValueError:
            return None
        return done if done is not None else _answer_of(texts, refusals, [])

    def not_reasked(self, request: Mapping[str, Any], allowed_tools: frozenset[str]) -> str | None:
        if request.get("conversation") is not None:
            return "conversation"
        for names in server_tools(request):
            if not allowed_tools.intersection(names):
                return "server_tool"
        return None

    def route(self, request: Mapping[str, Any], path: str | None, model: str | None) -> Route:
        return Route(self.name, "/responses")

    def answers(self, response: Mapping[str, Any]) -> list[str]:
        return responses_answers(response)

    def with_draws(self, body: Mapping[str, Any], n: int) -> dict[str, Any]:
        if n != 1:
            raise ValueError(f"{self.name} draws one answer a call, not {n}")
        out = {k: v for k, v in body.items() if k not in self.rules.own}
        out["stream"] = False
        out["store"] = False
        return out
