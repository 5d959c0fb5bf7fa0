"""Secrets in settings: read from a mounted file, and the one message for a secret given
twice. Secret values are ``SecretStr`` in the schema; this module never logs them."""

from __future__ import annotations

from pathlib import Path

from monitor.core.errors import ConfigError
from monitor.core.review import reviewer_name_problem

__all__ = ["MIN_REVIEWER_TOKEN_CHARS", "given_twice", "read_reviewer_tokens", "read_secret"]

MIN_REVIEWER_TOKEN_CHARS = 16


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


def read_reviewer_tokens(path: Path, where: str) -> dict[str, list[str]]:
    """A file of ``name:token`` lines (blank lines and ``#`` comments skipped): reviewer
    name -> tokens (a name may have several, to rotate them). :class:`ConfigError` naming
    ``where`` and the line for anything unusable; never a token in a message."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise ConfigError(f"{where}: cannot read {path}: {reason}") from None
    out: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, token = (part.strip() for part in line.partition(":"))
        at = f"{where}: {path}:{number}"
        if not colon:
            raise ConfigError(f"{at}: expected 'name:token'")
        problem = reviewer_name_problem(name)
        if problem is not None:
            raise ConfigError(f"{at}: the reviewer's name {problem}")
        if len(token) < MIN_REVIEWER_TOKEN_CHARS:
            raise ConfigError(
                f"{at}: the token of {name!r} is shorter than {MIN_REVIEWER_TOKEN_CHARS} "
                "characters (make one with: openssl rand -hex 24)"
            )
        if owner.setdefault(token, name) != name:
            raise ConfigError(f"{at}: {name!r} has the same token as {owner[token]!r}")
        out.setdefault(name, []).append(token)
    if not out:
        raise ConfigError(f"{where}: {path} names no reviewer")
    return out
