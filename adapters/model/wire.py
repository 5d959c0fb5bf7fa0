"""The chat-completions wire format: the body sent for a request, the answers read
from a response, and ``Retry-After`` (see :mod:`adapters.model.client`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Final

from monitor.core.apis.openai_chat import chat_answers
from monitor.core.errors import InputError, ModelCallError

__all__ = [
    "FORWARDED_FIELDS",
    "build_body",
    "encode",
    "forward_body",
    "parse_completion",
    "parse_retry_after",
]

FORWARDED_FIELDS: Final = frozenset(
    {"top_p", "stop", "response_format", "presence_penalty", "frequency_penalty"}
)
"""Request fields resent besides ``messages`` (see the module docstring)."""


def build_body(
    request: Mapping[str, Any], *, model: str, temperature: float, max_tokens: int
) -> dict[str, Any]:
    """The request body sent for ``request`` (``n`` is added per call).

    Raises :class:`ModelCallError` (not retriable) when ``messages`` is not a non-empty list.
    """
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ModelCallError("request has no non-empty 'messages' list", retriable=False)
    body: dict[str, Any] = {"messages": messages}
    body.update({k: request[k] for k in sorted(FORWARDED_FIELDS) if request.get(k) is not None})
    body.update(model=model, temperature=temperature, max_tokens=max_tokens, stream=False)
    return body


def forward_body(request: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """``request`` as it is sent with ``forward=True``: without ``n``, ``stream`` and
    ``stream_options`` (set per call), with ``model`` when it names none.

    Raises :class:`ModelCallError` (not retriable) when ``messages`` is not a non-empty list.
    """
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ModelCallError("request has no non-empty 'messages' list", retriable=False)
    body = {k: v for k, v in request.items() if k not in ("n", "stream", "stream_options")}
    body.setdefault("model", model)
    body["stream"] = False
    return body


def parse_completion(raw: bytes) -> list[str]:
    """The answers of the choices of a chat-completion body, in order
    (:func:`monitor.core.apis.openai_chat.chat_answers`: text content as it is,
    ``content: null`` gives ``""``, tool calls or a refusal a marked answer). Raises
    :class:`~monitor.core.errors.InputError` with a short reason (never the body itself)
    for anything that is not a well-formed completion.
    """
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise InputError("body is not JSON") from None
    if not isinstance(obj, dict):
        raise InputError("body has no non-empty 'choices' list")
    return chat_answers(obj)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date).

    ``now`` is the wall-clock time (epoch seconds) for HTTP-dates. ``None`` if absent or
    unreadable; never negative.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        return None
    return max(0.0, when.timestamp() - now)


def encode(body: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ModelCallError(
            f"request cannot be sent as JSON ({type(exc).__name__})", retriable=False
        ) from None
