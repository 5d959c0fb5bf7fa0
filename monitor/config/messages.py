"""Validation messages that name the field: ``tasks[0] (arith).endpoint.base_url: ...``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

__all__ = ["format_validation", "task_label"]


def task_label(index: int, name: object) -> str:
    return f"tasks[{index}] ({name})" if isinstance(name, str) and name else f"tasks[{index}]"


def _task_label(index: int, tasks: Any) -> str:
    name = None
    if isinstance(tasks, list) and index < len(tasks) and isinstance(tasks[index], dict):
        name = tasks[index].get("name")
    return task_label(index, name)


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


def format_validation(exc: ValidationError, source: str, tasks: Any) -> str:
    lines = []
    for err in exc.errors():
        msg = re.sub(r"^(Value|Assertion) error, ", "", err["msg"])
        lines.append(f"{source}: {_where(err['loc'], tasks)}: {msg}")
    return "\n".join(lines)
