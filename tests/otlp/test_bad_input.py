"""Bad input through a running relmon's OTLP receiver: bodies cut short or of garbage
(400), another content type (415), a gzip bomb (413, never inflated past
``max_body_bytes``), one request of 10,000 spans (taken or refused as the queue bound says,
while other requests are answered), an attribute of megabytes, and messages of another
schema (rejected, counted, in the ``partial_success``). Every refusal is counted."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import time
import tracemalloc
from pathlib import Path

import aiohttp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.apis_e2e.upstream import Upstream
from tests.otlp.harness import OtlpRelmon, chat_attributes, otlp_relmon, spans_total
from tests.traces.otlp import span, traces_doc
from tests.waiting import wait_until

PB = "application/x-protobuf"
JSON = "application/json"


def _refused(r: OtlpRelmon, status: int) -> float:
    return r.value("relmon_otlp_requests_refused_total", status=str(status))


async def post(r: OtlpRelmon, http: aiohttp.ClientSession, data: object, media: str) -> int:
    async with http.post(f"{r.url}/v1/traces", data=data, headers={"Content-Type": media}) as resp:
        return resp.status


def _pb_request(count: int, attributes: dict[str, str]) -> bytes:
    """An ExportTraceServiceRequest of ``count`` spans of one trace."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(count):
        s = scope.spans.add(
            trace_id=bytes.fromhex("0af7651916cd43dd8448eb211c80319c"),
            span_id=(i + 1).to_bytes(8, "big"),
            name="chat",
            start_time_unix_nano=1_732_000_000_000_000_000,
        )
        for key, val in attributes.items():
            s.attributes.add(key=key).value.string_value = val
    body: bytes = request.SerializeToString()
    return body


