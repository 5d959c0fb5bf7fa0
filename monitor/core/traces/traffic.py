"""A read inference span as a traffic event, whichever source brought it (the OTLP
receiver, or a Kafka record of format ``otlp``: :func:`read_resource_spans`). No I/O.

The event's id is ``<trace id>-<span id>``, its sampling draw comes from the trace id
(:func:`~.sampling.trace_draw`: a trace is monitored whole or not at all), its ``ts`` is
the span's start, and it carries the span's ``unrecorded`` answer-shaping fields and
whether its served answer is a tool call, which decide how far its re-asks and served
answer count (:class:`~monitor.core.events.TrafficEvent`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent, event_from_request
from monitor.core.traces.otlp_json import decode_resource_spans
from monitor.core.traces.sampling import trace_draw
from monitor.core.traces.shapes import SpanCall, read_span
from monitor.core.traces.spans import Span

__all__ = ["OTLP_FORMAT", "SpanBatch", "matched_attributes", "read_resource_spans", "span_event"]

OTLP_FORMAT: Final = "otlp"
"""The ``format`` of a Kafka traffic event that holds one OTLP JSON ``ResourceSpans``."""


@dataclass(frozen=True, slots=True)
class SpanBatch:
    """The spans of one ``ResourceSpans`` as traffic: the events of its read spans (in
    order), how many inference spans had no content (unmonitored), and why the first
    rejected span was rejected (None: none was). Spans that are not inference spans
    count nowhere."""

    events: tuple[TrafficEvent, ...]
    no_content: int
    rejected: str | None


def span_event(span: Span, call: SpanCall, attribute_keys: frozenset[str]) -> TrafficEvent:
    """The traffic event of ``span``, read as ``call`` (its outcome ``read``), with the
    attributes some task's ``match.attributes`` names (``attribute_keys``);
    :class:`~monitor.core.errors.InputError` when the rebuilt request is not an event."""
    assert call.request is not None and call.api is not None  # a read span's
    event = event_from_request(
        f"{span.trace_id}-{span.span_id}",
        call.request,
        response_text=call.served,
        draw=trace_draw(span.trace_id),
        api=call.api,
        path=call.path,
    )
    return replace(
        event,
        ts=datetime.fromtimestamp(call.start_ns / 1e9, UTC) if call.start_ns else None,
        attributes=matched_attributes(attribute_keys, span),
        unrecorded=call.unrecorded,
        served_tool_call=call.served_tool_call,
    )


def matched_attributes(keys: frozenset[str], span: Span) -> Mapping[str, object] | None:
    """The span's and its resource's attributes some task matches on (the span's win);
    None when no task matches on any."""
    if not keys:
        return None
    found = {k: span.resource[k] for k in keys if k in span.resource}
    found.update((k, span.attributes[k]) for k in keys if k in span.attributes)
    return found


def read_resource_spans(obj: Mapping[str, Any], attribute_keys: frozenset[str]) -> SpanBatch:
    """Every span of one OTLP JSON ``ResourceSpans`` (a parsed object; other keys, such
    as a Kafka event's ``format``, are ignored) read as :func:`span_event` reads it;
    :class:`~monitor.core.errors.InputError` when it does not decode."""
    spans = decode_resource_spans(obj, "event")
    events: list[TrafficEvent] = []
    no_content = 0
    rejected: str | None = None
    for span in spans:
        call = read_span(span)
        if call.outcome == "read":
            try:
                events.append(span_event(span, call, attribute_keys))
                continue
            except InputError as exc:
                call = replace(call, outcome="rejected", reason=str(exc))
        if call.outcome == "no_content":
            no_content += 1
        elif call.outcome == "rejected" and rejected is None:
            rejected = f"span {call.reason}"
    return SpanBatch(tuple(events), no_content, rejected)
