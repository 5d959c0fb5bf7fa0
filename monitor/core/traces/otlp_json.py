"""The OTLP JSON mapping of ``ExportTraceServiceRequest`` and ``ExportLogsServiceRequest``
decoded into :mod:`.spans`' dataclasses. No I/O.

The mapping is protobuf's JSON form with OTLP's exceptions: trace and span ids are hex,
not base64; enum values are integers. Field names are lowerCamelCase
(``resourceSpans``), and the snake-case proto names (``resource_spans``) are accepted
too, as protobuf JSON parsers accept them. 64-bit integers (``startTimeUnixNano``,
``intValue``) come as decimal strings or numbers. Anything that does not fit raises
:class:`OtlpDecodeError` (a :class:`ValueError`) saying where: the receiver answers 400.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from monitor.core.errors import InputError
from monitor.core.traces.spans import LogRecord, Span, SpanEvent

__all__ = [
    "OtlpDecodeError",
    "any_value",
    "decode_logs",
    "decode_resource_spans",
    "decode_traces",
]

_T = TypeVar("_T")
_HEX: Final = re.compile(r"[0-9a-fA-F]*")
_MAX_DEPTH: Final = 32
"""How deep ``arrayValue`` / ``kvlistValue`` may nest before the body is refused."""


class OtlpDecodeError(InputError):
    """An OTLP JSON body that does not decode (HTTP 400)."""


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` (lowerCamelCase) or its snake-case spelling; None when absent."""
    value = obj.get(name)
    return obj.get(_snake(name)) if value is None else value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise OtlpDecodeError(f"{where} must be a JSON object")
    return value


