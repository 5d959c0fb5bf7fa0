"""Traces as a source: OpenTelemetry spans read as model calls. No I/O.

:mod:`.spans` holds the decoded span and log record (whatever the wire form),
:mod:`.otlp_json` decodes the OTLP JSON mapping into them, :mod:`.shapes` reads an
inference span into a call of a wire API (:mod:`monitor.core.apis`), :mod:`.join` joins
log records to their spans, and :mod:`.sampling` draws a trace's sampling number.
"""

__all__: list[str] = []
