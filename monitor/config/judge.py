"""``tasks[].judge``: an LLM judge that labels every scored item for the judge-assisted
(prediction-powered) level; human verdicts keep correcting it (docs/method.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from monitor.config.endpoint import EndpointSettings
from monitor.core.errors import ConfigError
from monitor.core.judging import DEFAULT_JUDGE_TEMPLATE, check_template

__all__ = ["JudgeSettings"]


class JudgeSettings(BaseModel):
    """The judge's endpoint (the shape of ``tasks[].endpoint``) and its prompt."""

    model_config = ConfigDict(extra="forbid")

    endpoint: EndpointSettings
    prompt_template: str | None = None
    """With ``{query}`` and ``{answer}`` once each; the shipped one if neither is set."""
    prompt_template_file: Path | None = None
    max_tokens: int = Field(16, ge=1, le=4096)
    """The judge's reply length (its first word decides)."""

    @field_validator("prompt_template")
    @classmethod
    def _placeholders(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                check_template(v)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _one_template(self) -> JudgeSettings:
        if self.prompt_template is not None and self.prompt_template_file is not None:
            raise ValueError("set either prompt_template or prompt_template_file, not both")
        if self.endpoint.model is None:
            raise ValueError("endpoint.model: the judge's model is required")
        return self

    def template(self) -> str:
        """The prompt template to use; :class:`ConfigError` for an unreadable file."""
        if self.prompt_template is not None:
            return self.prompt_template
        if self.prompt_template_file is None:
            return DEFAULT_JUDGE_TEMPLATE
        try:
            text = self.prompt_template_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"judge.prompt_template_file: cannot read {self.prompt_template_file}: "
                f"{exc.strerror}"
            ) from None
        try:
            return check_template(text)
        except ConfigError as exc:
            raise ConfigError(f"judge.prompt_template_file: {exc}") from None
