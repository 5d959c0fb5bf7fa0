"""The composition root's parts: from settings to the live objects of one task, and to
the calibration store and review queue of the configured review backend.

This module and :mod:`monitor.app.runner` are the only places that pick an
implementation of a port (:mod:`monitor.engine.ports`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from adapters.canon.registry import get_async_canonicalizer
from adapters.kafka.review import (
    KafkaCalibrationStore,
    KafkaReviewQueue,
    durable_producer,
    start_producer,
)
from adapters.openai.client import OUTCOMES, OpenAIClient
from adapters.sqlite.store import SqliteStore
from monitor.config import Settings, TaskSettings
from monitor.core.canon import get_canonicalizer
from monitor.core.canon.base import Canonicalizer
from monitor.core.errors import ConfigError
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.ports import CalibrationStore, ReviewQueue
from monitor.engine.runtime import TaskRuntime
from monitor.engine.verdicts import VerdictScorer

__all__ = [
    "QUERY_HASH_KEY_FILE",
    "ReviewBackend",
    "build_review_backend",
    "build_task",
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


def _judge_client(*, endpoint: str, model: str, **options: Any) -> OpenAIClient:
    """The ``llm`` canonicalizer's judge: deterministic, temperature 0 (paper §3.3)."""
    options.setdefault("max_tokens", 32)
    return OpenAIClient(base_url=endpoint, model=model, temperature=0.0, **options)


def build_task(task: TaskSettings, metrics: Metrics) -> TaskRuntime:
    """A task's live parts: its model client, canonicalizers and stopping rule."""
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
class ReviewBackend:
    """The store and review queue of ``review.backend`` (SQLite: one object is both)."""

    store: CalibrationStore
    queue: ReviewQueue
    sqlite: SqliteStore | None = None
    """The SQLite store, which also serves the review API and page (HTTP backend)."""
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
            closers=[producer.stop],
        )
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    sqlite = SqliteStore(Path(settings.state_dir) / "relmon.sqlite3")
    return ReviewBackend(sqlite, sqlite, sqlite=sqlite)
