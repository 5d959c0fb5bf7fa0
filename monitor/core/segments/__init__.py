"""Reliability per segment, the pure part (DESIGN.md §6 "Reliability per segment"):
a task's ``segments`` setting and an event's raw segment value (:mod:`.spec`), the
query's language (:mod:`.language`), label values that carry no user text
(:mod:`.labels`), and which segments get a label of their own (:mod:`.table`).

The engine's use, per event of a task with ``segments``::

    raw = segment_value(spec, headers, request, query)   # str | None
    value = label_value(raw)            # stored with the item and its verdict
    table.observe(raw)                  # its review rate's label: its own, or "other"

Which values are exported under a label of their own is decided from the stored
verdicts (:mod:`monitor.engine.segments`), not by the table.
"""

from __future__ import annotations

from monitor.core.segments.labels import NONE, OTHER, is_label, label_value
from monitor.core.segments.language import detect_language, load_language_detector
from monitor.core.segments.spec import (
    DEFAULT_MAX_SEGMENTS,
    Headers,
    SegmentBy,
    SegmentSpec,
    parse_segments,
    segment_value,
)
from monitor.core.segments.table import SegmentTable, entry_events

__all__ = [
    "DEFAULT_MAX_SEGMENTS",
    "NONE",
    "OTHER",
    "Headers",
    "SegmentBy",
    "SegmentSpec",
    "SegmentTable",
    "detect_language",
    "entry_events",
    "is_label",
    "label_value",
    "load_language_detector",
    "parse_segments",
    "segment_value",
]
