"""A re-ask is the request production made. No I/O.

relmon measures how far the model's top answer to *this request* can be trusted, so the
K samples must be drawn from the request production sent, not from a simplified one.
:func:`reask_request` keeps every field of the captured request, except:

- **dropped** (:data:`DROPPED_FIELDS`): ``seed`` (K draws with one seed measure nothing),
  ``user``, ``store`` (resending ``store: true`` would store K completions),
  ``metadata``, ``service_tier``, ``logprobs``, ``top_logprobs`` (not ours to resend);
- **relmon's own** (:data:`OWN_FIELDS`): ``n``, ``stream``, ``stream_options`` (relmon
  asks without streaming, with its own ``n``); ``model`` is the task's model when it
  names one, else the request's;
- **raised**: a ``temperature`` below ``min_temperature`` is raised to it (at 0 the K
  answers would be one answer K times).

A field the request did not send stays unsent: production got the server's default,
so does the re-ask. Only a request that carries nothing but ``messages`` (and
``model``), which relmon then builds itself, gets the task's default ``temperature``
and ``max_tokens``. Last, the task's ``set`` mapping replaces or adds fields and its
``drop`` list removes fields.

Every change is returned (:attr:`Reask.changes`, field → ``{"from": sent, "to":
re-asked}``, ``"from"`` absent when the request did not send it, ``"to"`` absent when
dropped), so that it is counted (``relmon_reask_overrides_total{field}``) and shown to
the reviewer. Values in changes are summarised (:func:`shown_value`): numbers, booleans
and model names as they are, anything else as its kind and size, so that no user id,
metadata or prompt-like text leaves through them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from monitor.core.errors import ConfigError

__all__ = [
    "DROPPED_FIELDS",
    "OWN_FIELDS",
    "Reask",
    "ReaskPolicy",
    "override_fields",
    "reask_request",
    "shown_value",
]

DROPPED_FIELDS: Final = (
    "seed",
    "user",
    "store",
    "metadata",
    "service_tier",
    "logprobs",
    "top_logprobs",
)
"""Fields a re-ask never resends (see the module docstring)."""
OWN_FIELDS: Final = ("n", "stream", "stream_options")
"""Fields relmon sets itself on every call: not part of the measured request."""
_BUILT: Final = frozenset({"messages", "model"})
"""A request with only these fields is built by relmon (the task's defaults apply)."""


@dataclass(frozen=True, slots=True)
class ReaskPolicy:
    """A task's re-ask rules (``tasks[].reask`` and the endpoint's model and defaults)."""

    model: str | None = None
    """The model re-asked (the task's ``endpoint.model``); None: the request's."""
    min_temperature: float = 0.5
    default_temperature: float | None = None
    """For a request relmon builds itself (messages only)."""
    default_max_tokens: int | None = None
    set: Mapping[str, Any] = field(default_factory=dict)
    drop: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.min_temperature < 0:
            raise ConfigError(f"reask.min_temperature must be >= 0, not {self.min_temperature}")
        own = sorted(set(OWN_FIELDS) & (set(self.set) | set(self.drop)))
        if own:
            raise ConfigError(f"reask: {', '.join(own)} are relmon's own; they cannot be changed")
        if "messages" in self.drop:
            raise ConfigError("reask.drop: messages cannot be dropped (they are the question)")


@dataclass(frozen=True, slots=True)
class Reask:
    """The request re-asked, and what differs from the request production sent."""

    body: dict[str, Any]
    changes: dict[str, dict[str, Any]]


def override_fields(policy: ReaskPolicy) -> tuple[str, ...]:
    """Every field a re-ask under ``policy`` can change: the label values of
    ``relmon_reask_overrides_total{field}``, known at start."""
    names = {*DROPPED_FIELDS, "model", "temperature", "max_tokens", *policy.set, *policy.drop}
    return tuple(sorted(names))


def shown_value(name: str, value: Any) -> Any:
    """``value`` as a change shows it: numbers, booleans, None and model names as they
    are; anything else as its kind and size (no user ids or text leave through it)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if name == "model" and isinstance(value, str) and len(value) <= 200:
        return value
    if isinstance(value, str):
        return f"<text, {len(value)} chars>"
    if isinstance(value, Mapping):
        return f"<object, {len(value)} keys>"
    if isinstance(value, list | tuple):
        return f"<list, {len(value)} items>"
    return f"<{type(value).__name__}>"


_ABSENT: Final = object()
"""A field the request did not send (or the re-ask does not send)."""


def _change(changes: dict[str, dict[str, Any]], name: str, before: Any, after: Any) -> None:
    entry: dict[str, Any] = {}
    if before is not _ABSENT:
        entry["from"] = shown_value(name, before)
    if after is not _ABSENT:
        entry["to"] = shown_value(name, after)
    changes[name] = entry


def reask_request(request: Mapping[str, Any], policy: ReaskPolicy) -> Reask:
    """The re-ask of ``request`` under ``policy`` (see the module docstring)."""
    body = {k: v for k, v in request.items() if k not in OWN_FIELDS}
    changes: dict[str, dict[str, Any]] = {}
    built = set(body) <= _BUILT
    for name in DROPPED_FIELDS:
        if name in body:
            _change(changes, name, body.pop(name), _ABSENT)
    if policy.model is not None and body.get("model") != policy.model:
        _change(changes, "model", body.get("model", _ABSENT), policy.model)
        body["model"] = policy.model
    if built:
        for name, default in (
            ("temperature", policy.default_temperature),
            ("max_tokens", policy.default_max_tokens),
        ):
            if default is not None:
                _change(changes, name, _ABSENT, default)
                body[name] = default
    temperature = body.get("temperature")
    if (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and temperature < policy.min_temperature
    ):
        before = request.get("temperature", _ABSENT)
        _change(changes, "temperature", before, policy.min_temperature)
        body["temperature"] = policy.min_temperature
    for name, value in policy.set.items():
        if body.get(name, _ABSENT) != value:
            _change(changes, name, request.get(name, _ABSENT), value)
            body[name] = value
    for name in policy.drop:
        if name in body:
            _change(changes, name, request.get(name, _ABSENT), _ABSENT)
            del body[name]
    return Reask(body, changes)
