"""The traffic endpoint on aiohttp: a mirror target or an inline reverse proxy (docs/deploy.md).

``mode="mirror"``
    ``POST …/chat/completions`` (``/v1/chat/completions`` under any path prefix, e.g.
    ``/openai/v1/chat/completions``) is answered ``202 {"status": "accepted"}`` as soon as
    the body is read; only then is the body parsed and offered to the sink, so the live
    path (nginx ``mirror``, Envoy, Istio) never waits on relmon. A malformed body still
    gets its 202 (the mirror's answer is discarded anyway, and an error must never be
    fed back into the live path) and is counted with ``reject("mirror", reason)``. A
    body over ``max_body_bytes`` is refused with 413 and counted as ``"oversize"``. A
    log shipper may add the model's answer as a top-level ``"response"`` object (OpenAI
    response shape); it is removed from the request and becomes the event's answer.

``mode="proxy"``
    Every request (any method and path) goes to ``upstream_url + path + query`` with the
    client's headers minus hop-by-hop ones and ``Host``; the upstream's status, headers
    and body come back unchanged (no decompression, no re-encoding) and are relayed chunk
    by chunk as they arrive, so SSE streams stay streams. Only after the response is
    complete is a ``POST …/chat/completions`` with a 2xx answer turned into an event (the
    answer text from ``choices[0].message.content``, or the concatenated ``choices[0].
    delta.content`` of an SSE stream; no body: rejected) and offered to the sink;
    nothing the sink does can reach the client. Upstream unreachable: 502; no bytes from
    upstream for ``upstream_timeout_s``: 504 (or, mid-stream, the client connection is
    closed so the truncation is visible). Bodies over ``max_body_bytes`` are forwarded
    all the same (streamed) but not sampled, and counted as ``"oversize"`` (request) or
    ``"oversize response"``. Small bodies of known length (up to 64 KiB, not SSE) are
    read whole and sent with their headers in one write: one syscall instead of two.

Reject reasons are short fixed strings (``"oversize"``, ``"invalid JSON"``, …) or the
message of an :class:`~monitor.core.errors.InputError` from :mod:`monitor.core.events`; neither
ever holds prompt text. Item ids come from ``X-Request-Id`` when present, else a uuid4.

No request can stop the listener: whatever handling one request raises (a
bug, here or in the sink) is logged with where it was raised; a ``POST
…/chat/completions`` is then counted once as rejected (``internal error: <type>``), and
the client gets a 500 JSON error, or, when its answer had already begun, a closed
connection. The next request is handled as usual.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any, Literal

import aiohttp
import structlog
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from adapters.http import expect as http_expect
from adapters.http.messages import (
    HOP_BY_HOP_HEADERS,
    answer_text,
    json_response_text,
    sse_response_text,
    strip_hop_by_hop,
)
from monitor.core.errors import ConfigError, InputError, StateError
from monitor.core.events import TrafficEvent, event_from_request, is_text, parse_event
from monitor.core.failures import internal_error, raised_at
from monitor.engine.ports import EventSink

__all__ = [
    "HOP_BY_HOP_HEADERS",
    "LISTEN_BACKLOG",
    "RejectCallback",
    "TaskResolver",
    "TrafficServer",
    "header_task_resolver",
    "is_chat_completions_path",
    "json_response_text",
    "sse_response_text",
]

TaskResolver = Callable[[Mapping[str, str], str, Mapping[str, Any]], str | None]
"""``(headers, path, request body) -> task`` (``None``: let the service decide)."""

RejectCallback = Callable[[str, str], None]
"""``reject(source, reason)`` for malformed traffic (counted in metrics)."""

_MAX_REQUEST_ID = 256
_WHOLE_BODY_BYTES = 65_536
_log = structlog.get_logger(__name__)

LISTEN_BACKLOG = 1024
"""Pending connections the traffic port queues (aiohttp's default is 128; the kernel caps
it at net.core.somaxconn). A mirror opens a connection per copy when its pool is busy:
after a stall of the machine, a queue of 128 dropped SYNs, and the mirror's copies were
lost before relmon could count them (measured in bench/soak.py --max-connections 0)."""


def is_chat_completions_path(path: str) -> bool:
    """``…/chat/completions`` under any prefix (``/v1/…``, ``/openai/v1/…``, Azure's …)."""
    return path.rstrip("/").endswith("/chat/completions")


def header_task_resolver(
    header: str = "X-Relmon-Task",
    default: str | None = None,
    allowed: Collection[str] | None = None,
) -> TaskResolver:
    """A resolver that reads the task from one request header (``default`` if absent).

    With ``allowed``, any other value also gives ``default``: the task becomes a metric
    label, so clients must not be able to mint new ones.
    """

    def resolve(headers: Mapping[str, str], path: str, body: Mapping[str, Any]) -> str | None:
        value = headers.get(header, "").strip()
        if not value or (allowed is not None and value not in allowed):
            return default
        return value

    return resolve


def _request_id(headers: Mapping[str, str]) -> str:
    """``X-Request-Id`` (a uuid4 when absent or too long); InputError if not UTF-8."""
    rid = headers.get("X-Request-Id", "").strip()
    if not is_text(rid):  # undecodable header bytes arrive as lone surrogates
        raise InputError("X-Request-Id is not valid UTF-8")
    return rid if 0 < len(rid) <= _MAX_REQUEST_ID else uuid.uuid4().hex


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "relmon_traffic_error"}}, status=status
    )


