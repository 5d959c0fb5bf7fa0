"""The ``json`` canonicalizer: a JSON value, serialised canonically.

Where the JSON is looked for, first that parses wins:

1. the whole answer (surrounding whitespace ignored);
2. the content of a fenced code block (```` ```json ```` or an unlabelled fence), in order;
3. the balanced ``{...}`` or ``[...]`` spans of the answer, by position (an outer span
   before the spans inside it); at most 64 spans are tried.

The canonical form is ``json.dumps(value, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` after normalising numbers at every depth: an integral float is an
int (``1.0`` → ``1``, ``1e3`` → ``1000``) and ``-0.0`` is ``0``. Other floats keep
Python's shortest round-trip form. Booleans stay booleans, duplicate keys keep the last.
``NaN``, ``Infinity`` and numbers that overflow to infinity are rejected, as are values
nested too deeply to process; anything unparseable is :data:`INVALID`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Final

from monitor.core.canon.base import INVALID, QueryContext

__all__ = ["JsonCanonicalizer", "canonical_json"]

MAX_SPANS: Final = 64
"""Balanced spans tried at most, so a hostile answer costs linear time."""

_FENCE: Final = "```"
_JSON_LANGS: Final = frozenset({"", "json", "jsonc", "json5"})
_STRUCTURE: Final = re.compile(r'[{}\[\]"\\]')
_CLOSERS: Final = {"}": "{", "]": "["}


class _RejectedError(ValueError):
    """A JSON constant (NaN, Infinity) or number that has no canonical form."""


def _reject_constant(name: str) -> object:
    raise _RejectedError(name)


def _normalise(value: object) -> object:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _RejectedError(repr(value))
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _normalise(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    return value


def canonical_json(text: str) -> str | None:
    """The canonical serialisation of the JSON document ``text``, or ``None``."""
    try:
        value = _normalise(json.loads(text, parse_constant=_reject_constant))
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        return None


def _fenced_blocks(answer: str) -> Iterator[str]:
    pos = 0
    while (start := answer.find(_FENCE, pos)) != -1:
        line_end = answer.find("\n", start)
        if line_end == -1:
            return
        close = answer.find(_FENCE, line_end)
        if close == -1:
            return
        if answer[start + len(_FENCE) : line_end].strip().lower() in _JSON_LANGS:
            yield answer[line_end + 1 : close]
        pos = close + len(_FENCE)


def _balanced_spans(answer: str) -> list[tuple[int, int]]:
    """Every balanced bracket span, in one pass; strings inside brackets are respected."""
    spans: list[tuple[int, int]] = []
    stack: list[tuple[str, int]] = []
    in_string = escaped = False
    for m in _STRUCTURE.finditer(answer):
        ch = m[0]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = m.end() < len(answer) and answer[m.end()] in '\\"'
                if escaped:
                    continue
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = bool(stack)
        elif ch in "{[":
            stack.append((ch, m.start()))
        elif ch in _CLOSERS:
            if stack and stack[-1][0] == _CLOSERS[ch]:
                spans.append((stack.pop()[1], m.end()))
            else:
                stack.clear()
    spans.sort(key=lambda span: (span[0], -span[1]))
    return spans


class JsonCanonicalizer:
    """Canonical JSON; see the module docstring for the rules."""

    redact_canonical_only: Final = True
    """Strings are kept verbatim and numbers in full, so redaction rules match the
    canonical form as they match the answer (see :mod:`monitor.core.redaction`)."""

    @property
    def name(self) -> str:
        return "json"

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        whole = answer.strip()
        if not whole:
            return INVALID
        result = canonical_json(whole)
        if result is not None:
            return result
        for block in _fenced_blocks(answer):
            result = canonical_json(block)
            if result is not None:
                return result
        for start, end in _balanced_spans(answer)[:MAX_SPANS]:
            result = canonical_json(answer[start:end])
            if result is not None:
                return result
        return INVALID
