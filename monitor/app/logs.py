"""Logging: one JSON object a line on stderr, for relmon's own events and for every
library that logs through the standard library (aiohttp, aiokafka, asyncio).

relmon logs with structlog; the standard library's root logger gets a handler whose
formatter renders through the same processors, so aiohttp's ``aiohttp.server`` "Error
handling request" lines, its access log and asyncio's complaints come out as JSON too.
A record from a library passes :func:`redact_secrets` first: header values that carry
credentials (``Authorization``, ``Cookie``, ``X-Api-Key``, …) and bearer tokens are
masked in its message and in its traceback, since a malformed request line is logged
with the raw bytes the client sent. A client's malformed request (aiohttp's
``HttpProcessingError``) is logged as a warning without a traceback: it is the
client's fault, not a failure of relmon, and a traceback per bad request would let
anyone who reaches a port flood the logs.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import MutableMapping
from typing import Any

import structlog
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["SECRET_HEADERS", "configure_logging", "redact_secrets"]

SECRET_HEADERS = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-amz-security-token",
)
"""Headers whose values are masked wherever a library logs them (case-insensitive)."""

# A secret header's name, then the separator as the library wrote it (``: ``, ``':
# '``, ``=``), then the value up to the end of the line, a quote, or an escaped CR/LF.
_HEADER = re.compile(
    r"(?i)((?:proxy-)?authorization|(?:set-)?cookie|x-api-key|api-key|x-auth-token"
    r"|x-amz-security-token)(['\"]?\s*[:=]\s*['\"]?)([^\r\n'\"\\]*)"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=:-]+")
_REDACTED = "[redacted]"


def redact_secrets(text: str) -> str:
    """``text`` with credential header values and bearer tokens masked."""
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{_REDACTED}", text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{_REDACTED}", text)


def _foreign(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A standard-library record (a library's): redact, and no traceback for bad input."""
    record = event.get("_record")
    if record is None:
        return event  # relmon's own event: it never logs headers
    event["logger"] = record.name
    event["event"] = redact_secrets(str(event.get("event", "")))
    suppressed = getattr(record, "suppressed", None)
    if suppressed:  # lines like it held back by a rate limit (adapters.kafka.logs)
        event["suppressed"] = suppressed
    event.pop("stack_info", None)
    exc_info = event.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    if isinstance(exc_info, tuple) and exc_info[1] is not None:
        exc = exc_info[1]
        event["error"] = type(exc).__name__
        if isinstance(exc, HttpProcessingError):
            event["level"] = "warning"
            event["status"] = exc.code
        else:
            text = "".join(traceback.format_exception(*exc_info))
            event["exception"] = redact_secrets(text)
    return event


def configure_logging(fmt: str, *, level: int = logging.INFO) -> None:
    """structlog: JSON lines (production) or console (a terminal), on stderr; the
    standard library's loggers (aiohttp's among them) rendered the same way."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _foreign],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        pass_foreign_args=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_relmon", False):
            root.removeHandler(old)
    handler._relmon = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    # Libraries' info lines (aiokafka's group joins, aiohttp's access log: a line per
    # scrape or poll) are noise; their warnings and errors come through.
    root.setLevel(max(level, logging.WARNING))
    logging.captureWarnings(True)
