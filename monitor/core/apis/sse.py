"""Server-sent events as a client reads them: the JSON payload of each event. No I/O.

Every API here streams its answer as SSE (``text/event-stream``): events separated by a
blank line, each with one or more ``data:`` lines (joined with newlines, as the SSE
specification says). :func:`sse_payloads` returns the payloads that are JSON objects, in
order, up to OpenAI's ``[DONE]``; a comment, an ``event:`` name, a payload that is not
JSON or not an object is passed over, as a client passes over what it cannot read.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["is_event_stream", "sse_payloads"]


def is_event_stream(content_type: str) -> bool:
    """Whether a ``Content-Type`` is ``text/event-stream``."""
    return content_type.strip().lower().startswith("text/event-stream")


def _object(text: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _payloads(data: list[str], out: list[dict[str, Any]]) -> None:
    """One event's payload; when its lines joined are not JSON, each line read on its
    own (a server that wrote one JSON object per ``data:`` line without blank lines)."""
    joined = _object("\n".join(data))
    if joined is not None:
        out.append(joined)
    elif len(data) > 1:
        out.extend(obj for obj in map(_object, data) if obj is not None)


def sse_payloads(stream: bytes | str) -> list[dict[str, Any]]:
    """The JSON-object payloads of an SSE stream, in order (see the module)."""
    text = stream.decode("utf-8", errors="replace") if isinstance(stream, bytes) else stream
    out: list[dict[str, Any]] = []
    data: list[str] = []
    for line in text.splitlines():
        if not line:  # the end of an event
            if data:
                if data[0] == "[DONE]":
                    return out
                _payloads(data, out)
                data = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            value = value[1:] if value.startswith(" ") else value
            if value.strip() == "[DONE]":
                if data:
                    _payloads(data, out)
                return out
            data.append(value)
    if data:  # a last event without its blank line
        _payloads(data, out)
    return out
