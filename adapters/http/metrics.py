"""``/metrics``, ``/healthz`` and ``/readyz`` on aiohttp (default 127.0.0.1:9108).

``/readyz`` answers 200 once the readiness callback says so (windows loaded, sources
connected, no circuit breaker open) and 503 with the reasons otherwise.

``/readyz/traffic`` answers whether the traffic listener can take traffic: 503 only while
relmon starts or stops. Monitoring that has stopped (a breaker open, a broker gone) is
listed under ``degraded`` with a 200. It is the probe for a pod whose traffic must not
depend on monitoring: relmon as a sidecar (its readiness is the pod's) or as a proxy in
the live path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from adapters.http import expect as http_expect

__all__ = ["MetricsServer"]

Readiness = Callable[[], list[str]]
"""Returns the reasons the service is not ready; empty when ready."""


class MetricsServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Readiness,
        *,
        host: str = "127.0.0.1",
        port: int = 9108,
        before_scrape: Callable[[], None] | None = None,
        before_scrape_async: Callable[[], Awaitable[None]] | None = None,
        traffic_readiness: Readiness | None = None,
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self.traffic_readiness = traffic_readiness or readiness
        self.host, self.port = host, port
        self.before_scrape = before_scrape
        self.before_scrape_async = before_scrape_async
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.before_scrape_async is not None:
            await self.before_scrape_async()
        if self.before_scrape is not None:
            self.before_scrape()
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        reasons = self.readiness()
        if reasons:
            return web.json_response({"status": "not ready", "reasons": reasons}, status=503)
        return web.json_response({"status": "ready"})

    async def _readyz_traffic(self, request: web.Request) -> web.Response:
        blocking = self.traffic_readiness()
        if blocking:
            return web.json_response({"status": "not ready", "reasons": blocking}, status=503)
        return web.json_response({"status": "ready", "degraded": self.readiness()})

    async def start(self) -> None:
        app = web.Application()
        app.add_routes(
            [
                web.get("/metrics", self._metrics),
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/readyz/traffic", self._readyz_traffic),
            ]
        )
        http_expect.install(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
