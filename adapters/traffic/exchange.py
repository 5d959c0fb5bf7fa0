"""One request through the inline proxy (:class:`ProxyExchange`): the request's head as
sent upstream (hop-by-hop headers, ``Host`` and ``Expect`` left out, framing kept), its
body whole or streamed, the answer relayed as it comes (see :mod:`adapters.traffic.proxy`),
then settled: counted, its connection back in the pool (read again if the client's pace
had paused it), or a failure answered 502/504 or the client connection cut.
:class:`ExchangeGuard` counts an event request once at most, whatever happens to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

from adapters.traffic.intake import HeaderView, Intake
from adapters.traffic.proxy_metrics import RouteMetrics
from adapters.traffic.request import HOP_BY_HOP, NOT_FORWARDED, HeaderKinds, Request, decimal
from adapters.traffic.wire import ServerConnection, error_response, http_date
from adapters.upstream.pool import Exchange, UpstreamConnection, UpstreamPool

__all__ = [
    "WHOLE_BODY_BYTES",
    "ExchangeGuard",
    "Forwarding",
    "ProxyExchange",
    "request_head",
]

WHOLE_BODY_BYTES: Final = 65_536
_PLAIN_CONNECTION: Final = frozenset({b"keep-alive", b"close"})
# Answer header kinds: 0 relayed as it came; 1 length, 2 type, 3 date (read as relayed);
# 4 Connection and 5 the other hop-by-hop ones (not relayed).
_response_kind: Final = HeaderKinds(
    dict.fromkeys(HOP_BY_HOP, 5)
    | {b"connection": 4, b"content-length": 1, b"content-type": 2, b"date": 3}
)
_NO_HEADERS: Final[list[tuple[bytes, bytes]]] = []  # never changed: replaced
_NO_NAMES: Final[frozenset[bytes]] = frozenset()
_perf_counter: Final = time.perf_counter  # compiled: a C global, no lookups per request


def _named(connection: bytes) -> frozenset[bytes]:
    """The header names a ``Connection`` header makes hop-by-hop."""
    return frozenset(t.strip().lower() for t in connection.split(b",") if t.strip())


class Forwarding:
    """Where requests go: the upstream's address, path prefix and ``Host``."""

    __slots__ = ("host_line", "max_body", "metrics", "pool", "prefix", "read_timeout")

    def __init__(
        self,
        pool: UpstreamPool,
        *,
        prefix: bytes,
        host_header: bytes,
        read_timeout_s: float,
        max_body: int,
        metrics: RouteMetrics,
    ) -> None:
        self.pool = pool
        self.prefix = prefix
        self.host_line = b"Host: " + host_header + b"\r\n"
        self.read_timeout = read_timeout_s
        self.max_body = max_body
        self.metrics = metrics


def request_head(req: Request, fwd: Forwarding, body: bytes = b"") -> bytes:
    """The request line and headers sent upstream (framing kept, hop-by-hop dropped),
    and ``body`` after them (joined in the same copy)."""
    parts = [req.method, b" ", fwd.prefix, req.target, b" HTTP/1.1\r\n", fwd.host_line]
    named = _named(req.connection) - _PLAIN_CONNECTION if req.connection else None
    if named:  # rare: headers the Connection header makes hop-by-hop
        skip = NOT_FORWARDED | named
        for name, value in req.headers:
            if name.lower() not in skip:
                parts += (name, b": ", value, b"\r\n")
    else:
        parts += req.forwarded
    if req.chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    parts.append(b"\r\n")
    if body:
        parts.append(body)
    return b"".join(parts)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class ExchangeGuard:
    """An event request counted once at most (``count(reason)``), and whether its answer
    began (then a failure cuts the connection instead of answering 500)."""

    __slots__ = ("counted", "event", "intake", "started")

    def __init__(self, intake: Intake, event: bool) -> None:
        self.intake = intake
        self.event = event
        self.counted = False
        self.started = False

    def count(self, reason: str) -> None:
        if self.event and not self.counted:
            self.counted = True
            self.intake.reject(self.intake.source, reason)


