"""The inline proxy's HTTP/1.1 behaviour, case by case, against a scripted upstream on raw
sockets (:mod:`tests.traffic.raw_upstream`) and raw-socket clients where the framing is
the point: SSE event by event, chunked and close-delimited bodies, 204/304/HEAD,
repeated Set-Cookie, hop-by-hop headers both ways, exact targets, keep-alive and pooled
upstream connections, pipelining, 502/504, a client leaving mid-stream, 200 concurrent
requests without cross-talk, and the proxy's own metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop
from prometheus_client import CollectorRegistry

from adapters.traffic.proxy_metrics import ProxyMetrics
from adapters.traffic.traffic import TrafficServer, header_task_resolver
from tests.waiting import wait_until

from .conftest import Recorder, StartTraffic
from .raw_upstream import RawUpstream

Response = tuple[int, list[tuple[str, str]], bytes]


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    upstream = await RawUpstream().start()
    try:
        yield upstream
    finally:
        await upstream.stop()


@pytest.fixture
async def proxied(
    raw_upstream: RawUpstream, start_traffic: StartTraffic
) -> tuple[TrafficServer, CollectorRegistry]:
    registry = CollectorRegistry()
    server = await start_traffic(
        "proxy",
        Recorder(),
        upstream_url=raw_upstream.url,
        upstream_timeout_s=0.5,
        metrics=ProxyMetrics(registry),
    )
    return server, registry


@contextlib.asynccontextmanager
async def scripted_upstream(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """An upstream on 127.0.0.1 whose every connection ``serve`` handles; its URL."""
    upstream = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{upstream.sockets[0].getsockname()[1]}"
    finally:
        upstream.close()
        await upstream.wait_closed()


async def read_response(reader: asyncio.StreamReader, head_request: bool = False) -> Response:
    """One response off a raw connection, by its own framing."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers = [(k.strip(), v.strip()) for k, v in (x.split(":", 1) for x in head[1:] if x)]
    names = {k.lower(): v for k, v in headers}
    if head_request or status in (204, 304):
        return status, headers, b""
    if "content-length" in names:
        return status, headers, await reader.readexactly(int(names["content-length"]))
    if names.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        return status, headers, b"".join(parts)
    return status, headers, await reader.read()


async def exchange(port: int, raw: bytes, head_request: bool = False) -> Response:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await asyncio.wait_for(read_response(reader, head_request), 10)
    finally:
        writer.close()


