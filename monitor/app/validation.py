"""Everything ``relmon run`` checks before it binds a port or creates a file, beyond
the one-field checks of the schema; ``relmon check-config`` runs exactly this.

It lives in the app because it asks the adapters (can this canonicalizer be built, do
these TLS files make an SSL context). Every message names its field,
``tasks[0] (arith).endpoint.base_url: must start with http:// or https://``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from adapters.canon.registry import check_canonicalizer
from adapters.kafka.clients import build_ssl_context
from monitor.app.api_checks import api_problems
from monitor.app.route_checks import route_problems
from monitor.config.messages import task_label
from monitor.config.schema import (
    MAX_RETRIES_PER_OUTCOME,
    KafkaSettings,
    KafkaTlsSettings,
    Settings,
    TaskSettings,
)
from monitor.config.secrets import given_twice
from monitor.core.apis.registry import GENERIC
from monitor.core.errors import ConfigError
from monitor.core.stopping import fewest_samples as rule_fewest_samples
from monitor.core.stopping import get_stopping_rule

__all__ = ["budget_warnings", "fewest_samples", "validate_settings"]


def fewest_samples(task: TaskSettings) -> int:
    """The fewest samples an item of this task can use (:func:`rule_fewest_samples`)."""
    rule = get_stopping_rule(
        task.stopping_rule, k0=task.k0, k_max=task.k_max, delta=task.delta, futility=task.futility
    )
    return rule_fewest_samples(rule)


def budget_warnings(settings: Settings) -> list[str]:
    """Whether the tasks' ``expected_events_per_s`` fit ``budget.calls_per_minute``.

    Monitored items per second = events/s x sampling_rate; each uses between the
    fewest samples its stopping rule allows (:func:`fewest_samples`: unanimous answers,
    or a split the futility stop gives up on sooner) and k_max calls. The
    tasks share one budget. Tasks without ``expected_events_per_s`` are not counted.
    """
    budget = settings.budget.calls_per_minute
    low = high = items = 0.0
    parts = []
    for i, t in enumerate(settings.tasks):
        if t.expected_events_per_s is None:
            continue
        items_per_min = t.expected_events_per_s * t.sampling_rate * 60.0
        fewest = fewest_samples(t)
        items += items_per_min
        low += items_per_min * fewest
        high += items_per_min * t.k_max
        parts.append(
            f"{task_label(i, t.name)}: {t.expected_events_per_s:g} events/s x "
            f"sampling_rate {t.sampling_rate:g} x {fewest}..{t.k_max} samples"
        )
    if not parts:
        return []
    need = f"{low:,.0f}..{high:,.0f} calls/min ({'; '.join(parts)})"
    if low > budget:
        dropped = 1.0 - budget / low
        return [
            f"budget.calls_per_minute: {budget:,} cannot fit the expected traffic, which "
            f"needs {need}: at least {dropped:.0%} of the sampled events will be dropped; "
            "raise the budget or lower sampling_rate"
        ]
    if high > budget:
        return [
            f"budget.calls_per_minute: {budget:,} may not fit the expected traffic, which "
            f"needs {need}: it fits only if items use at most {budget / items:.1f} samples "
            "on average; watch relmon_budget_utilization and "
            'relmon_traffic_events_total{decision="dropped"}'
        ]
    return []


def _state_dir_problem(path: Path) -> str | None:
    """Why ``path`` could not be used as the state directory (checked, not created)."""
    path = path.expanduser()
    if path.exists():
        if not path.is_dir():
            return f"{path} exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{path} is not writable"
        return None
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{path} cannot be created: {parent} is not a writable directory"
    return None


_AIOKAFKA_SESSION_TIMEOUT_MS = 10_000
_AIOKAFKA_HEARTBEAT_INTERVAL_MS = 3_000


def _file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read (None if it can)."""
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    return None