class ProxyExchange(Exchange):
    """One request through the proxy (see the module); :meth:`run` returns when done."""

    __slots__ = (
        "_captured",
        "_rechunk",
        "_whole",
        "body",
        "capture",
        "client",
        "client_done_at",
        "conn",
        "finished",
        "fwd",
        "guard",
        "on_end",
        "oversize_response",
        "req",
        "resp_headers",
        "sample",
        "sent_at",
        "status",
        "upstream_done_at",
    )

    def __init__(
        self,
        req: Request,
        client: ServerConnection,
        fwd: Forwarding,
        guard: ExchangeGuard,
        on_end: Callable[[ProxyExchange, str | None], None] | None = None,
    ) -> None:
        self.req = req
        self.client = client
        self.fwd = fwd
        self.guard = guard
        self.conn: UpstreamConnection | None = None
        self.finished: asyncio.Future[str | None] | None = None
        # Without ``finished`` (the fast path): called once with the outcome instead.
        self.on_end = on_end
        self.sent_at = 0.0
        self.body = b""  # the request body, when held whole
        self.status = 0
        self.resp_headers: list[tuple[bytes, bytes]] = _NO_HEADERS
        self._whole: list[bytes] | None = None
        self._rechunk = False
        self.capture: list[bytes] | None = None
        self._captured = 0
        self.upstream_done_at = self.client_done_at = 0.0
        self.oversize_response = False
        # An event with its whole request body: keep a 2xx answer.
        self.sample = guard.event

    # -- the request ---------------------------------------------------------------------

    def send(self, conn: UpstreamConnection, body: bytes) -> None:
        """Carry the request, its whole ``body`` held, on ``conn``; the answer follows."""
        req = self.req
        self.body = body
        self.conn = conn
        self._hold(conn)
        if req.chunked:
            body = _chunk(body) + b"0\r\n\r\n" if body else b"0\r\n\r\n"
        conn.send(self, req.method == b"HEAD", request_head(req, self.fwd, body))
        self.sent_at = _perf_counter()

    async def run(self, body: bytes, complete: bool, *, retry: bool = False) -> str | None:
        """Forward, relay, wait for the end; the failure reason or None (relayed whole).
        ``retry``: the first attempt failed on a stale connection: only the second runs."""
        fwd, client = self.fwd, self.client
        client.on_lost = self._client_lost
        for attempt in (1,) if retry else (0, 1):
            self.finished = fwd.pool.loop.create_future()
            conn = fwd.pool.idle() if attempt == 0 else None
            if conn is None:
                try:
                    conn = await fwd.pool.acquire(fresh=attempt == 1)
                except TimeoutError:
                    return self._fail("timeout")
                except OSError:
                    return self._fail("connect_error")
            self.conn = conn
            if client.closed:
                conn.close()
                return "client"
            try:
                if complete:
                    self.send(conn, body)
                elif not await self._stream_body(conn, body):
                    return "client"
                outcome = await self.finished
            except BaseException:  # a bug, or the handler cancelled: the connection is in
                conn.close()  # an unknown state, and would stay taken from the pool
                raise
            if attempt == 0 and complete and self.retriable(outcome):
                continue
            return self.settle(outcome)
        return None  # not reached: the second attempt always returns

    def retriable(self, outcome: str | None) -> bool:
        """A reused connection the upstream had closed before answering anything."""
        conn = self.conn
        return outcome == "reset" and conn is not None and conn.reused and not conn.got_bytes

    def _hold(self, conn: UpstreamConnection) -> None:
        """``conn`` is read only while the client keeps up: paused at once when the
        client's buffer is already full (a pipelined request behind a long answer)."""
        client = self.client
        client.on_pause = conn.pause
        if not client.writable:
            conn.pause(True)

    def settle(self, outcome: str | None) -> str | None:
        """After the end: count a failure (502/504 or a cut answer) or the answer relayed
        whole, whose connection goes back to the pool; the failure reason or None."""
        if outcome is not None:
            return self._fail(outcome) if outcome != "client" else outcome
        req, fwd, conn = self.req, self.fwd, self.conn
        added = max(0.0, self.sent_at - req.received_at) if req.received_at else 0.0
        fwd.metrics.answered(self.status, added + self.client_done_at - self.upstream_done_at)
        if conn is not None:
            # The answer is whole: the client's pace no longer holds this connection (its
            # last bytes may have paused it), and the pool takes it only read again.
            self.client.on_pause = None
            if conn.paused:
                conn.pause(False)
            if conn.keep_alive and not conn.closed:
                fwd.pool.release(conn)  # closed there unless clean
            else:
                conn.close()
        return None

    def _end(self, outcome: str | None) -> None:
        """The exchange ended (None: answered whole): wake :meth:`run`, or, on the fast
        path, call ``on_end`` (once)."""
        finished = self.finished
        if finished is not None:
            if not finished.done():
                finished.set_result(outcome)
        elif self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            on_end(self, outcome)

    async def _stream_body(self, conn: UpstreamConnection, prefix: bytes) -> bool:
        """Forward a body too big to hold, chunk by chunk as it arrives."""
        chunked = self.req.chunked
        conn.start(self, self.req.method == b"HEAD")
        self._hold(conn)
        conn.write(
            request_head(self.req, self.fwd, _chunk(prefix) if chunked and prefix else prefix)
        )
        while True:
            try:
                chunk = await self.req.body.read()
            except ConnectionError:
                conn.close()
                return False
            if not chunk:
                break
            conn.write(_chunk(chunk) if chunked else chunk)
            await conn.drain()
        if chunked:
            conn.write(b"0\r\n\r\n")
        conn.watch()
        self.sent_at = _perf_counter()
        return True

    # -- the answer (called by the upstream connection) ------------------------------------

    def on_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        req = self.req
        named = _NO_NAMES
        length: int | None = None
        sse = has_date = False
        parts = [b"HTTP/1.1 %d %b\r\n" % (status, reason)]
        kind_of, seen = _response_kind, _response_kind.seen
        for name, value in headers:  # one pass; a name the Connection header lists: below
            kind = seen.get(name)
            if kind is None:
                kind = kind_of(name)
            if kind:
                if kind >= 4:  # hop-by-hop: not relayed
                    if kind == 4 and value.lower() not in _PLAIN_CONNECTION:
                        named = _named(value) - HOP_BY_HOP
                    continue
                if kind == 1:
                    n = decimal(value)
                    length = n if n >= 0 else None
                elif kind == 2:
                    sse = value.startswith(b"text/event-stream")
                else:
                    has_date = True
            parts.append(name)  # four appends: no tuple per header
            parts.append(b": ")
            parts.append(value)
            parts.append(b"\r\n")
        if named:  # rare: headers made hop-by-hop by the Connection header
            del parts[1:]
            for name, value in headers:
                if name.lower() not in HOP_BY_HOP and name.lower() not in named:
                    parts += (name, b": ", value, b"\r\n")
        if not has_date:
            parts.append(b"Date: " + http_date().encode() + b"\r\n")
        self.resp_headers = headers
        no_body = req.method == b"HEAD" or status in (204, 304)
        if length is None and not no_body:
            if req.version == "1.1":
                self._rechunk = True
                parts.append(b"Transfer-Encoding: chunked\r\n")
            else:
                req.keep_alive = False
        if not req.keep_alive:
            parts.append(b"Connection: close\r\n")
        elif req.version == "1.0":
            parts.append(b"Connection: keep-alive\r\n")
        parts.append(b"\r\n")
        if self.sample and 200 <= status < 300:
            self.capture = []
        if length is not None and length <= WHOLE_BODY_BYTES and not no_body and not sse:
            self._whole = parts  # the body joins the head: one write when it is all here
        else:
            self.guard.started = True
            self.client.write(b"".join(parts))

    def on_body(self, chunk: bytes) -> None:
        if self._whole is not None:
            self._whole.append(chunk)
        else:
            self.client.write(_chunk(chunk) if self._rechunk else chunk)
        if self.capture is not None:
            self._captured += len(chunk)
            if self._captured <= self.fwd.max_body:
                self.capture.append(chunk)
            else:
                self.capture = None
                self.oversize_response = True

    def on_done(self) -> None:
        self.upstream_done_at = _perf_counter()
        if self._whole is not None:
            self.guard.started = True
            self.client.write(b"".join(self._whole))
        elif self._rechunk:
            self.client.write(b"0\r\n\r\n")
        self.client_done_at = _perf_counter()
        self._end(None)

    def on_lost(self, reason: str) -> None:
        self._end(reason)

    def _client_lost(self) -> None:
        if self.conn is not None:
            self.conn.close()  # mid-answer: the connection is not given back to the pool
        self._end("client")

    def _fail(self, reason: str) -> str:
        """Count an upstream failure; answer 502/504, or cut an answer already begun."""
        if self.conn is not None:
            self.conn.close()
        self.fwd.metrics.failed(reason)
        if self.guard.started:
            self.client.abort()  # the client must see the truncation
        elif reason == "timeout":
            self.client.write(error_response(504, "Gateway Timeout", "upstream timed out"))
        elif reason == "connect_error":
            self.client.write(error_response(502, "Bad Gateway", "upstream unreachable"))
        else:
            self.client.write(error_response(502, "Bad Gateway", "upstream broke off"))
        return reason

    def answer(self) -> tuple[bytes, HeaderView] | None:
        """The whole 2xx answer body and headers, for sampling (None: not kept)."""
        if self.capture is None:
            return None
        return b"".join(self.capture), HeaderView(self.resp_headers)
