"""OTLP/HTTP bodies: protobuf and JSON requests decoded into the core's
:class:`~monitor.core.traces.spans.Span` and :class:`~monitor.core.traces.spans.LogRecord`
(ids as lower-case hex), and the answers encoded the way the request was
(``Export…ServiceResponse`` with its ``partial_success``, a ``google.rpc.Status`` for an
error), as the OTLP/HTTP specification says."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

from monitor.core.traces.otlp_json import OtlpDecodeError, decode_logs, decode_traces
from monitor.core.traces.spans import LogRecord, Span, SpanEvent

__all__ = [
    "JSON",
    "PROTOBUF",
    "decode",
    "export_response",
    "status_body",
]

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
_MAX_DEPTH: Final = 32


def _value(value: common_pb2.AnyValue, depth: int = 0) -> object:
    """One ``AnyValue`` as plain Python, as :func:`~monitor.core.traces.otlp_json.any_value`
    reads the JSON one."""
    if depth > _MAX_DEPTH:
        raise OtlpDecodeError(f"a value nests deeper than {_MAX_DEPTH} levels")
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v, depth + 1) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values, depth + 1)
    return getattr(value, kind)  # string, bool, int, double, bytes


def _attributes(pairs: Sequence[common_pb2.KeyValue], depth: int = 0) -> dict[str, object]:
    return {kv.key: _value(kv.value, depth) for kv in pairs}


def _hex(raw: bytes, size: int, what: str, *, required: bool) -> str:
    if not raw and not required:
        return ""
    if len(raw) != size:
        raise OtlpDecodeError(f"{what} must be {size} bytes, not {len(raw)}")
    return raw.hex()


def _spans(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    out = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for s in scope_spans.spans:
                out.append(
                    Span(
                        trace_id=_hex(s.trace_id, 16, "traceId", required=True),
                        span_id=_hex(s.span_id, 8, "spanId", required=True),
                        name=s.name,
                        start_ns=s.start_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        events=[
                            SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes))
                            for e in s.events
                        ],
                        resource=resource,
                        scope=scope,
                    )
                )
    return out


def _records(request: logs_service_pb2.ExportLogsServiceRequest) -> list[LogRecord]:
    out = []
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for r in scope_logs.log_records:
                attributes = _attributes(r.attributes)
                name = r.event_name or attributes.get("event.name", "")
                out.append(
                    LogRecord(
                        trace_id=_hex(r.trace_id, 16, "traceId", required=False),
                        span_id=_hex(r.span_id, 8, "spanId", required=False),
                        time_ns=r.time_unix_nano or r.observed_time_unix_nano,
                        event_name=name if isinstance(name, str) else "",
                        body=_value(r.body) if r.HasField("body") else None,
                        attributes=attributes,
                    )
                )
    return out


def decode(kind: str, media_type: str, body: bytes) -> list[Span] | list[LogRecord]:
    """The spans (``kind`` ``traces``) or log records (``logs``) of a request body;
    :class:`OtlpDecodeError` for one that does not decode (answered 400)."""
    if media_type == JSON:
        return decode_traces(body) if kind == "traces" else decode_logs(body)
    message: Message
    if kind == "traces":
        message = trace_service_pb2.ExportTraceServiceRequest()
    else:
        message = logs_service_pb2.ExportLogsServiceRequest()
    try:
        message.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError):
        raise OtlpDecodeError("body is not a protobuf Export request") from None
    if isinstance(message, trace_service_pb2.ExportTraceServiceRequest):
        return _spans(message)
    assert isinstance(message, logs_service_pb2.ExportLogsServiceRequest)
    return _records(message)


def _encoded(message: Message, media_type: str) -> bytes:
    if media_type == JSON:
        return json.dumps(json_format.MessageToDict(message)).encode()
    serialized: bytes = message.SerializeToString()
    return serialized


def export_response(kind: str, media_type: str, rejected: int, error: str) -> bytes:
    """The ``Export…ServiceResponse`` of a request (``partial_success`` set when
    ``rejected`` items were refused, ``error`` saying why)."""
    response: Any
    if kind == "traces":
        response = trace_service_pb2.ExportTraceServiceResponse()
        if rejected or error:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = error
    else:
        response = logs_service_pb2.ExportLogsServiceResponse()
        if rejected or error:
            response.partial_success.rejected_log_records = rejected
            response.partial_success.error_message = error
    return _encoded(response, media_type)


def status_body(code: int, message: str, media_type: str) -> bytes:
    """A ``google.rpc.Status`` (the body of an error answer), in ``media_type``."""
    return _encoded(status_pb2.Status(code=code, message=message), media_type)
