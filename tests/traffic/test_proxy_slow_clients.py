"""A slow client is the client's, never the upstream's: through the real proxy to a real
upstream on 127.0.0.1, with clients on raw sockets whose receive buffer is small (so the
proxy's buffer for them fills, as over a real network, and the proxy stops reading the
upstream while they do not read).

- A client that pauses mid-answer longer than ``upstream_read_timeout_s`` still gets the
  whole answer: the upstream's read timeout runs only while relmon reads the upstream.
- After an answer read slowly, the next requests on the pool get the upstream's answers,
  never relmon's own 504: a connection goes back to the pool only clean (read again,
  its answer complete), else it is closed.
- A client that takes no byte for ``client_send_timeout_s`` is cut: counted, logged
  (rate-limited), its upstream connection closed, never reused.
- A property (hypothesis): random answer sizes (up to 8 MB, with a length or chunked)
  and read patterns (fast, slow, stalled past the upstream timeout, closed early,
  pipelined), each followed by more requests on the pool: every complete answer is the
  upstream's bytes with the upstream's status, and nothing is counted against the
  upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from adapters.traffic.proxy_metrics import FAILURE_REASONS, ProxyMetrics
from adapters.traffic.traffic import TrafficServer, header_task_resolver
from adapters.upstream.pool import Exchange, UpstreamPool
from tests.waiting import wait_until

from .conftest import COMPILED, Recorder, StartTraffic

plain_python_only = pytest.mark.skipif(
    COMPILED,
    reason="drives the pool with an Exchange of its own, which cannot subclass the compiled "
    "one: tests/traffic/test_plain_python.py runs it on the plain-Python modules",
)

UPSTREAM_TIMEOUT_S = 0.5
STALL_S = 1.5  # past the upstream's read timeout (3 times), short of the send timeout
SEND_TIMEOUT_S = 10.0
CLIENT_RCVBUF = 16_384  # the kernel doubles it; a small window, as over a real network


# -- the upstream ----------------------------------------------------------------------------

_payloads: dict[tuple[int, int], bytes] = {}


def payload(size: int, seed: int) -> bytes:
    """``size`` bytes that differ per ``seed`` and per position (a swapped or lost piece,
    or another request's answer, shows)."""
    key = (size, seed)
    if key not in _payloads:
        if len(_payloads) > 64:
            _payloads.clear()
        unit = b"%08d" % seed
        lines = (b"%s:%09d\n" % (unit, i) for i in range(size // 19 + 1))
        _payloads[key] = b"".join(lines)[:size]
    return _payloads[key]


@dataclass
class BytesUpstream:
    """Answers ``GET /bytes/<size>/<seed>`` with :func:`payload` (``/chunked/…``: the same
    bytes chunked), keep-alive; counts its connections and the answers it wrote whole."""

    port: int = 0
    connections: int = 0
    closed: set[int] = field(default_factory=set)
    answered: int = 0
    _server: asyncio.Server | None = None
    _serving: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> BytesUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Close the listener and every connection, and wait for their handlers."""
        if self._server is not None:
            self._server.close()
            for writer in self._writers:
                writer.transport.abort()
            if self._serving:
                await asyncio.wait(self._serving, timeout=5)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.connections
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                kind, size, seed = head.split(b" ", 2)[1].decode().strip("/").split("/")
                body = payload(int(size), int(seed))
                if kind == "chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for i in range(0, len(body), 100_000):
                        piece = body[i : i + 100_000]
                        writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    writer.write(body)
                await writer.drain()
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.add(conn)
            self._writers.discard(writer)
            self._serving.discard(task)
            writer.close()


@pytest.fixture
async def bytes_upstream() -> AsyncIterator[BytesUpstream]:
    upstream = await BytesUpstream().start()
    try:
        yield upstream
    finally:
        await upstream.stop()


@dataclass
class Proxied:
    server: TrafficServer
    registry: CollectorRegistry
    upstream: BytesUpstream

    @property
    def port(self) -> int:
        return self.server.bound_port

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def upstream_failures(self) -> dict[str, float]:
        name = "relmon_proxy_upstream_failures_total"
        return {r: n for r in FAILURE_REASONS if (n := self.count(name, route="default", reason=r))}

    def client_timeouts(self) -> float:
        return self.count("relmon_proxy_client_send_timeouts_total")


async def start_proxy(
    start_traffic: StartTraffic, upstream: BytesUpstream, **kwargs: Any
) -> Proxied:
    registry = CollectorRegistry()
    kwargs.setdefault("upstream_timeout_s", UPSTREAM_TIMEOUT_S)
    kwargs.setdefault("client_send_timeout_s", SEND_TIMEOUT_S)
    server = await start_traffic(
        "proxy", Recorder(), upstream_url=upstream.url, metrics=ProxyMetrics(registry), **kwargs
    )
    return Proxied(server, registry, upstream)


@pytest.fixture
async def proxied(start_traffic: StartTraffic, bytes_upstream: BytesUpstream) -> Proxied:
    return await start_proxy(start_traffic, bytes_upstream)


# -- the clients -----------------------------------------------------------------------------


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection with a small receive buffer (set before connecting)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


def request(kind: str, size: int, seed: int) -> bytes:
    return b"GET /%s/%d/%d HTTP/1.1\r\nHost: relmon\r\n\r\n" % (kind.encode(), size, seed)


@dataclass(frozen=True)
class Pattern:
    """How a client reads one answer's body: ``fast``, ``slow`` (small reads, a pause
    after each), ``stall`` (STALL_S once, at ``at``), ``close`` (leaves at ``at``)."""

    how: str
    at: float = 0.0  # where in the body, a fraction of it


class ClientLeftError(Exception):
    """The client closed its connection on purpose (``close``)."""


async def read_body(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int, pattern: Pattern
) -> bytes:
    """The answer's body, read the ``pattern`` way (chunked or not: the proxy relays the
    upstream's framing, and this decodes either)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    assert status == 200, lines[0]  # the upstream's status: never relmon's own
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if x)}
    chunked = headers.get("transfer-encoding") == "chunked"
    if not chunked:
        assert int(headers["content-length"]) == size
    mark = int(size * pattern.at)
    got = bytearray()
    acted = False

    async def take(n: int) -> bytes:
        nonlocal acted
        if not acted and pattern.how in ("stall", "close") and len(got) + n > mark:
            if len(got) < mark:  # up to the mark first
                return await reader.readexactly(mark - len(got))
            acted = True
            if pattern.how == "close":
                writer.transport.abort()
                raise ClientLeftError
            await asyncio.sleep(STALL_S)  # the client does not read: real time is the point
        if pattern.how == "slow":
            await asyncio.sleep(0.005)  # a slow reader: real time is the point
            return await reader.read(n)  # what has come, up to n
        return await reader.readexactly(n)

    async def read_all() -> None:
        if chunked:
            while True:
                n = int((await reader.readuntil(b"\r\n")).strip(), 16)
                if n == 0:
                    await reader.readexactly(2)
                    return
                want = len(got) + n
                while len(got) < want:
                    got.extend(await take(want - len(got)))
                await reader.readexactly(2)
        else:
            while len(got) < size:
                got.extend(await take(size - len(got)))
            if pattern.how == "close" and not acted:  # the mark at the very end
                writer.transport.abort()
                raise ClientLeftError

    await asyncio.wait_for(read_all(), 30)
    return bytes(got)


