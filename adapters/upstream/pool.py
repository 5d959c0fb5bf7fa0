"""A pool of persistent keep-alive connections to one HTTP/1.1 server, each a raw
:class:`asyncio.Protocol` whose responses httptools parses: the proxy's client side
(:mod:`adapters.traffic.exchange`) and the model client's (:mod:`adapters.model.transport`).

:meth:`UpstreamPool.acquire` hands out an idle connection (the most recently used
first), opens a new one within the connect timeout, or, with ``max_connections`` in use,
waits for one to come back. Once its request is sent, a connection that receives no byte
for the read timeout while it is read is closed and its exchange told
``on_lost("timeout")`` (:meth:`UpstreamConnection.watch`; one timer sweeps every open
connection at least every quarter of the timeout and every second, and a connection
counts the sweeps since its last byte: nothing is scheduled, and no clock read, per
request). A connection its exchange holds paused (:meth:`UpstreamConnection.pause`: the
proxy's client cannot keep up) is not waiting for the upstream: its sweeps are not
counted, and start again from 0 when it is read again. A connection
carries one exchange at a time: it calls the exchange's ``on_head``, ``on_body`` (each
chunk as it arrives, no copy), ``on_done`` and ``on_lost``; 1xx interim answers are
dropped. A connection goes back into the pool only clean (:meth:`UpstreamPool.release`):
its answer complete, read (not paused), no exchange on it, kept alive by the upstream;
any other is ended (:meth:`UpstreamConnection.close`), and so is one that receives
bytes nobody asked for. A connection the upstream closes while idle leaves the pool by
itself.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools

__all__ = ["Exchange", "UpstreamConnection", "UpstreamPool"]


class Exchange:
    """What an upstream connection reports to the request it carries (the proxy's
    :class:`~adapters.traffic.exchange.ProxyExchange` overrides each method). A base class,
    not a Protocol: compiled (setup.py), a call through it is a direct call."""

    __slots__ = ()

    def on_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def on_body(self, chunk: bytes) -> None:
        raise NotImplementedError

    def on_done(self) -> None:
        raise NotImplementedError

    def on_lost(self, reason: str) -> None:
        raise NotImplementedError


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to the upstream (see the module)."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._parser = httptools.HttpResponseParser(self)
        # Bound once: compiled, a method called through its attribute is looked up by
        # name on every call.
        self._feed = self._parser.feed_data
        self.transport: asyncio.Transport | None = None
        self._write: Callable[[bytes], object] | None = None
        self.exchange: Exchange | None = None
        self.closed = False
        self.reused = False
        self.got_bytes = False
        self.head_only = False
        # Sweeps (:meth:`UpstreamPool._sweep`) since the request was sent or the last byte
        # came: a counter, not a clock read per request.
        self.quiet = 0
        self.waiting = False  # the request is sent, the answer not yet complete
        self.paused = False  # not read (:meth:`pause`): the read timeout does not run
        # Until its first answer, a new connection is clean (:attr:`clean`): nothing on it.
        self.keep_alive = True
        self.complete = True
        self.eof_ends = False  # no length, not chunked: the body ends when the upstream closes
        self._interim = False
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._framed = False
        self._writable = True
        self._drain: asyncio.Future[None] | None = None

    def send(self, exchange: Exchange, head_only: bool, request: bytes) -> None:
        """Carry ``exchange``, its whole ``request`` written at once: :meth:`start`, the
        write and :meth:`watch` in one call."""
        self.start(exchange, head_only)
        self.write(request)
        self.watch()

    def start(self, exchange: Exchange, head_only: bool) -> None:
        """Carry ``exchange`` (its request is written next)."""
        self.exchange = exchange
        self.head_only = head_only
        self.got_bytes = False
        self.complete = False

    def watch(self) -> None:
        """The request is sent: from now on, no byte for the read timeout times it out."""
        self.quiet = 0
        self.waiting = True

    def write(self, data: bytes) -> None:
        if self._write is not None and not self.closed:
            self._write(data)

    async def drain(self) -> None:
        if not self._writable and not self.closed:
            self._drain = self._loop.create_future()
            await self._drain

    def pause(self, paused: bool) -> None:
        """Stop (or go on) reading the upstream while the client cannot keep up. While
        paused the read timeout does not run: relmon, not the upstream, is behind; read
        again, the upstream has the whole timeout from then."""
        if self.transport is not None and not self.closed and paused != self.paused:
            self.paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.quiet = 0
                self.transport.resume_reading()

    @property
    def clean(self) -> bool:
        """Fit for the next exchange: its answer complete, read (not paused), open and
        kept alive, no exchange on it."""
        return (
            self.complete
            and self.keep_alive
            and not self.paused
            and not self.closed
            and self.exchange is None
        )

    def close(self) -> None:
        """End the connection (never returned to the pool)."""
        self.exchange = None
        self.waiting = False
        if not self.closed:
            self.closed = True  # at once: no one takes it from the pool meanwhile
            if self.transport is not None:
                self.transport.abort()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._write = self.transport.write
        self._pool.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.waiting = False
        self._pool.lost(self)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        exchange, self.exchange = self.exchange, None
        if exchange is None or self.complete:
            return
        if self.eof_ends and self._framed:
            self.complete = True
            exchange.on_done()
        else:
            exchange.on_lost("reset")

    def data_received(self, data: bytes) -> None:
        self.quiet = 0
        self.got_bytes = True
        if self.exchange is None:  # bytes nobody asked for: this connection is unusable
            self.close()
            return
        try:
            self._feed(data)
        except httptools.HttpParserError:
            exchange, self.exchange = self.exchange, None
            self.close()
            if exchange is not None and not self.complete:
                exchange.on_lost("invalid_response")

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.exchange is None:  # an answer nobody asked for, after the one that was
            self.close()
        self._reason = b""
        self._headers = []
        self._framed = False
        self.eof_ends = False

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue, 103 Early Hints: not relayed, the answer follows
            self._interim = True
            return
        self._framed = True
        self.keep_alive = self._parser.should_keep_alive()
        self.eof_ends = not self.keep_alive and status not in (204, 304) and not self.head_only
        if self.exchange is not None:
            self.exchange.on_head(status, self._reason, self._headers)
        if self.head_only:  # llhttp would wait for the body the length announces
            self._parser = httptools.HttpResponseParser(self)
            self._feed = self._parser.feed_data
            self._finish()

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None and not self._interim:
            self.exchange.on_body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._finish()

    def _finish(self) -> None:
        if self.complete:
            return
        self.complete = True
        self.waiting = False
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.on_done()


class UpstreamPool:
    """Up to ``max_connections`` connections to one upstream (see the module)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: bool,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        # The open connections; one timer sweeps them all while there are any (a timer,
        # or even a set update, per request costs more than the rest of its bookkeeping).
        self._conns: set[UpstreamConnection] = set()
        # A tick of at most min(1 s, a quarter of the timeout) that divides it: a
        # connection quiet for ``ticks + 1`` sweeps in a row had no byte for at least the
        # read timeout, and at most one tick more.
        ticks = max(4, math.ceil(read_timeout_s))
        self._tick = read_timeout_s / ticks
        self._quiet_sweeps = ticks + 1
        self._sweeping = False
        self._host = host
        self._port = port
        self._ssl = ssl.create_default_context() if tls else None
        self._connect_timeout = connect_timeout_s
        self._max = max_connections
        self._idle: list[UpstreamConnection] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[UpstreamConnection | None]] = deque()
        self.closing = False

    def idle(self) -> UpstreamConnection | None:
        """An idle connection at once (the most recently used), None when there is none."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def acquire(self, *, fresh: bool = False) -> UpstreamConnection:
        """An idle connection, else a new one (OSError, TimeoutError when it fails)."""
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        if self._open >= self._max:
            waiter: asyncio.Future[UpstreamConnection | None] = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:  # a timeout: what was handed goes to the next
                if waiter.done() and not waiter.cancelled():
                    handed_late = waiter.result()
                    if handed_late is not None:
                        self.release(handed_late)
                    else:
                        self._wake(None)
                raise
            if handed is not None:
                return handed
        self._open += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await self.loop.create_connection(
                    lambda: UpstreamConnection(self),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except BaseException:
            self._open -= 1
            self._wake(None)
            raise
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """``conn`` finished an exchange and stays open: the next one takes it, when it is
        :attr:`~UpstreamConnection.clean`; else it is closed."""
        conn.reused = True
        if self.closing or not conn.clean:
            conn.close()
            return
        if not self._waiters or not self._wake(conn):
            self._idle.append(conn)

    def _wake(self, conn: UpstreamConnection | None) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def opened(self, conn: UpstreamConnection) -> None:
        self._conns.add(conn)
        if not self._sweeping:
            self._sweeping = True
            self.loop.call_later(self._tick, self._sweep)

    def lost(self, conn: UpstreamConnection) -> None:
        self._open -= 1
        self._conns.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        self._wake(None)

    def _sweep(self) -> None:
        """Time out the connections that wait with no byte for the read timeout (swept
        at least every quarter of it and every second, while any connection is open):
        one quiet sweep more counted on each waiting connection that is read."""
        self._sweeping = False
        limit = self._quiet_sweeps
        quiet: list[UpstreamConnection] = []
        for conn in self._conns:
            if conn.waiting and not conn.paused:
                conn.quiet += 1
                if conn.quiet >= limit:
                    quiet.append(conn)
        for conn in quiet:
            exchange = conn.exchange
            conn.close()
            if exchange is not None:
                exchange.on_lost("timeout")
        if self._conns:
            self._sweeping = True
            self.loop.call_later(self._tick, self._sweep)

    def close(self) -> None:
        """Close the idle connections; the busy ones close when their exchange ends."""
        self.closing = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
