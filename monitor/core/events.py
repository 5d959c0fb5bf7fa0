"""The traffic event (docs/kafka.md, "Traffic events") and its validation, without I/O.

A traffic event is one logged or mirrored LLM call::

    {"id": "req-123", "ts": "2026-11-22T07:00:00Z", "model": "gpt-4.1", "task": "triage",
     "request": {"model": "gpt-4.1", "messages": [{"role": "user", "content": "..."}]},
     "response": {"choices": [{"message": {"content": "..."}}]}}

``task``, ``ts`` and ``response`` are optional. An event may name its wire API
(``"api"``, default ``openai.chat``: :mod:`monitor.core.apis`), with ``request`` and
``response`` in that API's own shape (the response as JSON, or as the text of its SSE
stream) and ``path`` where the API keeps the model there (Gemini).
:func:`parse_event` turns bytes into a :class:`TrafficEvent` or raises
:class:`~monitor.core.errors.InputError` with a short reason (no prompt text in it),
which sources count and dead-letter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from monitor.core.apis.base import WireApi, is_text
from monitor.core.apis.registry import API_NAMES, DEFAULT_API, GENERIC, carried_headers, get_api
from monitor.core.apis.sse import sse_payloads
from monitor.core.errors import InputError

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_EVENT_ID_CHARS",
    "MAX_PATH_CHARS",
    "TrafficEvent",
    "event_api",
    "event_from_request",
    "is_text",
    "parse_event",
    "query_hash",
    "query_text",
    "served_answer",
]

MAX_EVENT_BYTES = 1_048_576
MAX_PATH_CHARS = 2048
"""An event's ``path`` longer than this is rejected."""
MAX_EVENT_ID_CHARS = 512
"""An event id longer than this is rejected: with the task name (at most 256
characters) it makes the item id, which a verdict names (``monitor.core.review``)."""


@dataclass(frozen=True, slots=True)
class TrafficEvent:
    """One model call seen in traffic. ``request`` is the request body in its API's
    shape; ``response_text`` the answer production served (an answer string: text, or
    a marked tool-call or refusal answer), when known."""

    id: str
    model: str
    request: Mapping[str, Any]
    task: str | None = None
    ts: datetime | None = None
    response_text: str | None = None
    draw: float | None = None
    """The sampling draw, uniform in [0, 1), of an event whose id the traffic port made
    up (the request had no ``X-Request-Id`` of its own): it is sampled when the draw is
    under its task's rate. None: sampled by the hash of (task, id), the same way
    everywhere (:mod:`monitor.core.sampler`). Never read from an event's JSON."""
    api: str = DEFAULT_API
    """The wire API of the call (``monitor.core.apis.registry.API_NAMES``)."""
    path: str | None = None
    """The production request's path, without its query string (never a ``?key=``)."""
    headers: tuple[tuple[str, str], ...] = ()
    """The production headers its re-asks carry (``registry.CARRIED_HEADERS``: Anthropic's
    ``anthropic-version`` and ``anthropic-beta``; never a credential)."""
    attributes: Mapping[str, object] | None = None
    """A span's (``traffic.otlp``): its span and resource attributes that some task's
    ``match.attributes`` names (the span's winning over its resource's); None for every
    other source, whose events no such task takes."""
    unrecorded: tuple[str, ...] = ()
    """A span's answer-shaping request fields its API has and the span did not record
    (``tools``, ``response_format``, ``stop``, ``seed`` …): its re-ask cannot repeat
    them, so its served answer is not one of the draws. Empty for every other source."""
    served_tool_call: bool = False
    """A span's served answer is a tool call (with ``tools`` in :attr:`unrecorded`, its
    tool definitions are unknown). False for every other source."""


_CHAT: Final = get_api(DEFAULT_API)


def _reject(reason: str) -> InputError:
    return InputError(reason)


def event_api(name: str) -> WireApi | None:
    """The API an event names (None: ``generic``, whose rules are its task's);
    :class:`InputError` for a name relmon does not know."""
    if name == GENERIC:
        return None
    if name not in API_NAMES:
        raise _reject(f"'api' must be one of {', '.join(API_NAMES)}")
    return get_api(name)