async def fetch(port: int, kind: str, size: int, seed: int) -> None:
    """A request on a new connection, read at once: the upstream's exact bytes."""
    reader, writer = await connect(port)
    try:
        writer.write(request(kind, size, seed))
        assert await read_body(reader, writer, size, Pattern("fast")) == payload(size, seed)
    finally:
        writer.close()


# -- the findings, one by one ----------------------------------------------------------------


async def test_a_client_pausing_past_the_upstream_timeout_gets_the_whole_body(
    proxied: Proxied,
) -> None:
    """Once: 20 MB, the client paused 8 s after 1 MB, a 6 s timeout: the body was cut at
    4-5.5 MB (status 200 already sent). Here 6 MB, a pause of 3 upstream timeouts."""
    await pause_past_the_upstream_timeout(proxied)


async def pause_past_the_upstream_timeout(proxied: Proxied) -> None:
    size = 6_000_000
    for seed in range(2):
        reader, writer = await connect(proxied.port)
        try:
            writer.write(request("bytes", size, seed))
            body = await read_body(reader, writer, size, Pattern("stall", 1_000_000 / size))
        finally:
            writer.close()
        assert body == payload(size, seed)
    assert proxied.upstream_failures() == {}
    assert proxied.client_timeouts() == 0


async def test_after_slow_reads_the_pool_answers_the_next_requests(proxied: Proxied) -> None:
    """Once: after a large answer read slowly, the next request got relmon's own 504 (its
    pooled connection still paused, so its answer was never read). Such an answer here
    ends while the proxy holds the upstream paused for the slow client."""
    await slow_reads_then_the_pool(proxied)


