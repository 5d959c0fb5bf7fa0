"""The traffic endpoint: a mirror target or an inline reverse proxy (docs/deploy.md).

The data plane is relmon's own, apart from aiohttp (which serves the review API and the
metrics): HTTP/1.1 on a raw asyncio protocol parsed by httptools (:mod:`.wire`), a pool
of persistent keep-alive connections to the upstream (:mod:`.upstream`), the proxy's
exchange (:mod:`.proxy`) and the mirror's handler (:mod:`.mirror`). Nothing on the
live path logs per request or parses JSON: an event is decided from the request's head
first and only a request that may be sampled is parsed (:mod:`.intake`).

``mode="mirror"``: ``POST …/chat/completions`` is answered ``202`` as soon as the body is
read (413 over ``max_body_bytes``, 404 for anything else), then offered.
``mode="proxy"``: every request goes to the upstream and its answer comes back unchanged
(streaming included); a ``POST …/chat/completions`` with a whole 2xx answer is offered
afterwards. Upstream unreachable: 502; no bytes for ``upstream_timeout_s`` while relmon
reads the upstream: 504. A client that takes no byte of its answer for
``client_send_timeout_s`` while relmon's buffer for it is full is cut (counted in
``relmon_proxy_client_send_timeouts_total``, logged rate-limited); while it does not
read, relmon does not read the upstream either, and that time is not the upstream's.

No request can stop the listener: whatever handling one request raises is logged with
where it was raised; a ``POST …/chat/completions`` is then counted once as rejected
(``internal error: <type>``), and the client gets a 500 JSON error, or, when its answer
had already begun, a closed connection.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

import structlog
from yarl import URL

from adapters.traffic import wire
from adapters.traffic.exchange import Forwarding
from adapters.traffic.intake import (
    Intake,
    RejectCallback,
    RelayCallback,
    SeenCallback,
    SkipCallback,
    TaskResolver,
)
from adapters.traffic.messages import HOP_BY_HOP_HEADERS, json_response_text, sse_response_text
from adapters.traffic.mirror import Mirror
from adapters.traffic.proxy import Proxy, is_chat_completions_path
from adapters.traffic.proxy_metrics import DEFAULT_ROUTE, ProxyMetrics
from adapters.traffic.routing import Routes, RouteSpec
from adapters.traffic.wire import FastHandler, Handler, ServerConnection
from adapters.upstream.pool import UpstreamPool
from monitor.core.apis.base import WireApi
from monitor.core.errors import ConfigError, StateError
from monitor.engine.logs import ThrottledLog
from monitor.engine.ports import EventSink

__all__ = [
    "HOP_BY_HOP_HEADERS",
    "LISTEN_BACKLOG",
    "RejectCallback",
    "SkipCallback",
    "TaskResolver",
    "TrafficServer",
    "header_task_resolver",
    "is_chat_completions_path",
    "json_response_text",
    "sse_response_text",
]

_log = structlog.get_logger(__name__)

LISTEN_BACKLOG = 1024
"""Pending connections the traffic port queues (the kernel caps it at
net.core.somaxconn). A mirror opens a connection per copy when its pool is busy: after a
stall of the machine, a queue of 128 dropped SYNs, and the mirror's copies were lost
before relmon could count them (measured in bench/soak.py --max-connections 0)."""


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


def _check_upstreams(default: URL | None, routes: Sequence[RouteSpec]) -> None:
    for url in [default, *(URL(r.upstream_url) for r in routes)]:
        if url is not None and (url.scheme not in ("http", "https") or not url.host):
            raise ConfigError(f"not an http(s) upstream URL: {url}")
    if default is None and not routes:
        raise ConfigError("proxy mode needs an http(s) upstream_url or routes")


class TrafficServer:
    """The mirror or proxy endpoint. ``await start()``, ``await stop()``.

    ``skip`` is the service's fast path (``skip(source, task or None, event id)``, see
    :mod:`.intake`); without it every event request is parsed and offered. ``metrics``:
    the proxy's own (:class:`.proxy_metrics.ProxyMetrics`), on a private registry if
    none is given. ``relay``: an event request is handed to it unparsed instead of
    being offered (:mod:`.dataplane`). ``sock``: listen on this bound socket instead of
    binding ``host:port``. ``max_sampling_rate``: the highest rate of any task; a request
    without ``X-Request-Id`` whose draw is at or above it is skipped without resolving
    its task (:mod:`.intake`). ``offer_batch_s``: the requests that may be sampled are
    parsed and offered together, at most this long after the first of them
    (:meth:`flush_offers` and :meth:`stop` do it at once); 0: each at once.
    """

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
        routes: Sequence[RouteSpec] = (),
        max_body_bytes: int = 1_048_576,
        upstream_timeout_s: float = 60.0,
        upstream_connect_timeout_s: float = 5.0,
        client_send_timeout_s: float = 60.0,
        upstream_max_connections: int = 256,
        shutdown_timeout_s: float = 5.0,
        skip: SkipCallback | None = None,
        metrics: ProxyMetrics | None = None,
        relay: RelayCallback | None = None,
        sock: socket.socket | None = None,
        max_sampling_rate: float = 1.0,
        offer_batch_s: float = 0.0,
        seen: SeenCallback | None = None,
        generic_apis: Sequence[tuple[str, WireApi]] = (),
    ) -> None:
        if mode not in ("mirror", "proxy"):
            raise ConfigError(f"traffic mode must be 'mirror' or 'proxy', not {mode!r}")
        self._url = URL(upstream_url) if upstream_url else None
        self._routes = list(routes)
        if mode == "proxy":
            _check_upstreams(self._url, self._routes)
        if (
            min(
                max_body_bytes,
                upstream_timeout_s,
                upstream_connect_timeout_s,
                client_send_timeout_s,
            )
            <= 0
        ):
            raise ConfigError("max_body_bytes and the timeouts must be positive")
        if upstream_max_connections < 1:
            raise ConfigError("upstream_max_connections must be at least 1")
        if offer_batch_s < 0:
            raise ConfigError("offer_batch_s must not be negative")
        self._intake = Intake(
            mode,
            sink=sink,
            reject=reject,
            task_resolver=task_resolver,
            skip=skip,
            relay=relay,
            max_rate=max_sampling_rate,
            batch_s=offer_batch_s,
            seen=seen,
            generic=generic_apis,
        )
        self._sock = sock
        self._mode = mode
        self._host = host
        self._port = port
        self._max_body = max_body_bytes
        self._read_timeout = upstream_timeout_s
        self._connect_timeout = upstream_connect_timeout_s
        self._send_timeout = client_send_timeout_s
        self._stall_log = ThrottledLog(name=__name__)  # a client can trigger it: rate-limited
        self._max_connections = upstream_max_connections
        self._shutdown_timeout = shutdown_timeout_s
        self._metrics = metrics if metrics is not None else ProxyMetrics()
        self._server: asyncio.Server | None = None
        self._pools: list[UpstreamPool] = []
        self._connections: set[ServerConnection] = set()
        self._bound_port: int | None = None

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        if self._bound_port is None:
            raise StateError("TrafficServer is not started")
        return self._bound_port

    def flush_offers(self) -> None:
        """Offer the requests waiting for their batch now (before a scrape, say)."""
        self._intake.flush()

    def _handler(self) -> tuple[Handler, FastHandler | None]:
        if self._mode == "mirror":
            return Mirror(self._intake, self._max_body).handle, None
        entries = [(r, self._forwarding(r)) for r in self._routes]
        default = None
        if self._url is not None:
            default = self._forwarding(RouteSpec(DEFAULT_ROUTE, str(self._url)))
        routes = Routes(entries, default, self._max_body)
        proxy = Proxy(routes, self._intake, self._metrics)
        return proxy.handle, proxy.fast

    def _forwarding(self, route: RouteSpec) -> Forwarding:
        """A route's upstream: its own pool, ``Host`` and metrics."""
        url = URL(route.upstream_url)
        assert url.host is not None
        default_port = url.port == {"http": 80, "https": 443}[url.scheme]
        host = url.host if default_port else f"{url.host}:{url.port}"
        read_timeout = route.read_timeout_s or self._read_timeout
        pool = UpstreamPool(
            url.host,
            url.port or 80,
            tls=url.scheme == "https",
            connect_timeout_s=route.connect_timeout_s or self._connect_timeout,
            read_timeout_s=read_timeout,
            max_connections=route.pool_size or self._max_connections,
        )
        self._pools.append(pool)
        return Forwarding(
            pool,
            prefix=url.raw_path.rstrip("/").encode(),
            host_header=host.encode("idna"),
            read_timeout_s=read_timeout,
            max_body=self._max_body,
            metrics=self._metrics.route(route.label),
        )

    async def start(self) -> None:
        """Listen; :class:`ConfigError` if the address cannot be bound."""
        if self._server is not None:
            raise StateError("TrafficServer already started")
        handler, fast = self._handler()
        loop = asyncio.get_running_loop()
        connections = self._connections
        send_timeout, stalled = self._send_timeout, self._client_stalled

        def connection() -> ServerConnection:
            return ServerConnection(handler, connections, fast, send_timeout, stalled)

        try:
            if self._sock is not None:
                server = await loop.create_server(
                    connection, sock=self._sock, backlog=LISTEN_BACKLOG
                )
            else:
                server = await loop.create_server(
                    connection,
                    self._host,
                    self._port,
                    backlog=LISTEN_BACKLOG,
                )
        except OSError as exc:
            self._close_pool()
            raise ConfigError(
                f"cannot listen on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from None
        self._server = server
        self._bound_port = int(server.sockets[0].getsockname()[1])
        _log.info(
            "traffic_server_started",
            mode=self._mode,
            host=self._host,
            port=self._bound_port,
            compiled=not wire.__file__.endswith(".py"),  # make compile, the container image
        )

    def _client_stalled(self) -> None:
        """A client took no byte of its answer for the send timeout: it is cut."""
        self._metrics.client_send_timeout()
        self._stall_log.warning(
            "traffic_client_send_timeout",
            client_send_timeout_s=self._send_timeout,
            detail="the client read nothing of its answer: connection cut",
        )

    async def stop(self) -> None:
        """Stop listening, let running requests finish (up to the shutdown timeout)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._shutdown_timeout
            while True:  # a pipelined request may follow the one answered: wait again
                running = [c.running for c in self._connections]
                for conn in list(self._connections):
                    if conn.running is None:
                        conn.close()
                waits = [r for r in running if r is not None and not r.done()]
                if not waits or loop.time() >= deadline:
                    break
                await asyncio.wait(waits, timeout=deadline - loop.time())
            for conn in list(self._connections):
                conn.abort()
            await server.wait_closed()
        self._intake.flush()  # nothing a request handed on stays behind
        self._close_pool()
        self._bound_port = None

    def _close_pool(self) -> None:
        pools, self._pools = self._pools, []
        for pool in pools:
            pool.close()