def _kafka_tls_problems(tls: KafkaTlsSettings, *, others: bool) -> list[str]:
    """The TLS files: both halves of a client certificate, readable, and (when nothing
    else is wrong, ``others`` False) an SSL context built from them."""
    problems: list[str] = []
    if (tls.cert_file is None) != (tls.key_file is None):
        given, missing = (
            ("cert_file", "key_file") if tls.key_file is None else ("key_file", "cert_file")
        )
        problems.append(
            f"kafka.tls.{missing}: required with kafka.tls.{given} (mutual TLS needs "
            "both the client certificate and its key)"
        )
    unreadable = False
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(tls, name)
        problem = _file_problem(path) if path is not None else None
        if problem:
            problems.append(f"kafka.tls.{name}: {problem}")
            unreadable = True
    if not unreadable and not problems and not others:
        try:
            build_ssl_context(tls)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def _kafka_problems(kafka: KafkaSettings) -> tuple[list[str], list[str]]:
    """Problems and warnings of ``kafka``'s security and group settings."""
    problems: list[str] = []
    warnings: list[str] = []
    protocol = kafka.security_protocol
    tls, sasl = kafka.tls, kafka.sasl
    uses_tls = protocol in ("SSL", "SASL_SSL")
    uses_sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    if tls.model_fields_set and not uses_tls:
        problems.append(
            f"kafka.tls: set, but kafka.security_protocol is {protocol}, which does not use "
            "TLS; use SSL or SASL_SSL (or remove kafka.tls)"
        )
    if sasl.configured() and not uses_sasl:
        problems.append(
            f"kafka.sasl: set, but kafka.security_protocol is {protocol}, which does not "
            "authenticate with SASL; use SASL_SSL or SASL_PLAINTEXT (or remove kafka.sasl)"
        )
    if uses_tls:
        problems += _kafka_tls_problems(tls, others=bool(problems))
    if uses_sasl:
        if sasl.mechanism is None:
            problems.append(
                f"kafka.sasl.mechanism: required with security_protocol {protocol}: "
                "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
            )
        if not sasl.username:
            problems.append(f"kafka.sasl.username: required with security_protocol {protocol}")
        # Both password and password_file: validate_settings reports it, Kafka on or off.
        if sasl.password is None and sasl.password_file is not None:
            try:
                sasl.resolved_password()
            except ConfigError as exc:
                problems.append(str(exc))
        elif sasl.password is None or not sasl.password.get_secret_value():
            problems.append(
                f"kafka.sasl.password: required with security_protocol {protocol}: set "
                "kafka.sasl.password, RELMON_KAFKA__SASL__PASSWORD or kafka.sasl.password_file"
            )
        if protocol == "SASL_PLAINTEXT" and sasl.mechanism == "PLAIN":
            warnings.append(
                "kafka.sasl.mechanism: PLAIN over SASL_PLAINTEXT sends the password in clear "
                "text on the network; use SASL_SSL (or a SCRAM mechanism)"
            )
    session = kafka.session_timeout_ms or _AIOKAFKA_SESSION_TIMEOUT_MS
    heartbeat = kafka.heartbeat_interval_ms or _AIOKAFKA_HEARTBEAT_INTERVAL_MS
    if heartbeat >= session:
        field = (
            "heartbeat_interval_ms"
            if kafka.heartbeat_interval_ms is not None
            else "session_timeout_ms"
        )
        problems.append(
            f"kafka.{field}: the heartbeat interval ({heartbeat} ms) must be below the "
            f"session timeout ({session} ms), typically a third of it"
        )
    return problems, warnings


def _judge_problems(where: str, t: TaskSettings, settings: Settings) -> list[str]:
    """``tasks[].judge``: its template and key readable; a backend that keeps its labels."""
    if t.judge is None:
        return []
    problems: list[str] = []
    if settings.review.backend == "kafka":
        problems.append(
            f"{where}.judge: the judge-assisted level needs review.backend: http (with store "
            "sqlite or postgres, which keep the judge's labels); the Kafka review backend "
            "does not keep them yet"
        )
    for read in (t.judge.template, t.judge.endpoint.resolved_api_key):
        try:
            read()
        except ConfigError as exc:
            problems.append(
                f"{where}.{exc}".replace(".endpoint.api_key", ".judge.endpoint.api_key")
            )
    return problems


