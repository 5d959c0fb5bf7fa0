"""Spans from the official OpenTelemetry SDK and its OTLP/HTTP exporter, sent to a running
relmon whose task re-asks the upstream fixture: a review item scored with the span's
served answer, log records joined to their span, a span without content counted
unmonitored, a trace sampled whole, and every request forwarded byte for byte."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from monitor.core.review import ReviewItem
from monitor.core.sampler import sampled
from monitor.core.traces.sampling import trace_draw
from tests.apis_e2e.upstream import Upstream
from tests.otlp.harness import OtlpRelmon, chat_attributes, otlp_relmon, spans_total
from tests.ports import free_port
from tests.traces.otlp import log_record, logs_doc, span, traces_doc
from tests.waiting import wait_until

CHECKOUT = {"match": {"attributes": {"service.name": "checkout"}}}


def _export(
    url: str, spans: list[tuple[str, dict[str, Any]]], service: str = "checkout"
) -> list[str]:
    """Spans (name, attributes) made with the SDK under one agent span (one trace) and
    exported as each ends; the ids (trace-span) of the spans made."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
    tracer = provider.get_tracer("opentelemetry.instrumentation.openai_v2")
    ids = []
    try:
        with tracer.start_as_current_span("agent run"):
            for name, attributes in spans:
                with tracer.start_as_current_span(name, attributes=attributes) as s:
                    context = s.get_span_context()
                    ids.append(f"{context.trace_id:032x}-{context.span_id:016x}")
    finally:
        provider.shutdown()
    return ids


async def _item(r: OtlpRelmon, event_id: str) -> ReviewItem:
    found: list[ReviewItem] = []

    async def stored() -> bool:
        item = await r.running.store.get_review_item(f"chat:{event_id}")
        found.extend([item] if item is not None else [])
        return item is not None

    await wait_until(stored, timeout_s=30, what=f"review item of span {event_id}")
    return found[-1]


async def test_sdk_spans_become_scored_items_with_their_served_answer(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with otlp_relmon(tmp_path, upstream, task=CHECKOUT) as r:
        read, silent = await asyncio.to_thread(
            _export,
            r.url,
            [("chat gpt-4.1", chat_attributes()), ("chat gpt-4.1", chat_attributes(None))],
        )
        item = await _item(r, read)
        assert item.served_rank == 1  # the span's answer, and every re-ask agrees
        assert item.candidates[0][0].lower() == "rome"
        assert item.query.endswith("What is the capital of Italy?")
        reasks = upstream.received(key="task-key-chat-0001")
        assert reasks and all(q.body["model"] == "gpt-4.1" for q in reasks)

        async def counted() -> bool:  # the silent span waits join_s for log records first
            return spans_total(r, "genai", "no_content") == 1

        await wait_until(counted, timeout_s=30, what="the span without content counted")
        assert spans_total(r, "genai", "read") == 1
        assert spans_total(r, "other", "not_inference") == 1  # the agent's own span
        unmonitored = r.value("relmon_traffic_events_total", source="otlp", decision="unmonitored")
        assert unmonitored == 1
        assert await r.running.store.get_review_item(f"chat:{silent}") is None
        # Another service's spans match no task (match.attributes: service.name checkout).
        await asyncio.to_thread(_export, r.url, [("chat", chat_attributes())], "billing")

        async def skipped() -> bool:
            return r.value("relmon_traffic_events_total", source="otlp", decision="skipped") == 1

        await wait_until(skipped, timeout_s=10, what="the billing span skipped")


async def test_log_records_are_joined_to_their_span(tmp_path: Path, upstream: Upstream) -> None:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4.1",
    }
    async with otlp_relmon(tmp_path, upstream, join_s=1.0) as r, aiohttp.ClientSession() as http:
        records = logs_doc(
            log_record("gen_ai.user.message", {"content": "What is the capital of France?"}),
            log_record(
                "gen_ai.choice",
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "Paris"},
                },
                time_ns=2,
            ),
        )
        headers = {"Content-Type": "application/json"}
        async with http.post(f"{r.url}/v1/logs", data=records, headers=headers) as resp:
            assert resp.status == 200  # before their span: they wait for it
        async with http.post(
            f"{r.url}/v1/traces", data=traces_doc(span(attributes)), headers=headers
        ) as resp:
            assert resp.status == 200
        item = await _item(r, "5b8efff798038103d269b633813fc60c-eee19b7ec3c1b174")
        assert item.candidates[0][0].lower() == "paris"
        assert item.served_rank == 1
        assert r.value("relmon_otlp_log_records_total", outcome="taken") == 2
        assert r.value("relmon_otlp_log_records_total", outcome="dropped") == 0


