"""Builders of OTLP JSON documents, as OpenTelemetry SDKs' JSON exporters write them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["SPAN", "TRACE", "attr", "kv", "log_record", "logs_doc", "span", "traces_doc", "value"]

TRACE = "5b8efff798038103d269b633813fc60c"
SPAN = "eee19b7ec3c1b174"


def value(v: Any) -> dict[str, Any]:
    """An AnyValue (an empty one for None)."""
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [value(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": [kv(k, x) for k, x in v.items()]}}
    raise TypeError(type(v))


def kv(key: str, v: Any) -> dict[str, Any]:
    return {"key": key, "value": value(v)}


def attr(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [kv(k, v) for k, v in attributes.items()]


def span(
    attributes: Mapping[str, Any],
    *,
    name: str = "chat gpt-4o",
    span_id: str = SPAN,
    trace_id: str = TRACE,
    events: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": "1732000000000000000",
        "endTimeUnixNano": "1732000001500000000",
        "attributes": attr(attributes),
        "events": events or [],
        "status": {},
    }


def traces_doc(*spans: dict[str, Any], service: str = "checkout") -> str:
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": attr({"service.name": service})},
                    "scopeSpans": [
                        {
                            "scope": {"name": "opentelemetry.instrumentation.openai_v2"},
                            "spans": list(spans),
                        }
                    ],
                }
            ]
        }
    )


def log_record(
    event_name: str, body: Any, *, span_id: str = SPAN, time_ns: int = 1
) -> dict[str, Any]:
    return {
        "timeUnixNano": str(1732000000000000000 + time_ns),
        "traceId": TRACE,
        "spanId": span_id,
        "eventName": event_name,
        "body": value(body),
        "attributes": attr({"gen_ai.system": "openai"}),
    }


def logs_doc(*records: dict[str, Any]) -> str:
    return json.dumps(
        {
            "resourceLogs": [
                {
                    "resource": {"attributes": attr({"service.name": "checkout"})},
                    "scopeLogs": [
                        {
                            "scope": {"name": "opentelemetry.instrumentation.openai_v2"},
                            "logRecords": list(records),
                        }
                    ],
                }
            ]
        }
    )
