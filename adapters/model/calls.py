"""How one model call is sent and read, per wire API (see :mod:`adapters.model.client`):
the path under the base URL, the auth header, the body for ``n`` answers, and the
answers read from the response body."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from adapters.model.wire import encode, parse_completion
from monitor.core.apis.base import Route, WireApi
from monitor.core.apis.sse import sse_payloads
from monitor.core.errors import InputError

__all__ = ["ApiCall", "Call", "ChatCall", "not_found_hint"]

_OPENAI_BASE: Final = "most servers want base_url to end in /v1, as https://api.openai.com/v1"
_BASE_URL_HINTS: Final[dict[str, str]] = {
    "openai.chat": _OPENAI_BASE,
    "openai.responses": _OPENAI_BASE,
    "openai.completions": _OPENAI_BASE,
    "anthropic.messages": "the path has the version, so base_url is the origin without /v1, "
    "as https://api.anthropic.com",
    "gemini.generate_content": "the path has the version, so base_url is the origin without "
    "/v1beta, as https://generativelanguage.googleapis.com",
    "generic": "the path is production's, under match.path_prefix, so base_url is the "
    "service's origin",
}
"""What ``endpoint.base_url`` must be, per API, given the path each call adds to it."""


class Call:
    """How one call is sent and read (see :class:`ChatCall`, :class:`ApiCall`)."""

    max_draws: int = 1
    api_name: str = "openai.chat"
    path: str | None = None
    auth: str = "bearer"
    headers: tuple[tuple[str, str], ...] = ()

    def payload(self, body: Mapping[str, Any], n: int) -> bytes:
        raise NotImplementedError

    def parse(self, raw: bytes) -> list[str]:
        raise NotImplementedError


class ChatCall(Call):
    """A chat-completions call to the base URL + ``/chat/completions``."""

    def __init__(self) -> None:
        self.max_draws = 1 << 30
        self.path = "/chat/completions"

    def payload(self, body: Mapping[str, Any], n: int) -> bytes:
        return encode({**body, "n": n} if n > 1 else body)

    def parse(self, raw: bytes) -> list[str]:
        return parse_completion(raw)


class ApiCall(Call):
    """A call in ``api``, by ``route``."""

    def __init__(self, api: WireApi, route: Route | None) -> None:
        self.api = api
        self.api_name = api.name
        self.max_draws = api.max_draws_per_call
        self.auth = api.auth
        if route is not None:
            self.path = route.path
            self.headers = route.headers
        else:
            self.path = "/chat/completions"

    def payload(self, body: Mapping[str, Any], n: int) -> bytes:
        return encode(self.api.with_draws(body, n))

    def parse(self, raw: bytes) -> list[str]:
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            return self._streamed(raw)
        if not isinstance(doc, dict):
            raise InputError("body is not a JSON object")
        return self.api.answers(doc)

    def _streamed(self, raw: bytes) -> list[str]:
        """The one answer of a body that is an SSE stream (a ``generic`` request that
        asks its service to stream is resent as it is), read as production's stream is
        read; :class:`InputError` when it is neither JSON nor such a stream."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("body is not JSON") from None
        payloads = sse_payloads(text) if self.max_draws == 1 else []
        if not payloads:
            raise InputError("body is not JSON")
        answer = self.api.stream_answer(payloads)
        if answer is None:
            raise InputError("a streamed body whose events hold no answer")
        return [answer]


def not_found_hint(how: Call) -> str:
    """Why a 404 or 405 likely came back for ``how``: the path relmon added to
    ``endpoint.base_url``, and what the base URL of that API must be then."""
    hint = _BASE_URL_HINTS.get(how.api_name, _OPENAI_BASE)
    return (
        f"nothing answers {how.api_name} there; check endpoint.base_url and endpoint.api "
        f"(relmon posts {how.api_name} to base_url + {how.path or ''}; {hint}: docs/apis/)"
    )
