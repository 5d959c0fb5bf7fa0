"""One chat-completions POST over a pool of keep-alive HTTP/1.1 connections
(:mod:`adapters.upstream.pool`, httptools): the model client's network, in place of
aiohttp's client, which spent about 2.4 times the CPU per call (bench/model_client_bench.py).
A re-ask runs on the event loop that serves the live traffic, so its cost is the live
path's.

:meth:`ModelTransport.post` sends the JSON body to the URL's path, or to the base URL's
path + a path of the call's own (``Host``, ``Content-Type``, ``Accept``,
``Accept-Encoding: identity``, ``User-Agent``, the key the API's way: a Bearer token,
``x-api-key`` or ``x-goog-api-key``, or the URL's user info as Basic credentials, and
the call's own extra headers) and returns the status, the ``Retry-After`` header and the
whole body, decoded when the server compressed it anyway (gzip, deflate). Redirects are
not followed. Failures are :class:`TransportError`, whose ``kind`` is ``timeout`` (no
answer within ``timeout_s``, connecting included), ``connection_error`` (refused, reset,
TLS, an unparseable answer) or ``too_big`` (over ``max_bytes``, announced or received,
before or after decoding).

A pooled connection the server had closed while it was idle fails before any byte comes
back; the request then goes once more on a new connection, which is what every HTTP
client does (the server cannot have acted on a request it never read).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import zlib
from typing import Final
from urllib.parse import SplitResult, quote, unquote, urlsplit

from adapters.upstream.pool import Exchange, UpstreamPool
from monitor.core.errors import ConfigError

__all__ = ["ModelTransport", "TransportError", "host_and_port"]

_USER_AGENT: Final = b"relmon"


class TransportError(Exception):
    """One POST that gave no whole answer: ``kind`` says why (see the module)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Call(Exchange):
    """What one POST's connection reports: the status, headers and body (up to ``limit``
    bytes; past it, the call ends ``too_big`` at once)."""

    __slots__ = ("body", "finished", "headers", "kept", "limit", "size", "status")

    def __init__(self, limit: int, finished: asyncio.Future[str | None]) -> None:
        self.limit = limit
        self.finished = finished
        self.status = 0
        self.kept = False  # a 2xx: its body is the answer, kept; any other's is only read
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.size = 0

    def on_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers = headers
        self.kept = 200 <= status < 300
        if not self.kept:
            return
        length = header(headers, b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.limit:
            self._end("too_big")

    def on_body(self, chunk: bytes) -> None:
        if self.finished.done():
            return
        self.size += len(chunk)
        if not self.kept:  # only the status counts: a long body ends the connection
            if self.size > self.limit:
                self._end("cut")
        elif self.size > self.limit:
            self.body = []
            self._end("too_big")
        else:
            self.body.append(chunk)

    def on_done(self) -> None:
        self._end(None)

    def on_lost(self, reason: str) -> None:
        self._end(reason)

    def _end(self, outcome: str | None) -> None:
        if not self.finished.done():
            self.finished.set_result(outcome)


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), None when absent."""
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _close(pool: UpstreamPool) -> None:
    """Close ``pool``'s idle connections; those of a loop that has ended die with it
    (closing them there raises "Event loop is closed")."""
    with contextlib.suppress(RuntimeError):
        pool.close()


def host_and_port(parts: SplitResult) -> str:
    """``host[:port]`` of a URL, without its user info, an IPv6 address in brackets: the
    ``Host`` header, and what messages show (ValueError for a port that is not one)."""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return host if parts.port is None else f"{host}:{parts.port}"


def _auth_line(scheme: str, key: bytes) -> bytes:
    if scheme == "x-api-key":
        return b"x-api-key: " + key + b"\r\n"
    if scheme == "x-goog-api-key":
        return b"x-goog-api-key: " + key + b"\r\n"
    return b"Authorization: Bearer " + key + b"\r\n"


def _header_line(name: str, value: str) -> bytes:
    """One extra header line; a name or value that could split the head is refused."""
    if not name.isascii() or not name.isprintable() or ":" in name or " " in name:
        raise TransportError("invalid", "a header name relmon cannot send")
    if not value.isprintable() or "\r" in value or "\n" in value:
        raise TransportError("invalid", f"a value of header {name} relmon cannot send")
    return name.encode("ascii") + b": " + value.encode("utf-8") + b"\r\n"


class ModelTransport:
    """POSTs to one endpoint's URLs (see the module)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None,
        timeout_s: float,
        max_connections: int,
        max_bytes: int,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("base_url must be an http:// or https:// URL with a host")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        try:
            port = parts.port
        except ValueError:
            raise ConfigError("base_url has an invalid port") from None
        self._port = port if port is not None else (443 if self._tls else 80)
        self._key = b""
        self._basic = b""
        if api_key:
            if not api_key.isascii() or not api_key.isprintable():
                raise ConfigError("the model API key must be printable ASCII")
            self._key = api_key.encode("ascii")
        elif parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._basic = b"Authorization: Basic " + base64.b64encode(pair.encode()) + b"\r\n"
        self._path = parts.path or "/"
        self._host_line = (
            b" HTTP/1.1\r\nHost: "
            + host_and_port(parts).encode("idna")
            + b"\r\nContent-Type: application/json\r\nAccept: application/json\r\n"
            + b"Accept-Encoding: identity\r\nUser-Agent: "
            + _USER_AGENT
            + b"\r\n"
        )
        self._heads: dict[tuple[str | None, str], bytes] = {}
        self._timeout = timeout_s
        self._max = max_connections
        self._limit = max_bytes
        self._pool: UpstreamPool | None = None
        self._closed = False

    def _head_for(self, path: str | None, auth: str) -> bytes:
        """The request head up to ``Content-Length: `` for a call to ``path`` (under the
        base URL's own path; None: the URL itself) with the key sent the ``auth`` way."""
        head = self._heads.get((path, auth))
        if head is None:
            target = self._path if path is None else self._path.rstrip("/") + path
            credentials = _auth_line(auth, self._key) if self._key else self._basic
            head = (
                b"POST "
                + quote(target, safe="/%:@!$&'()*+,;=~").encode("ascii")
                + self._host_line
                + credentials
                + b"Content-Length: "
            )
            if len(self._heads) < 64:
                self._heads[(path, auth)] = head
        return head

    def close(self) -> None:
        """Close the idle connections; a call still running closes its own at its end."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            _close(pool)

    def _get_pool(self) -> UpstreamPool:
        pool = self._pool
        if pool is None or pool.loop is not asyncio.get_running_loop():
            if pool is not None:  # made on another loop (a script's, a test's)
                _close(pool)
            pool = self._pool = UpstreamPool(
                self._host,
                self._port,
                tls=self._tls,
                connect_timeout_s=self._timeout,
                read_timeout_s=self._timeout,
                max_connections=self._max,
            )
        return pool

    async def post(
        self,
        payload: bytes,
        *,
        path: str | None = None,
        auth: str = "bearer",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> tuple[int, str | None, bytes]:
        """The status, ``Retry-After`` and body of one POST of ``payload`` (to ``path``
        under the base URL, else to the URL; the key sent the ``auth`` way, with
        ``headers`` besides)."""
        if self._closed:
            raise TransportError("closed", "the model client is closed")
        head = self._heads.get((path, auth)) or self._head_for(path, auth)
        if headers:
            extra = b"".join(_header_line(name, value) for name, value in headers)
            head = head.replace(b"Content-Length: ", extra + b"Content-Length: ", 1)
        request = head + str(len(payload)).encode() + b"\r\n\r\n" + payload
        try:
            async with asyncio.timeout(self._timeout):
                call = await self._exchange(self._get_pool(), request)
        except TimeoutError:
            raise TransportError("timeout", f"no response within {self._timeout:g} s") from None
        except OSError as exc:
            raise TransportError(
                "connection_error", f"connection error ({type(exc).__name__})"
            ) from None
        body = b"".join(call.body)
        encoding = (header(call.headers, b"content-encoding") or "").strip().lower()
        if encoding not in ("", "identity"):
            body = self._decoded(encoding, body)
        return call.status, header(call.headers, b"retry-after"), body

    async def _exchange(self, pool: UpstreamPool, request: bytes) -> _Call:
        loop = pool.loop
        for attempt in (0, 1):
            conn = pool.idle() if attempt == 0 else None
            if conn is None:
                conn = await pool.acquire(fresh=attempt == 1)
            call = _Call(self._limit, loop.create_future())
            try:
                conn.send(call, False, request)
                outcome = await call.finished
            except BaseException:  # a timeout or a cancel: the connection is mid-answer
                conn.close()
                raise
            if outcome is None:
                if conn.keep_alive and not conn.closed:
                    pool.release(conn)
                else:
                    conn.close()
                return call
            conn.close()
            if outcome == "cut":  # an error status with a long body: the status is enough
                return call
            if attempt == 0 and outcome == "reset" and conn.reused and not conn.got_bytes:
                continue  # an idle connection the server had closed: once more, fresh
            if outcome == "too_big":
                raise TransportError("too_big", f"body over {self._limit} bytes")
            if outcome == "timeout":
                raise TransportError("timeout", f"no response within {self._timeout:g} s")
            what = "an answer that is not HTTP" if outcome == "invalid_response" else outcome
            raise TransportError("connection_error", f"connection error ({what})")
        raise AssertionError("not reached: the second attempt always returns")

    def _decoded(self, encoding: str, body: bytes) -> bytes:
        """``body`` decompressed (gzip, deflate), at most ``max_bytes`` of it."""
        if encoding in ("gzip", "x-gzip"):
            windows = [zlib.MAX_WBITS | 16]
        elif encoding == "deflate":  # zlib-wrapped as the RFC says, or raw as some send
            windows = [zlib.MAX_WBITS, -zlib.MAX_WBITS]
        else:
            raise TransportError("invalid", f"unsupported Content-Encoding {encoding[:32]!r}")
        for wbits in windows:
            inflater = zlib.decompressobj(wbits)
            try:
                out = inflater.decompress(body, self._limit + 1)
            except zlib.error:
                continue
            if len(out) > self._limit or inflater.unconsumed_tail:
                raise TransportError("too_big", f"body over {self._limit} bytes")
            return out
        raise TransportError("invalid", f"a body that is not valid {encoding}")
