"""The traffic event (docs/kafka.md, "Traffic events") and its validation, without I/O.

A traffic event is one logged or mirrored LLM call::

    {"id": "req-123", "ts": "2026-11-22T07:00:00Z", "model": "gpt-4.1", "task": "triage",
     "request": {"model": "gpt-4.1", "messages": [{"role": "user", "content": "..."}]},
     "response": {"choices": [{"message": {"content": "..."}}]}}

``task``, ``ts`` and ``response`` are optional. :func:`parse_event` turns bytes into a
:class:`TrafficEvent` or raises :class:`~monitor.core.errors.InputError` with a short reason
(no prompt text in it), which sources count and dead-letter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from monitor.core.errors import InputError

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_EVENT_ID_CHARS",
    "TrafficEvent",
    "event_from_request",
    "is_text",
    "parse_event",
    "query_hash",
    "query_text",
]

MAX_EVENT_BYTES = 1_048_576
MAX_EVENT_ID_CHARS = 512
"""An event id longer than this is rejected: with the task name (at most 256
characters) it makes the item id, which a verdict names (``monitor.core.review``)."""


@dataclass(frozen=True, slots=True)
class TrafficEvent:
    """One model call seen in traffic. ``request`` is the OpenAI chat request body."""

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


def _reject(reason: str) -> InputError:
    return InputError(reason)


def is_text(value: object) -> bool:
    """A ``str`` that is valid Unicode: no lone surrogates, which JSON's ``\\ud800``
    escapes and undecodable header bytes produce and which no UTF-8 encoder (SQLite,
    Kafka, the logs) accepts."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def _check_messages(request: Mapping[str, Any]) -> None:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _reject("'request' must be a chat request with a non-empty 'messages' list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise _reject("'request' must be a chat request with a non-empty 'messages' list")
        if not _content_ok(m["content"]):
            raise _reject(
                "a message's 'content' must be text, null or a list of parts whose 'text' is text"
            )


def _response_text(response: Any) -> str | None:
    if response is None:
        return None
    try:
        content = response["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise _reject("'response' has no choices[0].message.content") from None
    if content is not None and not is_text(content):
        raise _reject("'response' content is not a string")
    return content if isinstance(content, str) else None


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
    request = obj.get("request")
    model = obj.get("model", request.get("model") if isinstance(request, dict) else None)
    item_id, request, model, task, ts = _checked(
        obj.get("id"), request, model, obj.get("task"), obj.get("ts")
    )
    return TrafficEvent(
        id=item_id,
        model=model,
        request=request,
        task=task,
        ts=ts,
        response_text=_response_text(obj.get("response")),
    )


def _checked(
    item_id: Any, request: Any, model: Any, task: Any, ts: Any
) -> tuple[str, dict[str, Any], str, str | None, datetime | None]:
    """An event's fields validated, in the order their reasons are reported."""
    if isinstance(item_id, bool) or not isinstance(item_id, str | int) or str(item_id) == "":
        raise _reject("'id' must be a non-empty string")
    if not is_text(str(item_id)):
        raise _reject("'id' must be valid Unicode")
    if len(str(item_id)) > MAX_EVENT_ID_CHARS:
        raise _reject(f"'id' is over the limit of {MAX_EVENT_ID_CHARS} characters")
    if not isinstance(request, dict):
        raise _reject("'request' must be a chat request with a non-empty 'messages' list")
    _check_messages(request)
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
) -> TrafficEvent:
    """An event from a mirrored or proxied request body, validated as :func:`parse_event`
    validates ``{"id": item_id, "model": body["model"], "task": task, "request": body,
    "response": <response_text as a chat completion>}`` (``draw``: its sampling draw),
    without building that document: a sampled proxied request costs the live path this."""
    item_id, request, model, task, _ = _checked(item_id, dict(body), body.get("model"), task, None)
    if response_text is not None and not is_text(response_text):
        raise _reject("'response' content is not a string")
    return TrafficEvent(
        id=item_id,
        model=model,
        request=request,
        task=task,
        response_text=response_text,
        draw=draw,
    )


def query_text(request: Mapping[str, Any]) -> str:
    """The user-visible text of a chat request (for canonicalizer context; never logged)."""
    parts = []
    for m in request.get("messages", []):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # content parts
            parts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return "\n".join(parts)


def query_hash(request: Mapping[str, Any], key: bytes) -> str:
    """A short keyed hash (HMAC-SHA256) of the query, logged instead of the text.

    Equal queries get equal hashes under one key, so repeats can be spotted in the
    logs; without the key, a dictionary of likely prompts cannot be matched against
    them (an unkeyed hash of a short prompt is reversed by trying candidates).
    """
    text = query_text(request).encode("utf-8", "surrogatepass")
    return hmac.new(key, text, hashlib.sha256).hexdigest()[:16]