async def test_cut_garbage_and_foreign_content_types_are_refused_and_counted(
    tmp_path: Path, upstream: Upstream
) -> None:
    whole = _pb_request(1, chat_attributes())
    cases = [
        (whole[: len(whole) // 2], {"Content-Type": PB}, 400),
        (b"\x00\x01garbage\xff\xfe" * 64, {"Content-Type": PB}, 400),
        (b"\x89PNG\r\n\x1a\n\x00\x00", {"Content-Type": JSON}, 400),
        (gzip.compress(whole)[:-12], {"Content-Type": PB, "Content-Encoding": "gzip"}, 400),
        (whole, {"Content-Type": "text/plain"}, 415),
        (whole, {"Content-Type": "application/grpc"}, 415),
        (whole, {"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ]
    async with otlp_relmon(tmp_path, upstream) as r, aiohttp.ClientSession() as http:
        assert _refused(r, 400) == 0 and _refused(r, 415) == 0  # at 0 from the start
        for data, headers, status in cases:
            async with http.post(f"{r.url}/v1/traces", data=data, headers=headers) as resp:
                assert resp.status == status, (headers, await resp.text())
        async with http.post(
            f"{r.url}/v1/logs", data=whole[:7], headers={"Content-Type": PB}
        ) as resp:
            assert resp.status == 400
        assert _refused(r, 400) == 5
        assert _refused(r, 415) == 3
        assert spans_total(r, "genai", "read") == 0  # nothing of a refused body is read


def _gzip_bomb(size: int) -> bytes:
    """``size`` zero bytes gzipped: about a thousandth of that as sent."""
    out = io.BytesIO()  # streamed: the test never holds ``size`` bytes itself
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as z:
        chunk = bytes(1 << 20)
        for _ in range(size >> 20):
            z.write(chunk)
    return out.getvalue()


async def test_a_gzip_bomb_is_refused_413_without_being_inflated(
    tmp_path: Path, upstream: Upstream
) -> None:
    bomb = _gzip_bomb(256 << 20)
    limit = 1 << 20
    assert len(bomb) < limit  # small as sent: only its inflated size is over the limit
    headers = {"Content-Type": PB, "Content-Encoding": "gzip"}
    async with (
        otlp_relmon(tmp_path, upstream, max_body_bytes=limit) as r,
        aiohttp.ClientSession() as http,
    ):
        tracemalloc.start()
        try:
            async with http.post(
                f"{r.url}/v1/traces", data=io.BytesIO(bomb), headers=headers
            ) as resp:
                assert resp.status == 413
                assert "gunzipped" in await resp.text()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # Inflated up to the limit and no further (256 MiB if it were inflated whole).
        assert peak < 16 * limit, peak
        assert _refused(r, 413) == 1


async def test_ten_thousand_spans_in_one_request_never_stall_the_receiver(
    tmp_path: Path, upstream: Upstream
) -> None:
    many = _pb_request(10_000, chat_attributes())
    small = traces_doc(span({"http.method": "GET"}, span_id="00000000000000c1"))
    async with (
        otlp_relmon(tmp_path, upstream, queue_size=15_000, join_s=60) as r,
        aiohttp.ClientSession() as http,
    ):
        began = time.monotonic()
        big = asyncio.create_task(post(r, http, io.BytesIO(many), PB))
        waits: list[float] = []
        while not big.done():  # small requests, one after another, while it is read
            started = time.monotonic()
            assert await post(r, http, small, JSON) == 200
            waits.append(time.monotonic() - started)
        assert await big == 200
        took = time.monotonic() - began
        # Each answered in a fraction of the big one's time: none waited for its reading
        # (read on the event loop, the one small request sent meanwhile waits it all;
        # what is left is a pause of the garbage collector, for the 10,000 spans' objects).
        assert len(waits) >= 5 and max(waits) < took / 2, (took, waits)
        assert spans_total(r, "other", "not_inference") == len(waits)
        # All 10,000 held for their log records, then the next request refused: no room.
        async with http.post(
            f"{r.url}/v1/traces", data=io.BytesIO(many), headers={"Content-Type": PB}
        ) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"]
        assert _refused(r, 429) == 1


async def test_an_attribute_of_megabytes_within_the_limit_is_read(
    tmp_path: Path, upstream: Upstream
) -> None:
    question = "What is the capital of Italy? " + "Context. " * 400_000  # 3.6 MB
    doc = traces_doc(span(chat_attributes(question), span_id="00000000000000d1"))
    assert 3_000_000 < len(doc) < 8_388_608
    async with otlp_relmon(tmp_path, upstream) as r, aiohttp.ClientSession() as http:
        headers = {"Content-Type": JSON}
        async with http.post(
            f"{r.url}/v1/traces", data=io.BytesIO(doc.encode()), headers=headers
        ) as resp:
            assert resp.status == 200
            assert "partialSuccess" not in await resp.json()

        async def read() -> bool:
            return spans_total(r, "genai", "read") == 1

        await wait_until(read, timeout_s=10, what="the span of megabytes read")
        assert sum(_refused(r, s) for s in (400, 413, 415, 429, 503)) == 0


async def test_messages_of_another_schema_are_rejected_counted_and_said(
    tmp_path: Path, upstream: Upstream
) -> None:
    foreign = [
        chat_attributes() | {"gen_ai.input.messages": json.dumps({"prompt": "hi"})},
        chat_attributes() | {"gen_ai.input.messages": json.dumps([{"speaker": "u", "x": 1}])},
        chat_attributes() | {"gen_ai.output.messages": json.dumps("Rome")},
    ]
    doc = traces_doc(*(span(a, span_id=f"00000000000000e{i}") for i, a in enumerate(foreign)))
    async with otlp_relmon(tmp_path, upstream) as r, aiohttp.ClientSession() as http:
        async with http.post(
            f"{r.url}/v1/traces", data=doc, headers={"Content-Type": JSON}
        ) as resp:
            assert resp.status == 200
            partial = (await resp.json())["partialSuccess"]
        assert partial["rejectedSpans"] == "3"
        assert partial["errorMessage"] == "spans rejected, not monitored: 3 foreign"
        assert spans_total(r, "genai", "rejected") == 3
        assert spans_total(r, "genai", "read") == 0
        rejected = r.value("relmon_traffic_events_total", source="otlp", decision="rejected")
        assert rejected == 3