def get(target: str, *extra: str, method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: relmon", *extra, "", ""]
    return "\r\n".join(lines).encode("latin-1")


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_chunked_and_close_delimited_bodies_arrive_whole(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, _ = proxied
    status, headers, body = await exchange(server.bound_port, get("/chunked"))
    assert (status, body) == (200, b"hello world")
    assert ("Transfer-Encoding", "chunked") in headers
    status, headers, body = await exchange(server.bound_port, get("/close"))
    assert (status, body) == (200, b"close-delimited body")
    # HTTP/1.0 client: the close-delimited body stays close-delimited.
    raw = b"GET /close HTTP/1.0\r\nHost: relmon\r\n\r\n"
    status, headers, body = await exchange(server.bound_port, raw)
    assert (status, body) == (200, b"close-delimited body")
    assert "Transfer-Encoding" not in dict(headers)


async def test_204_304_and_head_have_no_body_and_keep_the_connection(
    proxied: tuple[TrafficServer, CollectorRegistry],
) -> None:
    server, _ = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    writer.write(get("/nocontent"))
    status, headers, _ = await read_response(reader)
    assert status == 204 and ("X-Kind", "empty") in headers
    writer.write(get("/notmodified"))
    status, headers, _ = await read_response(reader)
    assert status == 304 and ("ETag", '"v1"') in headers
    writer.write(get("/head", method="HEAD"))
    status, headers, _ = await read_response(reader, head_request=True)
    assert status == 200 and ("Content-Length", "1234") in headers
    writer.write(get("/cookies"))  # the same connection still works: nothing was left over
    status, headers, body = await asyncio.wait_for(read_response(reader), 10)
    assert (status, body) == (200, b"ok")
    assert [v for k, v in headers if k == "Set-Cookie"] == ["a=1; Path=/", "b=2"]
    writer.close()


async def test_hop_by_hop_headers_are_dropped_both_ways(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, _ = proxied
    request = get(
        "/hop",
        "Connection: keep-alive, X-Private",
        "Keep-Alive: timeout=9",
        "X-Private: p",
        "TE: trailers",
        "Proxy-Authorization: Basic eA==",
        "X-App: a",
    )
    status, headers, _ = await exchange(server.bound_port, request)
    seen = raw_upstream.seen[-1]
    assert seen.header("X-App") == "a" and seen.header("Host") == f"127.0.0.1:{raw_upstream.port}"
    for name in ("X-Private", "Keep-Alive", "TE", "Proxy-Authorization"):
        assert seen.header(name) is None, name
    assert seen.header("Connection") is None
    names = {k.lower() for k, _ in headers}
    assert status == 200 and ("X-Kept", "k") in headers
    assert not names & {"x-secret", "keep-alive", "proxy-authenticate", "connection"}


@pytest.mark.parametrize(
    "target",
    ["/echo/a%2Fb?q=a%20b&q=2", "/echo//double//slash", "/echo/x?", "/echo/%7Euser;p=1?a=%ff"],
)
async def test_paths_and_queries_are_forwarded_byte_for_byte(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream, target: str
) -> None:
    server, _ = proxied
    status, _, body = await exchange(server.bound_port, get(target))
    assert (status, body.decode()) == (200, target)
    assert raw_upstream.seen[-1].target == target


async def test_keep_alive_and_pipelining_on_one_client_connection_reuse_one_upstream_connection(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, _ = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    for i in range(3):  # keep-alive: one request after the other
        writer.write(get(f"/echo/k{i}"))
        assert (await read_response(reader))[2] == f"/echo/k{i}".encode()
    # Pipelining: three requests in one write, answered in order.
    writer.write(b"".join(get(f"/echo/p{i}") for i in range(3)))
    for i in range(3):
        assert (await asyncio.wait_for(read_response(reader), 10))[2] == f"/echo/p{i}".encode()
    writer.close()
    assert raw_upstream.connections == 1  # the pooled upstream connection served all six
    assert {s.conn for s in raw_upstream.seen} == {0}


async def test_sse_is_relayed_event_by_event(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, _ = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    writer.write(get("/sse"))
    await reader.readuntil(b"\r\n\r\n")
    for i in range(3):
        await raw_upstream.sse_step.put(None)  # the upstream sends one event, no more
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)).strip(), 16)
        assert await reader.readexactly(size + 2) == f"data: event {i}\n\n\r\n".encode()
        assert raw_upstream.sse_sent == i + 1  # it came before the next was even sent
    assert await reader.readuntil(b"\r\n\r\n") == b"0\r\n\r\n"
    writer.close()


async def test_a_client_leaving_mid_stream_ends_the_upstream_connection(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, _ = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    writer.write(get("/forever"))
    await reader.readuntil(b"first\r\n")
    writer.transport.abort()
    await wait_until(lambda: 0 in raw_upstream.closed_connections, what="upstream conn closed")
    status, _, body = await exchange(server.bound_port, get("/echo/next"))
    assert (status, body) == (200, b"/echo/next")
    assert raw_upstream.seen[-1].conn == 1  # a new connection: the cut one was not pooled


async def test_502_504_and_the_failure_metrics(
    proxied: tuple[TrafficServer, CollectorRegistry], start_traffic: StartTraffic
) -> None:
    server, registry = proxied
    with pytest.raises(asyncio.IncompleteReadError):  # the answer began: the cut shows
        await exchange(server.bound_port, get("/forever"))  # no byte for 0.5 s: timeout
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    down_registry = CollectorRegistry()
    down = await start_traffic(
        "proxy",
        Recorder(),
        upstream_url=f"http://127.0.0.1:{dead}",
        metrics=ProxyMetrics(down_registry),
    )
    status, _, body = await exchange(down.bound_port, get("/x"))
    assert status == 502 and "unreachable" in json.loads(body)["error"]["message"]
    assert (
        sample(
            down_registry,
            "relmon_proxy_upstream_failures_total",
            route="default",
            reason="connect_error",
        )
        == 1
    )
    assert (
        sample(registry, "relmon_proxy_upstream_failures_total", route="default", reason="timeout")
        == 1
    )


async def test_status_classes_and_added_latency_are_counted(
    proxied: tuple[TrafficServer, CollectorRegistry],
) -> None:
    server, registry = proxied
    for target in ("/echo/a", "/echo/b", "/redirect", "/status", "/broken"):
        await exchange(server.bound_port, get(target))
    counts = {
        c: sample(registry, "relmon_proxy_requests_total", route="default", status_class=c)
        for c in ("2xx", "3xx", "4xx", "5xx")
    }
    assert counts == {"2xx": 2, "3xx": 1, "4xx": 1, "5xx": 1}
    assert sample(registry, "relmon_proxy_added_latency_seconds_count", route="default") == 5
    assert 0 < sample(registry, "relmon_proxy_added_latency_seconds_sum", route="default") < 5


def test_added_latency_is_timed_finer_than_uvloops_millisecond_clock() -> None:
    """uvloop's ``loop.time()`` moves in whole milliseconds; relmon runs on uvloop by
    default, and timed with it the added latency of a request came out 0 or 1 ms. It is
    timed with ``time.perf_counter()``: the sum of 20 requests is no whole number of ms."""

    async def proxy_twenty() -> tuple[float, float]:
        upstream = await RawUpstream().start()
        registry, recorder = CollectorRegistry(), Recorder()
        server = TrafficServer(
            sink=recorder.sink,
            reject=recorder.reject,
            task_resolver=header_task_resolver("X-Relmon-Task"),
            mode="proxy",
            port=0,
            upstream_url=upstream.url,
            metrics=ProxyMetrics(registry),
        )
        await server.start()
        try:
            for _ in range(20):
                status, _, _ = await exchange(server.bound_port, get("/echo/a"))
                assert status == 200
        finally:
            await server.stop()
            await upstream.stop()
        return (
            sample(registry, "relmon_proxy_added_latency_seconds_count", route="default"),
            sample(registry, "relmon_proxy_added_latency_seconds_sum", route="default"),
        )

    count, total = uvloop.run(proxy_twenty())
    assert count == 20
    assert 0 < total < 1
    assert abs(total * 1000 - round(total * 1000)) > 1e-6, total  # not whole milliseconds


async def test_200_concurrent_requests_get_their_own_answers(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, _ = proxied

    async def one(i: int) -> bool:
        body = f"body-{i}-" * (i % 7 + 1)
        raw = get("/id", f"X-Request-Id: r{i}", f"Content-Length: {len(body)}", method="POST")
        status, _, answer = await exchange(server.bound_port, raw + body.encode())
        return status == 200 and answer == f"r{i}|{body}".encode()

    results = await asyncio.gather(*(one(i) for i in range(200)))
    assert all(results)
    assert raw_upstream.connections <= 200


async def test_a_chunked_oversize_request_is_forwarded_with_its_framing(
    raw_upstream: RawUpstream, start_traffic: StartTraffic
) -> None:
    recorder = Recorder()
    server = await start_traffic(
        "proxy", recorder, upstream_url=raw_upstream.url, max_body_bytes=1000
    )
    payload = b"x" * 5000
    chunks = b"".join(b"%x\r\n%b\r\n" % (700, payload[i : i + 700]) for i in range(0, 4900, 700))
    chunks += b"%x\r\n%b\r\n0\r\n\r\n" % (100, payload[4900:])
    raw = get("/v1/chat/completions", "Transfer-Encoding: chunked", method="POST") + chunks
    status, _, _ = await exchange(server.bound_port, raw)
    assert status == 200
    seen = raw_upstream.seen[-1]
    assert seen.body == payload and seen.header("Transfer-Encoding") == "chunked"
    assert recorder.rejects == [("proxy", "oversize")] and recorder.events == []


async def test_unsampled_requests_are_never_parsed(
    raw_upstream: RawUpstream, start_traffic: StartTraffic
) -> None:
    """The fast path: skipped from the head (task header, request id), the sink never
    sees the event; with no task in the head the skip is asked with task None."""
    asked: list[tuple[str, str | None, str]] = []

    def skip(source: str, task: str | None, event_id: str) -> bool:
        asked.append((source, task, event_id))
        return event_id.startswith("skip")

    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=raw_upstream.url, skip=skip)
    body = b"{not json at all"  # parsed, it would be a rejection
    for rid, task in (("skip-1", "qa"), ("skip-2", None), ("keep-1", "qa")):
        extra = [f"X-Request-Id: {rid}", f"Content-Length: {len(body)}"]
        extra += [f"X-Relmon-Task: {task}"] if task else []
        raw = get("/v1/chat/completions", *extra, method="POST")
        assert (await exchange(server.bound_port, raw + body))[0] == 200
    await wait_until(lambda: len(recorder.rejects) == 1, what="the kept request parsed")
    assert asked == [
        ("proxy", "qa", "skip-1"),
        ("proxy", None, "skip-2"),
        ("proxy", "qa", "keep-1"),
    ]
    assert recorder.rejects == [("proxy", "invalid JSON")] and recorder.events == []


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(
    proxied: tuple[TrafficServer, CollectorRegistry],
) -> None:
    server, _ = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    writer.write(get("/echo/half"))
    writer.write_eof()  # shutdown(SHUT_WR), as some HTTP/1.0-era clients do
    status, _, body = await asyncio.wait_for(read_response(reader), 10)
    assert (status, body) == (200, b"/echo/half")
    assert await asyncio.wait_for(reader.read(), 10) == b""  # then closed by the proxy
    writer.close()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/1.1\r\nCookie: " + b"x" * 9000 + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400),
    ],
)
async def test_a_malformed_or_oversize_head_is_answered_and_the_connection_closed(
    proxied: tuple[TrafficServer, CollectorRegistry], raw: bytes, status: int
) -> None:
    server, _ = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    writer.write(raw)
    answer = await asyncio.wait_for(reader.read(), 10)  # all of it: then the proxy closed
    assert answer.startswith(b"HTTP/1.1 %d " % status) and b"Connection: close" in answer
    writer.close()


async def test_a_pooled_connection_the_upstream_closed_unanswered_is_retried_on_a_new_one(
    start_traffic: StartTraffic,
) -> None:
    writers: list[asyncio.StreamWriter] = []

    async def closes_the_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        for n in range(2):  # the second request on each connection: closed unanswered
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            if n == 0:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        writer.close()

    async with scripted_upstream(closes_the_second) as url:
        try:
            server = await start_traffic("proxy", Recorder(), upstream_url=url)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
            writer.write(get("/a"))  # each on a pooled connection, retried once found closed
            assert (await asyncio.wait_for(read_response(reader), 5))[::2] == (200, b"ok")
            writer.write(get("/b") * 3)  # pipelined: the same, one after the other
            for _ in range(3):
                assert (await asyncio.wait_for(read_response(reader), 5))[::2] == (200, b"ok")
            writer.close()
            await writer.wait_closed()
        finally:
            for each in writers:
                each.close()


def count_handler_tasks(loop: asyncio.AbstractEventLoop) -> list[str]:
    """From now on, the name of every task ``loop`` creates (a task factory that counts)."""
    created: list[str] = []

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        created.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    return created


async def test_a_request_whose_body_came_with_its_head_is_carried_without_a_task(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, registry = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    writer.write(get("/echo/first"))  # opens the pooled upstream connection (in a task)
    assert (await read_response(reader))[2] == b"/echo/first"
    loop = asyncio.get_running_loop()
    created = count_handler_tasks(loop)
    try:
        for i in range(20):  # keep-alive, bodies in the same write as their heads
            body = f"payload {i}".encode()
            raw = get("/id", f"X-Request-Id: f{i}", f"Content-Length: {len(body)}", method="POST")
            writer.write(raw + body)
            status, _, answer = await asyncio.wait_for(read_response(reader), 10)
            assert (status, answer) == (200, b"f%d|%b" % (i, body))
    finally:
        loop.set_task_factory(None)
    writer.close()
    handler_tasks = [name for name in created if name.startswith(("ServerConnection", "Proxy"))]
    assert handler_tasks == []  # all 20 from the protocol callbacks alone
    assert raw_upstream.connections == 1
    assert (
        sample(registry, "relmon_proxy_requests_total", route="default", status_class="2xx") == 21
    )


async def test_a_pipelined_request_whose_body_is_still_coming_follows_a_fast_one(
    proxied: tuple[TrafficServer, CollectorRegistry], raw_upstream: RawUpstream
) -> None:
    server, _ = proxied
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
    writer.write(get("/echo/warm"))
    assert (await read_response(reader))[2] == b"/echo/warm"
    # A whole request (the fast path), then the head of one whose body comes later.
    late = get("/id", "X-Request-Id: late", "Content-Length: 10", method="POST")
    writer.write(get("/echo/fast") + late + b"01234")
    assert (await asyncio.wait_for(read_response(reader), 10))[2] == b"/echo/fast"
    writer.write(b"56789")
    status, _, answer = await asyncio.wait_for(read_response(reader), 10)
    assert (status, answer) == (200, b"late|0123456789")
    writer.write(get("/echo/after"))  # and the connection goes on (back on the fast path)
    assert (await asyncio.wait_for(read_response(reader), 10))[2] == b"/echo/after"
    writer.close()
    assert raw_upstream.connections == 1


async def test_stop_lets_an_answer_in_flight_on_the_fast_path_finish(
    start_traffic: StartTraffic,
) -> None:
    asked = asyncio.Event()
    release = asyncio.Event()

    async def slow_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for n in range(2):
            await reader.readuntil(b"\r\n\r\n")
            if n == 1:  # the second request, on the pooled connection: held until released
                asked.set()
                await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
            await writer.drain()
        writer.close()

    async with scripted_upstream(slow_second) as url:
        server = await start_traffic("proxy", Recorder(), upstream_url=url)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_port)
        writer.write(get("/one"))
        assert (await read_response(reader))[::2] == (200, b"done")
        writer.write(get("/two"))
        await asyncio.wait_for(asked.wait(), 10)
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # it waits for the answer in flight
        release.set()
        assert (await asyncio.wait_for(read_response(reader), 10))[::2] == (200, b"done")
        await asyncio.wait_for(stopping, 10)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # then the connection closed
        writer.close()
