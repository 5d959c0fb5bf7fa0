"""The model client's own HTTP/1.1 transport (adapters/model/transport.py) against a raw
TCP server on 127.0.0.1 that writes exactly the bytes each test gives it: connection
reuse, an idle connection the server closed, compressed bodies, size limits, framing,
what is sent. The pool it shares with the proxy (adapters/upstream/pool.py) is checked
here too where only a client shows the case."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import socketserver
import ssl
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adapters.model.client import HttpModelClient
from adapters.upstream.pool import UpstreamPool
from monitor.core.errors import ConfigError, ModelCallError
from tests.kafka.tls import make_pki

ANSWER = json.dumps({"choices": [{"message": {"role": "assistant", "content": "42"}}]}).encode()

Respond = Callable[[int, bytes], bytes | None]
"""(request number, request bytes) -> the bytes to answer (None: never answer)."""


def http(body: bytes, *, status: str = "200 OK", headers: str = "", length: bool = True) -> bytes:
    framing = f"Content-Length: {len(body)}\r\n" if length else "Connection: close\r\n"
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{framing}{headers}\r\n"
    ).encode() + body


@dataclass
class RawServer:
    respond: Respond
    close_after_answer: bool = False
    one_per_connection: bool = False
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.respond(len(self.requests), request)
                if answer is None:
                    await asyncio.sleep(3600)  # a server that never answers
                    return
                writer.write(answer)
                await writer.drain()
                if self.close_after_answer or b"Connection: close" in answer:
                    break
                if self.one_per_connection:  # the next request finds it closing: a
                    await reader.readuntil(b"\r\n\r\n")  # race no pool can avoid
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_server(
    respond: Respond, *, close_after_answer: bool = False, one_per_connection: bool = False
) -> AsyncIterator[RawServer]:
    raw = RawServer(respond, close_after_answer, one_per_connection)
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    raw.port = server.sockets[0].getsockname()[1]
    try:
        yield raw
    finally:
        server.close()


def client(port: int, **options: object) -> tuple[HttpModelClient, list[str]]:
    outcomes: list[str] = []
    options.setdefault("timeout_s", 5.0)
    made = HttpModelClient(
        base_url=f"http://127.0.0.1:{port}/v1",
        model="m",
        on_outcome=outcomes.append,
        sleep=lambda s: asyncio.sleep(0),
        **options,  # type: ignore[arg-type]
    )
    return made, outcomes


async def test_one_connection_carries_every_sequential_call() -> None:
    async with raw_server(lambda n, req: http(ANSWER)) as server:
        model, outcomes = client(server.port)
        for _ in range(20):
            assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1) == ["42"]
        await model.aclose()
    assert server.connections == 1
    assert outcomes == ["ok"] * 20


async def test_an_idle_connection_the_server_closed_is_replaced_without_an_error() -> None:
    # The server answers one request per connection and closes the connection when the
    # next one arrives, unanswered: what a client sees when a server closes an idle
    # keep-alive connection just as a request goes out. The call must go out again on a
    # new connection, with no connection_error (which would cost a retry and a back-off).
    async with raw_server(lambda n, req: http(ANSWER), one_per_connection=True) as server:
        model, outcomes = client(server.port, max_retries=0)
        for _ in range(5):
            assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        await model.aclose()
    assert outcomes == ["ok"] * 5
    assert server.connections == 5


async def test_a_connection_closed_while_idle_is_not_used() -> None:
    async with raw_server(lambda n, req: http(ANSWER), close_after_answer=True) as server:
        model, outcomes = client(server.port, max_retries=0)
        for _ in range(3):
            assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
            await asyncio.sleep(0.05)  # the close reaches the client while it is idle
        await model.aclose()
    assert outcomes == ["ok"] * 3
    assert len(server.requests) == 3  # no request went out on a closed connection


async def test_what_is_sent() -> None:
    async with raw_server(lambda n, req: http(ANSWER)) as server:
        model, _ = client(server.port, api_key="sk-secret")
        await model.sample({"messages": [{"role": "user", "content": "é"}]}, 1)
        await model.aclose()
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    fields = dict(line.split(b": ", 1) for line in lines[1:])
    assert fields[b"Host"] == f"127.0.0.1:{server.port}".encode()
    assert fields[b"Authorization"] == b"Bearer sk-secret"
    assert fields[b"Content-Type"] == b"application/json"
    assert fields[b"Accept-Encoding"] == b"identity"
    assert int(fields[b"Content-Length"]) == len(body)
    sent = json.loads(body)
    assert sent["messages"][0]["content"] == "é" and sent["stream"] is False


async def test_user_info_in_the_url_is_sent_as_basic_credentials_and_never_shown() -> None:
    async with raw_server(lambda n, req: http(b"{}", status="500 Oops")) as server:
        model = HttpModelClient(
            base_url=f"http://ann:p%40ss@127.0.0.1:{server.port}/v1",
            model="m",
            max_retries=0,
        )
        with pytest.raises(ModelCallError) as failed:
            await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        await model.aclose()
    assert b"Authorization: Basic YW5uOnBAc3M=\r\n" in server.requests[0]  # ann:p@ss
    assert "p%40ss" not in str(failed.value) and "ann" not in str(failed.value)


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("gzip", gzip.compress(ANSWER)),
        ("deflate", zlib.compress(ANSWER)),
        ("deflate", zlib.compress(ANSWER)[2:-4]),  # raw deflate, as some servers send it
    ],
)
async def test_a_compressed_body_is_decoded(encoding: str, packed: bytes) -> None:
    answer = http(packed, headers=f"Content-Encoding: {encoding}\r\n")
    async with raw_server(lambda n, req: answer) as server:
        model, outcomes = client(server.port)
        texts = await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        await model.aclose()
    assert texts == ["42"] and outcomes == ["ok"]


@pytest.mark.parametrize(
    "answer",
    [
        # 1 KiB on the wire, 10 MiB once inflated: over the limit, however it came
        http(gzip.compress(b" " * 10_485_760), headers="Content-Encoding: gzip\r\n"),
        http(ANSWER, headers="Content-Encoding: br\r\n"),  # never asked for
        http(b"\x1f\x8b not gzip at all", headers="Content-Encoding: gzip\r\n"),
        http(b"x" * 70_000),
        http(b"x" * 70_000, length=False),  # close-delimited
    ],
    ids=["gzip bomb", "brotli", "corrupt gzip", "over the limit", "over, close-delimited"],
)
async def test_bodies_that_cannot_be_read_are_invalid_responses(answer: bytes) -> None:
    async with raw_server(lambda n, req: answer) as server:
        model, outcomes = client(server.port, max_response_bytes=65_536, retries={"invalid": 0})
        with pytest.raises(ModelCallError, match="invalid response") as failed:
            await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        await model.aclose()
    assert outcomes == ["invalid_response"]
    assert not failed.value.retriable


async def test_a_close_delimited_answer_is_read_to_its_end() -> None:
    async with raw_server(lambda n, req: http(ANSWER, length=False)) as server:
        model, outcomes = client(server.port)
        for _ in range(3):  # each on a new connection: the server closed the last
            assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        await model.aclose()
    assert outcomes == ["ok"] * 3 and server.connections == 3


async def test_an_error_status_with_a_long_body_keeps_its_status() -> None:
    answer = http(b"e" * 200_000, status="503 Busy", headers="Retry-After: 7\r\n")
    async with raw_server(lambda n, req: answer if n == 1 else http(ANSWER)) as server:
        waits: list[float] = []

        async def sleep(s: float) -> None:
            waits.append(s)

        model = HttpModelClient(
            base_url=f"http://127.0.0.1:{server.port}/v1",
            model="m",
            max_response_bytes=65_536,
            sleep=sleep,
        )
        assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1) == ["42"]
        await model.aclose()
    assert waits == [7.0]  # a server_error whose Retry-After was read, not a garbled body


async def test_a_timeout_gives_its_connection_up_and_the_next_call_is_answered() -> None:
    async with raw_server(lambda n, req: None if n == 1 else http(ANSWER)) as server:
        model, outcomes = client(server.port, timeout_s=0.3, concurrency=1)
        assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1) == ["42"]
        await model.aclose()
    assert outcomes == ["timeout", "ok"]
    assert server.connections == 2  # the timed-out connection was not used again


async def test_a_connection_handed_to_a_cancelled_waiter_goes_back_to_the_pool() -> None:
    async with raw_server(lambda n, req: http(ANSWER)) as server:
        pool = UpstreamPool(
            "127.0.0.1",
            server.port,
            tls=False,
            connect_timeout_s=1.0,
            read_timeout_s=1.0,
            max_connections=1,
        )
        conn = await pool.acquire()
        waiter = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)  # it waits: the one connection allowed is taken
        pool.release(conn)  # handed to the waiter...
        waiter.cancel()  # ...which is cancelled before it runs (a timeout)
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.idle() is conn  # not lost: counted open, owned by nobody
        pool.close()


async def test_a_path_outside_ascii_is_percent_encoded() -> None:
    async with raw_server(lambda n, req: http(ANSWER)) as server:
        model = HttpModelClient(base_url=f"http://127.0.0.1:{server.port}/é v1", model="m")
        assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        await model.aclose()
    assert server.requests[0].startswith(b"POST /%C3%A9%20v1/chat/completions HTTP/1.1\r\n")


@pytest.mark.parametrize("key", ["sk-é", "sk-\r\nX-Injected: 1"])
def test_a_key_that_cannot_be_a_header_is_a_config_error(key: str) -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        HttpModelClient(base_url="http://127.0.0.1:1/v1", model="m", api_key=key)


@pytest.mark.parametrize("trusted", [True, False])
async def test_https_checks_the_servers_certificate(
    trusted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    raw = RawServer(lambda n, req: http(ANSWER))
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    # the default trust store, as a deployment sets it (OpenSSL reads the variable)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca if trusted else pki.other_ca))
    try:
        outcomes: list[str] = []
        model = HttpModelClient(
            base_url=f"https://127.0.0.1:{port}/v1", model="m", max_retries=0,
            on_outcome=outcomes.append,
        )  # fmt: skip
        if trusted:
            assert await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        else:
            with pytest.raises(ModelCallError, match="connection error"):
                await model.sample({"messages": [{"role": "user", "content": "q"}]}, 1)
        await model.aclose()
    finally:
        server.close()
    assert outcomes == (["ok"] if trusted else ["connection_error"])
    assert len(raw.requests) == (1 if trusted else 0)


class _KeepAliveHandler(socketserver.StreamRequestHandler):
    """A blocking server's connection: answers every request with ANSWER, kept alive."""

    def handle(self) -> None:
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            length = next(
                int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length:")
            )  # fmt: skip
            self.rfile.read(length)
            self.wfile.write(http(ANSWER))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_client_used_on_a_second_event_loop_opens_new_connections() -> None:
    """A client kept across ``asyncio.run`` calls (a script, a test) must not reuse the
    connections of a closed loop. Those are left to the garbage collector, which warns
    that their transports were never closed (collected here, not in a later test)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _KeepAliveHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        model = HttpModelClient(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m", max_retries=0
        )
        request = {"messages": [{"role": "user", "content": "q"}]}
        assert asyncio.run(model.sample(request, 1)) == ["42"]
        assert asyncio.run(model.sample(request, 1)) == ["42"]  # another loop
        asyncio.run(model.aclose())
    finally:
        server.shutdown()
        server.server_close()
        gc.collect()