async def slow_reads_then_the_pool(proxied: Proxied) -> None:
    # Whether an answer's last bytes come while the client's buffer is full depends on
    # its size and the buffers' sizes: several sizes past what the kernel holds.
    for seed, size in enumerate(range(4_000_000, 7_500_000, 500_000)):
        reader, writer = await connect(proxied.port)
        try:
            writer.write(request("bytes", size, seed))
            assert await read_body(reader, writer, size, Pattern("slow")) == payload(size, seed)
            # The next request on the same client connection, then two on new ones.
            writer.write(request("bytes", 1000, 100 + seed))
            body = await read_body(reader, writer, 1000, Pattern("fast"))
            assert body == payload(1000, 100 + seed)
        finally:
            writer.close()
        await fetch(proxied.port, "bytes", 200_000, 200 + seed)
        await fetch(proxied.port, "chunked", 1000, 300 + seed)
    assert proxied.upstream_failures() == {}


@pytest.mark.parametrize("finding", ["pause", "slow reads"])
def test_both_findings_on_uvloop(finding: str) -> None:
    """The same two, on uvloop (relmon's default loop, ``traffic.uvloop``): its transports
    pause and resume a protocol their own way."""

    async def run() -> None:
        upstream = await BytesUpstream().start()
        registry, recorder = CollectorRegistry(), Recorder()
        server = TrafficServer(
            sink=recorder.sink,
            reject=recorder.reject,
            task_resolver=header_task_resolver("X-Relmon-Task"),
            mode="proxy",
            port=0,
            upstream_url=upstream.url,
            upstream_timeout_s=UPSTREAM_TIMEOUT_S,
            client_send_timeout_s=SEND_TIMEOUT_S,
            metrics=ProxyMetrics(registry),
        )
        await server.start()
        try:
            proxied = Proxied(server, registry, upstream)
            if finding == "pause":
                await pause_past_the_upstream_timeout(proxied)
            else:
                await slow_reads_then_the_pool(proxied)
        finally:
            await server.stop()
            await upstream.stop()

    uvloop.run(run())