def _task_problems(i: int, t: TaskSettings, settings: Settings) -> list[str]:
    """The problems of task ``i``, each naming its field."""
    problems: list[str] = []
    where = task_label(i, t.name)
    if not (t.endpoint.model or t.match.model or t.endpoint.api == GENERIC):
        problems.append(
            f"{where}.endpoint.model: required: the model relmon asks again "
            "(or name it in match.model)"
        )
    if t.endpoint.api_key is not None and t.endpoint.api_key_file is not None:
        variable = f"RELMON_TASKS__{i}__ENDPOINT__API_KEY"
        problems.append(f"{where}.{given_twice('endpoint.api_key', variable)}")
    elif t.endpoint.api_key_file is not None:
        try:
            t.endpoint.resolved_api_key()
        except ConfigError as exc:
            problems.append(f"{where}.{exc}")
    problems += _canonicalizer_problems(where, t)
    problems += api_problems(where, t)
    problems += _judge_problems(where, t, settings)
    for kind, count in t.endpoint.retry_limits().items():
        if count > MAX_RETRIES_PER_OUTCOME:
            field = (
                f"retries.{kind}" if kind in t.endpoint.retries.model_fields_set else "max_retries"
            )
            problems.append(
                f"{where}.endpoint.{field}: {count} retries of one call is more than "
                f"{MAX_RETRIES_PER_OUTCOME}; with backoff up to 30 s an item would hold "
                "its budget for many minutes"
            )
    if t.k_max > settings.budget.calls_per_minute:
        problems.append(
            f"{where}.k_max: {t.k_max} is more than budget.calls_per_minute "
            f"({settings.budget.calls_per_minute}); an item reserves k_max calls, so "
            "none could ever be admitted"
        )
    return problems


def _canonicalizer_problems(where: str, t: TaskSettings) -> list[str]:
    """The canonicalizer as named (so the message is the same with or without
    answer_pattern), then wrapped in the pattern as the service builds it."""
    try:
        check_canonicalizer(t.canonicalizer, t.canonicalizer_options)
    except ConfigError as exc:
        return [f"{where}.canonicalizer: {exc}"]
    if t.answer_pattern is None:
        return []
    try:
        re.compile(t.answer_pattern)
    except re.error as exc:
        return [f"{where}.answer_pattern: not a regular expression: {exc}"]
    try:
        check_canonicalizer(*t.canonicalizer_spec())
    except ConfigError as exc:
        return [f"{where}.answer_pattern: {exc}"]
    return []


def _review_auth_problems(
    settings: Settings, review_token: str | None, token_twice: bool
) -> list[str]:
    """The review API's authentication (``review.auth``): with ``token``, a shared token
    or a readable ``review.tokens_file``; with ``proxy`` the field checks suffice."""
    if settings.review.auth == "proxy":
        return []
    problems: list[str] = []
    try:
        reviewers = settings.review.reviewer_tokens()
    except ConfigError as exc:
        problems.append(str(exc))
        reviewers = {"(reported)": []}
    token = review_token or ("(reported)" if token_twice else None)
    if not token:
        try:
            token = settings.resolved_review_token()
        except ConfigError as exc:
            problems.append(str(exc))
            token = "(reported)"
    if not token and not reviewers:
        problems.append(
            "review.token: the review API needs a token: set RELMON_REVIEW_TOKEN, "
            "review.token, review.token_file or review.tokens_file"
        )
    return problems


def _secret_problems(settings: Settings, review_token: str | None) -> list[str]:
    """Secrets given twice or unreadable; the review token the HTTP backend needs; the
    state directory that keeps the store or the generated query hash key."""
    problems: list[str] = []
    token_twice = settings.review.token is not None and settings.review.token_file is not None
    if token_twice:
        problems.append(given_twice("review.token", "RELMON_REVIEW__TOKEN"))
    sasl = settings.kafka.sasl
    if sasl.password is not None and sasl.password_file is not None:
        problems.append(given_twice("kafka.sasl.password", "RELMON_KAFKA__SASL__PASSWORD"))
    if settings.review.backend == "http":
        problem = _state_dir_problem(settings.state_dir)
        if problem:
            problems.append(f"state_dir: {problem}")
        problems += _review_auth_problems(settings, review_token, token_twice)
    if settings.query_hash_key is not None and settings.query_hash_key_file is not None:
        problems.append(given_twice("query_hash_key", "RELMON_QUERY_HASH_KEY"))
    elif settings.query_hash_key_file is not None:
        try:
            settings.resolved_query_hash_key()
        except ConfigError as exc:
            problems.append(str(exc))
    elif settings.review.backend != "http" and settings.query_hash_key is None:
        problem = _state_dir_problem(settings.state_dir)
        if problem:  # the generated query hash key is kept there
            problems.append(
                f"state_dir: {problem} (it keeps the query hash key; or set query_hash_key)"
            )
    return problems


