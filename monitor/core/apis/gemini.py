"""``gemini.generate_content``: Gemini ``POST …/models/{model}:generateContent`` and
``:streamGenerateContent`` (docs/apis/gemini.md).

The model is in the path (``/v1beta/models/gemini-2.0-flash:generateContent``; tuned
models under ``tunedModels/``, Vertex AI's ``…/publishers/google/models/…`` alike). The
answer is ``candidates[0].content.parts[]``: the text parts joined with nothing, as the
SDK's ``GenerateContentResponse.text`` joins them (``thought: true`` parts never count);
``functionCall`` parts are a tool-call answer. A candidate without text or calls that
finished (``STOP``, ``MAX_TOKENS``: the thinking used the whole budget) is the empty
answer; one a safety filter stopped (:data:`BLOCKED_REASONS`) is a refusal. Streamed,
each event is a response chunk: the first candidate's parts are gathered across chunks.

The re-ask goes to the task's ``endpoint.base_url`` + the API's own path: the
production path's version (and Vertex AI's project and location; ``/v1beta/`` when
there is none), the model (the task's, else the production path's, each one plain
path segment) and ``:generateContent`` (never the streaming method), with
``generationConfig.candidateCount`` draws; ``generationConfig.seed`` is dropped and
``generationConfig.temperature`` raised. The REST API also reads snake case
(``generation_config``): relmon's rules name the camel-case fields, so a request that
puts a field those rules change (temperature, seed, candidate count) under
``generation_config`` is refused (:meth:`GeminiGenerateContent.check_request`); any
other snake-case field is resent as sent. Tools other than function declarations run at
the provider (Google Search, code execution, URL context, …): such a request is not
re-asked unless the task allows each of them (``reask.server_tools``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from monitor.core.apis.base import AuthScheme, Route, is_text, require
from monitor.core.canon.toolcall import refusal_answer, tool_calls_answer
from monitor.core.errors import ConfigError, InputError
from monitor.core.reask import FieldRules

__all__ = [
    "BLOCKED_REASONS",
    "FINISHED_REASONS",
    "GeminiGenerateContent",
    "gemini_query",
    "server_tools",
]

_PATH: Final = re.compile(
    r"(?P<prefix>(?:.*/)?)(?P<collection>models|tunedModels)/(?P<model>[^/:]+)"
    r":(?:generateContent|streamGenerateContent)"
)
"""A production path: what comes before the model collection is the version (and
Vertex AI's project and location), under whatever prefix the deployment has."""
_OWN_PREFIX: Final = re.compile(
    r"(?:.*/)?(?P<own>(?P<version>v[0-9]+[a-z0-9]*)/"
    r"(?:projects/[A-Za-z0-9][A-Za-z0-9_-]*/locations/[A-Za-z0-9][A-Za-z0-9_-]*/"
    r"publishers/google/)?)"
)
"""The API's own part of a production path's prefix, the one a re-ask keeps: the
version segment (``v1beta``, ``v1``), and Vertex AI's ``projects/P/locations/L/
publishers/google/`` after it, each a plain name; anything before the version (a
gateway's own prefix, or a client's ``..``) is never kept."""
_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")
"""A model name that is one path segment (no ``/``, ``:``, ``?`` or ``..``)."""
_DEFAULT_PREFIX: Final = "/v1beta/"
_METHOD: Final = ":generateContent"

_GENERATION_CONFIG: Final = ("generationConfig", "generation_config")
_COUNT: Final = ("candidateCount", "candidate_count")
_RULED_SNAKE: Final = frozenset({"temperature", "seed", *_COUNT})
"""Fields the re-ask rules change: under snake-case ``generation_config`` they would
escape them (see the module)."""
_FUNCTIONS: Final = frozenset({"functionDeclarations", "function_declarations"})
"""The one kind of tool the client runs; every other key of a tool runs at Google."""

BLOCKED_REASONS: Final = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "MODEL_ARMOR",
        "ESCALATION",
    }
)
"""``finishReason`` s of a candidate a filter stopped: without content, a refusal."""
FINISHED_REASONS: Final = frozenset({"STOP", "MAX_TOKENS"})
"""``finishReason`` s of a candidate that ended normally: without text, the empty answer."""

