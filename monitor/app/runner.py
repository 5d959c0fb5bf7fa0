"""``relmon run``: build the service from settings, run it, drain on SIGTERM.

The composition root: the one place (with :mod:`monitor.app.wiring`) that picks the
adapters behind the engine's ports. A TaskGroup-like set of tasks runs the sources, the
workers, the HTTP servers and the periodic metrics refresh. ``drain=True`` (arq's burst
mode) stops once traffic, work and verdicts have been quiet for ``idle_s`` seconds,
which makes end-to-end runs deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, generate_latest

from adapters.http.metrics import MetricsServer
from adapters.kafka.clients import client_options, connection_problem, group_options
from adapters.kafka.source import KafkaEventSource
from adapters.kafka.verdicts import KafkaVerdictConsumer
from adapters.review.review import ReviewServer
from adapters.review.review_page import ReviewPage
from adapters.traffic.dataplane import DataPlaneProcess
from adapters.traffic.traffic import TrafficServer
from monitor.app import dataplane
from monitor.app.otlp import kafka_span_options, start_otlp
from monitor.app.supervision import supervise
from monitor.app.validation import validate_settings
from monitor.app.wiring import (
    ReviewBackend,
    build_otel,
    build_outbox,
    build_review_auth,
    build_review_backend,
    build_task,
    query_hash_key,
)
from monitor.config import Settings
from monitor.core.errors import ConfigError, RelmonError
from monitor.engine.follower import VerdictFollower
from monitor.engine.metrics import Metrics
from monitor.engine.ports import CalibrationStore, Source
from monitor.engine.routing import HeaderTaskResolver
from monitor.engine.service import MonitorService
from monitor.engine.verdicts import VerdictScorer

__all__ = ["Running", "run_service", "start_service"]

log = structlog.get_logger("relmon")


@dataclass
class Running:
    """A started service and everything around it (see :func:`start_service`)."""

    settings: Settings
    service: MonitorService
    registry: CollectorRegistry
    store: CalibrationStore
    metrics_server: MetricsServer | None
    review_server: ReviewServer | None
    traffic_server: TrafficServer | DataPlaneProcess | None
    sources: list[Source] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    started: bool = False
    """Every listener and source is up (the metrics port answers before the others)."""
    down: set[str] = field(default_factory=set)
    """The sources (by ``source_name``) whose run stopped anyway and that are not running
    again yet (:func:`~monitor.app.supervision.supervise` keeps it)."""

    def not_ready_for_traffic(self) -> list[str]:
        """Why the traffic listener cannot take traffic: only while starting or stopping,
        or while its own process (``traffic.data_plane: process``) is being replaced."""
        reasons = [] if self.started else ["starting: not every listener is up yet"]
        if not self.service.accepting:
            reasons.append("stopping: no traffic is admitted")
        return reasons + self._data_plane_down()

    def _data_plane_down(self) -> list[str]:
        plane = self.traffic_server
        if isinstance(plane, DataPlaneProcess) and self.started and plane.down:
            return ["traffic data plane process exited: being restarted"]
        return []

    async def sync_traffic(self) -> None:
        """Count every request answered before now: offer the ones waiting for their
        batch, or, with the data plane in its own process, wait until what it sent (its
        waiting offers too) is counted."""
        if isinstance(self.traffic_server, DataPlaneProcess):
            await self.traffic_server.sync()
        elif self.traffic_server is not None:
            self.traffic_server.flush_offers()

    def not_ready(self) -> list[str]:
        """Why monitoring is not working: the traffic reasons, unloaded windows,
        unreachable sources and open circuit breakers."""
        reasons = [] if self.started else ["starting: not every listener is up yet"]
        reasons += [] if self.service.loaded else ["calibration windows not loaded"]
        reasons += [r for r in map(self._source_down, self.sources) if r is not None]
        outbox = self.service.reviews.outbox.problem()
        reasons += [] if outbox is None else [outbox]
        if not self.service.accepting:
            reasons.append("stopping: no traffic is admitted")
        reasons += self._data_plane_down()
        reasons += [
            f"task {name}: circuit breaker to the model endpoint open, no items re-asked"
            for name in self.service.circuits_open()
        ]
        return reasons

    def _source_down(self, s: Source) -> str | None:
        """Why ``s`` takes nothing now: its store unreachable, stopped and being
        restarted, or not connected."""
        if isinstance(s, VerdictFollower) and s.unreachable is not None:
            return f"{s.store_name} unreachable: read again every second"
        if s.source_name in self.down:
            return f"{type(s).__name__} stopped and is being restarted"
        if s.connected:
            return None
        if s.topic is not None:
            return f"Kafka broker not reachable ({type(s).__name__}, topic {s.topic})"
        return f"{type(s).__name__} not connected"

    async def close(self, drain_timeout_s: float) -> bool:
        if self.traffic_server is not None:
            await self.traffic_server.stop()
        for s in self.sources:
            await s.stop(drain_timeout_s)
        for t in self.tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        drained = await self.service.stop(drain_timeout_s)
        for closer in reversed(self.closers):
            with contextlib.suppress(Exception):
                await closer()
        return drained


async def start_service(settings: Settings, *, review_token: str | None = None) -> Running:
    """Build and start everything; the caller runs until done and calls ``close``.

    The settings are validated first (:func:`~monitor.app.validation.validate_settings`, the
    same check as ``relmon check-config``), before any port is bound or file created.
    When Kafka cannot be reached at start the error says why (TLS verification, SASL
    authentication, nothing listening), found by one more connection with the same
    options; ``relmon run`` then exits with status 2.
    """
    partial: list[Running] = []
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        return await _start_service(settings, review_token, closers, partial)
    except BaseException as exc:
        # Whatever started is stopped again: a failed start leaks no port, thread or task.
        if partial:
            await partial[0].close(0.0)
        else:
            for closer in reversed(closers):
                with contextlib.suppress(Exception):
                    await closer()
        if not (isinstance(exc, RelmonError) and settings.kafka.enabled and exc.retriable):
            raise
        problem = await connection_problem(
            settings.kafka.bootstrap_servers, client_options(settings.kafka)
        )
        if problem is None:
            raise
        raise type(exc)(f"cannot reach Kafka at {problem}") from exc


async def _start_service(
    settings: Settings,
    review_token: str | None,
    closers: list[Callable[[], Awaitable[None]]],
    partial: list[Running],
) -> Running:
    for warning in validate_settings(settings, review_token=review_token):
        log.warning("config_warning", message=warning)
    registry = CollectorRegistry()
    metrics = Metrics(registry, k_max=max(t.k_max for t in settings.tasks))
    tasks = [build_task(t, metrics) for t in settings.tasks]
    closers.extend(t.client.aclose for t in tasks)
    closers.extend(t.judge.aclose for t in tasks if t.judge is not None)
    redactor = settings.redaction.redactor()
    # One SSL context for every Kafka client.
    kafka_options = client_options(settings.kafka) if settings.kafka.enabled else {}
    scorer = VerdictScorer({t.name: t for t in tasks}, redactor)
    backend = await build_review_backend(settings, scorer, kafka_options)
    closers.extend([*backend.closers, backend.store.aclose])
    service = MonitorService(
        tasks,
        store=backend.store,
        review_queue=backend.queue,
        metrics=metrics,
        budget=settings.budget,
        seed=settings.seed or 0,
        log_prompts=settings.log_prompts,
        query_hash_key=query_hash_key(settings),
        redactor=redactor,
        outbox=build_outbox(settings, closers),
    )
    await service.load()
    follower = _follower(backend, service, settings, metrics)
    if backend.kafka_store is not None and backend.kafka_queue is not None:
        # The queue's depth starts from the replayed items.
        for pending in backend.kafka_store.pending_item_ids():
            backend.kafka_queue.item_seen(pending)
    service.start()
    running = Running(
        settings=settings,
        service=service,
        registry=registry,
        store=backend.store,
        metrics_server=None,
        review_server=None,
        traffic_server=None,
        sources=[] if follower is None else [follower],
        closers=closers,
    )
    partial.append(running)
    running.metrics_server = metrics_server = MetricsServer(
        registry,
        running.not_ready,
        host=settings.metrics.host,
        port=settings.metrics.port,
        before_scrape=service.publish,
        before_scrape_async=running.sync_traffic,
        traffic_readiness=running.not_ready_for_traffic,
    )
    await _listen("metrics", settings.metrics.host, settings.metrics.port, metrics_server.start)
    closers.append(metrics_server.stop)
    await _start_review(running, backend, metrics, review_token)
    await _start_traffic(running, metrics)
    if settings.kafka.enabled:
        await _start_kafka_source(running, metrics, kafka_options)
    _supervise_sources(running, metrics, kafka_options)
    otel = build_otel(settings, registry, service)
    if otel is not None:
        otel.start()
        closers.append(otel.aclose)
    log.info(
        "relmon_started",
        tasks=[t.name for t in tasks],
        metrics=f"{settings.metrics.host}:{metrics_server.bound_port}",
        review=settings.review.backend,
        traffic=settings.traffic.mode,
        kafka=settings.kafka.enabled,
    )
    running.started = True
    return running


def _follower(
    backend: ReviewBackend, service: MonitorService, settings: Settings, metrics: Metrics
) -> VerdictFollower | None:
    """With a shared store: the other replicas' verdicts, from where the load stopped."""
    if backend.shared is None:
        return None
    follower = VerdictFollower(
        backend.shared,
        service.calibration,
        sync_s=settings.store.sync_s,
        waiting=service.reviews.outbox.counts,
    )
    follower.start(service.calibration.loaded_through)
    metrics.init_source(follower.source_name, traffic=False)
    return follower


