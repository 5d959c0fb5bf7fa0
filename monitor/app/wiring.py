"""The composition root's parts: from settings to the live objects of one task, and to
the calibration store and review queue of the configured review backend.

This module and :mod:`monitor.app.runner` are the only places that pick an
implementation of a port (:mod:`monitor.engine.ports`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from adapters.canon.registry import get_async_canonicalizer
from adapters.files.outbox import open_outbox
from adapters.kafka.review import (
    KafkaCalibrationStore,
    KafkaReviewQueue,
    durable_producer,
    start_producer,
)
from adapters.model.client import OUTCOMES, HttpModelClient
from adapters.otel.exporter import OtelExporter
from adapters.postgres.store import PostgresStore
from adapters.review.review_auth import ReviewAuth
from adapters.sqlite.store import SqliteStore
from monitor.config import Settings, TaskSettings
from monitor.config.endpoint import EndpointSettings
from monitor.config.judge import JudgeSettings
from monitor.core.canon import get_canonicalizer
from monitor.core.canon.base import Canonicalizer
from monitor.core.canon.toolcall import PlainAnswersOnly
from monitor.core.errors import ConfigError
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.ports import CalibrationStore, ReviewQueue
from monitor.engine.reviews import OutboxSettings
from monitor.engine.runtime import TaskRuntime
from monitor.engine.service import MonitorService
from monitor.engine.verdicts import VerdictScorer

__all__ = [
    "QUERY_HASH_KEY_FILE",
    "ReviewBackend",
    "build_judge",
    "build_otel",
    "build_outbox",
    "build_review_auth",
    "build_review_backend",
    "build_task",
    "endpoint_client",
    "query_hash_key",
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


def _judge_client(*, endpoint: str, model: str, **options: Any) -> HttpModelClient:
    """The ``llm`` canonicalizer's judge: deterministic, temperature 0 (paper §3.3)."""
    options.setdefault("max_tokens", 32)
    return HttpModelClient(base_url=endpoint, model=model, temperature=0.0, **options)


def build_task(task: TaskSettings, metrics: Metrics) -> TaskRuntime:
    """A task's live parts: its model client, canonicalizers and stopping rule."""
    endpoint = task.endpoint
    model = endpoint.model or task.match.model
    if model is None:  # validate_settings reports this first
        raise ConfigError(f"task {task.name!r}: set endpoint.model (or match.model)")
    calls = metrics.model_calls
    by_outcome: dict[str, Any] = {}

    def outcome(name: str) -> None:
        # The labelled child once per outcome: this runs for every model call.
        child = by_outcome.get(name)
        if child is None:
            child = by_outcome[name] = calls.labels(model, task.name, name)
        child.inc()

    client = endpoint_client(
        endpoint,
        model,
        temperature=endpoint.temperature,
        max_tokens=endpoint.max_tokens,
        supports_n=endpoint.supports_n,
        forward=True,  # the engine sends the re-ask of the production request
        on_outcome=outcome,
    )
    spec, options = task.canonicalizer_spec()
    canonicalizer = get_async_canonicalizer(spec, model_client_factory=_judge_client, **options)
    if task.canonicalizer.strip().lower() != "tool_call":
        canonicalizer = PlainAnswersOnly(canonicalizer)  # a tool-call answer is INVALID
    # For verdicts that type the answer instead of picking a rank (sync canonicalizers only).
    async_only = task.canonicalizer.strip().lower() in _ASYNC_ONLY  # answer_pattern or not
    sync: Canonicalizer | None = None if async_only else get_canonicalizer(spec, **options)

    rule = get_stopping_rule(
        task.stopping_rule, k0=task.k0, k_max=task.k_max, delta=task.delta, futility=task.futility
    )
    runtime = TaskRuntime(task, canonicalizer, rule, client, sync, client_outcomes=OUTCOMES)
    if task.judge is not None:
        runtime.judge, runtime.judge_template = build_judge(task.judge), task.judge.template()
        metrics.init_judge(model, task.name)
    return runtime


def build_judge(judge: JudgeSettings) -> HttpModelClient:
    """The judge of ``tasks[].judge``: temperature 0, a short reply (its first word)."""
    assert judge.endpoint.model is not None  # JudgeSettings requires it
    return endpoint_client(
        judge.endpoint, judge.endpoint.model, temperature=0.0, max_tokens=judge.max_tokens
    )


def endpoint_client(endpoint: EndpointSettings, model: str, **options: Any) -> HttpModelClient:
    """A client of ``endpoint`` with its key, timeouts, limits, retries and breaker."""
    return HttpModelClient(
        base_url=endpoint.base_url,
        model=model,
        api_key=endpoint.resolved_api_key(),
        timeout_s=endpoint.timeout_s,
        concurrency=endpoint.concurrency,
        rate_limit_per_s=endpoint.rate_limit_per_s,
        retries=endpoint.retry_limits(),
        breaker_threshold=endpoint.circuit_breaker.failures,
        breaker_cooldown_s=endpoint.circuit_breaker.cooldown_s,
        **options,
    )


