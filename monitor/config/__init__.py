"""Settings: pydantic-settings from RELMON_... variables (nested with ``__``) and a YAML
file for the rest, mostly the task list. Read once at start and passed down.

- :mod:`monitor.config.schema`: the keys, their defaults and one-field checks;
- :mod:`monitor.config.sources`: the YAML file and the environment;
- :mod:`monitor.config.secrets`: secrets read from mounted files;
- :mod:`monitor.config.messages`: messages that name the field;
- :mod:`monitor.config.loading`: :func:`load_settings`, :func:`effective_settings`.
"""

from monitor.config.loading import effective_settings, load_settings
from monitor.config.schema import (
    BudgetSettings,
    EndpointSettings,
    KafkaSettings,
    KafkaTlsSettings,
    Settings,
    TaskSettings,
    default_state_dir,
)

__all__ = [
    "BudgetSettings",
    "EndpointSettings",
    "KafkaSettings",
    "KafkaTlsSettings",
    "Settings",
    "TaskSettings",
    "default_state_dir",
    "effective_settings",
    "load_settings",
]
