"""The traffic data plane's own process (``traffic.data_plane: process``, see
:mod:`adapters.traffic.dataplane`): ``python -m monitor.app.dataplane --uvloop|--asyncio
CONTROL_FD LISTEN_FD``, started by ``relmon run``, never by hand.

It builds the :class:`~adapters.traffic.traffic.TrafficServer` from the same settings the
main process has (sent over the control socket): the same listener limits and upstream,
and the same fast path (a request hash-sampled by no task is skipped and counted here);
every other event request goes to the main process unparsed.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import uvloop
from prometheus_client import CollectorRegistry

from adapters.traffic.dataplane import API_KEY, DataPlaneProcess, Relay, serve_child
from adapters.traffic.intake import HeaderView, Intake
from adapters.traffic.proxy_metrics import DEFAULT_ROUTE, ProxyMetrics
from adapters.traffic.routing import RouteSpec
from adapters.traffic.traffic import LISTEN_BACKLOG, TrafficServer
from monitor.app.logs import configure_logging
from monitor.config import Settings
from monitor.core.apis.base import WireApi
from monitor.core.apis.registry import GENERIC, get_api
from monitor.core.errors import StateError
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission
from monitor.engine.routing import HeaderTaskResolver, HeadSkip, RoutedTask, TaskRouter

if TYPE_CHECKING:  # the child process runs no service: it need not load one
    from monitor.engine.metrics import Metrics
    from monitor.engine.service import MonitorService

__all__ = ["bind", "build", "command", "listener_options", "main", "start_data_plane"]


def command(settings: Settings) -> list[str]:
    """The argv of the data plane's process for ``settings`` (the descriptors follow)."""
    loop = "--uvloop" if settings.traffic.uvloop else "--asyncio"
    return [sys.executable, "-m", "monitor.app.dataplane", loop]


def _no_sink(event: TrafficEvent, source: str) -> Admission:
    raise StateError("the data plane's process relays its events, it never offers them")


def build(settings: object, listening: socket.socket, relay: Relay) -> TrafficServer:
    """The traffic server of the data plane's process."""
    assert isinstance(settings, Settings)
    configure_logging(settings.log_format)
    router = TaskRouter({t.name: RoutedTask(t) for t in settings.tasks})
    skip = HeadSkip(router)
    relay.skip_counts = skip.take
    traffic = settings.traffic
    return TrafficServer(
        sink=_no_sink,
        reject=relay.reject,
        task_resolver=HeaderTaskResolver(router, traffic.task_header),
        skip=skip,
        metrics=relay.metrics,
        relay=relay.offer,
        seen=relay.seen,
        sock=listening,
        **listener_options(settings),
    )


def listener_options(settings: Settings) -> dict[str, Any]:
    """The :class:`~adapters.traffic.traffic.TrafficServer` keywords ``traffic.*`` sets,
    the same in one process or two."""
    traffic = settings.traffic
    return {
        "mode": traffic.mode,
        "host": traffic.host,
        "port": traffic.port,
        "upstream_url": traffic.upstream_url,
        "routes": route_specs(settings),
        "max_body_bytes": traffic.max_body_bytes,
        "upstream_timeout_s": traffic.upstream_read_timeout_s,
        "upstream_connect_timeout_s": traffic.upstream_connect_timeout_s,
        "client_send_timeout_s": traffic.client_send_timeout_s,
        "upstream_max_connections": traffic.upstream_pool_size,
        "offer_batch_s": traffic.offer_batch_s,
        # A request without X-Request-Id whose draw is over it: skipped at once.
        "max_sampling_rate": max((t.sampling_rate for t in settings.tasks), default=0.0),
        "generic_apis": generic_apis(settings),
    }


def route_specs(settings: Settings) -> list[RouteSpec]:
    """``traffic.routes`` as the proxy takes them, in order."""
    return [
        RouteSpec(
            label,
            r.upstream_url,
            api=r.match.api,
            path_prefix=r.match.path_prefix,
            connect_timeout_s=r.upstream_connect_timeout_s,
            read_timeout_s=r.upstream_read_timeout_s,
            pool_size=r.upstream_pool_size,
        )
        for label, r in zip(settings.traffic.route_labels(), settings.traffic.routes, strict=True)
    ]


def proxy_metrics(settings: Settings, registry: CollectorRegistry) -> ProxyMetrics:
    """The proxy's metrics, every route's label exported from the start."""
    labels = settings.traffic.route_labels()
    if settings.traffic.upstream_url:
        labels.append(DEFAULT_ROUTE)
    return ProxyMetrics(registry, routes=labels)


def generic_apis(settings: Settings) -> list[tuple[str, WireApi]]:
    """The ``generic`` tasks' path prefixes and their APIs, in task order."""
    return [
        (t.match.path_prefix, get_api(GENERIC, t.generic_options))
        for t in settings.tasks
        if t.endpoint.api == GENERIC and t.match.path_prefix is not None
    ]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on the first address ``host`` resolves to, for the child
    to inherit (an OSError when it cannot be bound)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


async def start_data_plane(
    settings: Settings,
    service: MonitorService,
    metrics: Metrics,
    proxy_metrics: ProxyMetrics | None,
    listening: socket.socket,
) -> DataPlaneProcess:
    """The main process's side: start the child on ``listening``; the events it hands on
    are parsed and offered here, its counts added to this process's metrics."""
    traffic = settings.traffic
    intake = Intake(
        traffic.mode,
        sink=service.admission.offer,  # compiled, with no Python function between
        reject=service.admission.reject,
        task_resolver=HeaderTaskResolver(service.router, traffic.task_header),
        skip=None,
        generic=generic_apis(settings),  # the child relays their requests too
    )

    def on_offer(  # noqa: PLR0917  (the relay callback: seven positional)
        source: str,
        headers: list[tuple[bytes, bytes]],
        path: str,
        raw: bytes,
        answer: tuple[bytes, list[tuple[bytes, bytes]]] | None,
        rid: str | None,
        draw: float | None,
    ) -> None:
        intake.offer(
            functools.partial(service.reject, source),
            HeaderView(headers),
            path,
            raw,
            answer=None if answer is None else (answer[0], HeaderView(answer[1])),
            rid=rid,
            draw=draw,
        )

    def on_counts(decisions: dict[tuple[str, str], int], proxy: Any) -> None:
        for (source, decision), n in decisions.items():
            if decision.startswith(API_KEY):
                service.admission.count_api(source, decision[len(API_KEY) :], n)
            else:
                service.admission.count_many(source, decision, n)
        if proxy is not None and proxy_metrics is not None:
            proxy_metrics.merge(proxy)

    plane = DataPlaneProcess(
        command=command(settings),
        config=settings,
        listening=listening,
        on_offer=on_offer,
        on_reject=service.reject,
        on_counts=on_counts,
        on_restart=metrics.source_restarts.labels(traffic.mode).inc,
    )
    try:
        await plane.start()
    except BaseException:
        listening.close()
        raise
    return plane


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    loop, control_fd, listen_fd = args[0], int(args[1]), int(args[2])
    factory = uvloop.new_event_loop if loop == "--uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve_child(control_fd, listen_fd, build))


if __name__ == "__main__":
    sys.exit(main())