_CONTENTS_REASON: Final = (
    "'contents' must be a non-empty list of {role, parts} objects (the REST form; "
    "the SDK sends a bare string as this list)"
)
_PARTS_REASON: Final = "a content's 'parts' must be a list of objects whose 'text' is text"


def _parts_ok(content: Any) -> bool:
    """A Content: an object with an optional string ``role`` and a list of part objects
    whose ``text``, where present, is valid Unicode."""
    if not isinstance(content, dict):
        return False
    role = content.get("role")
    parts = content.get("parts")
    if role is not None and not isinstance(role, str):
        return False
    if not isinstance(parts, list):
        return False
    return all(isinstance(p, dict) and ("text" not in p or is_text(p["text"])) for p in parts)


def _system(request: Mapping[str, Any]) -> Any:
    """The system instruction, in either casing (None when absent)."""
    value = request.get("systemInstruction")
    return request.get("system_instruction") if value is None else value


def _check_generation_config(request: Mapping[str, Any]) -> None:
    config = request.get("generation_config")
    if config is None:
        return
    require(isinstance(config, dict), "'generation_config' must be an object")
    ruled = sorted(_RULED_SNAKE & set(config))
    require(
        not ruled,
        f"'generation_config' (snake case) holds {', '.join(ruled)}: send "
        "'generationConfig', whose fields a re-ask drops, raises and sets",
    )


def _text_parts(content: Any) -> list[str]:
    """The ``text`` strings of a Content's parts, in order."""
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return []
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]


def gemini_query(request: Mapping[str, Any]) -> str:
    """The system instruction's text, then every content's text parts, newline-joined."""
    texts = _text_parts(_system(request))
    contents = request.get("contents")
    if isinstance(contents, list):
        for content in contents:
            texts.extend(_text_parts(content))
    return "\n".join(texts)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def server_tools(request: Mapping[str, Any]) -> list[str]:
    """The provider-run tools a request carries, by their camel-case names: every key of
    a ``tools`` entry but function declarations (``googleSearch``, ``codeExecution``,
    ``urlContext``, and any kind added later, which may act)."""
    tools = request.get("tools")
    if not isinstance(tools, list):
        return []
    names: list[str] = []
    for tool in tools:
        if isinstance(tool, dict):
            names.extend(_camel(k) for k in tool if k not in _FUNCTIONS)
    return names


def _model_ref(model: str) -> tuple[str, str]:
    """``(collection, name)`` of a model as a task or a body names it: ``gemini-2.0-flash``
    and ``models/gemini-2.0-flash`` are under ``models``, ``tunedModels/x`` under its own."""
    collection, _, name = model.rpartition("/")
    if collection not in ("", "models", "tunedModels"):
        raise InputError("a Gemini model must be a name, 'models/NAME' or 'tunedModels/NAME'")
    if not _MODEL_NAME.fullmatch(name):
        raise InputError("a Gemini model name must be one path segment")
    return collection or "models", name


def _candidate_answer(texts: list[str], calls: list[tuple[str, Any]], reason: Any) -> str | None:
    """One candidate's answer from its parts (see the module)."""
    if calls:
        return tool_calls_answer(calls)
    if texts:
        return "".join(texts)
    if reason in BLOCKED_REASONS:
        return refusal_answer(reason)
    if reason in FINISHED_REASONS:
        return ""
    return None


def _gather(candidate: Mapping[str, Any], texts: list[str], calls: list[tuple[str, Any]]) -> None:
    """A candidate's non-thought text parts and function calls, appended."""
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return
    for part in parts:
        if not isinstance(part, dict):
            continue
        call = part.get("functionCall")
        if isinstance(call, dict):
            name = call.get("name")
            args = call.get("args")
            calls.append((name if isinstance(name, str) else "", {} if args is None else args))
        elif isinstance(part.get("text"), str) and part.get("thought") is not True:
            texts.append(part["text"])


def _answer_of(candidate: Any) -> str | None:
    if not isinstance(candidate, dict):
        return None
    texts: list[str] = []
    calls: list[tuple[str, Any]] = []
    _gather(candidate, texts, calls)
    try:
        return _candidate_answer(texts, calls, candidate.get("finishReason"))
    except ValueError:  # NaN in a call's args
        return None