@plain_python_only
async def test_the_pool_takes_back_only_a_clean_connection() -> None:
    """A connection whose answer completed while it was paused, or whose answer is not
    complete, is closed by :meth:`UpstreamPool.release`, not handed out again; one read
    again after its answer goes back."""
    upstream = await BytesUpstream().start()

    class Call(Exchange):
        def __init__(self, release_mid_answer: bool = False) -> None:
            self.done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            self.body = bytearray()
            self.release_mid_answer = release_mid_answer

        def on_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
            pass

        def on_body(self, chunk: bytes) -> None:
            self.body += chunk
            if self.release_mid_answer:  # its first bytes: the answer is not complete
                self.release_mid_answer = False
                pool.release(conn)

        def on_done(self) -> None:
            self.done.set_result(None)

        def on_lost(self, reason: str) -> None:
            self.done.set_result(reason)

    pool = UpstreamPool(
        "127.0.0.1",
        upstream.port,
        tls=False,
        connect_timeout_s=2,
        read_timeout_s=UPSTREAM_TIMEOUT_S,
        max_connections=4,
    )
    try:
        conn = await pool.acquire()
        call = Call()
        conn.send(call, False, request("bytes", 10, 1))
        assert await call.done is None
        conn.pause(True)  # its last bytes paused it: a later answer would never be read
        pool.release(conn)
        assert pool.idle() is None and conn.closed
        conn = await pool.acquire()
        call = Call(release_mid_answer=True)
        conn.send(call, False, request("bytes", 5_000_000, 2))
        await wait_until(lambda: conn.closed, what="the connection released mid-answer")
        assert 0 < len(call.body) < 5_000_000
        assert pool.idle() is None
        conn = await pool.acquire()
        call = Call()
        conn.send(call, False, request("bytes", 10, 3))
        conn.pause(True)
        conn.pause(False)
        assert await call.done is None
        pool.release(conn)
        assert pool.idle() is conn
    finally:
        pool.close()
        await upstream.stop()