async def _listen(name: str, host: str, port: int, start: Callable[[], Awaitable[None]]) -> None:
    """Start a listener; a taken port is a ConfigError naming it, not a traceback."""
    try:
        await start()
    except OSError as exc:
        raise ConfigError(
            f"{name}.port: cannot listen on {host}:{port}: {exc.strerror or exc} "
            "(another process holds it?)"
        ) from None


async def _start_review(
    running: Running, backend: ReviewBackend, metrics: Metrics, review_token: str | None
) -> None:
    """The review API and page on the SQLite store, or the Kafka verdict follower."""
    settings, service = running.settings, running.service
    if backend.review_store is not None:
        running.review_server = ReviewServer(
            store=backend.review_store,
            handler=service.apply_verdict,
            auth=build_review_auth(settings, review_token),  # validate_settings checked it
            host=settings.review.host,
            port=settings.review.port,
            page=ReviewPage(
                store=backend.review_store,
                handler=service.apply_verdict,
                progress=service.review_progress,
                lease_s=settings.review.lease_s,
                undo_s=settings.review.undo_s,
                max_leases=settings.review.max_leases_per_reviewer,
            ),
        )
        await _listen(
            "review", settings.review.host, settings.review.port, running.review_server.start
        )
        running.closers.append(running.review_server.stop)
        return
    assert backend.kafka_store is not None  # review.backend kafka
    verdicts = KafkaVerdictConsumer(
        backend.kafka_store,
        service.apply_verdict,
        service.reject_verdict,
        wait_s=settings.kafka.verdict_wait_s,
        review_queue=backend.kafka_queue,
        on_item=service.note_review_item,
        lag_gauge=metrics.kafka_consumer_lag,
        offset_resets=metrics.kafka.offset_resets,
    )
    metrics.init_source(verdicts.source_name, traffic=False)
    metrics.kafka.init(backend.kafka_store.topics)
    await verdicts.start()
    running.sources.append(verdicts)