async def _read_prefix(content: aiohttp.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit + 1`` bytes; ``True`` when the body ended within ``limit``."""
    buf = bytearray()
    while len(buf) <= limit:
        chunk = await content.read(limit + 1 - len(buf))
        if not chunk:
            return bytes(buf), True
        buf += chunk
    return bytes(buf), False


async def _chain(prefix: bytes, rest: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    yield prefix
    async for chunk in rest.iter_any():
        yield chunk


class _Exchange:
    """One request: an event (``POST …/chat/completions``)? counted? its answer begun?"""

    __slots__ = ("counted", "event", "finished", "started")

    def __init__(self, event: bool) -> None:
        self.event = event
        self.counted = False
        self.started: web.StreamResponse | None = None
        self.finished = False


class TrafficServer:
    """The mirror or proxy endpoint. ``await start()``, ``await stop()``."""

    def __init__(
        self,
        *,
        sink: EventSink,
        reject: RejectCallback,
        task_resolver: TaskResolver,
        mode: Literal["mirror", "proxy"],
        port: int,
        host: str = "127.0.0.1",
        upstream_url: str | None = None,
        max_body_bytes: int = 1_048_576,
        upstream_timeout_s: float = 60.0,
        upstream_connect_timeout_s: float = 5.0,
        upstream_max_connections: int = 256,
        shutdown_timeout_s: float = 5.0,
        access_log: bool = False,
    ) -> None:
        if mode not in ("mirror", "proxy"):
            raise ConfigError(f"traffic mode must be 'mirror' or 'proxy', not {mode!r}")
        if mode == "proxy":
            url = URL(upstream_url or "")
            if url.scheme not in ("http", "https") or not url.host:
                raise ConfigError("proxy mode needs an http(s) upstream_url")
        if max_body_bytes <= 0 or upstream_timeout_s <= 0 or upstream_connect_timeout_s <= 0:
            raise ConfigError("max_body_bytes and the upstream timeouts must be positive")
        self._sink = sink
        self._reject = reject
        self._task_resolver = task_resolver
        self._mode = mode
        self._host = host
        self._port = port
        self._upstream = (upstream_url or "").rstrip("/")
        self._max_body = max_body_bytes
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=upstream_connect_timeout_s, sock_read=upstream_timeout_s
        )
        self._max_connections = upstream_max_connections
        self._shutdown_timeout = shutdown_timeout_s
        self._access_log = access_log
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        if self._bound_port is None:
            raise StateError("TrafficServer is not started")
        return self._bound_port

    async def start(self) -> None:
        """Listen; :class:`ConfigError` if the address cannot be bound."""
        if self._runner is not None:
            raise StateError("TrafficServer already started")
        app = web.Application(client_max_size=self._max_body)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        http_expect.install(app)
        if self._mode == "proxy":
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections, limit_per_host=0, ttl_dns_cache=300
                ),
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        if self._access_log:
            runner = web.AppRunner(
                app,
                handle_signals=False,
                access_log_class=_AccessLogger,
                shutdown_timeout=self._shutdown_timeout,
            )
        else:
            runner = web.AppRunner(
                app, handle_signals=False, access_log=None, shutdown_timeout=self._shutdown_timeout
            )
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, backlog=LISTEN_BACKLOG)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            await self._close_session()
            raise ConfigError(
                f"cannot listen on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        self._bound_port = int(runner.addresses[0][1])
        _log.info("traffic_server_started", mode=self._mode, host=self._host, port=self._bound_port)

    async def stop(self) -> None:
        """Stop listening, let running requests finish (up to the shutdown timeout)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self._close_session()
        self._bound_port = None

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- guard --------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """The mirror or proxy handler for one request, guarded (see the module)."""
        ex = _Exchange(request.method == "POST" and is_chat_completions_path(request.path))
        try:
            if self._mode == "mirror":
                return await self._mirror(request, ex)
            return await self._proxy(request, ex)
        except Exception as exc:  # a bug; asyncio.CancelledError is not an Exception
            reason = internal_error(exc)
            _log.error("traffic_request_failed", error=reason, at=raised_at(exc))
            self._count(ex, reason)
            if ex.started is not None:  # the answer began: cut short, the client must see it
                if not ex.finished and request.transport is not None:
                    request.transport.abort()
                return ex.started
            return _json_error(500, f"relmon could not handle this request ({reason})")

    def _count(self, ex: _Exchange, reason: str) -> None:
        """Count the request's event as rejected, once (a request that is no event: never)."""
        if ex.event and not ex.counted:
            ex.counted = True
            self._reject(self._mode, reason)

    # -- mirror -------------------------------------------------------------------------

    async def _mirror(self, request: web.Request, ex: _Exchange) -> web.StreamResponse:
        if not ex.event:
            return _json_error(404, "only POST …/chat/completions is mirrored")
        length = request.content_length
        try:
            if length is not None and length > self._max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self._max_body, actual_size=length)
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self._count(ex, "oversize")
            return _json_error(413, f"request body over {self._max_body} bytes")
        except (aiohttp.ClientPayloadError, ConnectionError):
            self._count(ex, "truncated body")
            return _json_error(400, "request body was cut short")
        response = web.json_response({"status": "accepted"}, status=202)
        ex.started = response
        try:
            await response.prepare(request)
            await response.write_eof()  # the mirror has its answer before any parsing
            ex.finished = True
        except ConnectionError:
            pass  # the mirror went away: its answer is discarded anyway, the body is whole
        self._offer(ex, request.headers, request.path, body, None)
        return response

    # -- proxy --------------------------------------------------------------------------

    async def _proxy(self, request: web.Request, ex: _Exchange) -> web.StreamResponse:
        session = self._session
        if session is None:
            return _json_error(503, "proxy is stopping")
        body: bytes | None = b""  # none: not a chat request, counted as invalid JSON
        data: bytes | AsyncIterator[bytes] | None = None
        if request.body_exists:
            try:
                body, complete = await _read_prefix(request.content, self._max_body)
            except (aiohttp.ClientPayloadError, ConnectionError):
                self._count(ex, "truncated body")
                return _json_error(400, "request body was cut short")
            data = body if complete else _chain(body, request.content)
            if not complete:
                body = None
                self._count(ex, "oversize")
        headers = strip_hop_by_hop(request.headers.items(), request.headers.get("Connection", ""))
        headers.popall("Host", None)
        headers.popall("Expect", None)  # the body is already read; 100-continue was answered
        url = URL(self._upstream + request.raw_path, encoded=True)
        try:
            upstream = await session.request(
                request.method, url, headers=headers, data=data, allow_redirects=False
            )
        except TimeoutError:
            return _json_error(504, "upstream timed out")
        except aiohttp.ClientError as exc:
            _log.warning("proxy_upstream_unreachable", error=type(exc).__name__)
            return _json_error(502, "upstream unreachable")
        keep = ex.event and body is not None and upstream.ok
        try:
            resp, captured = await self._relay(request, upstream, ex, keep=keep)
        finally:
            upstream.close()  # after a full read the connection is already back in the pool
        if captured is not None and body is not None:
            self._offer(ex, request.headers, request.path, body, (captured, upstream.headers))
        return resp

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, ex: _Exchange, *, keep: bool
    ) -> tuple[web.StreamResponse, bytes | None]:
        """Copy the upstream answer to the client as it arrives.

        With ``keep``, also returns the body (up to ``max_body_bytes``) once the whole
        exchange completed, for sampling; ``None`` otherwise.
        """
        headers = strip_hop_by_hop(upstream.headers.items(), upstream.headers.get("Connection", ""))
        if _small_and_whole(request.method, upstream):
            return await self._relay_whole(request, upstream, headers, ex, keep=keep)
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        capture: bytearray | None = bytearray() if keep else None
        try:
            ex.started = resp
            await resp.prepare(request)
            while True:
                try:
                    chunk = await upstream.content.readany()
                except (TimeoutError, aiohttp.ClientError) as exc:
                    _log.warning("proxy_upstream_broke_off", error=type(exc).__name__)
                    if request.transport is not None:
                        request.transport.abort()  # the client must see the truncation
                    return resp, None
                if not chunk:
                    break
                await resp.write(chunk)
                if capture is not None:
                    if len(capture) + len(chunk) <= self._max_body:
                        capture += chunk
                    else:
                        capture = None
                        self._count(ex, "oversize response")
            await resp.write_eof()
            ex.finished = True
        except ConnectionError:  # the client went away
            return resp, None
        return resp, bytes(capture) if capture is not None else None

    async def _relay_whole(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        headers: CIMultiDict[str],
        ex: _Exchange,
        *,
        keep: bool,
    ) -> tuple[web.StreamResponse, bytes | None]:
        """A small body of known length: read it, send headers and body in one write."""
        try:
            data = await upstream.read()
        except TimeoutError:
            return _json_error(504, "upstream timed out"), None
        except aiohttp.ClientError as exc:
            _log.warning("proxy_upstream_broke_off", error=type(exc).__name__)
            return _json_error(502, "upstream broke off"), None
        resp = web.Response(
            body=data, status=upstream.status, reason=upstream.reason, headers=headers
        )
        try:
            ex.started = resp
            await resp.prepare(request)
            await resp.write_eof()
            ex.finished = True
        except ConnectionError:  # the client went away
            return resp, None
        return resp, data if keep and len(data) <= self._max_body else None

    # -- both ---------------------------------------------------------------------------

    def _offer(
        self,
        ex: _Exchange,
        headers: Mapping[str, str],
        path: str,
        raw: bytes,
        answer: tuple[bytes, CIMultiDictProxy[str]] | None,
    ) -> None:
        """Parse, build the event (with the answer's text from the upstream's ``answer``
        body and headers) and offer it; never raises: whatever fails is counted once."""
        source = self._mode
        try:
            text = None if answer is None else answer_text(*answer)
            event = self._event(source, headers, path, raw, text)
            self._sink(event, source)  # the sink counts its decision last: nothing twice
        except InputError as exc:
            self._count(ex, str(exc))
        except Exception as exc:  # a bug, here or in the sink
            reason = internal_error(exc)
            _log.error("traffic_event_failed", source=source, error=reason, at=raised_at(exc))
            self._count(ex, reason)

    def _event(
        self, source: str, headers: Mapping[str, str], path: str, raw: bytes, text: str | None
    ) -> TrafficEvent:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # also too deep, or a 5,000-digit number
            raise InputError("invalid JSON") from None
        if not isinstance(body, dict):
            raise InputError("request body is not a JSON object")
        logged = body.pop("response", None) if source == "mirror" else None
        item_id = _request_id(headers)
        task = self._task_resolver(headers, path, body)
        if logged is None:
            return event_from_request(item_id, body, task=task, response_text=text)
        return parse_event(
            {"id": item_id, "model": body.get("model"), "task": task, "request": body}
            | {"response": logged}
        )


def _small_and_whole(method: str, upstream: aiohttp.ClientResponse) -> bool:
    """A JSON-sized body of known length that is not a stream: no point streaming it."""
    length = upstream.content_length
    return (
        length is not None
        and length <= _WHOLE_BODY_BYTES
        and method != "HEAD"
        and upstream.status >= 200
        and upstream.status not in (204, 304)
        and not upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    )


class _AccessLogger(AbstractAccessLogger):
    """One line per request: method, path, status, time (no headers: they hold keys)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        _log.info(
            "traffic_request",
            method=request.method,
            path=request.path,
            status=response.status,
            seconds=round(time, 6),
        )
