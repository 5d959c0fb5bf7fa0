"""The traffic endpoint against real servers and clients on 127.0.0.1.

Mirror: 202 before any parsing (proved with a sink that waits for the client to have its
answer), bad bodies counted but still 202 (the mirror never disturbs the live path),
oversize refused with 413. Proxy: byte-identical pass-through, SSE relayed as it
arrives, sampling after completion, 502/504 for a dead or slow upstream.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
import urllib.request
from collections.abc import AsyncIterator

import aiohttp
import pytest
from yarl import URL

from adapters.traffic.traffic import (
    LISTEN_BACKLOG,
    TrafficServer,
    header_task_resolver,
    is_chat_completions_path,
    json_response_text,
    sse_response_text,
)
from monitor.core.errors import ConfigError
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission
from tests.waiting import wait_until

from .conftest import (
    BIG_ANSWER,
    BIG_COMPLETION_BYTES,
    COMPLETION_BYTES,
    SSE_DELTAS,
    Recorder,
    StartTraffic,
    Upstream,
    sse_chunks,
)

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "What is 6*7?"}]}


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


# -- mirror ------------------------------------------------------------------------------


async def test_mirror_answers_before_the_sink_is_called(start_traffic: StartTraffic) -> None:
    # The sink blocks (on purpose, against its contract) until a client in another
    # thread has read its 202. If the server answered only after offering the event,
    # the sink would wait out its 30 s and record False.
    client_has_answer = threading.Event()
    seen: list[tuple[TrafficEvent, bool]] = []

    def blocking_sink(event: TrafficEvent, source: str) -> Admission:
        seen.append((event, client_has_answer.wait(timeout=30)))
        return Admission("sampled")

    recorder = Recorder()
    server = await start_traffic("mirror", recorder, sink=blocking_sink)

    def post() -> tuple[int, bytes]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.bound_port}/v1/chat/completions",
            data=json.dumps(CHAT).encode(),
            headers={"Content-Type": "application/json", "X-Request-Id": "req-1"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            status, body = response.status, response.read()
        client_has_answer.set()
        return status, body

    status, body = await asyncio.to_thread(post)
    assert (status, json.loads(body)) == (202, {"status": "accepted"})
    await wait_until(lambda: len(seen) == 1, what="the event at the sink")
    event, answered_first = seen[0]
    assert answered_first, "the mirror waited for the sink before answering"
    assert event.id == "req-1" and event.model == "m1" and event.response_text is None
    assert recorder.rejects == []


async def test_mirror_event_fields_request_id_and_task(
    start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("mirror", recorder)
    base = f"http://127.0.0.1:{server.bound_port}"
    headers = {"X-Request-Id": "abc-123", "X-Relmon-Task": "triage"}
    async with client.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers) as r:
        assert r.status == 202
    async with client.post(f"{base}/openai/v1/chat/completions", json=CHAT) as r:
        assert r.status == 202
    await wait_until(lambda: len(recorder.events) == 2, what="2 events at the sink")
    (first, source1), (second, source2) = recorder.events
    assert (source1, source2) == ("mirror", "mirror")
    assert (first.id, first.task, first.model) == ("abc-123", "triage", "m1")
    assert first.request["messages"] == CHAT["messages"]
    assert second.task is None
    assert len(second.id) == 32 and int(second.id, 16) >= 0  # a uuid4 when no X-Request-Id
    assert recorder.rejects == []


async def test_mirror_takes_a_logged_response_from_the_body(
    start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("mirror", recorder)
    body = CHAT | {"response": {"choices": [{"message": {"content": "42"}}]}}
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    async with client.post(url, json=body) as r:
        assert r.status == 202
    await wait_until(lambda: len(recorder.events) == 1, what="the event at the sink")
    event = recorder.events[0][0]
    assert event.response_text == "42"
    assert "response" not in event.request


@pytest.mark.parametrize(
    ("body", "reason_part"),
    [
        (b"{not json", "invalid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"model": "m1"}).encode(), "messages"),
        (json.dumps({"messages": CHAT["messages"]}).encode(), "model"),
        (json.dumps(CHAT | {"response": {"choices": []}}).encode(), "response"),
    ],
)
async def test_mirror_counts_malformed_bodies_and_still_answers_202(
    start_traffic: StartTraffic, client: aiohttp.ClientSession, body: bytes, reason_part: str
) -> None:
    recorder = Recorder()
    server = await start_traffic("mirror", recorder)
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    async with client.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 202  # the mirror must never feed an error back to the live path
    await wait_until(lambda: len(recorder.rejects) == 1, what="the rejection to be counted")
    source, reason = recorder.rejects[0]
    assert source == "mirror" and reason_part in reason
    assert "6*7" not in reason  # no prompt text in reasons
    assert recorder.events == []


async def test_mirror_refuses_oversize_bodies_with_413(
    start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("mirror", recorder, max_body_bytes=1000)
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    big = json.dumps(CHAT | {"padding": "x" * 2000}).encode()

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: caught while reading
        for i in range(0, len(big), 300):
            yield big[i : i + 300]

    for data in (big, chunked()):
        async with client.post(url, data=data) as r:
            assert r.status == 413
            assert "error" in await r.json()
    assert recorder.rejects == [("mirror", "oversize"), ("mirror", "oversize")]
    async with client.post(url, json=CHAT) as r:  # a body under the limit still works
        assert r.status == 202
    await wait_until(lambda: len(recorder.events) == 1, what="the event at the sink")


async def test_mirror_only_takes_chat_completions(
    start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("mirror", recorder)
    base = f"http://127.0.0.1:{server.bound_port}"
    async with client.get(f"{base}/v1/chat/completions") as r:
        assert r.status == 404
    async with client.post(f"{base}/v1/embeddings", json=CHAT) as r:
        assert r.status == 404
    assert recorder.events == [] and recorder.rejects == []


@pytest.mark.integration  # reads the listen queue with iproute2's ss
async def test_the_traffic_port_queues_a_burst_of_connections(start_traffic: StartTraffic) -> None:
    """A mirror opens a connection per copy when its pool is busy: the listen queue holds
    LISTEN_BACKLOG of them (aiohttp's default 128 dropped SYNs after a stall).
    ``ss`` shows a listening socket's queue limit as its Send-Q."""
    import subprocess
    from pathlib import Path

    server = await start_traffic("mirror", Recorder())
    listed = await asyncio.to_thread(
        subprocess.run,
        ["ss", "-Hltn", f"sport = :{server.bound_port}"],
        capture_output=True,
        text=True,
        check=True,
    )
    somaxconn = await asyncio.to_thread(Path("/proc/sys/net/core/somaxconn").read_text)
    assert int(listed.stdout.split()[2]) == min(LISTEN_BACKLOG, int(somaxconn)) > 128


def test_header_task_resolver() -> None:
    free = header_task_resolver("X-Task")
    assert free({"X-Task": " qa "}, "/", {}) == "qa"
    assert free({}, "/", {}) is None
    strict = header_task_resolver("X-Task", default="general", allowed={"qa", "triage"})
    assert strict({"X-Task": "triage"}, "/", {}) == "triage"
    assert strict({"X-Task": "made-up"}, "/", {}) == "general"
    assert strict({}, "/", {}) == "general"


def test_chat_completions_paths() -> None:
    assert is_chat_completions_path("/v1/chat/completions")
    assert is_chat_completions_path("/openai/deployments/gpt/chat/completions")
    assert not is_chat_completions_path("/v1/completions")
    assert not is_chat_completions_path("/v1/chat/completionsx")


# -- proxy -------------------------------------------------------------------------------


async def test_proxy_passes_json_through_unchanged_and_samples_after(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url)
    headers = {
        "Authorization": "Bearer sk-test",
        "X-Custom": "kept",
        "X-Request-Id": "px-1",
        "X-Relmon-Task": "qa",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "dropped",
    }
    async with client.post(f"{upstream.url}/v1/chat/completions", json=CHAT) as r:
        direct = (r.status, await r.read(), [(k, v) for k, v in r.headers.items() if k != "Date"])
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    async with client.post(url, json=CHAT, headers=headers) as r:
        proxied = (r.status, await r.read(), [(k, v) for k, v in r.headers.items() if k != "Date"])
        assert "Date" in r.headers
    assert proxied == direct  # status, body and every header (order included)
    status, body, resp_headers = proxied
    assert (status, body) == (200, COMPLETION_BYTES)
    assert ("X-Upstream", "yes") in resp_headers and ("Set-Cookie", "a=1") in resp_headers
    upstream.requests.pop(0)
    seen = upstream.requests[0]["headers"]
    assert seen["Authorization"] == "Bearer sk-test" and seen["X-Custom"] == "kept"
    assert "X-Hop" not in seen
    assert seen["Host"] == upstream.url.removeprefix("http://")
    assert json.loads(upstream.requests[0]["body"]) == CHAT
    await wait_until(lambda: len(recorder.events) == 1, what="the event at the sink")
    event, source = recorder.events[0]
    assert source == "proxy"
    assert (event.id, event.task, event.response_text) == ("px-1", "qa", "The answer is 42.")


async def test_proxy_forwards_any_method_path_and_query(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url + "/echo")
    base = f"http://127.0.0.1:{server.bound_port}"
    raw = URL(f"{base}/v1/models?limit=5&q=a%2Fb", encoded=True)  # sent exactly as written
    async with client.get(raw) as r:
        assert (r.status, r.reason) == (201, "Made It")
        expected = {"method": "GET", "path_qs": "/echo/v1/models?limit=5&q=a%2Fb", "size": 0}
        assert await r.json() == expected
    async with client.delete(f"{base}/v1/files/f1", data=b"x" * 5000) as r:
        assert (await r.json())["size"] == 5000
    async with client.head(f"{base}/v1/models") as r:
        assert r.status == 201 and int(r.headers["Content-Length"]) > 0
        assert await r.read() == b""
    assert recorder.events == [] and recorder.rejects == []


async def test_proxy_forwards_oversize_requests_without_sampling_them(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic(
        "proxy", recorder, upstream_url=upstream.url + "/echo", max_body_bytes=1000
    )
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    big = json.dumps(CHAT | {"padding": "x" * 5000}).encode()

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 700):
            yield big[i : i + 700]

    for data in (big, chunked()):
        async with client.post(url, data=data, headers={"Expect": "100-continue"}) as r:
            assert (r.status, (await r.json())["size"]) == (201, len(big))
    assert [req["body"] for req in upstream.requests] == [big, big]
    assert "Content-Length" in upstream.requests[0]["headers"]  # framing kept as sent
    assert "Content-Length" not in upstream.requests[1]["headers"]
    assert recorder.rejects == [("proxy", "oversize"), ("proxy", "oversize")]
    assert recorder.events == []


async def test_proxy_streams_sse_as_it_arrives(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url)
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    received = bytearray()
    async with client.post(url, json=CHAT | {"stream": True}) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream"
        assert r.headers["X-Upstream"] == "sse"
        # The upstream holds its tail until released: a buffering proxy would never
        # deliver this first chunk and the read would time out.
        received += await asyncio.wait_for(r.content.readany(), timeout=30)
        assert received == sse_chunks()[0]
        assert upstream.sent_chunks == 1 and not upstream.stream_done
        assert recorder.events == []  # nothing is sampled before the response completes
        upstream.release.set()
        async for chunk in r.content.iter_any():
            received += chunk
    assert bytes(received) == b"".join(sse_chunks())
    await wait_until(lambda: len(recorder.events) == 1, what="the event at the sink")
    event = recorder.events[0][0]
    assert event.response_text == "".join(SSE_DELTAS)
    assert event.request["stream"] is True


async def test_proxy_streams_large_bodies_and_still_samples_them(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    assert len(BIG_COMPLETION_BYTES) > 200_000  # above the size sent in one piece
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url)
    url = f"http://127.0.0.1:{server.bound_port}/big/v1/chat/completions"
    async with client.post(url, json=CHAT) as r:
        assert r.headers["Content-Length"] == str(len(BIG_COMPLETION_BYTES))
        assert await r.read() == BIG_COMPLETION_BYTES
    await wait_until(lambda: len(recorder.events) == 1, what="the event at the sink")
    assert recorder.events[0][0].response_text == BIG_ANSWER


async def test_proxy_relays_compressed_bodies_untouched(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url)
    url = f"http://127.0.0.1:{server.bound_port}/gz/v1/chat/completions"
    async with client.post(url, json=CHAT, headers={"Accept-Encoding": "gzip"}) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        body = await r.read()
    assert gzip.decompress(body) == COMPLETION_BYTES
    await wait_until(lambda: len(recorder.events) == 1, what="the event at the sink")
    assert recorder.events[0][0].response_text == "The answer is 42."


async def test_proxy_passes_upstream_errors_and_does_not_sample_them(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url)
    url = f"http://127.0.0.1:{server.bound_port}/bad/v1/chat/completions"
    async with client.post(url, json=CHAT) as r:
        assert r.status == 400
        assert await r.json() == {"error": {"message": "no such model"}}
    await _sampled_marker(client, server, recorder)
    assert recorder.rejects == []  # the error was neither sampled nor counted


async def _sampled_marker(
    client: aiohttp.ClientSession, server: TrafficServer, recorder: Recorder
) -> None:
    """A barrier: a good chat request through the same proxy, waited for at the sink.
    Anything the requests before it were going to offer would have come first: it must
    be the only event."""
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    async with client.post(url, json=CHAT, headers={"X-Request-Id": "marker"}) as r:
        assert (r.status, await r.read()) == (200, COMPLETION_BYTES)
    await wait_until(lambda: len(recorder.events) >= 1, what="the marker at the sink")
    assert [event.id for event, _ in recorder.events] == ["marker"]


async def test_proxy_counts_unparseable_chat_requests(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url + "/echo")
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    async with client.post(url, data=b"{broken") as r:
        assert r.status == 201  # forwarded all the same
    await wait_until(lambda: len(recorder.rejects) == 1, what="the rejection to be counted")
    assert recorder.rejects == [("proxy", "invalid JSON")]


async def test_proxy_survives_a_raising_sink(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder(raise_in_sink=True)
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url)
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    for _ in range(2):
        async with client.post(url, json=CHAT) as r:
            assert (r.status, await r.read()) == (200, COMPLETION_BYTES)
    await wait_until(lambda: len(recorder.events) == 2, what="2 events at the sink")


async def test_proxy_answers_502_when_upstream_is_down(
    start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=f"http://127.0.0.1:{dead}")
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    async with client.post(url, json=CHAT) as r:
        assert r.status == 502
        assert "unreachable" in (await r.json())["error"]["message"]
    assert recorder.events == []


async def test_proxy_answers_504_when_upstream_is_too_slow(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic(
        "proxy", recorder, upstream_url=upstream.url, upstream_timeout_s=0.3
    )
    url = f"http://127.0.0.1:{server.bound_port}/slow/v1/chat/completions"
    started = time.monotonic()
    async with client.post(url, json=CHAT) as r:
        assert r.status == 504
    assert time.monotonic() - started < 30  # the upstream answers after 60 s
    assert recorder.events == []


async def test_proxy_answers_504_when_a_small_body_stalls(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic(
        "proxy", recorder, upstream_url=upstream.url, upstream_timeout_s=0.3
    )
    url = f"http://127.0.0.1:{server.bound_port}/stalled/v1/chat/completions"
    async with client.post(url, json=CHAT) as r:
        assert r.status == 504
        assert "timed out" in (await r.json())["error"]["message"]
    assert recorder.events == []


async def test_proxy_closes_the_client_stream_when_upstream_stalls_mid_stream(
    upstream: Upstream, start_traffic: StartTraffic, client: aiohttp.ClientSession
) -> None:
    recorder = Recorder()
    server = await start_traffic(
        "proxy", recorder, upstream_url=upstream.url, upstream_timeout_s=0.3
    )
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    async with client.post(url, json=CHAT | {"stream": True}) as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()  # never released: the proxy gives up and cuts the stream
    await _sampled_marker(client, server, recorder)  # the cut stream was not sampled
    assert recorder.rejects == []


def test_proxy_needs_an_upstream_and_binding_errors_are_config_errors() -> None:
    recorder = Recorder()
    with pytest.raises(ConfigError):
        TrafficServer(
            sink=recorder.sink,
            reject=recorder.reject,
            task_resolver=lambda h, p, b: None,
            mode="proxy",
            port=0,
        )


async def test_a_taken_port_is_a_config_error(start_traffic: StartTraffic) -> None:
    recorder = Recorder()
    first = await start_traffic("mirror", recorder)
    second = TrafficServer(
        sink=recorder.sink,
        reject=recorder.reject,
        task_resolver=lambda h, p, b: None,
        mode="mirror",
        port=first.bound_port,
    )
    with pytest.raises(ConfigError, match="cannot listen"):
        await second.start()


def test_answer_text_extraction() -> None:
    assert json_response_text(COMPLETION_BYTES) == "The answer is 42."
    assert json_response_text(b'{"choices": []}') is None
    assert json_response_text(b"garbage") is None
    assert sse_response_text(b"".join(sse_chunks())) == "Hello world"
    mixed = (
        b'data: {"choices":[{"index":1,"delta":{"content":"other"}}]}\n\n'
        b"data: not json\n\n: a comment\n\n"
        b'data: {"choices":[{"index":0,"delta":{"content":"mine"}}]}\n\n'
        b"data: [DONE]\n\n"
        b'data: {"choices":[{"index":0,"delta":{"content":"after done"}}]}\n\n'
    )
    assert sse_response_text(mixed) == "mine"
    assert sse_response_text(b"data: [DONE]\n\n") is None
