"""A task's ``segments`` setting (DESIGN.md §6 "Reliability per segment"), and the raw
segment value of one production request.

``by`` says where an event's segment comes from, one of::

    segments: {by: {header: X-Tenant}, max: 20}       # a production request header
    segments: {by: {field: metadata.tenant}, max: 5}  # JMESPath in the production request
    segments: {by: language}                          # the query's language, offline

``max`` (default 20, 1 to 1000): how many segments get a label of their own, the busiest
(:mod:`monitor.core.segments.table`); the rest share ``other``.
``min_reviews_per_hour`` (default 0): the review rate each segment is guaranteed.

A header is found whatever its case. A field's value is a string as it is; a number or
a boolean as JSON writes it (``42``, ``true``); a list, an object or null is no value. A
header that carries a credential (``Authorization``, ``X-Api-Key``, ``Cookie``, ...)
cannot be a segment, not even hashed: a hash of a key is still a fingerprint of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult

from monitor.core.apis.generic import compiled_jmespath
from monitor.core.errors import ConfigError
from monitor.core.segments.language import detect_language

__all__ = [
    "CREDENTIAL_HEADERS",
    "DEFAULT_MAX_SEGMENTS",
    "MAX_MAX_SEGMENTS",
    "Headers",
    "SegmentBy",
    "SegmentKind",
    "SegmentSpec",
    "parse_segments",
    "segment_value",
]

SegmentKind = Literal["header", "field", "language"]
Headers = Mapping[str, str] | Iterable[tuple[str, str]]
"""Request headers: a mapping, or ``(name, value)`` pairs as ``TrafficEvent.headers``."""

DEFAULT_MAX_SEGMENTS: Final = 20
MAX_MAX_SEGMENTS: Final = 1000
CREDENTIAL_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-auth-token",
        "x-amz-security-token",
    }
)
"""Headers that cannot be a segment (lower case)."""
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
"""An HTTP header name (RFC 9110 ``token``)."""
_KEYS: Final = frozenset({"by", "max", "min_reviews_per_hour"})
_KINDS: Final = "{header: NAME}, {field: JMESPATH}, language"


@dataclass(frozen=True, slots=True)
class SegmentBy:
    """Where a segment value comes from: ``kind`` and its ``name`` (the header's name in
    lower case, or the JMESPath expression; empty for ``language``). A
    :class:`ConfigError` when it cannot work."""

    kind: SegmentKind
    name: str = ""
    expression: ParsedResult | None = field(default=None, compare=False, repr=False)
    """The compiled JMESPath of a ``field`` (made from ``name`` when not given)."""

    def __post_init__(self) -> None:
        if self.kind == "header":
            if not isinstance(self.name, str) or not _TOKEN.fullmatch(self.name):
                raise ConfigError(f"by.header: {self.name!r} is not an HTTP header name")
            if self.name.lower() in CREDENTIAL_HEADERS:
                raise ConfigError(
                    f"by.header: {self.name!r} carries a credential and cannot be a segment"
                )
            object.__setattr__(self, "name", self.name.lower())
        elif self.kind == "field":
            if self.expression is None:
                object.__setattr__(self, "expression", compiled_jmespath("by.field", self.name))
        elif self.kind == "language":
            if self.name:
                raise ConfigError(f"by: language takes no argument, not {self.name!r}")
        else:
            raise ConfigError(f"by: must be one of {_KINDS}, not {self.kind!r}")


@dataclass(frozen=True, slots=True)
class SegmentSpec:
    """A task's ``segments`` setting (see the module)."""

    by: SegmentBy
    max: int = DEFAULT_MAX_SEGMENTS
    min_reviews_per_hour: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int):
            raise ConfigError(f"max: must be a whole number, not {self.max!r}")
        if not 1 <= self.max <= MAX_MAX_SEGMENTS:
            raise ConfigError(f"max: must be from 1 to {MAX_MAX_SEGMENTS}, not {self.max}")
        rate = self.min_reviews_per_hour
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise ConfigError(f"min_reviews_per_hour: must be a number, not {rate!r}")
        if not math.isfinite(rate) or rate < 0:
            raise ConfigError(f"min_reviews_per_hour: must be 0 or more, not {rate!r}")
        object.__setattr__(self, "min_reviews_per_hour", float(rate))


def _parse_by(value: object) -> SegmentBy:
    if value == "language":
        return SegmentBy("language")
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, name),) = value.items()
        if kind in ("header", "field"):
            return SegmentBy(kind, name)
    raise ConfigError(f"by: must be one of {_KINDS}, not {value!r}")


def parse_segments(value: object, *, option: str = "segments") -> SegmentSpec:
    """A ``segments`` mapping as a :class:`SegmentSpec`; a :class:`ConfigError` that
    starts with ``option`` (say ``tasks[0].segments``) and names the key otherwise."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{option}: must be a mapping with 'by', not {value!r}")
    unknown = sorted(str(k) for k in value if k not in _KEYS)
    if unknown:
        raise ConfigError(f"{option}: unknown key(s) {unknown}; known: {sorted(_KEYS)}")
    if "by" not in value:
        raise ConfigError(f"{option}.by: is required, one of {_KINDS}")
    try:
        return SegmentSpec(
            by=_parse_by(value["by"]),
            max=value.get("max", DEFAULT_MAX_SEGMENTS),
            min_reviews_per_hour=value.get("min_reviews_per_hour", 0.0),
        )
    except ConfigError as e:  # each message starts with its key: "max: ..."
        raise ConfigError(f"{option}.{e}") from None


def _header(headers: Headers, name: str) -> str | None:
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in pairs:
        if key.lower() == name:
            return value
    return None


def _scalar(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return None  # null, a list, an object


def segment_value(
    spec: SegmentSpec | SegmentBy,
    headers: Headers = (),
    request: Mapping[str, Any] | None = None,
    query: str | None = None,
) -> str | None:
    """The raw segment value of one production request (see the module), before it is
    made a label (:func:`monitor.core.segments.labels.label_value`); None for no value
    (absent, empty, or a language that cannot be told)."""
    by = spec.by if isinstance(spec, SegmentSpec) else spec
    raw: str | None
    if by.kind == "header":
        raw = _header(headers, by.name)
        raw = raw.strip() if isinstance(raw, str) else None
    elif by.kind == "field":
        if request is None or by.expression is None:
            return None
        try:
            raw = _scalar(by.expression.search(request))
        except JMESPathError:  # a function given a value of the wrong type
            raw = None
    else:
        raw = detect_language(query) if isinstance(query, str) else None
    return raw or None
