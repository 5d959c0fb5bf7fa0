"""The OTLP JSON mapping decoded: lowerCamelCase and snake-case names, every AnyValue
kind, hex ids, and a clear ValueError for what does not decode."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from monitor.core.traces.otlp_json import (
    OtlpDecodeError,
    any_value,
    decode_logs,
    decode_resource_spans,
    decode_traces,
)
from monitor.core.traces.spans import LogRecord, Span, SpanEvent
from tests.traces.otlp import SPAN, TRACE, log_record, logs_doc, span, traces_doc


def test_a_span_with_its_resource_scope_and_events() -> None:
    event = {
        "timeUnixNano": "1732000000000000500",
        "name": "gen_ai.user.message",
        "attributes": [{"key": "content", "value": {"stringValue": "hi"}}],
    }
    doc = traces_doc(span({"gen_ai.request.model": "gpt-4o"}, events=[event]))
    [decoded] = decode_traces(doc)
    assert decoded == Span(
        trace_id=TRACE,
        span_id=SPAN,
        name="chat gpt-4o",
        start_ns=1732000000000000000,
        attributes={"gen_ai.request.model": "gpt-4o"},
        events=[SpanEvent("gen_ai.user.message", 1732000000000000500, {"content": "hi"})],
        resource={"service.name": "checkout"},
        scope="opentelemetry.instrumentation.openai_v2",
    )


def test_every_any_value_kind() -> None:
    raw: dict[str, Any] = {
        "s": {"stringValue": "x"},
        "b": {"boolValue": True},
        "i": {"intValue": "-42"},
        "j": {"intValue": 7},
        "d": {"doubleValue": 0.5},
        "n": {"doubleValue": "NaN"},
        "y": {"bytesValue": "aGk="},
        "e": {},
        "a": {"arrayValue": {"values": [{"stringValue": "p"}, {"intValue": "1"}]}},
        "k": {"kvlistValue": {"values": [{"key": "role", "value": {"stringValue": "user"}}]}},
    }
    got = {k: any_value(v) for k, v in raw.items()}
    nan = got.pop("n")
    assert isinstance(nan, float) and math.isnan(nan)
    assert got == {
        "s": "x",
        "b": True,
        "i": -42,
        "j": 7,
        "d": 0.5,
        "y": b"hi",
        "e": None,
        "a": ["p", 1],
        "k": {"role": "user"},
    }


def test_snake_case_names_and_upper_case_ids() -> None:
    doc = {
        "resource_spans": [
            {
                "scope_spans": [
                    {
                        "spans": [
                            {
                                "trace_id": TRACE.upper(),
                                "span_id": SPAN.upper(),
                                "name": "x",
                                "start_time_unix_nano": 5,
                                "attributes": [
                                    {"key": "k", "value": {"int_value": "3"}},
                                    {
                                        "key": "l",
                                        "value": {
                                            "array_value": {"values": [{"bool_value": False}]}
                                        },
                                    },
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    [decoded] = decode_traces(json.dumps(doc).encode())
    assert (decoded.trace_id, decoded.span_id, decoded.start_ns) == (TRACE, SPAN, 5)
    assert decoded.attributes == {"k": 3, "l": [False]}
    assert decoded.resource == {} and decoded.scope == ""


def test_one_resource_spans_as_kafka_carries_it() -> None:
    doc = json.loads(traces_doc(span({"a": "b"}), span({}, span_id="00f067aa0ba902b7")))
    spans = decode_resource_spans(doc["resourceSpans"][0])
    assert [s.span_id for s in spans] == [SPAN, "00f067aa0ba902b7"]


def test_log_records_event_name_from_the_field_or_the_attribute() -> None:
    old = log_record("", {"content": "hi"})
    old["attributes"].append({"key": "event.name", "value": {"stringValue": "gen_ai.user.message"}})
    del old["timeUnixNano"]
    old["observedTimeUnixNano"] = "99"
    records = decode_logs(logs_doc(log_record("gen_ai.choice", {"index": 0}), old))
    assert records[0] == LogRecord(
        TRACE, SPAN, 1732000000000000001, "gen_ai.choice", {"index": 0}, {"gen_ai.system": "openai"}
    )
    assert (records[1].event_name, records[1].time_ns, records[1].body) == (
        "gen_ai.user.message",
        99,
        {"content": "hi"},
    )


def test_a_record_without_ids_belongs_to_no_span() -> None:
    record = log_record("x", "text")
    del record["traceId"], record["spanId"]
    [decoded] = decode_logs(logs_doc(record))
    assert (decoded.trace_id, decoded.span_id, decoded.body) == ("", "", "text")


def test_an_empty_request_has_nothing() -> None:
    assert decode_traces("{}") == [] and decode_logs(b"{}") == []


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("not json", "not JSON"),
        ("[]", "body must be a JSON object"),
        ('{"resourceSpans": {}}', "resourceSpans must be a JSON array"),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "'
            + SPAN
            + '"}]}]}]}',
            "traceId must be 32 hex digits",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "' + TRACE + '"}]}]}]}',
            "spanId must be 16 hex digits",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
            + TRACE
            + '", "spanId": "'
            + SPAN
            + '", "startTimeUnixNano": "soon"}]}]}]}',
            "startTimeUnixNano must be an integer",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
            + TRACE
            + '", "spanId": "'
            + SPAN
            + '", "attributes": [{"key": 1}]}]}]}]}',
            "key must be a string",
        ),
        (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
            + TRACE
            + '", "spanId": "'
            + SPAN
            + '", "attributes": [{"key": "k", "value": {"bytesValue": "!!"}}]}]}]}]}',
            "base64",
        ),
    ],
)
def test_what_does_not_decode_says_why(doc: str, says: str) -> None:
    with pytest.raises(OtlpDecodeError, match=says) as caught:
        decode_traces(doc)
    assert isinstance(caught.value, ValueError)


def test_nesting_is_bounded() -> None:
    deep: dict[str, Any] = {"stringValue": "x"}
    for _ in range(40):
        deep = {"arrayValue": {"values": [deep]}}
    with pytest.raises(OtlpDecodeError, match="nests deeper"):
        any_value(deep)
