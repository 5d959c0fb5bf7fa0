"""The wire APIs by name, and which one a production path belongs to. No I/O.

Adding an API: its module beside this one, and one line in :data:`_STANDARD` (or, for an
API that needs a task's options as ``generic`` does, in :func:`get_api`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from monitor.core.apis.anthropic_messages import AnthropicMessages
from monitor.core.apis.base import Route, WireApi
from monitor.core.apis.gemini import GeminiGenerateContent
from monitor.core.apis.generic import GenericApi
from monitor.core.apis.openai_chat import OpenAIChat
from monitor.core.apis.openai_completions import OpenAICompletions
from monitor.core.apis.openai_responses import OpenAIResponses
from monitor.core.apis.paths import unsafe_path
from monitor.core.errors import ConfigError

__all__ = [
    "API_NAMES",
    "CARRIED_HEADERS",
    "DEFAULT_API",
    "GENERIC",
    "api_for_path",
    "capture_headers",
    "captured_headers",
    "carried",
    "carried_headers",
    "get_api",
    "path_refused",
]

DEFAULT_API: Final = "openai.chat"
"""The API of an event that names none (every event before the fourth round)."""
GENERIC: Final = "generic"

# In the order paths are tried: chat before completions (``/chat/completions`` ends in
# ``/completions``).
_STANDARD: Final[tuple[WireApi, ...]] = (
    OpenAIChat(),
    OpenAIResponses(),
    AnthropicMessages(),
    GeminiGenerateContent(),
    OpenAICompletions(),
)
_BY_NAME: Final[dict[str, WireApi]] = {api.name: api for api in _STANDARD}
API_NAMES: Final[tuple[str, ...]] = (*(api.name for api in _STANDARD), GENERIC)
"""Every API's name: the values of ``endpoint.api``, ``match.api``, an event's ``api``
and the ``api`` metric label (with ``unmonitored`` beside them)."""


CARRIED_HEADERS: Final[dict[str, tuple[tuple[str, str | None], ...]]] = {
    "anthropic.messages": (("anthropic-version", "2023-06-01"), ("anthropic-beta", None)),
}
"""Production request headers a re-ask carries, per API: ``(name, default)`` (None: sent
only when production sent it). Never a credential."""
MAX_CARRIED_CHARS: Final = 1024


_CAPTURED: list[str] = []
"""Header names (lower case) an event keeps beside the carried ones: the segment
headers of the configured tasks (``tasks[].segments.by.header``), :func:`capture_headers`."""


def capture_headers(names: Iterable[str]) -> None:
    """Keep these headers (lower-cased) on every traffic event from now on, for the tasks
    that segment by a header (``TrafficEvent.headers``; a re-ask never sends them:
    :func:`carried` keeps only :data:`CARRIED_HEADERS`). Called once at start with the
    configured tasks' segment headers, which are never credentials
    (:mod:`monitor.core.segments.spec`); names only add up in a process."""
    for name in sorted({name.lower() for name in names}):
        if name not in _CAPTURED:
            _CAPTURED.append(name)


def captured_headers() -> frozenset[str]:
    """The header names :func:`capture_headers` was given."""
    return frozenset(_CAPTURED)


def carried_headers(api: str, header: Callable[[str], str | None]) -> tuple[tuple[str, str], ...]:
    """The headers of a production request (``header(name)``) that its re-asks carry, and
    those a task's segments read (:func:`capture_headers`): what its event keeps."""
    out = []
    wanted = [name for name, _ in CARRIED_HEADERS.get(api, ())]
    if _CAPTURED:
        wanted.extend(name for name in _CAPTURED if name not in wanted)
    for name in wanted:
        value = header(name)
        if value is not None and value.isprintable() and 0 < len(value) <= MAX_CARRIED_CHARS:
            out.append((name, value))
    return tuple(out)


def carried(route: Route, headers: Sequence[tuple[str, str]]) -> Route:
    """``route`` with the production ``headers`` its API carries, and their defaults."""
    wanted = CARRIED_HEADERS.get(route.api)
    if not wanted:
        return route
    given = {name.lower(): value for name, value in headers}
    pairs = ((name, given.get(name, default)) for name, default in wanted)
    return replace(route, headers=tuple((n, v) for n, v in pairs if v is not None))


def api_for_path(path: str) -> WireApi | None:
    """The standard API a ``POST`` to ``path`` (no query string) belongs to, if any."""
    for api in _STANDARD:
        if api.recognises(path):
            return api
    return None


def path_refused(api: WireApi, path: str | None) -> bool:
    """Whether a request to ``path`` must not be re-asked in ``api`` because of where it
    went: a target a client shaped to go elsewhere
    (:func:`~monitor.core.apis.paths.unsafe_path`), or, ``generic``, a path that leaves
    the task's ``match.path_prefix`` (:meth:`GenericApi.reask_path`). Every other re-ask
    follows the API's own path (:meth:`WireApi.route`), never the production one."""
    if unsafe_path(path):
        return True
    return isinstance(api, GenericApi) and api.reask_path(path) is None


def get_api(name: str, options: Mapping[str, Any] | None = None) -> WireApi:
    """The API named ``name``; ``generic`` is built from ``options`` (``query_path``,
    ``answer_path``: :class:`~monitor.core.apis.generic.GenericApi`)."""
    if name == GENERIC:
        return GenericApi(**dict(options or {}))
    api = _BY_NAME.get(name)
    if api is None:
        raise ConfigError(f"unknown api {name!r}; known: {', '.join(API_NAMES)}")
    return api
