"""The inline reverse proxy's data plane: one request from the client to the upstream and
its answer back, as bytes, with no copy of a header or a body it does not need.

Every request (any method and path) goes to the upstream's path prefix + the request's
own target (path and query, byte for byte) on a pooled keep-alive connection
(:mod:`adapters.upstream.pool`), with the client's headers minus hop-by-hop ones,
``Host`` and ``Expect`` (``100-continue`` is answered here). The body keeps its framing
(a length, or chunks). The answer's status, reason, headers (repeated ones too) and body
come back unchanged, hop-by-hop headers dropped; chunked and close-delimited bodies go to
an HTTP/1.1 client chunked. Each body chunk is written to the client as it arrives (an
SSE stream stays a stream); a small body of known length (up to 64 KiB, not SSE) is sent
with its head in one write. The upstream connection stops being read while the client
cannot keep up, and that time is not the upstream's: its read timeout runs only while
relmon reads it. A client that takes no byte for the send timeout is cut
(:class:`~adapters.traffic.wire.ServerConnection`).

Each request goes to the upstream of the first route that matches it
(:class:`~adapters.traffic.routing.Routes`); when none does and there is no default
upstream, relmon answers 404 (counted in ``relmon_proxy_unrouted_requests_total``).
Upstream unreachable: 502; no bytes from the upstream for the read timeout: 504 (or,
once the answer began, the client connection is cut so the truncation shows). A reused
connection the upstream had closed is retried once on a new one when the request body
is held whole. A client leaving (or cut) mid-answer ends the upstream connection (it
never goes back to the pool); one whose answer is whole goes back read again
(:meth:`~adapters.upstream.pool.UpstreamPool.release` takes only a clean one). Only
after the answer completed is a ``POST`` of a wire API relmon
reads (``…/chat/completions``, ``…/responses``, ``…/v1/messages``, ``…:generateContent``,
``…/completions``, a ``generic`` task's path prefix: :meth:`Intake.classify`) with a 2xx
answer sampled (:class:`~adapters.traffic.intake.Intake`); nothing it does can
reach the client. Bodies over ``max_body_bytes`` are forwarded all the same but not
sampled (counted ``"oversize"`` or ``"oversize response"``).
"""

from __future__ import annotations

from collections.abc import Awaitable

import structlog

from adapters.traffic.exchange import ExchangeGuard, ProxyExchange
from adapters.traffic.intake import HeaderView, Intake, event_key
from adapters.traffic.proxy_metrics import ProxyMetrics
from adapters.traffic.request import Request, read_prefix
from adapters.traffic.routing import Routes
from adapters.traffic.wire import ServerConnection, error_response
from monitor.core.failures import internal_error, raised_at

__all__ = [
    "Proxy",
    "event_guard",
    "expect_answered",
    "is_chat_completions_path",
    "is_chat_target",
    "target_path",
]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_log = structlog.get_logger("adapters.traffic.traffic")


def is_chat_completions_path(path: str) -> bool:
    """``…/chat/completions`` under any prefix (``/v1/…``, ``/openai/v1/…``, Azure's …)."""
    return path.rstrip("/").endswith("/chat/completions")


def is_chat_target(target: bytes) -> bool:
    """:func:`is_chat_completions_path` of a raw request target (path and query)."""
    # The usual target first (``find``: ``b"?" in target`` first tries ``b"?"`` as an int,
    # and raises and clears a TypeError inside, on every call).
    if target.endswith(b"/chat/completions") and target.find(b"?") < 0:
        return True
    path = target.partition(b"?")[0]
    return path.endswith(b"/chat/completions") or path.rstrip(b"/").endswith(b"/chat/completions")


def target_path(target: bytes) -> str:
    """The path of a raw request target, decoded as aiohttp does."""
    return target.split(b"?", 1)[0].decode("utf-8", "surrogateescape")


def expect_answered(req: Request, client: ServerConnection) -> bool:
    """``100 Continue`` for ``Expect: 100-continue`` (HTTP/1.1); False after answering
    any other value with a fixed 417 (never echoed) and closing."""
    if req.expect is None or req.version != "1.1":
        return True
    if req.expect.strip().lower() == b"100-continue":
        if not req.body.done:
            client.write(_CONTINUE)
        return True
    req.keep_alive = False
    message = "only Expect: 100-continue is supported"
    client.write(error_response(417, "Expectation Failed", message, close=True))
    return False


def event_guard(intake: Intake, req: Request) -> ExchangeGuard:
    """The guard of one request: an event when it is a ``POST`` of a wire API relmon
    reads (:meth:`Intake.classify`, which counts every request by API)."""
    return ExchangeGuard(intake, intake.classify(req.method, req.target))


class _Retry:
    """A fast-path exchange tried once more, in a task (a class, not a closure in
    :meth:`Proxy._fast_end`: compiled, a closure's frame is built on every call)."""

    __slots__ = ("exchange", "proxy")

    def __init__(self, proxy: Proxy, exchange: ProxyExchange) -> None:
        self.proxy = proxy
        self.exchange = exchange

    async def run(self, req: Request, client: ServerConnection) -> None:
        exchange = self.exchange
        await self.proxy._guarded(
            self.proxy._relay(exchange, True, retry=True), exchange.guard, client
        )


