"""``relmon run``: build the service from settings, run it, drain on SIGTERM.

A TaskGroup runs the sources, the workers, the HTTP servers and the periodic metrics
refresh. ``drain=True`` (arq's burst mode) stops once traffic, work and verdicts have
been quiet for ``idle_s`` seconds, which makes end-to-end runs deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, generate_latest

from adapters.canon.registry import get_async_canonicalizer
from adapters.http.metrics import MetricsServer
from adapters.http.review import ReviewServer
from adapters.http.review_page import ReviewPage
from adapters.http.traffic import TrafficServer
from adapters.kafka.clients import client_options, connection_problem, group_options
from adapters.kafka.review import (
    KafkaCalibrationStore,
    KafkaReviewQueue,
    durable_producer,
    start_producer,
)
from adapters.kafka.source import KafkaEventSource
from adapters.kafka.verdicts import KafkaVerdictConsumer
from adapters.openai.client import OUTCOMES, OpenAIClient
from adapters.sqlite.store import SqliteStore
from monitor.app.logs import configure_logging
from monitor.app.validation import validate_settings
from monitor.config import Settings, TaskSettings
from monitor.core.canon import get_canonicalizer
from monitor.core.canon.base import Canonicalizer
from monitor.core.errors import ConfigError, RelmonError
from monitor.core.review import verdict_score
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.ports import CalibrationStore, ReviewQueue
from monitor.engine.service import MonitorService, TaskRuntime

__all__ = [
    "QUERY_HASH_KEY_FILE",
    "Running",
    "configure_logging",
    "query_hash_key",
    "run_service",
    "start_service",
    "supervise",
]

QUERY_HASH_KEY_FILE = "query-hash.key"

log = structlog.get_logger("relmon")

_ASYNC_ONLY = frozenset({"embedding", "llm"})


def query_hash_key(settings: Settings) -> bytes:
    """The key of the logged query hash: ``query_hash_key`` or ``query_hash_key_file``,
    else the one generated into ``state_dir/query-hash.key`` (mode 0600) at the first
    start and reused."""
    configured = settings.resolved_query_hash_key()
    if configured is not None:
        return configured.encode("utf-8")
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    path = settings.state_dir / QUERY_HASH_KEY_FILE
    if not path.exists():
        # Written whole under another name, then linked: a crash never leaves a
        # half-written key, and two starting processes agree on one key.
        fd, tmp = tempfile.mkstemp(dir=settings.state_dir, prefix=".query-hash.")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, secrets.token_hex(32).encode("ascii"))
            os.fsync(fd)
            os.close(fd)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
        log.info("query_hash_key_created", path=str(path))
    try:
        mode = path.stat().st_mode & 0o777
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the query hash key: {exc.strerror}") from None
    if mode & 0o077:
        log.warning("query_hash_key_readable_by_others", path=str(path), mode=oct(mode))
    if len(key) < 32:
        raise ConfigError(f"{path}: the query hash key is too short (delete it to regenerate)")
    return key


def _judge_client(*, endpoint: str, model: str, **options: Any) -> OpenAIClient:
    """The ``llm`` canonicalizer's judge: deterministic, temperature 0 (paper §3.3)."""
    options.setdefault("max_tokens", 32)
    return OpenAIClient(base_url=endpoint, model=model, temperature=0.0, **options)


def build_task(task: TaskSettings, metrics: Metrics) -> TaskRuntime:
    endpoint = task.endpoint
    model = endpoint.model or task.match.model
    if model is None:  # validate_settings reports this first
        raise ConfigError(f"task {task.name!r}: set endpoint.model (or match.model)")
    calls = metrics.model_calls

    def outcome(name: str) -> None:
        calls.labels(model, task.name, name).inc()

    client = OpenAIClient(
        base_url=endpoint.base_url,
        model=model,
        api_key=endpoint.resolved_api_key(),
        temperature=endpoint.temperature,
        max_tokens=endpoint.max_tokens,
        timeout_s=endpoint.timeout_s,
        concurrency=endpoint.concurrency,
        rate_limit_per_s=endpoint.rate_limit_per_s,
        supports_n=endpoint.supports_n,
        retries=endpoint.retry_limits(),
        breaker_threshold=endpoint.circuit_breaker.failures,
        breaker_cooldown_s=endpoint.circuit_breaker.cooldown_s,
        on_outcome=outcome,
    )
    spec, options = task.canonicalizer_spec()
    canonicalizer = get_async_canonicalizer(spec, model_client_factory=_judge_client, **options)
    # For verdicts that type the answer instead of picking a rank (sync canonicalizers only).
    async_only = task.canonicalizer.strip().lower() in _ASYNC_ONLY  # answer_pattern or not
    sync: Canonicalizer | None = None if async_only else get_canonicalizer(spec, **options)

    rule = get_stopping_rule(
        task.stopping_rule, k0=task.k0, k_max=task.k_max, delta=task.delta, futility=task.futility
    )
    return TaskRuntime(task, canonicalizer, rule, client, sync, client_outcomes=OUTCOMES)