async def test_a_trace_is_sampled_whole(tmp_path: Path, upstream: Upstream) -> None:
    rate = 0.5
    traces = [f"{i:04x}" + "9" * 28 for i in range(1, 9)]
    wanted = [t for t in traces if sampled("chat", trace_draw(t), rate)]
    assert 0 < len(wanted) < len(traces)  # both cases occur
    spans = [
        span(chat_attributes(), trace_id=t, span_id=f"{i:02x}{j:014x}")
        for i, t in enumerate(traces)
        for j in (1, 2)
    ]
    async with (
        otlp_relmon(tmp_path, upstream, task={"sampling_rate": rate}) as r,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(
            f"{r.url}/v1/traces",
            data=traces_doc(*spans),
            headers={"Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200

        async def decided() -> bool:
            events = [
                r.value("relmon_traffic_events_total", source="otlp", decision=d)
                for d in ("sampled", "skipped")
            ]
            return sum(events) == len(spans)

        await wait_until(decided, timeout_s=10, what="every span decided")
        assert r.value("relmon_traffic_events_total", source="otlp", decision="sampled") == 2 * len(
            wanted
        )
        for i, t in enumerate(traces):
            for j in (1, 2):
                event_id = f"{t}-{i:02x}{j:014x}"
                if t in wanted:
                    assert (await _item(r, event_id)).item_id == f"chat:{event_id}"
                else:
                    assert await r.running.store.get_review_item(f"chat:{event_id}") is None


async def test_forward_to_gets_the_exact_bytes_and_answers_the_client(
    tmp_path: Path, upstream: Upstream
) -> None:
    got: list[tuple[str, bytes, dict[str, str]]] = []

    async def collector(request: web.Request) -> web.Response:
        got.append((request.path, await request.read(), dict(request.headers)))
        return web.Response(status=202, body=b"collector says hi", content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/{kind}", collector)
    runner = web.AppRunner(app, auto_decompress=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with (
            otlp_relmon(tmp_path, upstream, forward_to=f"http://127.0.0.1:{port}") as r,
            aiohttp.ClientSession() as http,
        ):
            body = gzip.compress(traces_doc(span(chat_attributes())).encode())
            headers = {
                "Content-Type": "application/json; charset=utf-8",
                "Content-Encoding": "gzip",
            }
            async with http.post(f"{r.url}/v1/traces", data=body, headers=headers) as resp:
                assert resp.status == 202
                assert await resp.read() == b"collector says hi"
            async with http.post(
                f"{r.url}/v1/logs",
                data=b"\x00junk",
                headers={"Content-Type": "application/x-protobuf"},
            ) as resp:
                assert resp.status == 202  # the collector's answer, not relmon's 400
            [(path, raw, sent), (logs_path, junk, _)] = got
            assert (path, raw, logs_path, junk) == ("/v1/traces", body, "/v1/logs", b"\x00junk")
            assert sent["Content-Type"] == headers["Content-Type"]
            assert sent["Content-Encoding"] == "gzip"
            await _item(r, "5b8efff798038103d269b633813fc60c-eee19b7ec3c1b174")  # read all the same
    finally:
        await runner.cleanup()
