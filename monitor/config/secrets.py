"""Secrets in settings: read from a mounted file, and the one message for a secret given
twice. Secret values are ``SecretStr`` in the schema; this module never logs them."""

from __future__ import annotations

from pathlib import Path

from monitor.core.errors import ConfigError

__all__ = ["given_twice", "read_secret"]


def read_secret(path: Path, where: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if not text:
        raise ConfigError(f"{where}: {path} is empty")
    return text


def given_twice(key: str, variable: str) -> str:
    """The one message for a secret given both as ``key`` (or its variable) and in a file.

    ``key`` is the full name (``endpoint.api_key``); the file key is ``key + "_file"``.
    """
    return f"{key}_file: set either {key} (or {variable}) or {key}_file, not both"
