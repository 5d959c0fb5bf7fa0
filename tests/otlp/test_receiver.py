"""The OTLP/HTTP answers of a running relmon: protobuf and JSON bodies, gzip, the
``partial_success`` counts, and 400, 413, 415, 429 as the specification says."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import aiohttp
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.apis_e2e.upstream import Upstream
from tests.otlp.harness import chat_attributes, otlp_relmon, spans_total
from tests.traces.otlp import log_record, logs_doc, span, traces_doc
from tests.waiting import wait_until

PB = "application/x-protobuf"
TRUNCATED = chat_attributes() | {"gen_ai.input.messages": '[{"role": "user", "parts": [{"ty'}


def _pb_value(v: object) -> common_pb2.AnyValue:
    if isinstance(v, str):
        return common_pb2.AnyValue(string_value=v)
    raise TypeError(type(v))


def _pb_request(*spans: tuple[str, str, dict[str, object]]) -> bytes:
    """An ExportTraceServiceRequest of (trace id, span id, attributes) spans."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for trace_id, span_id, attributes in spans:
        s = scope.spans.add(
            trace_id=bytes.fromhex(trace_id),
            span_id=bytes.fromhex(span_id),
            name="chat",
            start_time_unix_nano=1_732_000_000_000_000_000,
            kind=trace_pb2.Span.SPAN_KIND_CLIENT,
        )
        for key, val in attributes.items():
            s.attributes.add(key=key, value=_pb_value(val))
    return request.SerializeToString()


async def test_protobuf_and_gzipped_json_answer_in_kind_with_partial_success(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with otlp_relmon(tmp_path, upstream) as r, aiohttp.ClientSession() as http:
        body = _pb_request(
            ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", chat_attributes()),
            ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203332", TRUNCATED),
            ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203333", {"http.method": "GET"}),
        )
        headers = {"Content-Type": f"{PB}; charset=binary"}
        async with http.post(f"{r.url}/v1/traces", data=body, headers=headers) as resp:
            assert resp.status == 200
            assert resp.content_type == PB
            answer = trace_service_pb2.ExportTraceServiceResponse.FromString(await resp.read())
        assert answer.partial_success.rejected_spans == 1
        assert "truncated" in answer.partial_success.error_message
        doc = traces_doc(
            span(TRUNCATED, span_id="00000000000000a1"),
            span(TRUNCATED, span_id="00000000000000a2"),
            span(chat_attributes(), span_id="00000000000000a3"),
        )
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        data = gzip.compress(doc.encode())
        async with http.post(f"{r.url}/v1/traces", data=data, headers=headers) as resp:
            assert resp.status == 200
            assert resp.content_type == "application/json"
            partial = (await resp.json())["partialSuccess"]
        assert partial["rejectedSpans"] == "2"
        assert partial["errorMessage"] == "spans rejected, not monitored: 2 truncated"

        async def counted() -> bool:
            return spans_total(r, "genai", "read") == 2

        await wait_until(counted, timeout_s=10, what="both readable spans read")
        assert spans_total(r, "genai", "rejected") == 3
        assert spans_total(r, "other", "not_inference") == 1
        rejected = r.value("relmon_traffic_events_total", source="otlp", decision="rejected")
        assert rejected == 3


async def test_log_records_that_name_no_span_are_rejected_others_ignored(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with otlp_relmon(tmp_path, upstream) as r, aiohttp.ClientSession() as http:
        lost = log_record("gen_ai.user.message", {"content": "hi"})
        lost["spanId"] = ""
        plain = log_record("", "GET /health 200")
        request = logs_service_pb2.ExportLogsServiceRequest()
        request.resource_logs.add().scope_logs.add().log_records.add(event_name="gen_ai.choice")
        async with http.post(
            f"{r.url}/v1/logs", data=request.SerializeToString(), headers={"Content-Type": PB}
        ) as resp:
            assert resp.status == 200
            answer = logs_service_pb2.ExportLogsServiceResponse.FromString(await resp.read())
        assert answer.partial_success.rejected_log_records == 1
        async with http.post(
            f"{r.url}/v1/logs",
            data=logs_doc(lost, plain),
            headers={"Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["partialSuccess"]["rejectedLogRecords"] == "1"
        assert r.value("relmon_otlp_log_records_total", outcome="rejected") == 2
        assert r.value("relmon_otlp_log_records_total", outcome="ignored") == 1


async def test_undecodable_oversize_and_foreign_bodies(tmp_path: Path, upstream: Upstream) -> None:
    async with (
        otlp_relmon(tmp_path, upstream, max_body_bytes=4096) as r,
        aiohttp.ClientSession() as http,
    ):
        url = f"{r.url}/v1/traces"
        cases = [
            (b"\xff\xff\xff", {"Content-Type": PB}, 400),
            (b'{"resourceSpans": 3}', {"Content-Type": "application/json"}, 400),
            (b"not gzip", {"Content-Type": PB, "Content-Encoding": "gzip"}, 400),
            (b"x" * 5000, {"Content-Type": PB}, 413),
            # 4 KiB as sent, 1 MiB once gunzipped: refused on the decompressed size
            (
                gzip.compress(b"\0" * 1_048_576),
                {"Content-Type": PB, "Content-Encoding": "gzip"},
                413,
            ),
            (b"{}", {"Content-Type": "text/plain"}, 415),
            (b"{}", {"Content-Type": "application/json", "Content-Encoding": "br"}, 415),
        ]
        for data, headers, status in cases:
            async with http.post(url, data=data, headers=headers) as resp:
                assert resp.status == status, (headers, status, await resp.text())
                raw = await resp.read()
            if headers["Content-Type"] == PB:
                assert status_pb2.Status.FromString(raw).message
            elif headers["Content-Type"] == "application/json":
                assert json.loads(raw)["message"]
        assert (
            sum(
                spans_total(r, shape, outcome)
                for shape in ("genai", "other")
                for outcome in ("read", "rejected", "not_inference")
            )
            == 0
        )


async def test_a_full_queue_is_answered_429_with_retry_after(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with (
        otlp_relmon(tmp_path, upstream, queue_size=1, join_s=60) as r,
        aiohttp.ClientSession() as http,
    ):
        headers = {"Content-Type": "application/json"}
        first = traces_doc(span(chat_attributes(), span_id="00000000000000b1"))
        async with http.post(f"{r.url}/v1/traces", data=first, headers=headers) as resp:
            assert resp.status == 200
        second = traces_doc(
            span(chat_attributes(), span_id="00000000000000b2"),
            span({"http.method": "GET"}, span_id="00000000000000b3"),
        )
        async with http.post(f"{r.url}/v1/traces", data=second, headers=headers) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "2"
        # Not taken, not counted: the exporter sends the whole request again.
        assert spans_total(r, "other", "not_inference") == 0
        assert r.value("relmon_traffic_events_total", source="otlp", decision="dropped") == 0
        # Spans that are not inference spans need no room.
        only_other = traces_doc(span({"http.method": "GET"}, span_id="00000000000000b4"))
        async with http.post(f"{r.url}/v1/traces", data=only_other, headers=headers) as resp:
            assert resp.status == 200
        assert r.running.not_ready() == []
