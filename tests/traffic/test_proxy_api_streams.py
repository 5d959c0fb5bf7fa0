"""The proxy conformance suite's streaming case for every wire API (tests/traffic/
test_proxy_conformance.py holds the rest, which no path changes): each API's own SSE
stream, as its SDK reads it, reaches the client event by event (each before the upstream
sent the next), and once it ended the event is offered with the answer read from that
stream, in its API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.apis_e2e import bodies
from tests.waiting import wait_until

from .conftest import Recorder, StartTraffic
from .raw_upstream import RawUpstream

ANSWER = "The capital is Paris."
MODEL = "m-1"
STREAMS: dict[str, tuple[str, dict[str, object], Iterator[bytes]]] = {
    "openai.chat": (
        "/v1/chat/completions",
        {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Capital?"}]},
        bodies.chat_sse(ANSWER, MODEL),
    ),
    "openai.responses": (
        "/v1/responses",
        {"model": MODEL, "stream": True, "input": "Capital?"},
        bodies.response_sse(ANSWER, MODEL),
    ),
    "anthropic.messages": (
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 9,
            "stream": True,
            "messages": [{"role": "user", "content": "Capital?"}],
        },
        bodies.message_sse(ANSWER, MODEL),
    ),
    "gemini.generate_content": (
        f"/v1beta/models/{MODEL}:streamGenerateContent",
        {"contents": [{"role": "user", "parts": [{"text": "Capital?"}]}]},
        bodies.gemini_sse(ANSWER, MODEL),
    ),
    "openai.completions": (
        "/v1/completions",
        {"model": MODEL, "stream": True, "prompt": "Capital?"},
        bodies.completion_sse(ANSWER, MODEL),
    ),
}


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    upstream = await RawUpstream().start()
    try:
        yield upstream
    finally:
        await upstream.stop()


@pytest.mark.parametrize("api", sorted(STREAMS))
async def test_each_apis_stream_is_relayed_event_by_event_and_read_once_it_ended(
    api: str, raw_upstream: RawUpstream, start_traffic: StartTraffic
) -> None:
    path, request, stream = STREAMS[api]
    events = list(stream)
    assert len(events) >= 3
    raw_upstream.sse_script[path] = events
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=raw_upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    body = json.dumps(request).encode()
    target = path + ("?alt=sse&key=prod-secret" if "generateContent" in path else "")
    head = f"POST {target} HTTP/1.1\r\nHost: relmon\r\nContent-Type: application/json\r\n"
    writer.write(head.encode() + b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    await reader.readuntil(b"\r\n\r\n")
    for i, event in enumerate(events):
        await raw_upstream.sse_step.put(None)  # the upstream sends one event, no more
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)).strip(), 16)
        assert await reader.readexactly(size + 2) == event + b"\r\n"
        assert raw_upstream.sse_sent == i + 1  # it came before the next was even sent
        if i < len(events) - 1:  # the upstream ends its answer right after the last one
            assert recorder.events == []  # sampled only once the answer is complete
    assert await reader.readuntil(b"\r\n\r\n") == b"0\r\n\r\n"
    writer.close()
    await wait_until(lambda: len(recorder.events) == 1, what="the event offered")
    event, source = recorder.events[0]
    assert (source, event.api, event.model, event.response_text) == ("proxy", api, MODEL, ANSWER)
    assert event.path == path and "prod-secret" not in repr(event)
    assert recorder.rejects == []
