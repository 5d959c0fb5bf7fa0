"""Where settings come from besides the defaults: the YAML file and the environment,
with ``RELMON_TASKS__<i>__...`` applied to the file's i-th task."""

from __future__ import annotations

import copy
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from monitor.core.errors import ConfigError

__all__ = ["YAML_DATA", "IndexedEnvSource", "YamlSource"]

YAML_DATA: dict[type[BaseSettings], dict[str, Any]] = {}
"""The parsed YAML file of the settings class being built (set by ``load_settings``)."""


class IndexedEnvSource(PydanticBaseSettingsSource):
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


class YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)