@dataclass
class Running:
    """A started service and everything around it (see :func:`start_service`)."""

    settings: Settings
    service: MonitorService
    registry: CollectorRegistry
    store: CalibrationStore
    metrics_server: MetricsServer | None
    review_server: ReviewServer | None
    traffic_server: TrafficServer | None
    sources: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    started: bool = False
    """Every listener and source is up (the metrics port answers before the others)."""

    def not_ready_for_traffic(self) -> list[str]:
        """Why the traffic listener cannot take traffic: only while starting or stopping."""
        reasons = [] if self.started else ["starting: not every listener is up yet"]
        if not self.service.accepting:
            reasons.append("stopping: no traffic is admitted")
        return reasons

    def not_ready(self) -> list[str]:
        """Why monitoring is not working: the traffic reasons, unloaded windows,
        unreachable sources and open circuit breakers."""
        reasons = [] if self.started else ["starting: not every listener is up yet"]
        reasons += [] if self.service.loaded else ["calibration windows not loaded"]
        reasons += [
            f"Kafka broker not reachable ({type(s).__name__}, topic {s.topic})"
            if hasattr(s, "topic")
            else f"{type(s).__name__} not connected"
            for s in self.sources
            if not s.connected
        ]
        if not self.service.accepting:
            reasons.append("stopping: no traffic is admitted")
        reasons += [
            f"task {name}: circuit breaker to the model endpoint open, no items re-asked"
            for name in self.service.circuits_open()
        ]
        return reasons

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
    try:
        return await _start_service(settings, review_token=review_token)
    except RelmonError as exc:
        if not (settings.kafka.enabled and exc.retriable):
            raise
        problem = await connection_problem(
            settings.kafka.bootstrap_servers, client_options(settings.kafka)
        )
        if problem is None:
            raise
        raise type(exc)(f"cannot reach Kafka at {problem}") from exc


async def _start_service(settings: Settings, *, review_token: str | None) -> Running:
    for warning in validate_settings(settings, review_token=review_token):
        log.warning("config_warning", message=warning)
    registry = CollectorRegistry()
    k_max = max(t.k_max for t in settings.tasks)
    metrics = Metrics(registry, k_max=k_max)
    tasks = [build_task(t, metrics) for t in settings.tasks]
    closers: list[Callable[[], Awaitable[None]]] = [t.client.aclose for t in tasks]
    sources: list[Any] = []
    review_queue: ReviewQueue
    store: CalibrationStore
    redactor = settings.redaction.redactor()
    kafka_store: Any = None  # with review.backend kafka: its store and queue
    kafka_queue: Any = None
    kafka_options: dict[str, Any] = {}
    if settings.kafka.enabled:
        kafka_options = client_options(settings.kafka)  # one SSL context for every client
    if settings.review.backend == "kafka":
        by_name = {t.name: t for t in tasks}

        def score(item: Any, verdict: Any) -> float:
            task = by_name.get(item.task)
            canonicalizer = redactor.for_verdicts(task.sync_canonicalizer if task else None)
            return verdict_score(item, verdict, canonicalizer)

        store = kafka_store = KafkaCalibrationStore(
            settings.kafka.bootstrap_servers,
            settings.kafka.review_topic,
            settings.kafka.verdict_topic,
            score,
            dead_letter_topic=settings.kafka.verdict_dead_letter_topic,
            **kafka_options,
        )
        producer = durable_producer(settings.kafka.bootstrap_servers, **kafka_options)
        await start_producer(producer, settings.kafka.bootstrap_servers)
        closers.append(producer.stop)
        review_queue = kafka_queue = KafkaReviewQueue(producer, settings.kafka.review_topic)
    else:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        sqlite = SqliteStore(Path(settings.state_dir) / "relmon.sqlite3")
        store = review_queue = sqlite
    closers.append(store.aclose)
    service = MonitorService(
        tasks,
        store=store,
        review_queue=review_queue,
        metrics=metrics,
        budget=settings.budget,
        seed=settings.seed or 0,
        log_prompts=settings.log_prompts,
        query_hash_key=query_hash_key(settings),
        redactor=redactor,
    )
    await service.load()
    if kafka_store is not None:  # the queue's depth starts from the replayed items
        for item_id in kafka_store.pending_item_ids():
            kafka_queue.item_seen(item_id)
    service.start()
    running = Running(
        settings=settings,
        service=service,
        registry=registry,
        store=store,
        metrics_server=None,
        review_server=None,
        traffic_server=None,
        sources=sources,
        closers=closers,
    )
    metrics_server = MetricsServer(
        registry,
        running.not_ready,
        host=settings.metrics.host,
        port=settings.metrics.port,
        before_scrape=service.publish,
        traffic_readiness=running.not_ready_for_traffic,
    )
    running.metrics_server = metrics_server
    await metrics_server.start()
    closers.append(metrics_server.stop)
    if settings.review.backend == "http":
        token = review_token or settings.resolved_review_token()
        if not token:  # validate_settings reports this first
            raise ConfigError("review.token: the review API needs a token")
        assert isinstance(store, SqliteStore)
        running.review_server = ReviewServer(
            store=store,
            handler=service.apply_verdict,
            token=token,
            host=settings.review.host,
            port=settings.review.port,
            page=ReviewPage(
                store=store,
                handler=service.apply_verdict,
                progress=service.review_progress,
                lease_s=settings.review.lease_s,
                undo_s=settings.review.undo_s,
            ),
        )
        await running.review_server.start()
        closers.append(running.review_server.stop)
    else:
        verdicts = KafkaVerdictConsumer(
            kafka_store,
            service.apply_verdict,
            service.reject_verdict,
            wait_s=settings.kafka.verdict_wait_s,
            review_queue=kafka_queue,
            on_item=service.note_review_item,
            lag_gauge=metrics.kafka_consumer_lag,
        )
        metrics.init_source(verdicts.source_name, traffic=False)
        await verdicts.start()
        sources.append(verdicts)
    if settings.traffic.mode != "off":
        metrics.init_source(settings.traffic.mode)
        header = settings.traffic.task_header
        running.traffic_server = TrafficServer(
            sink=service.offer,
            reject=service.reject,
            task_resolver=lambda h, p, b: service.resolve_task_name(h, p, b, header),
            mode=settings.traffic.mode,
            host=settings.traffic.host,
            port=settings.traffic.port,
            upstream_url=settings.traffic.upstream_url,
            max_body_bytes=settings.traffic.max_body_bytes,
        )
        await running.traffic_server.start()
        if running.review_server is not None:  # described in the review port's /openapi.json
            host, port = settings.traffic.host, running.traffic_server.bound_port
            running.review_server.traffic_url = f"http://{host}:{port}"
    if settings.kafka.enabled:
        metrics.init_source("kafka")
        source = KafkaEventSource(
            settings.kafka.bootstrap_servers,
            settings.kafka.traffic_topic,
            settings.kafka.group_id,
            settings.kafka.dead_letter_topic,
            functools.partial(service.offer, wait=True),  # paced by the budget, never dropped
            service.reject,
            lag_gauge=metrics.kafka_consumer_lag,
            **kafka_options,
            **group_options(settings.kafka),
        )
        await source.start()
        sources.append(source)
    explain: Callable[[], Awaitable[str | None]] | None = None
    if settings.kafka.enabled:  # every source is a Kafka client
        explain = functools.partial(
            connection_problem, settings.kafka.bootstrap_servers, kafka_options
        )
    running.tasks = [
        asyncio.create_task(
            supervise(
                s,
                on_restart=metrics.source_restarts.labels(s.source_name).inc,
                explain=explain,
            ),
            name=f"relmon-{type(s).__name__}",
        )
        for s in sources
    ]
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


