"""The traffic port's server side: HTTP/1.1 on a raw :class:`asyncio.Protocol`, parsed by
httptools (the way uvicorn builds its server), with no copy of a header or a body.

One :class:`ServerConnection` per client connection parses requests as bytes arrive and
handles them one at a time, in order: pipelined requests wait their turn (reading pauses
while one waits), keep-alive follows the request (``Connection``, HTTP version). A
request whose body came whole with its head is first offered to the handler's fast path
(:data:`FastHandler`), which may carry it from protocol callbacks alone, with no task
and no future, and calls :meth:`ServerConnection.done` when it answered; any other
request, or one the fast path declines, runs the handler coroutine in a task. A
request's body arrives in a :class:`~adapters.traffic.request.Body` its handler reads
(:mod:`adapters.traffic.request`). A handler that answered before the whole body
arrived (413) leaves the rest to be read and discarded. Bytes that are no HTTP/1.1 get a
400 and the connection is closed. Writes go straight to the transport;
:attr:`ServerConnection.on_pause` lets a proxy stop reading its upstream while the
client cannot keep up. A client that keeps the connection's write buffer full and takes
no byte of it for the send timeout is cut (as nginx's ``send_timeout``): one timer,
armed only while writing is paused. When the client goes away,
:attr:`ServerConnection.on_lost` is called and the handler's body reads fail with
:class:`ConnectionError`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Final, cast

import httptools

from adapters.traffic.request import Body, Request
from monitor.core.errors import InputError

__all__ = [
    "MAX_FIELD_BYTES",
    "MAX_HEAD_BYTES",
    "FastHandler",
    "Handler",
    "ServerConnection",
    "error_response",
    "http_date",
]

MAX_FIELD_BYTES: Final = 8190
"""The longest request target or header line taken (aiohttp's limits); longer: 400/431."""
MAX_HEAD_BYTES: Final = 65_536
_perf_counter: Final = time.perf_counter  # compiled: a C global, no lookups per request


def error_response(status: int, reason: str, message: str, *, close: bool = False) -> bytes:
    """A whole JSON error answer, ``{"error": {"message": …, "type": …}}``."""
    body = json.dumps({"error": {"message": message, "type": "relmon_traffic_error"}}).encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
    head += f"Content-Length: {len(body)}\r\nDate: {http_date()}\r\n"
    head += "Connection: close\r\n\r\n" if close else "\r\n"
    return head.encode() + body


_date = ["", 0.0]


def http_date() -> str:
    """The ``Date`` header's value, formatted once a second."""
    now = time.time()
    if now - _date[1] >= 1.0:  # type: ignore[operator]
        _date[0], _date[1] = formatdate(now, usegmt=True), float(int(now))
    return _date[0]  # type: ignore[return-value]


class _HeadTooLargeError(InputError):
    """A request head over the limits: answered ``status`` and the connection closed."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


Handler = Callable[["Request", "ServerConnection"], Awaitable[None]]
FastHandler = Callable[["Request", "ServerConnection"], bool]
"""``fast(request, conn)``: True when it took a request whose whole body is here, and
will call ``conn.done(request)`` once it answered; False leaves it to the handler. It is
called from a protocol callback: it must not raise, and must not call ``done`` itself."""


class ServerConnection(asyncio.Protocol):
    """One client connection: parse, run each request's handler in turn, keep alive."""

    def __init__(
        self,
        handler: Handler,
        connections: set[ServerConnection],
        fast: FastHandler | None = None,
        send_timeout_s: float = 60.0,
        on_send_timeout: Callable[[], None] | None = None,
    ) -> None:
        self._handler = handler
        self._send_timeout = send_timeout_s
        self._on_send_timeout = on_send_timeout  # called before a stalled client is cut
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_left = 0  # the write buffer's size when last checked
        self._fast = fast
        self._connections = connections
        self._loop = asyncio.get_event_loop()
        self._parser = httptools.HttpRequestParser(self)
        # Bound once: compiled, a method called through its attribute is looked up by
        # name on every call.
        self._feed = self._parser.feed_data
        self.transport: asyncio.Transport | None = None
        self._write: Callable[[bytes], object] | None = None
        self._url = b""
        self._head_size = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._parsing: Request | None = None
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a request is being handled, by the task or the fast path
        self._held: Request | None = None  # offered to the fast path once its body is whole
        self._idle_waiter: asyncio.Future[None] | None = None
        self.read_paused = False
        self._broken: bytes | None = None  # the error answer owed after the running request
        self.closed = False
        self._eof = False
        self.writable = True
        self._drain: asyncio.Future[None] | None = None
        self.on_pause: Callable[[bool], None] | None = None
        self.on_lost: Callable[[], None] | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._write = self.transport.write
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._connections.discard(self)
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        for request in (self._parsing, *self._pending):
            if request is not None:
                request.body.fail(ConnectionError("client gone"))
        self._pending.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()
        self._wake_idle()

    def data_received(self, data: bytes) -> None:
        answer = None
        try:
            self._feed(data)
            held, self._held = self._held, None
            if held is not None:  # its body is still coming: the handler reads it
                self._task = self._loop.create_task(self._run(held))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _HeadTooLargeError):
                answer = error_response(cause.status, cause.reason, cause.message, close=True)
            else:
                answer = error_response(400, "Bad Request", "malformed HTTP request", close=True)
        except httptools.HttpParserUpgrade:
            answer = error_response(501, "Not Implemented", "upgrades are not proxied", close=True)
        except httptools.HttpParserError:
            answer = error_response(400, "Bad Request", "malformed HTTP request", close=True)
        if answer is not None:
            held, self._held = self._held, None
            if held is not None:  # a bad request behind one whose body is cut short
                self._task = self._loop.create_task(self._run(held))
            self._fail(answer)

    def eof_received(self) -> bool | None:
        """The client is done sending (a half-close): answer what it sent, then close."""
        self._eof = True
        if self._parsing is not None:  # a body cut short never ends
            self._parsing.body.fail(ConnectionError("the client stopped sending"))
        if not self._busy:
            self.close()
        return True  # keep the transport open to write the answers

    def pause_writing(self) -> None:
        self.writable = False
        if self._send_timer is None and self.transport is not None:
            self._send_left = self.transport.get_write_buffer_size()
            self._send_timer = self._loop.call_later(self._send_timeout, self._send_check)
        if self.on_pause is not None:
            self.on_pause(True)

    def resume_writing(self) -> None:
        self.writable = True
        timer, self._send_timer = self._send_timer, None
        if timer is not None:
            timer.cancel()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self.on_pause is not None:
            self.on_pause(False)

    def _send_check(self) -> None:
        """Writing stayed paused for the send timeout: cut the client unless it took
        some of the buffer meanwhile (then it has another period)."""
        self._send_timer = None
        transport = self.transport
        if self.writable or self.closed or transport is None:
            return
        left = transport.get_write_buffer_size()
        if left != self._send_left:  # smaller: taken; larger: written since (a last
            self._send_left = left  # chunk), measured from here
            self._send_timer = self._loop.call_later(self._send_timeout, self._send_check)
            return
        if self._on_send_timeout is not None:
            self._on_send_timeout()
        self.abort()

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._head_size = 0
        self._url = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_FIELD_BYTES:
            raise _HeadTooLargeError(400, "Bad Request", "request target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value)
        self._headers.append((name, value))
        if len(value) > MAX_FIELD_BYTES or self._head_size > MAX_HEAD_BYTES:
            raise _HeadTooLargeError(
                431, "Request Header Fields Too Large", "request headers too large"
            )

    def on_headers_complete(self) -> None:
        request = Request(self._parser, self._url, self._headers, Body(self))
        self._parsing = request
        if not self._busy:
            self._busy = True
            if self._fast is not None:
                self._held = request  # decided when its body is complete
            else:
                self._task = self._loop.create_task(self._run(request))
        else:
            self._pending.append(request)
            self.pause_reading()  # one request in hand is enough: it waits its turn

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.body.feed(body)

    def on_message_complete(self) -> None:
        request, self._parsing = self._parsing, None
        if request is not None:
            request.received_at = _perf_counter()
            request.body.finish()
            if request is self._held:
                self._held = None
                self._start(request)

    # -- running requests --------------------------------------------------------------------

    def _start(self, request: Request) -> None:
        """Handle ``request`` (the connection is busy): the fast path, else a task."""
        fast = self._fast
        if fast is None or not request.body.done or not fast(request, self):
            self._task = self._loop.create_task(self._run(request))

    def done(self, request: Request) -> None:
        """The fast path answered ``request``: go on with the next one, or close."""
        transport = self.transport
        if request.keep_alive and transport is not None and not transport.is_closing():
            if self._pending:
                self._start(self._next())  # type: ignore[arg-type]
                return
            if self.read_paused:
                self.resume_reading()
        else:
            self.close()
        self._idle()

    def _next(self) -> Request | None:
        """The pipelined request that waits its turn (reading resumes once none waits)."""
        request = self._pending.popleft() if self._pending else None
        if not self._pending:
            self.resume_reading()
        return request

    def _idle(self) -> None:
        """No request in hand: close after a half-close or a broken request."""
        self._busy = False
        if self._eof:
            self.close()
        if self._broken is not None and not self.closed:
            self.write(self._broken)
            self.close()
        self._wake_idle()

    def _wake_idle(self) -> None:
        waiter, self._idle_waiter = self._idle_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def resume(self, request: Request, handler: Handler) -> None:
        """The fast path, which took ``request``, must wait after all: ``handler`` goes on
        with it in a task (the connection's requests then follow in that task)."""
        self._task = self._loop.create_task(self._run(request, handler))

    async def _run(self, request: Request | None, handler: Handler | None = None) -> None:
        while request is not None and not self.closed:
            try:
                await (handler or self._handler)(request, self)
                handler = None
            except Exception:  # the handler guards itself: this is a last resort
                self.abort()
                break
            if not request.keep_alive or self.transport is None or self.transport.is_closing():
                self.close()
                break
            if not request.body.done:
                request.body.skip_rest()
                try:
                    await request.body.read()  # b"" once the dropped rest has been read
                except ConnectionError:
                    break
            request = self._next()
            if request is not None and request.body.done and self._fast is not None:
                self._task = None
                self._start(request)  # back to the fast path (or a new task)
                return
        self._task = None
        self._idle()

    def _fail(self, answer: bytes) -> None:
        if not self._busy:
            self.write(answer)
            self.close()
        else:  # answered after the request that is running, then closed
            self._broken = answer
            self.pause_reading()

    @property
    def running(self) -> asyncio.Future[None] | None:
        """Done when the request in hand is answered (None between requests)."""
        if not self._busy or self.closed:
            return None
        if self._task is not None:
            return self._task
        if self._idle_waiter is None:
            self._idle_waiter = self._loop.create_future()
        return self._idle_waiter

    # -- for handlers ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._write is not None and not self.closed:
            self._write(data)

    async def drain(self) -> None:
        """Wait while the client reads slower than the answer comes."""
        if not self.writable and not self.closed:
            self._drain = self._loop.create_future()
            await self._drain

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Cut the connection: the client must see its answer was cut short."""
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = False
            self.transport.resume_reading()
