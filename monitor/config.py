"""Settings: pydantic-settings from RELMON_... variables (nested with ``__``) and a
YAML file for the rest, mostly the task list. Read once at start and passed down.

Precedence: environment variables over the YAML file over defaults. A task's field is
set from the environment by its index, ``RELMON_TASKS__0__ENDPOINT__API_KEY``, which
overrides that one field of the file's first task. Every listener binds to 127.0.0.1
unless configured otherwise; secrets are ``SecretStr`` and are masked by
:func:`effective_settings`.

Validation has two stages and one path: :func:`load_settings` parses and checks each
field; :func:`validate_settings` checks everything else ``relmon run`` depends on
(canonicalizer names and options, the re-asked model, the review token, Kafka
consistency, the call budget) and is what both ``relmon check-config`` and the service
start run, before any port is bound or file created. Every message names the field,
``tasks[0] (arith).endpoint.base_url: must start with http:// or https://``.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from monitor.errors import ConfigError
from monitor.redaction import BUILTIN_RULES, Redactor
from monitor.stopping import DEFAULT_FUTILITY, DEFAULT_RULE, available_rules, get_stopping_rule

__all__ = [
    "BudgetSettings",
    "CircuitBreakerSettings",
    "EndpointSettings",
    "KafkaSaslSettings",
    "KafkaSettings",
    "KafkaTlsSettings",
    "ListenSettings",
    "MatchSettings",
    "RedactionRuleSettings",
    "RedactionSettings",
    "RetrySettings",
    "ReviewSettings",
    "Settings",
    "TaskSettings",
    "TrafficSettings",
    "budget_warnings",
    "default_state_dir",
    "effective_settings",
    "fewest_samples",
    "load_settings",
    "validate_settings",
]

DEFAULT_ALPHAS = [0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.strip().lower().startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.strip() if value is not None else None


def _read_secret(path: Path, where: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if not text:
        raise ConfigError(f"{where}: {path} is empty")
    return text


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/relmon``, else ``~/.local/state/relmon`` (the XDG default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "relmon"


MAX_RETRIES_PER_OUTCOME = 10
"""The most retries ``validate_settings`` accepts for one outcome (backoff doubles up to
30 s: more would hold an item, and its reserved budget, for many minutes)."""


class RetrySettings(_Strict):
    """Retries of one model call, per failed outcome (each counted on its own)."""

    error: int = Field(3, ge=0)  # HTTP 5xx and connection errors
    timeout: int = Field(3, ge=0)  # the client's timeout, or HTTP 408
    rate_limited: int = Field(3, ge=0)  # HTTP 429 (Retry-After honoured)
    invalid: int = Field(2, ge=0)  # a 2xx body that is not a well-formed completion


class CircuitBreakerSettings(_Strict):
    """When the endpoint counts as down: after ``failures`` consecutive failed calls no
    call is made for ``cooldown_s`` seconds, then one trial call decides."""

    failures: int = Field(5, ge=1)
    cooldown_s: float = Field(30.0, ge=0, allow_inf_nan=False)

    @field_validator("failures", "cooldown_s", mode="before")
    @classmethod
    def _not_a_boolean(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool):  # pydantic would read true as 1
            kind = "an integer" if info.field_name == "failures" else "a number of seconds"
            raise ValueError(f"must be {kind}, got {str(v).lower()}")
        return v


class EndpointSettings(_Strict):
    """The OpenAI-compatible endpoint the re-issuer asks again."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None  # required unless the task's match.model names it
    api_key: SecretStr | None = None
    api_key_file: Path | None = None  # e.g. a mounted Kubernetes Secret
    temperature: float = Field(0.7, ge=0, le=2)
    max_tokens: int = Field(256, ge=1)
    timeout_s: float = Field(30.0, gt=0)
    concurrency: int = Field(4, ge=1)
    rate_limit_per_s: float | None = Field(None, gt=0)
    supports_n: bool = False
    max_retries: int | None = Field(None, ge=0)  # older form: error, timeout, rate_limited
    retries: RetrySettings = RetrySettings()
    circuit_breaker: CircuitBreakerSettings = CircuitBreakerSettings()

    def retry_limits(self) -> dict[str, int]:
        """Retries per outcome: ``retries``, where not set there ``max_retries`` (if set)."""
        limits = self.retries.model_dump()
        if self.max_retries is not None:
            for kind in ("error", "timeout", "rate_limited"):
                if kind not in self.retries.model_fields_set:
                    limits[kind] = self.max_retries
        return limits

    @field_validator("base_url")
    @classmethod
    def _base_url_scheme(cls, v: str) -> str:
        return _http_url(v) or v

    def resolved_api_key(self) -> str | None:
        """``api_key``, else the contents of ``api_key_file``, else None."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_file is not None:
            return _read_secret(self.api_key_file, "endpoint.api_key_file")
        return None


class MatchSettings(_Strict):
    """How traffic is matched to the task: any given condition must hold."""

    header: str | None = None  # value of the task header (see traffic.task_header)
    model: str | None = None
    path_prefix: str | None = None


class TaskSettings(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    match: MatchSettings = MatchSettings()
    canonicalizer: str = "text"
    canonicalizer_options: dict[str, Any] = {}
    answer_pattern: str | None = None  # a regex applied before the canonicalizer
    endpoint: EndpointSettings = EndpointSettings()
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
        """The smallest review probability an item can get (pi_min)."""
        if self.review_priority == "uniform":
            return self.review_rate
        return self.review_min_rate if self.review_min_rate is not None else self.review_rate / 5

    def canonicalizer_spec(self) -> tuple[str, dict[str, Any]]:
        """The canonicalizer to build: ``answer_pattern`` wraps it in ``regex``, which
        extracts from each raw answer what ``canonicalizer`` then sees (for ``embedding``
        and ``llm`` too: :func:`adapters.canon_registry.get_async_canonicalizer`)."""
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

    @field_validator("stopping_rule")
    @classmethod
    def _known_rule(cls, v: str) -> str:
        if v not in available_rules():
            raise ValueError(
                f"unknown stopping rule {v!r}; available: {', '.join(available_rules())}"
            )
        return v

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


class TrafficSettings(_Strict):
    mode: Literal["mirror", "proxy", "off"] = "mirror"
    host: str = "127.0.0.1"
    port: int = Field(9110, ge=0, le=65535)
    upstream_url: str | None = None
    task_header: str = "X-Relmon-Task"
    max_body_bytes: int = Field(1_048_576, ge=1024)

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    @field_validator("upstream_url")
    @classmethod
    def _upstream_scheme(cls, v: str | None) -> str | None:
        return _http_url(v)

    @model_validator(mode="after")
    def _proxy_needs_upstream(self) -> TrafficSettings:
        if self.mode == "proxy" and not self.upstream_url:
            raise ValueError("mode 'proxy' needs traffic.upstream_url")
        return self


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
            return _read_secret(self.password_file, "kafka.sasl.password_file")
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
    traffic_topic: str = "llm-traffic"
    dead_letter_topic: str = "relmon-dead-letter"
    group_id: str = "relmon"
    review_topic: str = "relmon-reviews"
    verdict_topic: str = "relmon-verdicts"
    verdict_dead_letter_topic: str = "relmon-verdicts-dead-letter"
    """Refused verdicts (malformed, or no review item within verdict_wait_s)."""
    verdict_wait_s: float = Field(30.0, gt=0, le=3600)
    """How long a verdict whose review item has not arrived yet waits for it."""


class ReviewSettings(_Strict):
    backend: Literal["http", "kafka"] = "http"
    host: str = "127.0.0.1"
    port: int = Field(9109, ge=0, le=65535)
    token: SecretStr | None = None
    token_file: Path | None = None
    lease_s: float = Field(120.0, gt=0, le=86_400)
    """How long an item handed to a reviewer is kept from the others."""
    undo_s: float = Field(10.0, ge=0, le=3600)
    """How long a verdict from the review page can be undone before it is applied."""

    def resolved_token(self) -> str | None:
        """``token``, else the contents of ``token_file`` (both: validate_settings refuses)."""
        if self.token is not None and self.token.get_secret_value().strip():
            return self.token.get_secret_value().strip()
        if self.token_file is not None:
            return _read_secret(self.token_file, "review.token_file")
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
    """What is masked in the query and answers a reviewer sees (monitor.redaction)."""

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


class _IndexedEnvSource(PydanticBaseSettingsSource):
    """The environment source, with ``RELMON_TASKS__<i>__...`` applied to the file's tasks.

    pydantic-settings turns those variables into ``{"0": {...}}``, which would replace
    the task list and fail as "not a valid list"; here each indexed variable overrides
    one field of task ``i`` of the YAML list (or of ``RELMON_TASKS`` given as JSON).
    """

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        env: PydanticBaseSettingsSource,
        data: dict[str, Any],
    ) -> None:
        super().__init__(settings_cls)
        self._env = env
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ does the work

    def __call__(self) -> dict[str, Any]:
        values = dict(self._env())
        indexed = values.get("tasks")
        if isinstance(indexed, dict):
            base = self._data.get("tasks")
            tasks: list[Any] = copy.deepcopy(base) if isinstance(base, list) else []
            for key in sorted(indexed, key=lambda k: int(k) if str(k).isdigit() else -1):
                if not str(key).isdigit():
                    raise ConfigError(
                        f"RELMON_TASKS__{key}__...: the part after RELMON_TASKS__ must be "
                        "a task index (0 for the first task)"
                    )
                index = int(key)
                if index > len(tasks):
                    raise ConfigError(
                        f"RELMON_TASKS__{index}__...: there are only {len(tasks)} tasks, so "
                        f"the next new one is RELMON_TASKS__{len(tasks)}__..."
                    )
                if index == len(tasks):
                    tasks.append({})
                if not isinstance(tasks[index], dict):
                    continue  # pydantic reports the bad task itself
                _deep_merge(tasks[index], indexed[key])
            values["tasks"] = tasks
        return values


def _deep_merge(target: dict[str, Any], update: Any) -> None:
    if not isinstance(update, dict):
        return
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = value


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RELMON_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    tasks: list[TaskSettings] = Field(default_factory=list)
    traffic: TrafficSettings = TrafficSettings()
    metrics: ListenSettings = ListenSettings(port=9108)
    review: ReviewSettings = ReviewSettings()
    kafka: KafkaSettings = KafkaSettings()
    budget: BudgetSettings = BudgetSettings()
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
            return _read_secret(self.query_hash_key_file, "query_hash_key_file")
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
        data = _YAML_DATA.get(settings_cls, {})
        return (
            init_settings,
            _IndexedEnvSource(settings_cls, env_settings, data),
            _YamlSource(settings_cls, data),
            file_secret_settings,
        )


_YAML_DATA: dict[type[BaseSettings], dict[str, Any]] = {}


def _label(index: int, name: object) -> str:
    return f"tasks[{index}] ({name})" if isinstance(name, str) and name else f"tasks[{index}]"


def _task_label(index: int, tasks: Any) -> str:
    name = None
    if isinstance(tasks, list) and index < len(tasks) and isinstance(tasks[index], dict):
        name = tasks[index].get("name")
    return _label(index, name)


def _where(loc: Sequence[int | str], tasks: Any) -> str:
    parts = list(loc)
    if len(parts) >= 2 and parts[0] == "tasks" and isinstance(parts[1], int):
        head, rest = _task_label(parts[1], tasks), parts[2:]
    else:
        head, rest = "", parts
    text = head
    for p in rest:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "(top level)"


def _format_validation(exc: ValidationError, source: str, tasks: Any) -> str:
    lines = []
    for err in exc.errors():
        msg = re.sub(r"^(Value|Assertion) error, ", "", err["msg"])
        lines.append(f"{source}: {_where(err['loc'], tasks)}: {msg}")
    return "\n".join(lines)


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``path`` (YAML), the environment and ``overrides``; ConfigError if bad."""
    data: dict[str, Any] = {}
    source = str(path) if path else "settings"
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(
                f"{path}{line}: invalid YAML: {getattr(exc, 'problem', exc)}"
            ) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded
    _YAML_DATA[Settings] = data
    try:
        settings = Settings(**overrides)
        settings._source = source
        return settings
    except ValidationError as exc:
        tasks = overrides.get("tasks", data.get("tasks"))
        raise ConfigError(_format_validation(exc, source, tasks)) from None
    finally:
        _YAML_DATA.pop(Settings, None)


