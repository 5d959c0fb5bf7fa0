"""A model endpoint's keys (``tasks[].endpoint``, and the judge's ``tasks[].judge.endpoint``):
where to ask, with which key, retries and circuit breaker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from monitor.config.secrets import read_secret
from monitor.core.apis.registry import API_NAMES

__all__ = [
    "MAX_RETRIES_PER_OUTCOME",
    "CircuitBreakerSettings",
    "EndpointSettings",
    "RetrySettings",
]

MAX_RETRIES_PER_OUTCOME = 10
"""The most retries ``validate_settings`` accepts for one outcome (backoff doubles up to
30 s: more would hold an item, and its reserved budget, for many minutes)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.strip().lower().startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.strip() if value is not None else None


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
    """The endpoint the re-issuer asks again, in one wire API (``docs/apis/``)."""

    # The wire API re-asks speak (monitor.core.apis.registry.API_NAMES); None: the API of
    # each event. An event in another API than a set one is rejected, never re-asked.
    api: str | None = None
    # As that vendor's SDK takes it: OpenAI-style APIs with the version segment
    # (http://vllm:8000/v1), Anthropic's and Gemini's without (https://api.anthropic.com).
    base_url: str = "http://127.0.0.1:8000/v1"
    # generic only: the agent service may act; it is re-asked only when declared safe to
    # repeat (check-config refuses a generic task without it).
    repeatable: bool = False
    model: str | None = None  # required unless the task's match.model names it
    api_key: SecretStr | None = None
    api_key_file: Path | None = None  # e.g. a mounted Kubernetes Secret
    # Only for a request relmon builds itself (an event that carries only messages):
    # any other re-ask sends the request's own fields (tasks[].reask).
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

    @field_validator("api")
    @classmethod
    def _known_api(cls, v: str | None) -> str | None:
        if v is not None and v not in API_NAMES:
            raise ValueError(f"unknown api {v!r}; known: {', '.join(API_NAMES)}")
        return v

    def resolved_api_key(self) -> str | None:
        """``api_key``, else the contents of ``api_key_file``, else None."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_file is not None:
            return read_secret(self.api_key_file, "endpoint.api_key_file")
        return None
