"""How one model call is sent and read, per wire API (see :mod:`adapters.model.client`):
the path under the base URL, the auth header, the body for ``n`` answers, and the
answers read from the response body."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from adapters.model.wire import encode, parse_completion
from monitor.core.apis.base import Route, WireApi
from monitor.core.apis.sse import sse_payloads
from monitor.core.errors import InputError

__all__ = ["ApiCall", "Call", "ChatCall"]


class Call:
    """How one call is sent and read (see :class:`ChatCall`, :class:`ApiCall`)."""

    max_draws: int = 1
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