def _check_request(api: WireApi | None, request: Any) -> None:
    if api is None:  # generic: any JSON object; its task's query_path reads it
        if not isinstance(request, dict):
            raise _reject("'request' must be a JSON object")
        return
    if not isinstance(request, dict):
        raise _reject(
            "'request' must be a chat request with a non-empty 'messages' list"
            if api.name == DEFAULT_API
            else f"'request' must be a JSON object (an {api.name} request)"
        )
    api.check_request(request)


def served_answer(api: WireApi | None, response: Any) -> str | None:
    """The answer production served, from an event's ``response`` (the API's JSON, or
    the text of its SSE stream); None when it holds none relmon can read;
    :class:`InputError` when it is neither a JSON object nor an SSE stream."""
    if response is None or api is None:
        return None
    if isinstance(response, str):
        payloads = sse_payloads(response)
        if not payloads:
            raise _reject("'response' text is not an SSE stream: no data: event holds JSON")
        return api.stream_answer(payloads)
    if not isinstance(response, dict):
        raise _reject("'response' must be a JSON object or the text of an SSE stream")
    return api.answer(response)


def _response_text(api: WireApi | None, response: Any) -> str | None:
    if response is None:
        return None
    if api is not None and api.name == DEFAULT_API and not isinstance(response, str):
        try:  # a chat event's response has always been checked
            content = response["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise _reject("'response' has no choices[0].message.content") from None
        if not isinstance(content, dict) or "content" not in content:
            raise _reject("'response' has no choices[0].message.content")
    text = served_answer(api, response)
    chat = api is not None and api.name == DEFAULT_API and isinstance(response, dict)
    if text is None and chat and response["choices"][0]["message"].get("content") is not None:
        raise _reject("'response' content is not a string")
    if text is not None and not is_text(text):
        raise _reject("'response' content is not a string")
    return text


def parse_event(
    raw: bytes | str | Mapping[str, Any], *, max_bytes: int = MAX_EVENT_BYTES
) -> TrafficEvent:
    """Validate one event; :class:`InputError` with a reason for anything malformed."""
    if isinstance(raw, bytes | str):
        size = len(raw.encode() if isinstance(raw, str) else raw)
        if size > max_bytes:
            raise _reject(f"event of {size} bytes is over the {max_bytes}-byte limit")
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _reject(f"invalid JSON: {getattr(exc, 'msg', 'not UTF-8')}") from None
        except ValueError:  # an integer of more than 4,300 digits (int_max_str_digits)
            raise _reject("invalid JSON: a number is too long") from None
        except RecursionError:
            raise _reject("invalid JSON: nested too deeply") from None
    else:
        obj = raw
    if not isinstance(obj, dict):
        raise _reject("event is not a JSON object")
    name = obj.get("api", DEFAULT_API)
    if not isinstance(name, str):
        raise _reject(f"'api' must be one of {', '.join(API_NAMES)}")
    api = event_api(name)
    path = obj.get("path")
    if path is not None and (
        not isinstance(path, str) or not is_text(path) or len(path) > MAX_PATH_CHARS
    ):
        raise _reject(f"'path' must be a text of at most {MAX_PATH_CHARS} characters")
    request = obj.get("request")
    model = obj.get("model")  # when present, even null: it is the model (and refused)
    if "model" not in obj and isinstance(request, dict):
        model = _request_model(api, request, path)
    item_id, request, model, task, ts = _checked(
        obj.get("id"), request, model, obj.get("task"), obj.get("ts"), api=api
    )
    return TrafficEvent(
        id=item_id,
        model=model,
        request=request,
        task=task,
        ts=ts,
        response_text=_response_text(api, obj.get("response")),
        api=name,
        path=_without_query(path),
        headers=_event_headers(name, obj.get("headers")),
    )


def _event_headers(api: str, headers: Any) -> tuple[tuple[str, str], ...]:
    """The headers an event names (an object) that its API's re-asks carry."""
    if headers is None:
        return ()
    if not isinstance(headers, dict):
        raise _reject("'headers' must be an object of header names and values")
    lowered = {str(k).lower(): v for k, v in headers.items()}
    return carried_headers(api, lambda name: _text_or_none(lowered.get(name)))


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and is_text(value) else None


def _without_query(path: str | None) -> str | None:
    """A path without its query string (a Gemini ``?key=`` is never kept)."""
    return None if path is None else path.split("?", 1)[0]


def _request_model(api: WireApi | None, request: Mapping[str, Any], path: str | None) -> Any:
    """The model a request names (in its body or, Gemini, its path); a generic request
    that names none is under the model ``generic`` (its task's model labels it)."""
    if api is None:
        model = request.get("model")
        return model if model is not None else GENERIC
    return api.model(request, _without_query(path)) or request.get("model")


def _checked(
    item_id: Any, request: Any, model: Any, task: Any, ts: Any, *, api: WireApi | None
) -> tuple[str, dict[str, Any], str, str | None, datetime | None]:
    """An event's fields validated, in the order their reasons are reported."""
    if isinstance(item_id, bool) or not isinstance(item_id, str | int) or str(item_id) == "":
        raise _reject("'id' must be a non-empty string")
    if not is_text(str(item_id)):
        raise _reject("'id' must be valid Unicode")
    if len(str(item_id)) > MAX_EVENT_ID_CHARS:
        raise _reject(f"'id' is over the limit of {MAX_EVENT_ID_CHARS} characters")
    _check_request(api, request)
    if not isinstance(model, str) or not model:
        raise _reject("'model' must be a non-empty string")
    if not is_text(model):
        raise _reject("'model' must be valid Unicode")
    if task is not None and (not is_text(task) or not task):
        raise _reject("'task' must be a non-empty string when present")
    parsed_ts = None
    if ts is not None:
        if not isinstance(ts, str):
            raise _reject("'ts' must be an RFC 3339 timestamp")
        try:
            parsed_ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            raise _reject("'ts' must be an RFC 3339 timestamp") from None
    return str(item_id), request, model, task, parsed_ts


def event_from_request(
    item_id: str,
    body: Mapping[str, Any],
    *,
    task: str | None = None,
    response_text: str | None = None,
    draw: float | None = None,
    api: str = DEFAULT_API,
    path: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> TrafficEvent:
    """An event from a mirrored or proxied request body, validated as :func:`parse_event`
    validates ``{"id": item_id, "api": api, "path": path, "task": task, "request": body,
    "response": <response_text in the API's shape>}`` (``draw``: its sampling draw),
    without building that document: a sampled proxied request costs the live path this."""
    wire = event_api(api)
    model = _request_model(wire, body, path)
    item_id, request, model, task, _ = _checked(item_id, dict(body), model, task, None, api=wire)
    if response_text is not None and not is_text(response_text):
        raise _reject("'response' content is not a string")
    return TrafficEvent(
        id=item_id,
        model=model,
        request=request,
        task=task,
        response_text=response_text,
        draw=draw,
        api=api,
        path=_without_query(path),
        headers=headers,
    )


def query_text(request: Mapping[str, Any], api: WireApi | None = None) -> str:
    """The question of a request (``api``'s, chat by default): the canonicalizer's
    context, the review's query; never logged."""
    return (api or _CHAT).query(request)


def query_hash(request: Mapping[str, Any] | str, key: bytes) -> str:
    """A short keyed hash (HMAC-SHA256) of the query, logged instead of the text.

    Equal queries get equal hashes under one key, so repeats can be spotted in the
    logs; without the key, a dictionary of likely prompts cannot be matched against
    them (an unkeyed hash of a short prompt is reversed by trying candidates).
    """
    query = request if isinstance(request, str) else query_text(request)
    text = query.encode("utf-8", "surrogatepass")
    return hmac.new(key, text, hashlib.sha256).hexdigest()[:16]
