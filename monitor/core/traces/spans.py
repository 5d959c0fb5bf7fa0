"""A span and a log record as relmon reads them, whatever they were decoded from (the
OTLP JSON mapping here, protobuf in an adapter). No I/O.

Attribute values are plain Python: ``str``, ``bool``, ``int``, ``float``, ``bytes``,
lists of values and ``dict`` s of them (an OTLP ``kvlistValue``), None for an empty
``AnyValue``. Ids are lower-case hex (32 digits for a trace, 16 for a span).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LogRecord", "Span", "SpanEvent"]


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """An event recorded on a span (``gen_ai.user.message``, …)."""

    name: str
    time_ns: int
    attributes: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Span:
    """One span with its resource's attributes and its scope's name."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    attributes: dict[str, object] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    resource: dict[str, object] = field(default_factory=dict)
    scope: str = ""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One log record; ``event_name`` is its ``eventName`` (or its ``event.name``
    attribute, where older SDKs put it), ``""`` when it names none. ``trace_id`` and
    ``span_id`` are ``""`` when the record belongs to no span."""

    trace_id: str
    span_id: str
    time_ns: int
    event_name: str
    body: object
    attributes: dict[str, object] = field(default_factory=dict)