def fewest_samples(task: TaskSettings) -> int:
    """The fewest samples an item of this task can use: unanimous answers from the start."""
    rule = get_stopping_rule(
        task.stopping_rule, k0=task.k0, k_max=task.k_max, delta=task.delta, futility=task.futility
    )
    for k in range(1, task.k_max + 1):
        if rule.decide([k]).stop:
            return k
    return task.k_max


def budget_warnings(settings: Settings) -> list[str]:
    """Whether the tasks' ``expected_events_per_s`` fit ``budget.calls_per_minute``.

    Monitored items per second = events/s x sampling_rate; each uses between the
    fewest samples its stopping rule allows (unanimous answers) and k_max calls. The
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
            f"{_label(i, t.name)}: {t.expected_events_per_s:g} events/s x "
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
        if (tls.cert_file is None) != (tls.key_file is None):
            given, missing = (
                ("cert_file", "key_file")
                if tls.key_file is None
                else (
                    "key_file",
                    "cert_file",
                )
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
        if not unreadable and not problems:
            from adapters.kafka_clients import build_ssl_context

            try:
                build_ssl_context(tls)
            except ConfigError as exc:
                problems.append(str(exc))
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


def _given_twice(key: str, variable: str) -> str:
    """The one message for a secret given both as ``key`` (or its variable) and in a file.

    ``key`` is the full name (``endpoint.api_key``); the file key is ``key + "_file"``.
    """
    return f"{key}_file: set either {key} (or {variable}) or {key}_file, not both"


def validate_settings(settings: Settings, *, review_token: str | None = None) -> list[str]:
    """Everything ``relmon run`` needs beyond the field checks; returns warnings.

    Raises :class:`ConfigError` listing every problem, one line each, each naming its
    field. Does no I/O besides reading the secret files it is pointed at; binds no port
    and creates no file. ``review_token`` is a token given in code (the demo's).
    """
    from adapters.canon_registry import check_canonicalizer

    problems: list[str] = []
    if not settings.tasks:
        problems.append("tasks: no tasks configured; add a 'tasks:' list to the config file")
    seen: dict[str, int] = {}
    for i, t in enumerate(settings.tasks):
        where = _label(i, t.name)
        if t.name in seen:
            problems.append(f"{where}.name: already the name of tasks[{seen[t.name]}]")
        seen.setdefault(t.name, i)
        if not (t.endpoint.model or t.match.model):
            problems.append(
                f"{where}.endpoint.model: required: the model relmon asks again "
                "(or name it in match.model)"
            )
        if t.endpoint.api_key is not None and t.endpoint.api_key_file is not None:
            variable = f"RELMON_TASKS__{i}__ENDPOINT__API_KEY"
            problems.append(f"{where}.{_given_twice('endpoint.api_key', variable)}")
        elif t.endpoint.api_key_file is not None:
            try:
                t.endpoint.resolved_api_key()
            except ConfigError as exc:
                problems.append(f"{where}.{exc}")
        # The canonicalizer as named (so the message is the same with or without
        # answer_pattern), then wrapped in the pattern as the service builds it.
        try:
            check_canonicalizer(t.canonicalizer, t.canonicalizer_options)
        except ConfigError as exc:
            problems.append(f"{where}.canonicalizer: {exc}")
        else:
            if t.answer_pattern is not None:
                try:
                    re.compile(t.answer_pattern)
                except re.error as exc:
                    problems.append(f"{where}.answer_pattern: not a regular expression: {exc}")
                else:
                    try:
                        check_canonicalizer(*t.canonicalizer_spec())
                    except ConfigError as exc:
                        problems.append(f"{where}.answer_pattern: {exc}")
        for kind, count in t.endpoint.retry_limits().items():
            if count > MAX_RETRIES_PER_OUTCOME:
                field = (
                    f"retries.{kind}"
                    if kind in t.endpoint.retries.model_fields_set
                    else ("max_retries")
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
    if settings.review.backend == "kafka" and not settings.kafka.enabled:
        problems.append("review.backend: 'kafka' needs kafka.enabled: true")
    kafka_warnings: list[str] = []
    if settings.kafka.enabled:
        kafka_problems, kafka_warnings = _kafka_problems(settings.kafka)
        problems += kafka_problems
    token_twice = settings.review.token is not None and settings.review.token_file is not None
    if token_twice:
        problems.append(_given_twice("review.token", "RELMON_REVIEW__TOKEN"))
    sasl = settings.kafka.sasl
    if sasl.password is not None and sasl.password_file is not None:
        problems.append(_given_twice("kafka.sasl.password", "RELMON_KAFKA__SASL__PASSWORD"))
    if settings.review.backend == "http":
        problem = _state_dir_problem(settings.state_dir)
        if problem:
            problems.append(f"state_dir: {problem}")
        token = review_token or ("(reported)" if token_twice else None)
        if not token:
            try:
                token = settings.resolved_review_token()
            except ConfigError as exc:
                problems.append(str(exc))
                token = "(reported)"
        if not token:
            problems.append(
                "review.token: the review API needs a token: set RELMON_REVIEW_TOKEN, "
                "review.token or review.token_file"
            )
    if settings.query_hash_key is not None and settings.query_hash_key_file is not None:
        problems.append(_given_twice("query_hash_key", "RELMON_QUERY_HASH_KEY"))
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
    if problems:
        raise ConfigError("\n".join(f"{settings._source}: {p}" for p in problems))
    return [f"{settings._source}: {w}" for w in [*kafka_warnings, *budget_warnings(settings)]]


def effective_settings(settings: Settings) -> dict[str, Any]:
    """The settings as plain data with every secret masked (for check-config and logs)."""
    data = settings.model_dump(mode="json")
    data["review"]["token"] = "**********" if settings.review.token else None
    data["review_token"] = "**********" if settings.review_token else None
    data["query_hash_key"] = "**********" if settings.query_hash_key else None
    data["kafka"]["sasl"]["password"] = "**********" if settings.kafka.sasl.password else None
    for task, raw in zip(data["tasks"], settings.tasks, strict=True):
        task["endpoint"]["api_key"] = "**********" if raw.endpoint.api_key else None
    data["environment_overrides"] = sorted(k for k in os.environ if k.startswith("RELMON_"))
    return data
