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

Each wire API has its own :class:`FieldRules` (:mod:`monitor.core.apis`): which fields
it drops, which are relmon's own, which it forces (Responses ``store: false``), where its
temperature is and how high it may go (Anthropic: 1.0). Field names may be dotted paths
into nested objects (``generationConfig.seed``); ``reask.set`` and ``reask.drop`` take
them too. :data:`CHAT_RULES` are the rules above.

Every change is returned (:attr:`Reask.changes`, field → ``{"from": sent, "to":
re-asked}``, ``"from"`` absent when the request did not send it, ``"to"`` absent when
dropped), so that it is counted (``relmon_reask_overrides_total{field}``) and shown to
the reviewer. Values in changes are summarised (:func:`shown_value`): numbers, booleans
and model names as they are, anything else as its kind and size, so that no user id,
metadata or prompt-like text leaves through them.

A request read from a span may lack answer-shaping fields production sent (the span did
not record them: ``tools``, ``response_format``, ``stop`` …). Their re-ask cannot
repeat them, and says so (:func:`with_unrecorded`): each is a change
``{"unrecorded": true}`` (:data:`UNRECORDED`), beside a change the task made to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from monitor.core.errors import ConfigError

__all__ = [
    "CHANGED",
    "CHAT_RULES",
    "DROPPED_FIELDS",
    "OWN_FIELDS",
    "TOOLS_UNRECORDED",
    "UNRECORDED",
    "FieldRules",
    "Reask",
    "ReaskPolicy",
    "get_field",
    "override_fields",
    "reask_request",
    "shown_value",
    "with_unrecorded",
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
CHANGED: Final = "changed"
UNRECORDED: Final = "unrecorded"
"""``relmon_reask_overrides_total{change}`` values: a field the re-ask dropped, raised or
set (``changed``), or one production may have sent that its span did not record."""
TOOLS_UNRECORDED: Final = "tools_unrecorded"
"""The ``relmon_not_reasked_total{reason}`` of a span whose served answer is a tool call
and whose tool definitions were not recorded: a re-ask without them asks another
question."""
_BUILT: Final = frozenset({"messages", "model"})
"""A request with only these fields is built by relmon (the task's defaults apply)."""


@dataclass(frozen=True, slots=True)
class FieldRules:
    """One wire API's re-ask rules (see the module). Names may be dotted paths."""

    dropped: tuple[str, ...] = DROPPED_FIELDS
    """Never resent; each counted and shown as a change."""
    own: tuple[str, ...] = OWN_FIELDS
    """relmon's own (removed silently; the client sets them per call)."""
    forced: tuple[tuple[str, Any], ...] = ()
    """``(field, value)`` always sent with this value (a change when it differs)."""
    temperature: str | None = "temperature"
    """Where the API keeps the temperature (None: it has none relmon raises)."""
    max_temperature: float | None = None
    """The highest temperature the API accepts (a raise never goes past it)."""
    model: str | None = "model"
    """The body field naming the model (None: the model is in the path)."""
    built: frozenset[str] | None = _BUILT
    """A request with only these fields is one relmon builds itself (the task's
    ``temperature`` and ``max_tokens`` apply); None: never."""


CHAT_RULES: Final = FieldRules()
"""The rules of OpenAI Chat Completions (the module docstring)."""


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


def override_fields(
    policy: ReaskPolicy, rules: Sequence[FieldRules] = (CHAT_RULES,)
) -> tuple[str, ...]:
    """Every field a re-ask under ``policy`` can change, under any of ``rules`` (the
    APIs a task may re-ask in): the label values of
    ``relmon_reask_overrides_total{field}``, known at start."""
    names = {"model", "max_tokens", *policy.set, *policy.drop}
    for r in rules:
        names.update(r.dropped)
        names.update(name for name, _ in r.forced)
        if r.temperature is not None:
            names.add(r.temperature)
    return tuple(sorted(names))


def with_unrecorded(
    changes: Mapping[str, Mapping[str, Any]], unrecorded: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """``changes`` with each ``unrecorded`` field marked ``"unrecorded": True`` (a field
    the task also changed keeps its ``from`` / ``to``)."""
    out = {name: dict(change) for name, change in changes.items()}
    for name in unrecorded:
        out.setdefault(name, {})[UNRECORDED] = True
    return out


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


def _copied(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The object holding field ``name`` (a dotted path) in ``body``, copied on the way
    down so that the production request is never changed; None when a parent is missing
    or not an object."""
    node: dict[str, Any] = body  # type: ignore[assignment]  # the caller's own copy
    *parents, _ = name.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, Mapping):
            return None
        node[part] = child = dict(child)
        node = child
    return node


def get_field(body: Mapping[str, Any], name: str) -> Any:
    """The value at ``name`` (a dotted path), or the absent marker."""
    node: Any = body
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _pop(body: dict[str, Any], name: str) -> Any:
    parent = _copied(body, name) if "." in name else body
    if parent is None:
        return _ABSENT
    return parent.pop(name.rsplit(".", 1)[-1], _ABSENT)


def _put(body: dict[str, Any], name: str, value: Any) -> None:
    if "." in name:
        node = body
        for part in name.split(".")[:-1]:
            child = node.get(part)
            node[part] = child = dict(child) if isinstance(child, Mapping) else {}
            node = child
        node[name.rsplit(".", 1)[-1]] = value
    else:
        body[name] = value


def reask_request(
    request: Mapping[str, Any], policy: ReaskPolicy, rules: FieldRules = CHAT_RULES
) -> Reask:
    """The re-ask of ``request`` under ``policy`` and the API's ``rules`` (see the
    module docstring)."""
    body = dict(request)
    for name in rules.own:
        _pop(body, name)
    changes: dict[str, dict[str, Any]] = {}
    built = rules.built is not None and set(body) <= rules.built
    for name in rules.dropped:
        before = _pop(body, name)
        if before is not _ABSENT:
            _change(changes, name, before, _ABSENT)
    for name, value in rules.forced:
        before = get_field(body, name)
        if before is _ABSENT or before != value or type(before) is not type(value):
            _change(changes, name, before, value)
            _put(body, name, value)
    field_ = rules.model
    if field_ is not None and policy.model is not None and body.get(field_) != policy.model:
        _change(changes, field_, body.get(field_, _ABSENT), policy.model)
        body[field_] = policy.model
    if built:
        for name, default in (
            ("temperature", policy.default_temperature),
            ("max_tokens", policy.default_max_tokens),
        ):
            if default is not None:
                _change(changes, name, _ABSENT, default)
                body[name] = default
    if rules.temperature is not None:
        _raise_temperature(body, changes, request, policy, rules)
    for name, value in policy.set.items():
        if get_field(body, name) != value:
            _change(changes, name, get_field(request, name), value)
            _put(body, name, value)
    for name in policy.drop:
        if _pop(body, name) is not _ABSENT:
            _change(changes, name, get_field(request, name), _ABSENT)
    return Reask(body, changes)


def _raise_temperature(
    body: dict[str, Any],
    changes: dict[str, dict[str, Any]],
    request: Mapping[str, Any],
    policy: ReaskPolicy,
    rules: FieldRules,
) -> None:
    """A temperature below the policy's minimum raised to it, never past the API's
    maximum (a request sent above that maximum is the server's to refuse, as it was)."""
    name = rules.temperature
    assert name is not None
    temperature = get_field(body, name)
    floor = policy.min_temperature
    if rules.max_temperature is not None:
        floor = min(floor, rules.max_temperature)
    if (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and temperature < floor
    ):
        _change(changes, name, get_field(request, name), floor)
        _put(body, name, floor)