class Proxy:
    """The proxy's request handler (see the module), guarded: whatever one request
    raises is logged, counted once (an event) and answered 500, or cuts the answer."""

    def __init__(self, routes: Routes, intake: Intake, metrics: ProxyMetrics) -> None:
        self.routes = routes
        self.intake = intake
        self.metrics = metrics

    def fast(self, req: Request, client: ServerConnection) -> bool:
        """The fast path (:data:`~adapters.traffic.wire.FastHandler`): a request whose whole
        body is here (within ``max_body_bytes``, no ``Expect``) goes out at once on an idle
        pooled connection, and the answer's callbacks finish it (:meth:`_fast_end`): no
        task, no future. False, for :meth:`handle`, when no connection is idle."""
        fwd = self.routes.pick(req.target)
        if fwd is None or req.expect is not None or req.body.size > fwd.max_body:
            return False
        body = req.body.whole()  # None: the client left
        if body is None:
            return False
        conn = fwd.pool.idle()
        if conn is None:
            return False
        try:
            exchange = ProxyExchange(
                req, client, fwd, event_guard(self.intake, req), self._fast_end
            )
            client.on_lost = exchange._client_lost
            exchange.send(conn, body)
        except Exception:  # a bug, before anything was sent: the handler takes the
            client.on_lost = client.on_pause = None  # request (and reports the bug)
            if conn.exchange is None:
                fwd.pool.release(conn)
            else:
                conn.close()
            return False
        return True

    def _fast_end(self, exchange: ProxyExchange, outcome: str | None) -> None:
        """A fast-path exchange ended: settle it and offer it, as :meth:`handle` does, or
        try once more in a task when the pooled connection had gone stale."""
        client = exchange.client
        if outcome is not None and exchange.retriable(outcome):
            client.resume(exchange.req, _Retry(self, exchange).run)
            return
        try:
            if exchange.settle(outcome) is None:
                self._offer(exchange)
        except Exception as exc:
            self._failed(exc, exchange.guard, client)
        client.on_lost = client.on_pause = None
        client.done(exchange.req)

    async def handle(self, req: Request, client: ServerConnection) -> None:
        guard = event_guard(self.intake, req)
        await self._guarded(self._handle(req, client, guard), guard, client)

    async def _guarded(
        self, work: Awaitable[None], guard: ExchangeGuard, client: ServerConnection
    ) -> None:
        """Run ``work``; a bug in it is reported (:meth:`_failed`), never raised."""
        try:
            await work
        except Exception as exc:  # a bug; asyncio.CancelledError is not an Exception
            self._failed(exc, guard, client)
        finally:
            client.on_lost = client.on_pause = None

    @staticmethod
    def _failed(exc: Exception, guard: ExchangeGuard, client: ServerConnection) -> None:
        reason = internal_error(exc)
        _log.error("traffic_request_failed", error=reason, at=raised_at(exc))
        guard.count(reason)
        if guard.started:
            client.abort()
        else:
            message = f"relmon could not handle this request ({reason})"
            client.write(error_response(500, "Internal Server Error", message))

    async def _handle(self, req: Request, client: ServerConnection, guard: ExchangeGuard) -> None:
        fwd = self.routes.pick(req.target)
        if fwd is None:
            self._unrouted(req, client, guard)
            return
        if not expect_answered(req, client):
            return
        body, complete = b"", True
        if req.has_body:
            whole = req.body.whole() if req.body.size <= fwd.max_body else None
            if whole is not None:  # the usual case: all of it came with the head
                body = whole
            else:
                try:
                    body, complete = await read_prefix(req.body, fwd.max_body)
                except ConnectionError:
                    guard.count("truncated body")
                    return
                if not complete:
                    guard.count("oversize")
        exchange = ProxyExchange(req, client, fwd, guard)
        exchange.sample = guard.event and complete
        exchange.body = body
        await self._relay(exchange, complete)

    def _unrouted(self, req: Request, client: ServerConnection, guard: ExchangeGuard) -> None:
        """No route takes the request and there is no default upstream: 404, counted."""
        self.metrics.unrouted()
        guard.count("no route")
        req.keep_alive = False  # its body, if any, is never read
        message = "relmon: no entry of traffic.routes takes this path, and no upstream_url"
        client.write(error_response(404, "Not Found", message, close=True))

    async def _relay(self, exchange: ProxyExchange, complete: bool, *, retry: bool = False) -> None:
        """Forward and relay (``retry``: only the second attempt), then offer the event."""
        if await exchange.run(exchange.body, complete, retry=retry) is None:
            self._offer(exchange)

    def _offer(self, exchange: ProxyExchange) -> None:
        """After a relayed answer: a sampled event with a whole 2xx answer is offered."""
        if not exchange.sample or not 200 <= exchange.status < 300:
            return
        if exchange.oversize_response:
            exchange.guard.count("oversize response")
            return
        req = exchange.req
        rid, draw = event_key(req.request_id)
        if draw is not None and self.intake.skipped_at_once(draw):
            return  # most requests, at the cost of one random number
        headers = HeaderView(req.headers)
        path = target_path(req.target)
        if not self.intake.skipped(headers, path, rid, draw):
            answer = exchange.answer()
            self.intake.offer(
                exchange.guard.count,
                headers,
                path,
                exchange.body,
                answer=answer,
                rid=rid,
                draw=draw,
            )
