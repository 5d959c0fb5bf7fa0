"""A request as the traffic port parsed it: its head (the values read from it, and the
header lines a proxy forwards, from one pass over the headers) and its body as it
arrives (:class:`Body`; reading pauses while more than :data:`HIGH_WATER` bytes of it
wait). :class:`HeaderKinds` classifies header names by their raw bytes, remembered, so a
name a peer sends on every request costs a dict lookup.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

import httptools

from adapters.traffic.messages import HOP_BY_HOP_HEADERS

__all__ = [
    "HIGH_WATER",
    "HOP_BY_HOP",
    "NOT_FORWARDED",
    "Body",
    "FlowControl",
    "HeaderKinds",
    "Request",
    "decimal",
    "read_prefix",
]


class FlowControl(Protocol):
    """The connection a body arrives on: reading it pauses and resumes."""

    read_paused: bool

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


HIGH_WATER: Final = 262_144
_LOW_WATER: Final = 65_536
HOP_BY_HOP: Final = frozenset(h.encode() for h in HOP_BY_HOP_HEADERS)
NOT_FORWARDED: Final = HOP_BY_HOP | {b"host", b"expect"}
"""The request headers a proxy does not pass on as they came: the hop-by-hop ones
(RFC 9110 7.6.1), ``Host`` (the upstream's own) and ``Expect`` (answered here)."""


class HeaderKinds:
    """What a header name is, by the raw name as it came: ``kinds`` maps lower-case
    names to a kind (any other name is kind 0); answers are remembered for up to
    ``limit`` distinct raw names (a client's own names cannot grow it without bound), so
    the few names a peer sends again and again cost one dict lookup, not a ``lower()``."""

    __slots__ = ("_kinds", "_limit", "seen")

    def __init__(self, kinds: dict[bytes, int], limit: int = 512) -> None:
        self._kinds = kinds
        self._limit = limit
        self.seen: dict[bytes, int] = {}
        """The answers remembered: a caller in a loop reads this first (``seen.get``)."""

    def __call__(self, name: bytes) -> int:
        kind = self.seen.get(name)
        if kind is None:
            kind = self._kinds.get(name.lower(), 0)
            if len(self.seen) < self._limit:
                self.seen[name] = kind
        return kind


# Request header kinds: 0 forwarded as it came; 1-5 read here (1-2 forwarded too). Each
# name Final: compiled, a C constant, where a plain module name is a dict lookup per use.
_LENGTH: Final = 1
_REQUEST_ID: Final = 2
_CONNECTION: Final = 3
_ENCODING: Final = 4
_EXPECT: Final = 5
_DROPPED: Final = 6
_request_kind: Final = HeaderKinds(
    dict.fromkeys(NOT_FORWARDED, _DROPPED)
    | {b"content-length": _LENGTH, b"x-request-id": _REQUEST_ID}
    | {b"connection": _CONNECTION, b"transfer-encoding": _ENCODING, b"expect": _EXPECT}
)


def decimal(value: bytes) -> int:
    """``int(value)`` when ``value`` is ASCII digits (``value.isdigit()``), else -1: one
    compiled loop, where ``isdigit()`` and ``int()`` were two calls by name."""
    if not value:
        return -1
    n = 0
    for c in value:
        if c < 48 or c > 57:
            return -1
        n = n * 10 + c - 48
    return n


class Body:
    """A request body as it arrives; :meth:`read` gives its chunks, ``b""`` at the end."""

    __slots__ = ("_chunks", "_conn", "_waiter", "buffered", "discard", "done", "error", "size")

    def __init__(self, conn: FlowControl) -> None:
        self._conn = conn
        # A list: compiled, its operations are native calls, where a deque's are looked up
        # by name (at most HIGH_WATER bytes wait: a pop from the front stays cheap).
        self._chunks: list[bytes] = []
        self._waiter: asyncio.Future[None] | None = None
        self.buffered = 0
        self.size = 0
        self.done = False
        self.discard = False
        self.error: BaseException | None = None

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.discard:
            return
        self._chunks.append(chunk)
        self.buffered += len(chunk)
        if self.buffered > HIGH_WATER:
            self._conn.pause_reading()
        if self._waiter is not None:
            self._wake()

    def finish(self) -> None:
        self.done = True
        if self._waiter is not None:
            self._wake()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes:
        """The next chunk, ``b""`` at the end; ConnectionError if the client left."""
        while not self._chunks:
            if self.error is not None:
                raise ConnectionError("the client closed the connection")
            if self.done:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        chunk = self._chunks.pop(0)
        self.buffered -= len(chunk)
        if self.buffered < _LOW_WATER:
            self._conn.resume_reading()
        return chunk

    def whole(self) -> bytes | None:
        """The whole body, without waiting, when all of it has arrived (a single chunk
        is not copied); None while more may come or when the client left. It stays
        held: asked again (by a handler the fast path left it to), the same bytes."""
        if not self.done or self.error is not None or self.discard:
            return None
        chunks = self._chunks
        if len(chunks) > 1:
            joined = b"".join(chunks)
            chunks.clear()
            chunks.append(joined)
        if self._conn.read_paused:  # all of it is here: nothing more to hold back
            self._conn.resume_reading()
        return chunks[0] if chunks else b""

    def skip_rest(self) -> None:
        """Nobody reads the rest: drop what waits and what still comes."""
        self.discard = True
        self._chunks.clear()
        self.buffered = 0
        self._conn.resume_reading()


class Request:
    """One parsed request head, its body to come, and when it was received
    (``received_at``: ``time.perf_counter()`` once the whole request is here).

    ``headers``: every ``(name, value)`` as received; ``forwarded``: the header lines a
    proxy passes on (:data:`NOT_FORWARDED` left out), as parts to join.
    """

    __slots__ = (
        "body",
        "chunked",
        "connection",
        "content_length",
        "expect",
        "forwarded",
        "headers",
        "keep_alive",
        "method",
        "received_at",
        "request_id",
        "target",
        "version",
    )

    def __init__(
        self,
        parser: httptools.HttpRequestParser,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: Body,
    ) -> None:
        self.method: bytes = parser.get_method()
        self.target = target
        self.headers = headers
        self.keep_alive: bool = parser.should_keep_alive()
        # One pass over the headers: the ones read here (the last of each, but the first
        # X-Request-Id), and the lines a proxy forwards.
        forwarded: list[bytes] = []
        connection: bytes | None = None
        expect = request_id = length = encoding = None
        kind_of, seen = _request_kind, _request_kind.seen
        for name, value in self.headers:
            kind = seen.get(name)
            if kind is None:
                kind = kind_of(name)
            if kind:
                if kind == _LENGTH:
                    length = value
                elif kind == _REQUEST_ID:
                    request_id = value if request_id is None else request_id
                else:
                    if kind == _CONNECTION:
                        connection = value
                    elif kind == _ENCODING:
                        encoding = value
                    elif kind == _EXPECT:
                        expect = value
                    continue  # not forwarded
            forwarded.append(name)  # four appends: no tuple per header
            forwarded.append(b": ")
            forwarded.append(value)
            forwarded.append(b"\r\n")
        self.forwarded = forwarded
        # Kept alive with no Connection header: HTTP/1.1, as llhttp decides keep-alive (an
        # HTTP/1.0 request is kept alive only by "Connection: keep-alive"). The version
        # string is built only otherwise: httptools formats it anew on every call.
        if self.keep_alive and connection is None:
            self.version: str = "1.1"
        else:
            self.version = parser.get_http_version()
        self.connection: bytes = b"" if connection is None else connection
        self.expect: bytes | None = expect
        self.request_id: bytes | None = request_id
        self.chunked = encoding is not None and b"chunked" in encoding.lower()
        self.content_length: int | None = None
        if length is not None:
            n = decimal(length)
            if n >= 0:
                self.content_length = n
        self.body = body
        self.received_at = 0.0

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)


async def read_prefix(body: Body, limit: int) -> tuple[bytes, bool]:
    """At least the first ``limit + 1`` bytes of ``body`` (all of it if shorter; a single
    chunk is not copied); ``True`` when the body ended within ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await body.read()
        if not chunk:
            return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False
