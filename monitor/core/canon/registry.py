"""Canonicalizers by name: the built-in ones, registered ones, and import paths.

``get_canonicalizer("numeric", percent="fraction")`` builds a registered canonicalizer;
``get_canonicalizer("mypkg.canon:Dates", fmt="iso")`` imports ``Dates`` from
``mypkg.canon`` (``"mypkg.canon.Dates"`` works too) and calls it with the options. The
result must satisfy :class:`~monitor.core.canon.base.Canonicalizer`. Every failure (unknown
name, failed import, options the factory does not take, a bad option value) is a
:class:`~monitor.core.errors.ConfigError` with a one-line message.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from monitor.core.canon.base import Canonicalizer
from monitor.core.canon.jsonc import JsonCanonicalizer
from monitor.core.canon.mcq import McqCanonicalizer
from monitor.core.canon.numeric import NumericCanonicalizer
from monitor.core.canon.regex import RegexCanonicalizer
from monitor.core.canon.text import TextCanonicalizer
from monitor.core.canon.toolcall import ToolCallCanonicalizer
from monitor.core.errors import ConfigError

__all__ = [
    "available_canonicalizers",
    "get_canonicalizer",
    "parse_canonicalizer_options",
    "register_canonicalizer",
]

_REGISTRY: dict[str, Callable[..., Canonicalizer]] = {
    "json": JsonCanonicalizer,
    "mcq": McqCanonicalizer,
    "numeric": NumericCanonicalizer,
    "text": TextCanonicalizer,
    "tool_call": ToolCallCanonicalizer,
}
_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def available_canonicalizers() -> list[str]:
    """The registered names, sorted."""
    return sorted(_REGISTRY)


def register_canonicalizer(
    name: str, factory: Callable[..., Canonicalizer], *, replace: bool = False
) -> None:
    """Make ``factory(**options)`` available as ``get_canonicalizer(name, **options)``.

    Names are lowercase identifiers (``[a-z][a-z0-9_-]*``), so they never look like an
    import path. Registering a taken name needs ``replace=True``.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(f"canonicalizer name {name!r} must match [a-z][a-z0-9_-]*")
    if not callable(factory):
        raise ConfigError(f"canonicalizer factory for {name!r} is not callable")
    if name in _REGISTRY and not replace:
        raise ConfigError(f"canonicalizer {name!r} is already registered")
    _REGISTRY[name] = factory


def _unknown(spec: str, why: str) -> ConfigError:
    names = ", ".join(available_canonicalizers())
    return ConfigError(
        f"canonicalizer {spec!r}: {why}; available: {names}, or an import path 'module:Class'"
    )


def _import(spec: str) -> Callable[..., Any]:
    module_name, sep, attr_path = spec.partition(":")
    if not sep:
        module_name, _, attr_path = spec.rpartition(".")
    if not module_name or not attr_path:
        raise _unknown(spec, "not a registered name")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise _unknown(
            spec, f"cannot import {module_name!r} ({type(exc).__name__}: {exc})"
        ) from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError as exc:
            raise _unknown(spec, f"{module_name!r} has no attribute {attr_path!r}") from exc
    if not callable(target):
        raise _unknown(spec, f"{attr_path!r} is not a class or factory")
    return target  # type: ignore[no-any-return]


def get_canonicalizer(spec: str, **options: Any) -> Canonicalizer:
    """Build the canonicalizer ``spec``: a registered name (any case) or an import path."""
    spec = spec.strip()
    factory = _REGISTRY.get(spec.lower())
    if factory is None:
        if ":" not in spec and "." not in spec:
            raise _unknown(spec, "unknown name")
        factory = _import(spec)
    try:
        built = factory(**options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        given = ", ".join(sorted(options)) or "none"
        raise ConfigError(
            f"canonicalizer {spec!r}: bad options ({given}): {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(built, Canonicalizer) or not isinstance(getattr(built, "name", None), str):
        raise ConfigError(
            f"canonicalizer {spec!r} built a {type(built).__name__}, which lacks a str 'name' "
            "and a 'canonicalize(answer, context)' method"
        )
    return built


def _regex(
    *,
    then: str | Canonicalizer = "text",
    then_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> Canonicalizer:
    """The ``regex`` canonicalizer, its ``then`` built here when given by name."""
    if isinstance(then, str):
        return RegexCanonicalizer(
            then=get_canonicalizer(then, **dict(then_options or {})), **options
        )
    if then_options:
        raise ConfigError("regex: then_options only go with a canonicalizer name")
    return RegexCanonicalizer(then=then, **options)


_REGISTRY["regex"] = _regex


def parse_canonicalizer_options(pairs: Sequence[str]) -> dict[str, Any]:
    """Options from command-line ``key=value`` strings.

    A value that parses as JSON becomes that value (``articles=false``, ``then_options={...}``);
    anything else stays a string (``percent=fraction``, ``pattern=\\d+``). ``NaN`` and
    ``Infinity`` stay strings. A pair without ``=``, a key that is not an identifier, or
    a key given twice is a :class:`~monitor.core.errors.ConfigError`.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"canonicalizer option {pair!r} is not of the form key=value")
        if key in options:
            raise ConfigError(f"canonicalizer option {key!r} is given twice")
        options[key] = _option_value(raw)
    return options


def _reject_constant(name: str) -> object:
    raise ValueError(name)


def _option_value(raw: str) -> Any:
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return raw