@dataclass
class ReviewBackend:
    """The store and review queue of ``review.backend`` (SQLite: one object is both)."""

    store: CalibrationStore
    queue: ReviewQueue
    review_store: SqliteStore | PostgresStore | None = None
    """The store that also serves the review API and page (HTTP backend)."""
    shared: PostgresStore | None = None
    """A store other replicas write too: this one follows their verdicts."""
    kafka_store: KafkaCalibrationStore | None = None
    kafka_queue: KafkaReviewQueue | None = None
    closers: list[Any] = field(default_factory=list)


async def build_review_backend(
    settings: Settings, scorer: VerdictScorer, kafka_options: dict[str, Any]
) -> ReviewBackend:
    """The calibration store and review queue of the configured review backend
    (``scorer``: the service's, so that replayed and live verdicts score alike)."""
    if settings.review.backend == "kafka":
        kafka_store = KafkaCalibrationStore(
            settings.kafka.bootstrap_servers,
            settings.kafka.review_topic,
            settings.kafka.verdict_topic,
            scorer,
            dead_letter_topic=settings.kafka.verdict_dead_letter_topic,
            **kafka_options,
        )
        producer = durable_producer(settings.kafka.bootstrap_servers, **kafka_options)
        await start_producer(producer, settings.kafka.bootstrap_servers)
        kafka_queue = KafkaReviewQueue(producer, settings.kafka.review_topic)
        return ReviewBackend(
            kafka_store,
            kafka_queue,
            kafka_store=kafka_store,
            kafka_queue=kafka_queue,
            # Run last to first: writes still waiting for the broker give up, then the
            # producer closes.
            closers=[producer.stop, kafka_queue.stop],
        )
    if settings.store.backend == "postgres":
        dsn = settings.store.resolved_dsn()
        if dsn is None:  # validate_settings reports this first
            raise ConfigError("store.dsn: required with store.backend: postgres")
        shared = await PostgresStore.open(dsn)
        return ReviewBackend(shared, shared, review_store=shared, shared=shared)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    unlock = lock_state_dir(Path(settings.state_dir))
    try:
        sqlite = SqliteStore(Path(settings.state_dir) / "relmon.sqlite3")
    except BaseException:
        await unlock()
        raise
    return ReviewBackend(sqlite, sqlite, review_store=sqlite, closers=[unlock])


def build_outbox(
    settings: Settings, closers: list[Callable[[], Awaitable[None]]]
) -> OutboxSettings:
    """The review outbox: a directory in ``state_dir`` when it can be written (its lock's
    release joins ``closers``), else memory (logged); named after the review queue."""
    if settings.review.backend == "kafka":
        name = "Kafka review topic"
    elif settings.store.backend == "postgres":
        name = "PostgreSQL store"
    else:
        name = "SQLite store"
    opened = open_outbox(Path(settings.state_dir))
    if isinstance(opened, str):
        log.warning("review_outbox_in_memory", why=opened)
        return OutboxSettings(None, settings.review.outbox_max_items, name)
    storage, release = opened
    closers.append(release)
    return OutboxSettings(storage, settings.review.outbox_max_items, name)


def lock_state_dir(state_dir: Path) -> Callable[[], Awaitable[None]]:
    """Hold ``state_dir/relmon.lock`` while this process runs: the SQLite store is one
    process's, and a second ``relmon run`` on the same state dir is refused at start
    (``relmon verdicts`` and other readers do not take the lock). Returns the release."""
    path = state_dir / "relmon.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(
            f"state_dir: {state_dir} is in use by another relmon (pid {holder}); the SQLite "
            "store is one process's: give each process its own state_dir, or share "
            "store.backend: postgres"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode("ascii"))

    async def release() -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    return release


def build_review_auth(settings: Settings, review_token: str | None = None) -> ReviewAuth:
    """How the review API and page authenticate (``review.auth``): the shared token
    (``review_token``, the demo's, else RELMON_REVIEW_TOKEN / ``review.token`` /
    ``review.token_file``) and the per-reviewer tokens of ``review.tokens_file``, or the
    trusted auth proxy. :class:`ConfigError` naming the field if unusable."""
    review = settings.review
    if review.auth == "proxy":
        return ReviewAuth(
            mode="proxy",
            proxy_headers=review.proxy_headers,
            trusted_proxies=review.trusted_proxies,
        )
    token = review_token or settings.resolved_review_token()
    reviewers = review.reviewer_tokens()
    if not token and not reviewers:
        raise ConfigError(
            "review.token: the review API needs a token: set RELMON_REVIEW_TOKEN, "
            "review.token, review.token_file or review.tokens_file"
        )
    return ReviewAuth(token=token, reviewer_tokens=reviewers)


def build_otel(
    settings: Settings, registry: CollectorRegistry, service: MonitorService
) -> OtelExporter | None:
    """With ``otel.enabled``: the exporter, told of every verdict this replica stores,
    its gauges refreshed as a scrape would (``MonitorService.publish``); else None."""
    if not settings.otel.enabled:
        return None
    exporter = OtelExporter(
        settings.otel, registry, refresh=service.publish, log_prompts=settings.log_prompts
    )
    service.calibration.listeners.append(exporter.verdict)
    service.calibration.judgement_listeners.append(exporter.judgement)
    return exporter
