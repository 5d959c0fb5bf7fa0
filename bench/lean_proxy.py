"""The leanest reverse proxy Python makes here: the floor relmon's data plane is held to.

No relmon code: a raw :class:`asyncio.Protocol` on uvloop, httptools parsing both sides,
a pool of keep-alive upstream connections, every request forwarded and its answer
relayed from the protocol callbacks (no task, no future per request). It does what a
benchmark needs and nothing else a proxy must (no timeouts, no streaming, no
backpressure, no 1xx, no pipelining): it only shows what the interpreter can reach on
this machine, measured in the same run as relmon and nginx
(``bench/proxy_saturation_bench.py --data-plane lean``).

    .venv/bin/python bench/lean_proxy.py UPSTREAM_PORT   # prints "PORT n", SIGTERM stops
"""

from __future__ import annotations

import asyncio
import signal
import sys

import httptools
import uvloop

_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"host", b"te"})


class Upstream(asyncio.Protocol):
    def __init__(self, pool: list[Upstream]) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.client: Client | None = None
        self.transport: asyncio.Transport | None = None
        self.parts: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.parts = [b"HTTP/1.1 %d OK\r\n" % self.parser.get_status_code()]

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _HOP:
            self.parts += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        self.parts[0] = b"HTTP/1.1 %d OK\r\n" % self.parser.get_status_code()
        self.parts.append(b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self.pool.append(self)
        if client is not None and client.transport is not None:  # None: the client left
            client.transport.write(b"".join(self.parts))


class Client(asyncio.Protocol):
    def __init__(self, pool: list[Upstream], up: tuple[str, int], host: bytes) -> None:
        self.pool = pool
        self.up = up
        self.host = host
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.parts: list[bytes] = []
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url = b""
        self.parts = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _HOP:
            self.parts += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        method = self.parser.get_method()
        self.parts[:0] = [method, b" ", self.url, b" HTTP/1.1\r\nHost: ", self.host, b"\r\n"]
        self.parts.append(b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        data = b"".join(self.parts)
        if self.pool:
            self._send(self.pool.pop(), data)
        else:
            asyncio.get_running_loop().create_task(self._connect(data))

    async def _connect(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, up = await loop.create_connection(lambda: Upstream(self.pool), *self.up)
        self._send(up, data)

    def _send(self, up: Upstream, data: bytes) -> None:
        up.client = self
        assert up.transport is not None
        up.transport.write(data)


async def serve(upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    pool: list[Upstream] = []
    up = ("127.0.0.1", upstream_port)
    host = b"127.0.0.1:%d" % upstream_port
    server = await loop.create_server(lambda: Client(pool, up, host), "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
