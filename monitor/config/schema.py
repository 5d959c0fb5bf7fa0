"""The settings schema: every key relmon reads, with its default and its checks.

Precedence: environment variables over the YAML file over defaults. A task's field is
set from the environment by its index, ``RELMON_TASKS__0__ENDPOINT__API_KEY``, which
overrides that one field of the file's first task. Every listener binds to 127.0.0.1
unless configured otherwise; secrets are ``SecretStr``.

Loading is :mod:`monitor.config.loading`; the checks beyond one field that ``relmon run``
and ``relmon check-config`` share are :mod:`monitor.app.validation`.

The validators here raise ``ValueError``, as pydantic requires: it becomes a
``ValidationError``, which loading reports as a :class:`~monitor.core.errors.ConfigError`
naming the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from monitor.config.endpoint import (
    MAX_RETRIES_PER_OUTCOME,
    CircuitBreakerSettings,
    EndpointSettings,
    RetrySettings,
)
from monitor.config.identity import ReviewIdentitySettings
from monitor.config.judge import JudgeSettings
from monitor.config.otel import OtelSettings
from monitor.config.secrets import read_secret
from monitor.config.sources import YAML_DATA, IndexedEnvSource, YamlSource
from monitor.config.store import StoreSettings
from monitor.config.traffic import RouteMatch, RouteSettings, TrafficSettings
from monitor.core.apis.registry import API_NAMES
from monitor.core.errors import ConfigError
from monitor.core.redaction import BUILTIN_RULES, Redactor
from monitor.core.review import MAX_TASK_NAME_CHARS
from monitor.core.segments import SegmentSpec, parse_segments
from monitor.core.stopping import DEFAULT_FUTILITY, DEFAULT_RULE, available_rules

__all__ = [
    "MAX_RETRIES_PER_OUTCOME",
    "BudgetSettings",
    "CircuitBreakerSettings",
    "EndpointSettings",
    "KafkaSaslSettings",
    "KafkaSettings",
    "KafkaTlsSettings",
    "ListenSettings",
    "MatchSettings",
    "ReaskSettings",
    "RedactionRuleSettings",
    "RedactionSettings",
    "RetrySettings",
    "ReviewIdentitySettings",
    "ReviewSettings",
    "RouteMatch",
    "RouteSettings",
    "Settings",
    "TaskSettings",
    "TrafficSettings",
    "default_state_dir",
]

DEFAULT_ALPHAS = [0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/relmon``, else ``~/.local/state/relmon`` (the XDG default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "relmon"


class ReaskSettings(_Strict):
    """How a re-ask differs from the production request (monitor.core.reask)."""

    min_temperature: float = Field(0.5, ge=0, le=2)  # a lower temperature is raised to it
    set: dict[str, Any] = {}  # fields replaced or added in every re-ask (dotted paths)
    drop: list[str] = []  # fields removed from every re-ask (dotted paths)
    # Tools the provider runs (web search, MCP, code execution...) known to be read-only:
    # a request carrying any other such tool is never re-asked (docs/apis/).
    server_tools: list[str] = []

    @model_validator(mode="after")
    def _not_relmons_own(self) -> ReaskSettings:
        own = sorted({"n", "stream", "stream_options"} & (set(self.set) | set(self.drop)))
        if own:
            raise ValueError(f"{', '.join(own)}: relmon's own fields cannot be set or dropped")
        if "messages" in self.set or "messages" in self.drop:
            raise ValueError("messages: the question itself cannot be set or dropped")
        return self


class MatchSettings(_Strict):
    """How traffic is matched to the task: any given condition must hold."""

    header: str | None = None  # value of the task header (see traffic.task_header)
    model: str | None = None
    path_prefix: str | None = None
    api: str | None = None  # the event's wire API (monitor.core.apis.registry.API_NAMES)
    # traffic.otlp spans only: span or resource attributes, each equal ({service.name: x})
    attributes: dict[str, str | bool | int | float] | None = Field(None, min_length=1)

    @field_validator("api")
    @classmethod
    def _known_api(cls, v: str | None) -> str | None:
        if v is not None and v not in API_NAMES:
            raise ValueError(f"unknown api {v!r}; known: {', '.join(API_NAMES)}")
        return v


class TaskSettings(_Strict):
    name: str = Field(min_length=1, max_length=MAX_TASK_NAME_CHARS, pattern=r"^[A-Za-z0-9_.:-]+$")
    match: MatchSettings = MatchSettings()
    canonicalizer: str = "text"
    canonicalizer_options: dict[str, Any] = {}
    answer_pattern: str | None = None  # a regex applied before the canonicalizer
    # endpoint.api generic only (JMESPath): where the question is in the request body, and
    # the answer in the response body.
    query_path: str | None = None
    answer_path: str | None = None
    endpoint: EndpointSettings = EndpointSettings()
    reask: ReaskSettings = ReaskSettings()
    judge: JudgeSettings | None = None  # judge-assisted level (PPI); off by default
    # Reliability per segment (monitor.core.segments): {by: {header: X-Tenant}, max: 20}.
    segments: dict[str, Any] | None = None
    k_max: int = Field(20, ge=1, le=200)
    k0: int = Field(3, ge=1)
    delta: float = Field(0.05, gt=0, lt=1)
    stopping_rule: str = DEFAULT_RULE
    futility: bool = DEFAULT_FUTILITY  # also stop once K_max can no longer certify
    sampling_rate: float = Field(0.01, ge=0, le=1)
    review_rate: float = Field(0.1, gt=0, le=1)
    alphas: list[float] = Field(default_factory=lambda: list(DEFAULT_ALPHAS), min_length=1)
    reliability_target: float = Field(0.9, gt=0, lt=1)
    window_size: int = Field(2000, ge=1)
    half_life_s: float | None = Field(3600.0, gt=0)
    expected_events_per_s: float | None = Field(None, ge=0)  # for check-config's budget check
    # Beyond the paper (all off or neutral by default; docs/beyond-the-paper.md):
    aci_gamma: float | None = Field(None, gt=0, le=1)  # adaptive alpha for served sets
    alarm_alpha: float = Field(0.001, gt=0, lt=1)  # e-detector alarm at 1/alarm_alpha
    review_priority: Literal["uniform", "uncertainty"] = "uniform"
    review_min_rate: float | None = Field(None, gt=0, le=1)  # pi_min when prioritised

    @property
    def review_floor(self) -> float:
        """The smallest inclusion probability an item can get (pi_min)."""
        if self.review_priority == "uniform":
            return self.review_rate
        return self.review_min_rate if self.review_min_rate is not None else self.review_rate / 5

    def canonicalizer_spec(self) -> tuple[str, dict[str, Any]]:
        """The canonicalizer to build: ``answer_pattern`` wraps it in ``regex``, which
        extracts from each raw answer what ``canonicalizer`` then sees (for ``embedding``
        and ``llm`` too: :func:`adapters.canon.registry.get_async_canonicalizer`)."""
        options = dict(self.canonicalizer_options)
        spec = self.canonicalizer
        if self.answer_pattern is not None:
            return "regex", {"pattern": self.answer_pattern, "then": spec, "then_options": options}
        return spec, options

    @field_validator("alphas")
    @classmethod
    def _alphas_in_range(cls, v: list[float]) -> list[float]:
        for a in v:
            if not 0 < a < 1:
                raise ValueError(f"alpha must be in (0, 1), got {a}")
        return sorted(set(v))

    @field_validator("segments")
    @classmethod
    def _segments_parse(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                parse_segments(v, option="segments")
            except ConfigError as e:  # "segments.max: ...": the location says "segments"
                raise ValueError(str(e).removeprefix("segments").lstrip(".: ")) from None
        return v

    @property
    def segment_spec(self) -> SegmentSpec | None:
        """``segments`` parsed (None: the task has no segments)."""
        return None if self.segments is None else parse_segments(self.segments)

    @field_validator("stopping_rule")
    @classmethod
    def _known_rule(cls, v: str) -> str:
        if v not in available_rules():
            raise ValueError(
                f"unknown stopping rule {v!r}; available: {', '.join(available_rules())}"
            )
        return v

    @property
    def generic_options(self) -> dict[str, str | None]:
        """``GenericApi``'s options (``endpoint.api: generic``)."""
        return {
            "query_path": self.query_path or "@",
            "answer_path": self.answer_path or "@",
            "path_prefix": self.match.path_prefix,
        }

    @model_validator(mode="after")
    def _k0_le_kmax(self) -> TaskSettings:
        if self.k0 > self.k_max:
            raise ValueError(f"k0 ({self.k0}) must be <= k_max ({self.k_max})")
        if self.review_min_rate is not None and self.review_min_rate > self.review_rate:
            raise ValueError(
                f"review_min_rate ({self.review_min_rate}) must be <= review_rate "
                f"({self.review_rate}), the rate of the most uncertain items"
            )
        return self


class ListenSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)


class KafkaTlsSettings(_Strict):
    """TLS to the brokers (``security_protocol`` SSL or SASL_SSL)."""

    ca_file: Path | None = None  # PEM CA bundle; else the system's CAs
    cert_file: Path | None = None  # client certificate (mutual TLS), with key_file
    key_file: Path | None = None  # its private key (PEM, unencrypted)
    check_hostname: bool = True


class KafkaSaslSettings(_Strict):
    """SASL authentication (``security_protocol`` SASL_PLAINTEXT or SASL_SSL)."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    username: str | None = None
    password: SecretStr | None = None  # or RELMON_KAFKA__SASL__PASSWORD
    password_file: Path | None = None  # e.g. a mounted Kubernetes Secret

    def configured(self) -> bool:
        """Whether a SASL setting other than the password is given (a password alone, as
        from RELMON_KAFKA__SASL__PASSWORD, is unused without a SASL protocol)."""
        return any(
            getattr(self, name) is not None for name in ("mechanism", "username", "password_file")
        )

    def resolved_password(self) -> str | None:
        """``password``, else the contents of ``password_file``, else None."""
        if self.password is not None and self.password.get_secret_value():
            return self.password.get_secret_value()
        if self.password_file is not None:
            return read_secret(self.password_file, "kafka.sasl.password_file")
        return None


class KafkaSettings(_Strict):
    enabled: bool = False
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    tls: KafkaTlsSettings = KafkaTlsSettings()
    sasl: KafkaSaslSettings = KafkaSaslSettings()
    session_timeout_ms: int | None = Field(None, ge=1)
    """Consumer group session timeout (aiokafka's default, 10 s, when unset)."""
    heartbeat_interval_ms: int | None = Field(None, ge=1)
    """Heartbeats to the group coordinator (aiokafka: 3 s); below the session timeout."""
    max_poll_interval_ms: int | None = Field(None, ge=1)
    """Longest time between two fetches before the member leaves the group (5 min)."""
    rebalance_timeout_ms: int | None = Field(None, ge=1)
    """How long a rebalance waits for members to rejoin (aiokafka: the session timeout)."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where the traffic consumer starts in a partition with no committed offset, or whose
    position lies past the log end (the broker lost its data, the topic was recreated)."""
    traffic_topic: str = "llm-traffic"
    dead_letter_topic: str = "relmon-dead-letter"
    group_id: str = "relmon"
    review_topic: str = "relmon-reviews"
    verdict_topic: str = "relmon-verdicts"
    verdict_dead_letter_topic: str = "relmon-verdicts-dead-letter"
    """Refused verdicts (malformed, or no review item within verdict_wait_s)."""
    verdict_wait_s: float = Field(30.0, gt=0, le=3600)
    """How long a verdict whose review item has not arrived yet waits for it."""

    # Sources never die silently (docs/kafka.md, "A bad event"): one traffic record's size limit.
    max_event_bytes: int = Field(1_048_576, ge=1024, le=67_108_864)
    """A traffic record over this many bytes is rejected and dead-lettered (1 MiB, as
    ``traffic.max_body_bytes``)."""


class ReviewSettings(ReviewIdentitySettings):
    backend: Literal["http", "kafka"] = "http"
    host: str = "127.0.0.1"
    port: int = Field(9109, ge=0, le=65535)
    token: SecretStr | None = None
    token_file: Path | None = None
    lease_s: float = Field(120.0, gt=0, le=86_400)
    """How long an item handed to a reviewer is kept from the others."""
    undo_s: float = Field(10.0, ge=0, le=3600)
    """How long a verdict from the review page can be undone before it is applied."""
    max_leases_per_reviewer: int = Field(20, ge=1, le=100_000)
    """Items one reviewer may hold leased at once (every replica together); one more is
    answered 429. Everyone on the shared token counts as one reviewer."""
    outbox_max_items: int = Field(10_000, ge=1, le=10_000_000)
    """Scored review items kept while the review queue refuses writes (the review
    outbox, on disk under state_dir when it is writable); past it the newest is dropped."""

    def resolved_token(self) -> str | None:
        """``token``, else the contents of ``token_file`` (both: validate_settings refuses)."""
        if self.token is not None and self.token.get_secret_value().strip():
            return self.token.get_secret_value().strip()
        if self.token_file is not None:
            return read_secret(self.token_file, "review.token_file")
        return None


class RedactionRuleSettings(_Strict):
    """A deployment's own redaction rule: every match of ``pattern`` becomes ``replacement``."""

    name: str = Field(min_length=1)
    pattern: str = Field(min_length=1)
    replacement: str = "[redacted]"

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return v


class RedactionSettings(_Strict):
    """What is masked in the query and answers a reviewer sees (monitor.core.redaction)."""

    builtin_rules: list[str] = Field(default_factory=lambda: list(BUILTIN_RULES))
    rules: list[RedactionRuleSettings] = Field(default_factory=list)
    answers: bool = True

    @field_validator("builtin_rules")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        unknown = [name for name in v if name not in BUILTIN_RULES]
        if unknown:
            raise ValueError(
                f"unknown shipped rule(s) {', '.join(unknown)}; shipped: {', '.join(BUILTIN_RULES)}"
            )
        return v

    def redactor(self) -> Redactor:
        return Redactor.from_config(
            self.builtin_rules,
            [(r.name, r.pattern, r.replacement) for r in self.rules],
            answers=self.answers,
        )


class BudgetSettings(_Strict):
    calls_per_minute: int = Field(600, ge=1)
    max_in_flight: int = Field(8, ge=1)
    queue_size: int = Field(64, ge=1)
    pace: bool = True


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RELMON_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    tasks: list[TaskSettings] = Field(default_factory=list)
    traffic: TrafficSettings = TrafficSettings()
    metrics: ListenSettings = ListenSettings(port=9108)
    review: ReviewSettings = ReviewSettings()
    store: StoreSettings = StoreSettings()
    kafka: KafkaSettings = KafkaSettings()
    budget: BudgetSettings = BudgetSettings()
    otel: OtelSettings = OtelSettings()
    review_token: SecretStr | None = None  # RELMON_REVIEW_TOKEN
    redaction: RedactionSettings = RedactionSettings()
    query_hash_key: SecretStr | None = None  # else query_hash_key_file, else state_dir
    query_hash_key_file: Path | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    log_format: Literal["json", "console"] = "json"
    log_prompts: bool = False
    drain_timeout_s: float = Field(30.0, gt=0)
    seed: int | None = None
    _source: str = PrivateAttr("settings")  # where they came from, for messages

    @field_validator("state_dir")
    @classmethod
    def _expand_home(cls, v: Path) -> Path:
        return v.expanduser()

    def resolved_query_hash_key(self) -> str | None:
        """``query_hash_key``, else the contents of ``query_hash_key_file``, else None
        (then a key is generated into ``state_dir``)."""
        if self.query_hash_key is not None and self.query_hash_key.get_secret_value():
            return self.query_hash_key.get_secret_value()
        if self.query_hash_key_file is not None:
            return read_secret(self.query_hash_key_file, "query_hash_key_file")
        return None

    def resolved_review_token(self) -> str | None:
        """RELMON_REVIEW_TOKEN, else review.token, else the contents of review.token_file."""
        if self.review_token is not None and self.review_token.get_secret_value():
            return self.review_token.get_secret_value()
        return self.review.resolved_token()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        data = YAML_DATA.get(settings_cls, {})
        return (
            init_settings,
            IndexedEnvSource(settings_cls, env_settings, data),
            YamlSource(settings_cls, data),
            file_secret_settings,
        )
