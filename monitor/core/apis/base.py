"""One port for a wire API: what relmon reads of a production call and how it re-asks it,
as pure functions over parsed JSON. No I/O.

Every API relmon watches (``docs/apis/``) is one module beside this one, an object that
satisfies :class:`WireApi`, registered by name in :mod:`.registry`. Adding an API touches
its module and the registry, nothing else: the traffic port recognises its requests by
path (:meth:`WireApi.recognises`), sources validate them (:meth:`WireApi.check_request`),
the engine reads the query (:meth:`WireApi.query`), the answer production served
(:meth:`WireApi.answer`, :meth:`WireApi.stream_answer`), decides whether the request may
be re-asked at all (:meth:`WireApi.not_reasked`), builds the re-ask
(:meth:`WireApi.reask`, by the field rules of :mod:`monitor.core.reask`) and reads the
re-ask's answers (:meth:`WireApi.answers`). Tool calls of every API become the one
``tool_call`` answer form (:func:`monitor.core.canon.toolcall.tool_calls_answer`).

The HTTP around it (auth headers, SSE framing of bytes, base URLs) lives in the
adapters; :data:`AUTH_SCHEMES` names the header each API's key goes in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from monitor.core.errors import InputError
from monitor.core.reask import FieldRules

__all__ = [
    "AUTH_SCHEMES",
    "AuthScheme",
    "Route",
    "WireApi",
    "is_text",
    "joined_text",
    "require",
]

AuthScheme = Literal["bearer", "x-api-key", "x-goog-api-key"]
AUTH_SCHEMES: Final[tuple[AuthScheme, ...]] = ("bearer", "x-api-key", "x-goog-api-key")
"""How an endpoint key is sent: ``Authorization: Bearer KEY``, ``x-api-key: KEY``
(Anthropic), ``x-goog-api-key: KEY`` (Gemini)."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where and how a re-ask goes: its API, the path under the task's
    ``endpoint.base_url``, and the production headers it carries (Anthropic's
    ``anthropic-version``/``anthropic-beta``; never a credential)."""

    api: str
    path: str
    headers: tuple[tuple[str, str], ...] = field(default=())


class WireApi(Protocol):
    """One wire API (see the module). Implementations are small immutable objects."""

    @property
    def name(self) -> str:
        """The API's name in configuration, events and metric labels (``openai.chat``)."""
        ...

    @property
    def rules(self) -> FieldRules:
        """What a re-ask keeps, drops, forces and raises (:mod:`monitor.core.reask`)."""
        ...

    @property
    def auth(self) -> AuthScheme:
        """How the task's endpoint key is sent."""
        ...

    @property
    def max_draws_per_call(self) -> int:
        """The most answers one call can ask for (``n``, ``candidateCount``): 1 where the
        API draws one answer a call."""
        ...

    def recognises(self, path: str) -> bool:
        """Whether a ``POST`` to ``path`` (no query string) is a call of this API."""
        ...

    def check_request(self, request: Mapping[str, Any]) -> None:
        """Raise :class:`InputError` (a short reason, never prompt text) when ``request``
        is not a request of this API relmon can monitor."""
        ...

    def model(self, request: Mapping[str, Any], path: str | None) -> str | None:
        """The model the request names (in its body, or in its path)."""
        ...

    def query(self, request: Mapping[str, Any]) -> str:
        """The question as the API holds it (system or instructions first, then the
        turns), for hashing, the canonicalizer's context and the (redacted) review."""
        ...

    def answer(self, response: Mapping[str, Any]) -> str | None:
        """The answer production got, from the API's JSON response: text, or a marked
        tool-call or refusal answer; None when the response holds no answer."""
        ...

    def stream_answer(self, events: Sequence[Mapping[str, Any]]) -> str | None:
        """The same answer from a streamed response: its SSE events' JSON payloads, in
        order, as the client read them (the deltas joined, or the completed event)."""
        ...

    def not_reasked(self, request: Mapping[str, Any], allowed_tools: frozenset[str]) -> str | None:
        """Why this request must not be re-asked (``"conversation"``, ``"server_tool"``),
        or None. ``allowed_tools``: server tools the task lists as read-only."""
        ...

    def route(self, request: Mapping[str, Any], path: str | None, model: str | None) -> Route:
        """Where the re-ask of ``request`` goes (``path``: the production path, if known;
        ``model``: the task's model, when it names one)."""
        ...

    def answers(self, response: Mapping[str, Any]) -> list[str]:
        """Every answer in a re-ask's JSON response, in order; :class:`InputError` when
        it is not a well-formed response of this API."""
        ...

    def with_draws(self, body: Mapping[str, Any], n: int) -> dict[str, Any]:
        """``body`` asking for ``n`` answers (``n`` <= :attr:`max_draws_per_call`),
        without streaming."""
        ...


def require(condition: bool, reason: str) -> None:
    """:class:`InputError` with ``reason`` unless ``condition``."""
    if not condition:
        raise InputError(reason)


def joined_text(parts: Any, *, key: str = "text") -> str | None:
    """The ``key`` strings of a list of content parts (dicts), joined with newlines;
    a plain string as it is; None when there is no text at all."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return None
    texts = [p[key] for p in parts if isinstance(p, dict) and isinstance(p.get(key), str)]
    return "\n".join(texts) if texts else None


def is_text(value: object) -> bool:
    """A ``str`` that is valid Unicode: no lone surrogates, which JSON's ``\\ud800``
    escapes and undecodable header bytes produce and which no UTF-8 encoder (SQLite,
    Kafka, the logs) accepts."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
