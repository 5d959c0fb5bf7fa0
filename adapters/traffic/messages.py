"""HTTP messages as the traffic port reads them: the answer of a response in its wire
API (JSON or an SSE stream, gzip or deflate; :mod:`monitor.core.apis` reads it), and the
hop-by-hop headers a proxy must not forward."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from multidict import CIMultiDict

from monitor.core.apis.base import WireApi, is_text
from monitor.core.apis.sse import is_event_stream, sse_payloads

__all__ = [
    "HOP_BY_HOP_HEADERS",
    "answer_text",
    "decoded",
    "json_response_text",
    "sse_response_text",
    "strip_hop_by_hop",
]

_MAX_INFLATED_BYTES = 16 * 1_048_576
_decode = msgspec.json.Decoder().decode

# fmt: off
HOP_BY_HOP_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
# fmt: on


def json_response_text(body: bytes) -> str | None:
    """``choices[0].message.content`` of a chat completion body, ``None`` if absent.

    Read by msgspec (the proxy reads it on its live path); what msgspec refuses and
    Python's json reads (NaN, a lone surrogate's escape, UTF-16) is read by json, so the
    text is the same either way."""
    doc = _document(body)
    try:
        content = doc["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


def sse_response_text(body: bytes) -> str | None:
    """The concatenated ``choices[0].delta.content`` of an SSE stream, up to ``[DONE]``."""
    parts: list[str] = []
    for raw_line in body.splitlines():
        line = raw_line.decode("utf-8", errors="replace")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            choices = json.loads(payload)["choices"]
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if not isinstance(choices, list):
            continue
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                parts.append(content)
    return "".join(parts) if parts else None


def decoded(body: bytes, encoding: str) -> bytes | None:
    """The body without its content encoding; None when it cannot be decoded here."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip", "deflate"):
        inflate = zlib.decompressobj(wbits=47)  # gzip or zlib header, auto-detected
        try:
            out = inflate.decompress(body, _MAX_INFLATED_BYTES)
        except zlib.error:
            return None
        # A body that inflates past the cap (a compression bomb) is not sampled.
        return out if inflate.eof and not inflate.unconsumed_tail else None
    return None  # br, zstd, …: the answer text stays unknown


def strip_hop_by_hop(headers: Iterable[tuple[str, str]], connection: str) -> CIMultiDict[str]:
    named = {h.strip().lower() for h in connection.split(",") if h.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers:
        low = name.lower()
        if low not in HOP_BY_HOP_HEADERS and low not in named:
            out.add(name, value)
    return out


def answer_text(body: bytes, headers: Mapping[str, str], api: WireApi | None = None) -> str | None:
    """The model's answer in a response body of ``api`` (chat by default), JSON or SSE
    (None when unknown: a body that is cut, not JSON or not UTF-8 loses the served
    answer, never the event)."""
    plain = decoded(body, headers.get("Content-Encoding", ""))
    if plain is None:
        return None
    if api is None:
        if is_event_stream(headers.get("Content-Type", "")):
            return sse_response_text(plain)
        return json_response_text(plain)
    if is_event_stream(headers.get("Content-Type", "")):
        try:  # not UTF-8: the served answer is lost, never a guess with U+FFFD in it
            stream = plain.decode("utf-8")
        except UnicodeDecodeError:
            return None
        text = api.stream_answer(sse_payloads(stream))
    else:
        doc = _document(plain)
        text = api.answer(doc) if isinstance(doc, dict) else None
    return text if text is None or is_text(text) else None


def _document(body: bytes) -> Any:
    """A JSON body read by msgspec, or by json what msgspec refuses and json reads (NaN,
    a lone surrogate's escape, UTF-16), so the document is the same either way; None when
    it is not JSON (or not UTF-8: msgspec raises UnicodeDecodeError, a ValueError)."""
    try:
        return _decode(body)
    except (msgspec.DecodeError, ValueError, RecursionError):
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            return None