async def _start_traffic(running: Running, metrics: Metrics) -> None:
    """The OTLP receiver if enabled; the mirror or proxy listener, unless ``traffic.mode``
    is off."""
    settings, service = running.settings, running.service
    if settings.traffic.otlp.enabled:  # beside the mirror or proxy, or alone
        await start_otlp(settings, service, metrics, running.sources, _listen)
    if settings.traffic.mode == "off":
        return
    metrics.init_source(settings.traffic.mode)
    header, traffic = settings.traffic.task_header, settings.traffic
    proxy_metrics = (
        dataplane.proxy_metrics(settings, running.registry) if traffic.mode == "proxy" else None
    )
    if traffic.data_plane == "process":
        bound: list[socket.socket] = []

        async def bind() -> None:  # here: a port taken is the same error as inline
            bound.append(dataplane.bind(traffic.host, traffic.port))

        await _listen("traffic", traffic.host, traffic.port, bind)
        running.traffic_server = await dataplane.start_data_plane(
            settings, service, metrics, proxy_metrics, bound[0]
        )
    else:
        running.traffic_server = TrafficServer(
            # The service's admission itself (what service.offer and .reject call): these
            # run for every sampled request, compiled (setup.py), with no Python function
            # between; so do the two below, for every proxied or mirrored request.
            sink=service.admission.offer,
            reject=service.admission.reject,
            task_resolver=HeaderTaskResolver(service.router, header),
            skip=service.admission.skip_by_head,
            seen=service.admission.count_api,
            metrics=proxy_metrics,
            **dataplane.listener_options(settings),
        )
        await _listen("traffic", traffic.host, traffic.port, running.traffic_server.start)
    if running.review_server is not None:  # described in the review port's /openapi.json
        host, port = settings.traffic.host, running.traffic_server.bound_port
        running.review_server.traffic_url = f"http://{host}:{port}"


