"""Log records joined to their spans by (trace id, span id), within bounds. No I/O; the
clock is passed in (seconds, never decreasing).

Semconv's per-message events often travel as log records, on another request than their
span and in either order. :class:`LogJoiner` holds a span until ``join_s`` after it
arrived, gathering the records of its ids, then releases it with them
(:meth:`LogJoiner.release`). At most ``max_spans`` spans wait: one more releases the
oldest at once (:meth:`LogJoiner.add_span` returns it). Records that arrive before their
span wait for it as long, at most ``max_records`` of them (the oldest dropped first);
so does a span's own list. What the bounds drop is counted in
:attr:`LogJoiner.dropped_records`, never silently.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from monitor.core.errors import ConfigError
from monitor.core.traces.spans import LogRecord, Span

__all__ = ["JoinedSpan", "LogJoiner"]

_Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class JoinedSpan:
    """A span released by the joiner, with the log records of its ids (arrival order)."""

    span: Span
    records: list[LogRecord]


@dataclass(slots=True)
class _Waiting:
    arrived: float
    span: Span | None = None
    records: list[LogRecord] = field(default_factory=list)


class LogJoiner:
    """Joins log records to spans (see the module)."""

    def __init__(self, join_s: float, max_spans: int, max_records: int = 10_000) -> None:
        if join_s < 0 or max_spans < 1 or max_records < 1:
            raise ConfigError("join_s must be >= 0, max_spans and max_records >= 1")
        self.join_s = join_s
        self.max_spans = max_spans
        self.max_records = max_records
        self.dropped_records = 0
        self._spans: OrderedDict[_Key, _Waiting] = OrderedDict()
        self._orphans: OrderedDict[_Key, _Waiting] = OrderedDict()
        self._orphan_count = 0
        self._now = float("-inf")

    def _clock(self, now: float) -> float:
        self._now = max(self._now, now)
        return self._now

    @property
    def waiting(self) -> int:
        """Spans waiting for their records."""
        return len(self._spans)

    @property
    def held_records(self) -> int:
        """Records waiting for their span."""
        return self._orphan_count

    def add_span(self, span: Span, now: float) -> list[JoinedSpan]:
        """Hold ``span`` for its records; returns the spans the ``max_spans`` bound
        releases now (the oldest first). A span already waiting is not held twice."""
        now = self._clock(now)
        key = (span.trace_id, span.span_id)
        if key in self._spans:
            return []
        entry = _Waiting(now, span)
        early = self._orphans.pop(key, None)
        if early is not None:
            self._orphan_count -= len(early.records)
            entry.records = early.records
        self._spans[key] = entry
        released = []
        while len(self._spans) > self.max_spans:
            released.append(self._joined(self._spans.popitem(last=False)[1]))
        return released

    def add_record(self, record: LogRecord, now: float) -> bool:
        """Join ``record`` to its span, or hold it for its span; False when it names no
        span (nothing to join it to) or its span's list is full (counted)."""
        now = self._clock(now)
        if not record.trace_id or not record.span_id:
            return False
        key = (record.trace_id, record.span_id)
        entry = self._spans.get(key)
        if entry is not None:
            if len(entry.records) >= self.max_records:
                self.dropped_records += 1
                return False
            entry.records.append(record)
            return True
        held = self._orphans.setdefault(key, _Waiting(now))
        held.records.append(record)
        self._orphan_count += 1
        while self._orphan_count > self.max_records:
            oldest = next(iter(self._orphans.values()))
            oldest.records.pop(0)
            self._orphan_count -= 1
            self.dropped_records += 1
            if not oldest.records:
                self._orphans.popitem(last=False)
        return True

    def release(self, now: float) -> list[JoinedSpan]:
        """The spans whose wait is over (``join_s`` after their arrival), oldest first;
        records still waiting for a span past ``join_s`` are dropped (counted)."""
        now = self._clock(now)
        released = []
        while self._spans:
            entry = next(iter(self._spans.values()))
            if now - entry.arrived < self.join_s:
                break
            released.append(self._joined(self._spans.popitem(last=False)[1]))
        while self._orphans:
            held = next(iter(self._orphans.values()))
            if now - held.arrived < self.join_s:
                break
            self._orphans.popitem(last=False)
            self._orphan_count -= len(held.records)
            self.dropped_records += len(held.records)
        return released

    def drain(self) -> list[JoinedSpan]:
        """Every waiting span, oldest first (at shutdown: none is lost)."""
        released = [self._joined(entry) for entry in self._spans.values()]
        self._spans.clear()
        return released

    @staticmethod
    def _joined(entry: _Waiting) -> JoinedSpan:
        assert entry.span is not None  # spans' entries always hold one
        return JoinedSpan(entry.span, entry.records)
