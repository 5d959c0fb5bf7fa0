"""A scripted HTTP/1.1 upstream on raw sockets (asyncio streams), for the proxy's
conformance tests: it answers each path with exact bytes (chunked, close-delimited,
204/304/HEAD, repeated headers, hop-by-hop ones, an SSE stream paced by the test, a
stream that never ends) and records what it received and on which connection."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

__all__ = ["RawUpstream", "Seen"]


@dataclass
class Seen:
    """One request as the upstream received it."""

    conn: int
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass
class RawUpstream:
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed_connections: set[int] = field(default_factory=set)
    sse_step: asyncio.Queue[None] = field(default_factory=asyncio.Queue)
    sse_sent: int = 0
    sse_script: dict[str, list[bytes]] = field(default_factory=dict)
    """Paths answered with these SSE events (one per step), as ``/sse`` is with three."""
    _server: asyncio.Server | None = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        self.connections += 1
        try:
            while True:
                request = await _read_request(reader, conn)
                if request is None:
                    break
                self.seen.append(request)
                if not await self._answer(request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed_connections.add(conn)
            writer.close()

    async def _answer(
        self, req: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Write the answer for ``req``; False to close the connection after it."""
        path = req.target.split("?", 1)[0]
        if path == "/sse":
            return await self._sse(writer, [f"data: event {i}\n\n".encode() for i in range(3)])
        if path in self.sse_script:
            return await self._sse(writer, self.sse_script[path])
        if path == "/forever":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            # A stream that never ends: wait (up to 60 s) for the proxy to close it.
            with contextlib.suppress(TimeoutError, ConnectionError):
                await asyncio.wait_for(reader.read(), 60)
            return False
        if path == "/close":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
            )
            writer.write(b"close-delimited body")
            await writer.drain()
            return False
        if path == "/id":
            await asyncio.sleep((hash(req.header("X-Request-Id")) % 5) / 1000)  # out of order
            body = f"{req.header('X-Request-Id')}|{req.body.decode()}".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
            return True
        writer.write(_FIXED.get(path, _echo(req)))
        await writer.drain()
        return True

    async def _sse(self, writer: asyncio.StreamWriter, events: list[bytes]) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for event in events:
            await asyncio.wait_for(self.sse_step.get(), 30)  # the test paces the stream
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
            self.sse_sent += 1
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _echo(req: Seen) -> bytes:
    body = req.target.encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


_FIXED = {
    "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    "/nocontent": b"HTTP/1.1 204 No Content\r\nX-Kind: empty\r\n\r\n",
    "/notmodified": b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\n\r\n',
    "/head": b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nContent-Type: text/plain\r\n\r\n",
    "/cookies": b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1; Path=/\r\nSet-Cookie: b=2\r\n"
    b"Content-Length: 2\r\n\r\nok",
    "/hop": b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\n"
    b"X-Secret: s\r\nProxy-Authenticate: Basic\r\nX-Kept: k\r\nContent-Length: 2\r\n\r\nok",
    "/status": b"HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\n\r\n",
    "/redirect": b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
    "/broken": b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
}


async def _read_request(reader: asyncio.StreamReader, conn: int) -> Seen | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if line]
    seen = Seen(conn, method, target, headers, b"")  # type: ignore[arg-type]
    length = seen.header("Content-Length")
    if length is not None:
        seen.body = await reader.readexactly(int(length))
    elif (seen.header("Transfer-Encoding") or "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        seen.body = b"".join(parts)
    return seen