def _store_problems(settings: Settings) -> list[str]:
    """``store``: a PostgreSQL store needs a DSN (given once) and the HTTP review backend."""
    store = settings.store
    if store.backend != "postgres":
        return []
    problems: list[str] = []
    if settings.review.backend != "http":
        problems.append(
            "store.backend: postgres holds the review queue of review.backend: http; with "
            "review.backend: kafka the Kafka topics are the store (remove store.backend)"
        )
    if store.dsn is not None and store.dsn_file is not None:
        problems.append(given_twice("store.dsn", "RELMON_STORE__DSN"))
    elif store.dsn_file is not None:
        try:
            store.resolved_dsn()
        except ConfigError as exc:
            problems.append(str(exc))
    elif store.resolved_dsn() is None:
        problems.append(
            "store.dsn: required with store.backend: postgres: set store.dsn, "
            "RELMON_STORE__DSN or store.dsn_file (postgresql://user:password@host/db)"
        )
    return problems


def validate_settings(settings: Settings, *, review_token: str | None = None) -> list[str]:
    """Everything ``relmon run`` needs beyond the field checks; returns warnings.

    Raises :class:`ConfigError` listing every problem, one line each, each naming its
    field. Does no I/O besides reading the secret files it is pointed at; binds no port
    and creates no file. ``review_token`` is a token given in code (the demo's).
    """
    problems: list[str] = []
    if not settings.tasks:
        problems.append("tasks: no tasks configured; add a 'tasks:' list to the config file")
    seen: dict[str, int] = {}
    for i, t in enumerate(settings.tasks):
        if t.name in seen:
            problems.append(
                f"{task_label(i, t.name)}.name: already the name of tasks[{seen[t.name]}]"
            )
        seen.setdefault(t.name, i)
        problems += _task_problems(i, t, settings)
    if settings.review.backend == "kafka" and not settings.kafka.enabled:
        problems.append("review.backend: 'kafka' needs kafka.enabled: true")
    kafka_warnings: list[str] = []
    if settings.kafka.enabled:
        kafka_problems, kafka_warnings = _kafka_problems(settings.kafka)
        problems += kafka_problems
    route_troubles, route_warnings = route_problems(settings)
    problems += route_troubles
    problems += _secret_problems(settings, review_token)
    problems += _store_problems(settings)
    if settings.otel.enabled:
        try:
            settings.otel.resolved_headers()
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(f"{settings._source}: {p}" for p in problems))
    warnings = [
        *kafka_warnings,
        *route_warnings,
        *budget_warnings(settings),
        *_data_plane_warnings(settings),
        *_span_match_warnings(settings),
    ]
    return [f"{settings._source}: {w}" for w in warnings]


def _span_match_warnings(settings: Settings) -> list[str]:
    """A task matching span attributes with no source of spans: it never matches."""
    if settings.traffic.otlp.enabled or settings.kafka.enabled:
        return []  # spans come to the receiver, or as Kafka events of format otlp
    return [
        f"{task_label(i, t.name)}.match.attributes: only spans carry attributes, and "
        "traffic.otlp.enabled is false: no event will match this task "
        "(docs/opentelemetry.md, traces as a source)"
        for i, t in enumerate(settings.tasks)
        if t.match.attributes
    ]


def _data_plane_warnings(settings: Settings) -> list[str]:
    """An embedding canonicalizer beside a one-process listener: each item's embedding
    takes CPU and the GIL from the live requests."""
    traffic = settings.traffic
    if traffic.mode == "off" or traffic.data_plane == "process":
        return []
    embedding = [t.name for t in settings.tasks if t.canonicalizer == "embedding"]
    if not embedding:
        return []
    return [
        f"traffic.data_plane: 'inline' while task(s) {', '.join(embedding)} use the "
        "embedding canonicalizer: its work shares the process, and the GIL, with the "
        f"{traffic.mode}'s live requests and raises their latency (docs/deploy.md, "
        "bench/isolation_bench.py); set traffic.data_plane: process"
    ]
