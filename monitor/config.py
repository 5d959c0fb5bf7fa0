"""Settings: pydantic-settings from ``RELMON_…`` variables (nested with ``__``) and a
YAML file for the rest, mostly the task list. Read once at start and passed down.

Precedence: environment variables over the YAML file over defaults. Every listener
binds to 127.0.0.1 unless configured otherwise; secrets are ``SecretStr`` and are
masked by :func:`effective_settings`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from monitor.errors import ConfigError
from monitor.stopping import available_rules

__all__ = [
    "BudgetSettings",
    "EndpointSettings",
    "KafkaSettings",
    "ListenSettings",
    "MatchSettings",
    "ReviewSettings",
    "Settings",
    "TaskSettings",
    "TrafficSettings",
    "effective_settings",
    "load_settings",
]

DEFAULT_ALPHAS = [0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointSettings(_Strict):
    """The OpenAI-compatible endpoint the re-issuer asks again."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None  # default: the model named in the traffic event
    api_key: SecretStr | None = None
    temperature: float = Field(0.7, ge=0, le=2)
    max_tokens: int = Field(256, ge=1)
    timeout_s: float = Field(30.0, gt=0)
    concurrency: int = Field(4, ge=1)
    rate_limit_per_s: float | None = Field(None, gt=0)
    supports_n: bool = False
    max_retries: int = Field(3, ge=0)


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
    stopping_rule: str = "mixture"
    sampling_rate: float = Field(0.01, ge=0, le=1)
    review_rate: float = Field(0.1, gt=0, le=1)
    alphas: list[float] = Field(default_factory=lambda: list(DEFAULT_ALPHAS), min_length=1)
    reliability_target: float = Field(0.9, gt=0, lt=1)
    window_size: int = Field(2000, ge=1)
    half_life_s: float | None = Field(3600.0, gt=0)

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

    @model_validator(mode="after")
    def _proxy_needs_upstream(self) -> TrafficSettings:
        if self.mode == "proxy" and not self.upstream_url:
            raise ValueError("traffic.mode 'proxy' needs traffic.upstream_url")
        return self


class KafkaSettings(_Strict):
    enabled: bool = False
    bootstrap_servers: str = "127.0.0.1:9092"
    traffic_topic: str = "llm-traffic"
    dead_letter_topic: str = "relmon-dead-letter"
    group_id: str = "relmon"
    review_topic: str = "relmon-reviews"
    verdict_topic: str = "relmon-verdicts"


class ReviewSettings(_Strict):
    backend: Literal["http", "kafka"] = "http"
    host: str = "127.0.0.1"
    port: int = Field(9109, ge=0, le=65535)
    token: SecretStr | None = None
    token_file: Path | None = None

    def resolved_token(self) -> str | None:
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is not None:
            try:
                return self.token_file.read_text(encoding="utf-8").strip() or None
            except OSError as exc:
                raise ConfigError(f"review.token_file {self.token_file}: {exc.strerror}") from None
        return None


class BudgetSettings(_Strict):
    calls_per_minute: int = Field(600, ge=1)
    max_in_flight: int = Field(8, ge=1)
    queue_size: int = Field(64, ge=1)


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
    review_token: SecretStr | None = None  # RELMON_REVIEW_TOKEN (DESIGN §3)
    state_dir: Path = Path("relmon-state")
    log_format: Literal["json", "console"] = "json"
    log_prompts: bool = False
    drain_timeout_s: float = Field(30.0, gt=0)
    seed: int | None = None

    def resolved_review_token(self) -> str | None:
        """RELMON_REVIEW_TOKEN, else review.token, else the contents of review.token_file."""
        if self.review_token is not None and self.review_token.get_secret_value():
            return self.review_token.get_secret_value()
        return self.review.resolved_token()

    @model_validator(mode="after")
    def _unique_tasks(self) -> Settings:
        names = [t.name for t in self.tasks]
        if len(names) != len(set(names)):
            raise ValueError("task names must be unique")
        return self

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
        return (init_settings, env_settings, _YamlSource(settings_cls, data), file_secret_settings)


_YAML_DATA: dict[type[BaseSettings], dict[str, Any]] = {}


def _format_validation(exc: ValidationError, source: str) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{source}: {where}: {first['msg']}{more}"


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``path`` (YAML), the environment and ``overrides``; ConfigError if bad."""
    data: dict[str, Any] = {}
    source = str(path) if path else "environment"
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
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, source)) from None
    finally:
        _YAML_DATA.pop(Settings, None)


def effective_settings(settings: Settings) -> dict[str, Any]:
    """The settings as plain data with every secret masked (for check-config and logs)."""
    data = settings.model_dump(mode="json")
    data["review"]["token"] = "**********" if settings.review.token else None
    data["review_token"] = "**********" if settings.review_token else None
    for task, raw in zip(data["tasks"], settings.tasks, strict=True):
        task["endpoint"]["api_key"] = "**********" if raw.endpoint.api_key else None
    data["environment_overrides"] = sorted(k for k in os.environ if k.startswith("RELMON_"))
    return data