async def _start_kafka_source(
    running: Running, metrics: Metrics, kafka_options: dict[str, Any]
) -> None:
    """The Kafka traffic source: paced by the budget, never dropping."""
    kafka, service = running.settings.kafka, running.service
    metrics.init_source("kafka")
    metrics.kafka.init([kafka.traffic_topic])
    source = KafkaEventSource(
        kafka.bootstrap_servers,
        kafka.traffic_topic,
        kafka.group_id,
        kafka.dead_letter_topic,
        functools.partial(service.offer, wait=True),
        service.reject,
        max_event_bytes=kafka.max_event_bytes,
        lag_gauge=metrics.kafka_consumer_lag,
        offset_resets=metrics.kafka.offset_resets,
        skip=service.skip_unsampled,
        **kafka_span_options(service),
        **kafka_options,
        **group_options(kafka),
    )
    await source.start()
    running.sources.append(source)


def _supervise_sources(running: Running, metrics: Metrics, kafka_options: dict[str, Any]) -> None:
    kafka = running.settings.kafka
    explain: Callable[[], Awaitable[str | None]] | None = None
    if kafka.enabled:  # every source is a Kafka client
        explain = functools.partial(connection_problem, kafka.bootstrap_servers, kafka_options)

    def restarted(name: str) -> None:
        metrics.source_restarts.labels(name).inc()
        running.down.discard(name)

    running.tasks = [
        asyncio.create_task(
            supervise(
                s,
                on_restart=functools.partial(restarted, s.source_name),
                on_down=functools.partial(running.down.add, s.source_name),
                explain=explain if s.topic is not None else None,  # Kafka's: a topic
            ),
            name=f"relmon-{type(s).__name__}",
        )
        for s in running.sources
    ]


def _activity(service: MonitorService) -> tuple[int, ...]:
    s = service.stats
    return (sum(s.by_decision.values()), s.scored, s.abandoned, s.verdicts, service.in_flight)


async def _wait_idle(
    service: MonitorService, idle_s: float, poll_s: float = 0.2, sources: Sequence[Source] = ()
) -> None:
    """Return once nothing happened for ``idle_s`` after the first activity, or for
    5 x ``idle_s`` if nothing ever happens (sources may take seconds to join a group).
    A source holding events until the budget allows (``paused``) is not quiet."""
    start = _activity(service)
    last, quiet, waited = start, 0.0, 0.0
    while True:
        await asyncio.sleep(poll_s)
        waited += poll_s
        now = _activity(service)
        busy = service.in_flight > 0 or any(s.paused for s in sources)
        quiet = quiet + poll_s if now == last and not busy else 0.0
        last = now
        if quiet >= idle_s and (now != start or waited >= 5 * idle_s):
            return


async def run_service(
    settings: Settings,
    *,
    drain: bool = False,
    idle_s: float = 3.0,
    metrics_out: Path | None = None,
    review_token: str | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or idle, with ``drain``); 0 if drained cleanly."""
    running = await start_service(settings, review_token=review_token)
    # What start built (modules, settings, clients: most of the process's objects) lives
    # as long as the process: frozen (at once, no collection that would hold the loop),
    # the collector no longer walks it in every full collection, which records arriving
    # in batches (a Kafka source's) make frequent (bench/kafka_ingest_bench.py).
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    async def refresh() -> None:
        while True:
            running.service.publish()
            await asyncio.sleep(2.0)

    refresher = asyncio.create_task(refresh())
    try:
        if drain:
            idle = asyncio.create_task(_wait_idle(running.service, idle_s, sources=running.sources))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({idle, stopped}, return_when=asyncio.FIRST_COMPLETED)
            idle.cancel()
            stopped.cancel()
        else:
            await stop.wait()
        log.info("relmon_stopping", in_flight=running.service.in_flight)
    finally:
        refresher.cancel()
        await running.sync_traffic()
        running.service.publish()
        if metrics_out is not None:
            await asyncio.to_thread(metrics_out.write_bytes, generate_latest(running.registry))
        drained = await running.close(settings.drain_timeout_s)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    # The metrics server is closed by now: the last line says how many items stopped
    # unfinished (each also logged as item_interrupted), so no count is lost.
    log.info("relmon_stopped", drained=drained, interrupted=running.service.stats.interrupted)
    return 0 if drained else 1