def _list(obj: Mapping[str, Any], name: str, where: str) -> list[Any]:
    value = _field(obj, name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpDecodeError(f"{where}.{name} must be a JSON array")
    return value


def _uint(value: Any, where: str) -> int:
    """A 64-bit integer as the mapping writes it (string or number); 0 when absent."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise OtlpDecodeError(f"{where} must be an integer or a decimal string")
    try:
        number = int(value)
    except ValueError:
        raise OtlpDecodeError(f"{where} must be an integer or a decimal string") from None
    if not -(2**63) <= number < 2**64:
        raise OtlpDecodeError(f"{where} is out of the 64-bit range")
    return number


def _hex_id(value: Any, digits: int, where: str, *, required: bool) -> str:
    """A hex id of ``digits`` digits, lower-cased; ``""`` when absent and not required."""
    if value in (None, "") and not required:
        return ""
    if not isinstance(value, str) or len(value) != digits or not _HEX.fullmatch(value):
        raise OtlpDecodeError(f"{where} must be {digits} hex digits")
    return value.lower()


def _double(value: Any, where: str) -> float:
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise OtlpDecodeError(f"{where}.doubleValue must be a number")
    try:
        number = float(value)
    except ValueError:
        raise OtlpDecodeError(f"{where}.doubleValue must be a number") from None
    if isinstance(value, str) and math.isnan(number):
        raise OtlpDecodeError(f"{where}.doubleValue must be a number")
    return number


def any_value(value: Any, where: str = "value", depth: int = 0) -> object:
    """One ``AnyValue`` as plain Python (see :mod:`.spans`); None for an empty one."""
    if depth > _MAX_DEPTH:
        raise OtlpDecodeError(f"{where} nests deeper than {_MAX_DEPTH} levels")
    if value is None:
        return None
    obj = _object(value, where)
    if (text := _field(obj, "stringValue")) is not None:
        if not isinstance(text, str):
            raise OtlpDecodeError(f"{where}.stringValue must be a string")
        return text
    if (flag := _field(obj, "boolValue")) is not None:
        if not isinstance(flag, bool):
            raise OtlpDecodeError(f"{where}.boolValue must be true or false")
        return flag
    if (number := _field(obj, "intValue")) is not None:
        return _uint(number, f"{where}.intValue")
    if (double := _field(obj, "doubleValue")) is not None:
        return _double(double, where)
    if (array := _field(obj, "arrayValue")) is not None:
        items = _list(_object(array, f"{where}.arrayValue"), "values", f"{where}.arrayValue")
        return [any_value(v, f"{where}.arrayValue.values[]", depth + 1) for v in items]
    if (kvlist := _field(obj, "kvlistValue")) is not None:
        pairs = _list(_object(kvlist, f"{where}.kvlistValue"), "values", f"{where}.kvlistValue")
        return _attributes(pairs, f"{where}.kvlistValue", depth + 1)
    if (raw := _field(obj, "bytesValue")) is not None:
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise OtlpDecodeError(f"{where}.bytesValue must be base64") from None
    return None


def _attributes(pairs: list[Any], where: str, depth: int = 0) -> dict[str, object]:
    """A list of ``KeyValue`` as a dict (a repeated key: the last one wins)."""
    out: dict[str, object] = {}
    for pair in pairs:
        obj = _object(pair, f"{where}[]")
        key = obj.get("key")
        if not isinstance(key, str):
            raise OtlpDecodeError(f"{where}[].key must be a string")
        out[key] = any_value(obj.get("value"), f"{where}[{key!r}]", depth)
    return out


def _attrs_of(obj: Mapping[str, Any], where: str) -> dict[str, object]:
    return _attributes(_list(obj, "attributes", where), f"{where}.attributes")


def _event(value: Any, where: str) -> SpanEvent:
    obj = _object(value, where)
    name = obj.get("name", "")
    if not isinstance(name, str):
        raise OtlpDecodeError(f"{where}.name must be a string")
    time_ns = _uint(_field(obj, "timeUnixNano"), f"{where}.timeUnixNano")
    return SpanEvent(name=name, time_ns=time_ns, attributes=_attrs_of(obj, where))


def _span(value: Any, where: str, resource: dict[str, object], scope: str) -> Span:
    obj = _object(value, where)
    name = obj.get("name", "")
    if not isinstance(name, str):
        raise OtlpDecodeError(f"{where}.name must be a string")
    events = _list(obj, "events", where)
    return Span(
        trace_id=_hex_id(_field(obj, "traceId"), 32, f"{where}.traceId", required=True),
        span_id=_hex_id(_field(obj, "spanId"), 16, f"{where}.spanId", required=True),
        name=name,
        start_ns=_uint(_field(obj, "startTimeUnixNano"), f"{where}.startTimeUnixNano"),
        attributes=_attrs_of(obj, where),
        events=[_event(e, f"{where}.events[{i}]") for i, e in enumerate(events)],
        resource=resource,
        scope=scope,
    )


def _log(value: Any, where: str, resource: dict[str, object], scope: str) -> LogRecord:
    obj = _object(value, where)
    attributes = _attrs_of(obj, where)
    name = _field(obj, "eventName")
    if name in (None, ""):
        name = attributes.get("event.name", "")
    if not isinstance(name, str):
        raise OtlpDecodeError(f"{where}.eventName must be a string")
    time_ns = _uint(_field(obj, "timeUnixNano"), f"{where}.timeUnixNano")
    if time_ns == 0:
        time_ns = _uint(_field(obj, "observedTimeUnixNano"), f"{where}.observedTimeUnixNano")
    return LogRecord(
        trace_id=_hex_id(_field(obj, "traceId"), 32, f"{where}.traceId", required=False),
        span_id=_hex_id(_field(obj, "spanId"), 16, f"{where}.spanId", required=False),
        time_ns=time_ns,
        event_name=name,
        body=any_value(obj.get("body"), f"{where}.body"),
        attributes=attributes,
    )


def _document(doc: bytes | str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(doc, Mapping):
        return doc
    try:
        parsed = json.loads(doc)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, deep nesting
        raise OtlpDecodeError(f"body is not JSON: {getattr(exc, 'msg', 'not UTF-8')}") from None
    return _object(parsed, "body")


def _scoped(
    resource_obj: Any,
    where: str,
    scopes: str,
    items: str,
    read: Callable[[Any, str, dict[str, object], str], _T],
) -> list[_T]:
    """The items of one ``ResourceSpans`` / ``ResourceLogs``, each with its resource's
    attributes and its scope's name."""
    obj = _object(resource_obj, where)
    resource_value = obj.get("resource")
    resource = {} if resource_value is None else _attrs_of(_object(resource_value, where), where)
    out: list[_T] = []
    for i, scoped in enumerate(_list(obj, scopes, where)):
        at = f"{where}.{scopes}[{i}]"
        scoped_obj = _object(scoped, at)
        scope_value = scoped_obj.get("scope")
        scope_name = _object(scope_value, at).get("name", "") if scope_value is not None else ""
        scope = scope_name if isinstance(scope_name, str) else ""
        entries = _list(scoped_obj, items, at)
        out.extend(read(e, f"{at}.{items}[{j}]", resource, scope) for j, e in enumerate(entries))
    return out


def decode_resource_spans(resource_spans: Any, where: str = "resourceSpans[0]") -> list[Span]:
    """The spans of one ``ResourceSpans`` (a parsed JSON object)."""
    return _scoped(resource_spans, where, "scopeSpans", "spans", _span)


def decode_traces(doc: bytes | str | Mapping[str, Any]) -> list[Span]:
    """Every span of an ``ExportTraceServiceRequest`` (its JSON text, or parsed)."""
    body = _document(doc)
    spans: list[Span] = []
    for i, resource_spans in enumerate(_list(body, "resourceSpans", "body")):
        spans.extend(decode_resource_spans(resource_spans, f"resourceSpans[{i}]"))
    return spans


def decode_logs(doc: bytes | str | Mapping[str, Any]) -> list[LogRecord]:
    """Every log record of an ``ExportLogsServiceRequest`` (its JSON text, or parsed)."""
    body = _document(doc)
    records: list[LogRecord] = []
    for i, resource_logs in enumerate(_list(body, "resourceLogs", "body")):
        where = f"resourceLogs[{i}]"
        records.extend(_scoped(resource_logs, where, "scopeLogs", "logRecords", _log))
    return records