async def supervise(
    source: Any,
    *,
    max_delay_s: float = 30.0,
    on_restart: Callable[[], None] | None = None,
    explain: Callable[[], Awaitable[str | None]] | None = None,
) -> None:
    """Run ``source`` until it stops; after a failure, restart it if it can.

    A source with a ``restart`` method (the Kafka traffic source, the verdict follower)
    is connected again after 1, 2, 4 ... up to ``max_delay_s`` seconds until that works,
    then run again; meanwhile ``/readyz`` reports it not connected. ``on_restart`` is
    called after each successful restart (the service counts them in
    ``relmon_source_restarts_total``). Other sources' failures are logged and end their
    task. ``explain`` says why the cluster refuses a connection (a certificate that
    expired, a password that changed): asked once at the first failed restart of an
    outage, and logged as ``source_unreachable``.
    """
    while True:
        try:
            await source.run()
            return
        except RelmonError as exc:
            restart = getattr(source, "restart", None)
            log.error(
                "source_failed",
                source=type(source).__name__,
                error=str(exc),
                restarting=restart is not None,
            )
            if restart is None:
                raise
        delay = 1.0
        explained = explain is None
        while True:
            await asyncio.sleep(delay)
            if getattr(source, "stopped", False):
                return
            try:
                await restart()
                break
            except RelmonError as exc:
                log.warning("source_restart_failed", source=type(source).__name__, error=str(exc))
                delay = min(2 * delay, max_delay_s)
                if not explained and explain is not None:
                    explained = True
                    problem = await explain()
                    if problem is not None:
                        log.error("source_unreachable", source=type(source).__name__, why=problem)
        if on_restart is not None:
            on_restart()
        log.info("source_restarted", source=type(source).__name__)


def _activity(service: MonitorService) -> tuple[int, ...]:
    s = service.stats
    return (sum(s.by_decision.values()), s.scored, s.abandoned, s.verdicts, service.in_flight)


async def _wait_idle(
    service: MonitorService, idle_s: float, poll_s: float = 0.2, sources: Sequence[Any] = ()
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
        busy = service.in_flight > 0 or any(getattr(s, "paused", False) for s in sources)
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
