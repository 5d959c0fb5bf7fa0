"""Loading settings: the YAML file, the environment and overrides, into one
:class:`~monitor.config.schema.Settings` (or a :class:`ConfigError` naming each bad
field); and the settings as plain data with every secret masked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from monitor.config.messages import format_validation
from monitor.config.schema import Settings
from monitor.config.sources import YAML_DATA
from monitor.core.errors import ConfigError

__all__ = ["effective_settings", "load_settings"]


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
    YAML_DATA[Settings] = data
    try:
        settings = Settings(**overrides)
        settings._source = source
        return settings
    except ValidationError as exc:
        tasks = overrides.get("tasks", data.get("tasks"))
        raise ConfigError(format_validation(exc, source, tasks)) from None
    finally:
        YAML_DATA.pop(Settings, None)


def effective_settings(settings: Settings) -> dict[str, Any]:
    """The settings as plain data with every secret masked (for check-config and logs)."""
    data = settings.model_dump(mode="json")
    data["review"]["token"] = "**********" if settings.review.token else None
    data["review_token"] = "**********" if settings.review_token else None
    data["query_hash_key"] = "**********" if settings.query_hash_key else None
    data["kafka"]["sasl"]["password"] = "**********" if settings.kafka.sasl.password else None
    data["store"]["dsn"] = "**********" if settings.store.dsn else None
    for task, raw in zip(data["tasks"], settings.tasks, strict=True):
        task["endpoint"]["api_key"] = "**********" if raw.endpoint.api_key else None
    data["environment_overrides"] = sorted(k for k in os.environ if k.startswith("RELMON_"))
    return data