@plain_python_only
async def test_a_paused_connection_is_not_timed_out_and_the_timer_restarts_on_resume() -> None:
    """The read timeout counts only while relmon reads: paused for 4 timeouts, nothing;
    read again with the upstream silent, it times out within the timeout and a tick."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst")
            await writer.drain()
            await reader.read()  # then nothing more, until the proxy closes
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    pool = UpstreamPool(
        "127.0.0.1",
        server.sockets[0].getsockname()[1],
        tls=False,
        connect_timeout_s=2,
        read_timeout_s=0.2,
        max_connections=1,
    )
    lost: list[str] = []

    class Call(Exchange):
        def on_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
            conn.pause(True)  # as the proxy does when its client cannot keep up

        def on_body(self, chunk: bytes) -> None:
            pass

        def on_done(self) -> None:
            lost.append("done")

        def on_lost(self, reason: str) -> None:
            lost.append(reason)

    try:
        conn = await pool.acquire()
        conn.send(Call(), False, request("bytes", 100, 0))
        await wait_until(lambda: conn.paused, what="the connection paused")
        await asyncio.sleep(0.8)  # 4 read timeouts, paused: real time is the point
        assert lost == [] and not conn.closed
        loop = asyncio.get_running_loop()
        resumed = loop.time()
        conn.pause(False)
        await wait_until(lambda: lost != [], what="the read timeout", timeout_s=5)
        assert lost == ["timeout"]
        assert 0.19 <= loop.time() - resumed < 1.0  # the timeout and a tick (and a busy machine)
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_a_client_stalled_past_the_send_timeout_is_cut(
    start_traffic: StartTraffic, bytes_upstream: BytesUpstream
) -> None:
    """A client that takes no byte for ``client_send_timeout_s`` is cut: counted (not
    as the upstream's failure), logged once however many (rate-limited), its upstream
    connection closed; the next request takes a new one and gets its answer."""
    proxied = await start_proxy(
        start_traffic, bytes_upstream, upstream_timeout_s=5.0, client_send_timeout_s=0.4
    )
    with capture_logs() as logs:
        for seed in range(2):
            upstream_conn = bytes_upstream.connections  # the pool has none idle: a new one
            reader, writer = await connect(proxied.port)
            writer.write(request("bytes", 8_000_000, seed))
            await reader.readexactly(50_000)  # the head and some body, then nothing
            assert bytes_upstream.connections == upstream_conn + 1
            await wait_until(
                lambda c=upstream_conn: c in bytes_upstream.closed,  # type: ignore[misc]
                what="the upstream connection closed",
            )
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                # Whatever the kernel still holds, then the end: never the whole body.
                await asyncio.wait_for(reader.readexactly(8_000_000), 10)
            writer.close()
    assert proxied.client_timeouts() == 2
    assert proxied.upstream_failures() == {}
    lines = [x for x in logs if x["event"] == "traffic_client_send_timeout"]
    assert len(lines) == 1, lines  # the second within the interval: held back
    assert lines[0]["log_level"] == "warning"
    before = bytes_upstream.connections
    await fetch(proxied.port, "bytes", 300_000, 7)
    assert bytes_upstream.connections == before + 1  # the cut ones were never reused


async def test_a_client_that_reads_slowly_but_steadily_is_not_cut(
    start_traffic: StartTraffic, bytes_upstream: BytesUpstream
) -> None:
    """The send timeout is per write, not for the whole answer: a client reading the
    answer over several send timeouts, a little at a time, gets all of it."""
    proxied = await start_proxy(
        start_traffic, bytes_upstream, upstream_timeout_s=5.0, client_send_timeout_s=0.3
    )
    size = 2_000_000
    reader, writer = await connect(proxied.port)
    writer.write(request("bytes", size, 1))
    await reader.readuntil(b"\r\n\r\n")
    got = bytearray()
    loop = asyncio.get_running_loop()
    started = loop.time()
    while len(got) < size:
        got += await reader.read(min(200_000, size - len(got)))
        await asyncio.sleep(0.1)  # a third of the send timeout per read: real time
    writer.close()
    assert bytes(got) == payload(size, 1)
    assert loop.time() - started > 0.3  # it did take longer than one send timeout
    assert proxied.client_timeouts() == 0


# -- the property ----------------------------------------------------------------------------

SIZES = st.one_of(
    st.integers(0, 70_000),  # a small answer (up to 64 KiB: sent with its head at once)
    st.integers(70_000, 1_000_000),  # the kernel's buffers hold it for the client
    st.integers(5_000_000, 8_000_000),  # past them: the proxy holds the upstream paused
)
PATTERNS = st.one_of(
    st.just(Pattern("fast")),
    st.just(Pattern("slow")),
    st.builds(Pattern, st.just("stall"), st.floats(0, 1)),
    st.builds(Pattern, st.just("close"), st.floats(0, 1)),
)
ASKS = st.lists(
    st.tuples(st.sampled_from(["bytes", "chunked"]), SIZES, PATTERNS), min_size=1, max_size=3
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(asks=ASKS, pipelined=st.booleans(), seed=st.integers(0, 10**6))
async def test_every_answer_is_the_upstreams_whatever_the_client_does(
    proxied: Proxied, asks: list[tuple[str, int, Pattern]], pipelined: bool, seed: int
) -> None:
    """Requests on one client connection, sent one after the other or pipelined (all at
    once), each read its own way (a ``close`` ends the connection), then more requests
    on the pool, on the same connection and on new ones: every answer read whole is the
    upstream's bytes, every status the upstream's (200), and the upstream is never
    blamed (no timeout, reset or 504 counted) nor the client cut (no send timeout)."""
    if pipelined:  # requests after a ``close`` are never read
        asks = asks[: next((i + 1 for i, a in enumerate(asks) if a[2].how == "close"), None)]
    reader, writer = await connect(proxied.port)
    left = False
    try:
        if pipelined:
            writer.write(b"".join(request(k, n, seed + i) for i, (k, n, _) in enumerate(asks)))
        for i, (kind, size, pattern) in enumerate(asks):
            if not pipelined:
                writer.write(request(kind, size, seed + i))
            try:
                body = await read_body(reader, writer, size, pattern)
            except ClientLeftError:
                left = True
                break
            assert body == payload(size, seed + i)
        if not left:  # the same connection goes on
            writer.write(request("bytes", 5000, seed + 50))
            assert await read_body(reader, writer, 5000, Pattern("fast")) == payload(
                5000, seed + 50
            )
    finally:
        writer.close()
    for j, (kind, size) in enumerate([("bytes", 1000), ("chunked", 150_000), ("bytes", 0)]):
        await fetch(proxied.port, kind, size, seed + 100 + j)
    assert proxied.upstream_failures() == {}
    assert proxied.client_timeouts() == 0