def _first_candidate(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    candidates = event.get("candidates")
    if not isinstance(candidates, list):
        return None
    for candidate in candidates:
        if isinstance(candidate, dict) and candidate.get("index", 0) == 0:
            return candidate
    return None


class GeminiGenerateContent:
    """The ``gemini.generate_content`` API (see the module)."""

    name: Final = "gemini.generate_content"
    auth: Final[AuthScheme] = "x-goog-api-key"
    max_draws_per_call: Final = 8
    rules: Final[FieldRules] = FieldRules(
        dropped=("generationConfig.seed",),
        own=("generationConfig.candidateCount",),
        forced=(),
        temperature="generationConfig.temperature",
        model=None,
        built=None,
    )

    def recognises(self, path: str) -> bool:
        return _PATH.fullmatch(path.rstrip("/")) is not None

    def check_request(self, request: Mapping[str, Any]) -> None:
        contents = request.get("contents")
        if not isinstance(contents, list) or not contents:
            raise InputError(_CONTENTS_REASON)
        for content in contents:
            require(_parts_ok(content), f"{_CONTENTS_REASON}; {_PARTS_REASON}")
        system = _system(request)
        require(
            system is None or _parts_ok(system),
            f"'systemInstruction' must be a {{parts}} object; {_PARTS_REASON}",
        )
        _check_generation_config(request)

    def model(self, request: Mapping[str, Any], path: str | None) -> str | None:
        match = _PATH.fullmatch(path.rstrip("/")) if path is not None else None
        if match is not None:
            return match["model"]
        model = request.get("model")
        if not isinstance(model, str):
            return None
        return model.removeprefix("models/")

    def query(self, request: Mapping[str, Any]) -> str:
        return gemini_query(request)

    def answer(self, response: Mapping[str, Any]) -> str | None:
        candidates = response.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            return None
        return _answer_of(candidates[0])

    def stream_answer(self, events: Sequence[Mapping[str, Any]]) -> str | None:
        texts: list[str] = []
        calls: list[tuple[str, Any]] = []
        reason: Any = None
        for event in events:
            candidate = _first_candidate(event)
            if candidate is None:
                continue
            _gather(candidate, texts, calls)
            reason = candidate.get("finishReason", reason)
        try:
            return _candidate_answer(texts, calls, reason)
        except ValueError:
            return None

    def not_reasked(self, request: Mapping[str, Any], allowed_tools: frozenset[str]) -> str | None:
        allowed = {_camel(t) for t in allowed_tools}
        if any(t not in allowed for t in server_tools(request)):
            return "server_tool"
        return None

    def route(self, request: Mapping[str, Any], path: str | None, model: str | None) -> Route:
        match = _PATH.fullmatch(path.rstrip("/")) if path is not None else None
        own = _OWN_PREFIX.fullmatch(match["prefix"]) if match is not None else None
        prefix = f"/{own['own']}" if own is not None else _DEFAULT_PREFIX
        if model is not None:
            collection, name = _model_ref(model)
        elif match is not None:
            collection, name = _model_ref(f"{match['collection']}/{match['model']}")
        elif isinstance(request.get("model"), str):
            collection, name = _model_ref(request["model"])
        else:
            raise InputError("a Gemini re-ask needs a model: the production path's, or the task's")
        return Route(self.name, f"{prefix}{collection}/{name}{_METHOD}")

    def answers(self, response: Mapping[str, Any]) -> list[str]:
        candidates = response.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            feedback = response.get("promptFeedback")
            blocked = feedback.get("blockReason") if isinstance(feedback, dict) else None
            if isinstance(blocked, str) and blocked.isidentifier():
                raise InputError(f"the prompt was blocked ({blocked}): no candidates")
            raise InputError("body has no non-empty 'candidates' list")
        texts: list[str] = []
        for candidate in candidates:
            text = _answer_of(candidate)
            if text is None:
                raise InputError("a candidate holds no text, function call or finish reason")
            texts.append(text)
        return texts

    def with_draws(self, body: Mapping[str, Any], n: int) -> dict[str, Any]:
        if not 1 <= n <= self.max_draws_per_call:
            raise ConfigError(f"gemini: {n} draws in one call; 1 to 8 (candidateCount)")
        out = dict(body)
        key = next((k for k in _GENERATION_CONFIG if isinstance(out.get(k), Mapping)), None)
        config = {k: v for k, v in out[key].items() if k not in _COUNT} if key else {}
        if n > 1:
            config["candidateCount"] = n
        if key is not None or config:
            out[key or "generationConfig"] = config
        return out
