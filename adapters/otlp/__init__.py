"""OTLP/HTTP: traces and logs sent by OpenTelemetry SDKs and collectors, read as traffic.

:mod:`.wire` decodes protobuf bodies into the core's spans and log records (JSON ones
through :mod:`monitor.core.traces.otlp_json`) and encodes the answers; :mod:`.intake`
joins log records to their spans, reads them (:mod:`monitor.core.traces.shapes`) and
offers the events to the service; :mod:`.receiver` is the HTTP server (``POST
/v1/traces``, ``/v1/logs``), forwarding every request to ``traffic.otlp.forward_to``.
"""

__all__: list[str] = []
