"""The client that re-asks the monitored model, in the wire API production used.

A call names its API and route (:class:`~monitor.core.apis.base.Route`: the path under
``base_url``, the production headers it carries); without them it is an OpenAI
chat-completions call to ``base_url + /chat/completions`` (the ``llm`` canonicalizer's
and the judge's). The key goes the API's way (``Authorization: Bearer``, ``x-api-key``,
``x-goog-api-key``); the body asks for several answers only where the API can
(``n``, ``candidateCount``) and ``supports_n`` is set; the answers are read by the API
(:meth:`~monitor.core.apis.base.WireApi.answers`).

:class:`HttpModelClient` implements :class:`monitor.engine.ports.ModelClient`: one pool of
keep-alive connections per endpoint (:mod:`.transport`), bounded concurrency, an
optional token-bucket rate limit, retries with jittered exponential backoff, a circuit
breaker, and a hard cap on the size of a response. Every network or OS error is
translated into :class:`~monitor.core.errors.ModelCallError` here.

What is sent
    With ``forward=True`` (the monitored model's client) the request as given, which
    the engine has made the re-ask of the production request
    (:func:`monitor.core.reask.reask_request`: every field kept but the few it drops or
    raises); the client only adds ``n`` and ``stream: false``, and ``model`` when the
    request names none. Otherwise (the ``llm`` canonicalizer's judge) :func:`build_body`:
    the request's ``messages`` plus the fields in :data:`FORWARDED_FIELDS`, with the
    client's ``model``, ``temperature`` and ``max_tokens``.

Outcomes
    ``on_outcome`` is called once per HTTP call (and once per call refused by the open
    circuit) with one of :data:`OUTCOMES`: ``ok``; ``timeout`` (the client's timeout,
    or HTTP 408); ``rate_limited`` (429); ``server_error`` (5xx); ``client_error``
    (other 4xx, or a redirect, which is never followed so the key cannot leak);
    ``invalid_response`` (a 2xx body that is not JSON, nor, for an API that draws one
    answer a call, an SSE stream holding the answer, read as production's stream is
    read; is not a well-formed response of its API
    (:meth:`~monitor.core.apis.base.WireApi.answers`: for chat, lacks
    ``choices[i].message.content`` or has non-string content); or is over
    ``max_response_bytes``); ``connection_error``; ``circuit_open``.

Retries
    Per outcome, each with its own count (``retries``, see :data:`RETRY_KINDS`):
    ``error`` (server_error and connection_error), ``timeout``, ``rate_limited`` (each
    ``max_retries`` by default) and ``invalid`` (invalid_response,
    :data:`DEFAULT_INVALID_RETRIES` by default: a proxy hiccup can garble a body or two).
    A retry waits ``d/2 + U(0, d/2)`` with ``d = min(backoff_max_s, backoff_base_s *
    2**attempt)`` (``attempt`` counts every retry of the call); a 429 or 503 with
    ``Retry-After`` (delta-seconds or an HTTP-date) waits that long instead, capped at
    ``backoff_max_s``. An exhausted ``invalid`` gives
    ``ModelCallError(retriable=False)``; the others ``ModelCallError(retriable=True)``.
    ``client_error`` is never retried (``retriable=False``, ``status`` set).

``tool_calls``, a refusal, ``content: null``
    A choice that calls tools is an answer: a marked JSON list of its calls, which the
    ``tool_call`` canonicalizer reads (every other canonicalizer makes it INVALID); a
    refusal is a marked answer too; ``content: null`` without either is ``""``. None is
    retried: that would bias the sample towards text answers.

Circuit breaker
    It counts endpoint failures only: after ``breaker_threshold`` consecutive failed
    calls (timeouts, 429, 5xx, connection errors) the circuit opens. An answer the
    endpoint gave but relmon cannot read (``invalid_response``: not JSON, not the API's
    shape, too big) follows from what the request asked as much as from the endpoint (a
    stream, a long answer), and no client may stop a task's monitoring with such
    requests: like a 4xx it shows the endpoint up and counts as a success for the
    breaker (it is still counted as its outcome, retried, and in the end fails the
    call). Once open, calls fail at once with outcome ``circuit_open`` and
    ``ModelCallError(retriable=True)``, without touching the network. After
    ``breaker_cooldown_s`` one trial call goes through (half-open); its success closes
    the circuit, its failure opens it for another cooldown. While the circuit is not
    closed, ``sample`` sends the first call of a batch alone and the rest only after it
    succeeded: a trial sent with parallel siblings would be cancelled by their
    ``circuit_open`` failures and the circuit would never close. The service sets both
    from a task's ``endpoint.circuit_breaker`` (``failures``, ``cooldown_s``).

``sample(request, n)`` returns exactly ``n`` texts or raises: with ``supports_n`` one
request asks for ``n`` choices (missing choices, e.g. from a server that ignores ``n``,
are topped up with single calls); otherwise ``n`` single calls run in parallel, bounded
by ``concurrency``, and the first that fails for good cancels the rest. The caller
abandons the item: partial samples are never returned. The API key is sent the API's
way and never appears in a message, a repr or a log.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from adapters.model.calls import ApiCall, Call, ChatCall, not_found_hint
from adapters.model.limits import CircuitBreaker, TokenBucket
from adapters.model.transport import ModelTransport, TransportError, host_and_port
from adapters.model.wire import (
    FORWARDED_FIELDS,
    build_body,
    forward_body,
    parse_completion,
    parse_retry_after,
)
from monitor.core.apis.base import Route, WireApi
from monitor.core.errors import ConfigError, InputError, ModelCallError
from monitor.engine.ports import Clock, SystemClock

__all__ = [
    "DEFAULT_INVALID_RETRIES",
    "FORWARDED_FIELDS",
    "OUTCOMES",
    "RETRY_KINDS",
    "HttpModelClient",
    "Outcome",
    "build_body",
    "forward_body",
    "parse_completion",
    "parse_retry_after",
]

Outcome = Literal[
    "ok",
    "timeout",
    "rate_limited",
    "server_error",
    "client_error",
    "invalid_response",
    "connection_error",
    "circuit_open",
]
OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
"""Every outcome, in a fixed order (for pre-creating metric label values)."""
_RETRIABLE: Final = frozenset({"timeout", "rate_limited", "server_error", "connection_error"})
RETRY_KINDS: Final = ("error", "timeout", "rate_limited", "invalid")
"""The keys of ``retries``: which failed outcomes each retry budget covers."""
_RETRY_KIND: Final[dict[str, str]] = {
    "server_error": "error",
    "connection_error": "error",
    "timeout": "timeout",
    "rate_limited": "rate_limited",
    "invalid_response": "invalid",
}
DEFAULT_INVALID_RETRIES: Final = 2
_ENDPOINT_UP: Final = frozenset({"client_error", "invalid_response"})
"""Failed outcomes that show the endpoint up and answering: never a breaker failure."""
_TRANSPORT_OUTCOME: Final[dict[str, Outcome]] = {
    "timeout": "timeout",
    "too_big": "invalid_response",
    "invalid": "invalid_response",
}
"""The outcome of each :class:`TransportError` kind; any other is a connection error."""


class _CallError(Exception):
    """One HTTP call that did not give completions (internal)."""

    def __init__(
        self,
        outcome: Outcome,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.outcome: Outcome = outcome
        self.status = status
        self.retry_after = retry_after


class HttpModelClient:
    """A :class:`~monitor.engine.ports.ModelClient` for one endpoint, in any wire API."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 1.0,
        max_tokens: int = 512,
        timeout_s: float = 60.0,
        concurrency: int = 8,
        rate_limit_per_s: float | None = None,
        supports_n: bool = False,
        max_retries: int = 3,
        retries: Mapping[str, int] | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        breaker_threshold: int = 5,
        breaker_cooldown_s: float = 30.0,
        max_response_bytes: int = 4 * 1024 * 1024,
        forward: bool = False,
        on_outcome: Callable[[str], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError("base_url must start with http:// or https://")
        if not model:
            raise ConfigError("model must be a non-empty string")
        checks = {
            "temperature >= 0": temperature >= 0,
            "max_tokens >= 1": max_tokens >= 1,
            "timeout_s > 0": timeout_s > 0,
            "concurrency >= 1": concurrency >= 1,
            "rate_limit_per_s > 0": rate_limit_per_s is None or rate_limit_per_s > 0,
            "max_retries >= 0": max_retries >= 0,
            "backoff_base_s >= 0": backoff_base_s >= 0,
            "backoff_max_s >= backoff_base_s": backoff_max_s >= backoff_base_s,
            "breaker_threshold >= 1": breaker_threshold >= 1,
            "breaker_cooldown_s >= 0": breaker_cooldown_s >= 0,
            "max_response_bytes >= 1": max_response_bytes >= 1,
        }
        limits = {k: max_retries for k in RETRY_KINDS} | {"invalid": DEFAULT_INVALID_RETRIES}
        for kind, count in (retries or {}).items():
            checks[f"retries keys in {', '.join(RETRY_KINDS)}"] = kind in RETRY_KINDS
            checks[f"retries.{kind} >= 0"] = isinstance(count, int) and count >= 0
            limits[kind] = count
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            raise ConfigError(f"HttpModelClient: need {', '.join(failed)}")
        self._retries = limits
        self._url = base_url.rstrip("/")
        self._shown_url = shown_url(self._url)
        key = "'***'" if api_key else "None"  # the key itself lives in the transport only
        self._repr = f"HttpModelClient(base_url={base_url!r}, model={model!r}, api_key={key})"
        self._model = model
        self._temperature = float(temperature)
        self._max_tokens = int(max_tokens)
        self._supports_n = supports_n
        self._backoff_base_s = float(backoff_base_s)
        self._backoff_max_s = float(backoff_max_s)
        self._forward = forward
        self._on_outcome = on_outcome
        self._sleep = sleep if sleep is not None else asyncio.sleep
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng if rng is not None else random.Random()
        self._slots = asyncio.Semaphore(int(concurrency))
        self._bucket = (
            TokenBucket(rate_limit_per_s, self._clock) if rate_limit_per_s is not None else None
        )
        self._breaker = CircuitBreaker(breaker_threshold, float(breaker_cooldown_s), self._clock)
        self._transport = ModelTransport(
            self._url,
            api_key=api_key,
            timeout_s=float(timeout_s),
            max_connections=int(concurrency),
            max_bytes=int(max_response_bytes),
        )
        self._closed = False

    def __repr__(self) -> str:
        return self._repr

    @property
    def circuit_state(self) -> Literal["closed", "open", "half_open"]:
        """The breaker's state (``half_open``: the next call is the trial)."""
        return self._breaker.state

    async def __aenter__(self) -> HttpModelClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent; later calls raise ModelCallError."""
        self._closed = True
        self._transport.close()

    async def sample(
        self,
        request: Mapping[str, Any],
        n: int,
        *,
        api: WireApi | None = None,
        route: Route | None = None,
    ) -> list[str]:
        """``n`` answers to ``request`` (in ``api``, sent by ``route``; None: chat
        completions); :class:`ModelCallError` if any call fails."""
        if n < 0:
            raise ConfigError(f"n must be >= 0, got {n}")
        if n == 0:
            return []
        if api is None or (api.name == "openai.chat" and route is None):
            return await self._sample(self._chat_body(request), n, ChatCall())
        call = ApiCall(api, route)
        body = dict(request)
        if api.rules.model is not None and self._forward:
            body.setdefault(api.rules.model, self._model)
        return await self._sample(body, n, call)

    def _chat_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return (
            forward_body(request, model=self._model)
            if self._forward
            else build_body(
                request,
                model=self._model,
                temperature=self._temperature,
                max_tokens=self._max_tokens,
            )
        )

    async def _sample(self, body: dict[str, Any], n: int, how: Call) -> list[str]:
        """``n`` answers: one call for as many as the API draws a call (with
        ``supports_n``), single calls in parallel for the rest."""
        texts: list[str] = []
        most = how.max_draws if self._supports_n else 1
        if most > 1 and n > 1:
            asked = min(n, most)
            texts = (await self._call(how.payload(body, asked), how))[:asked]
        rest = n - len(texts)
        if rest == 0:
            return texts
        single = how.payload(body, 1)
        if self._breaker.state != "closed":
            # Open or half-open: one call goes alone (the trial, once the cool-down is
            # over). Sent with siblings, their immediate circuit_open failures would
            # cancel it, and the circuit would never close again.
            texts = texts + (await self._call(single, how))[:1]
            rest -= 1
        if rest == 0:
            return texts
        if rest == 1:
            return texts + (await self._call(single, how))[:1]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._call(single, how)) for _ in range(rest)]
        except BaseExceptionGroup as eg:
            raise _first_model_error(eg) from None
        return texts + [task.result()[0] for task in tasks]

    async def _call(self, payload: bytes, how: Call) -> list[str]:
        """One logical call with retries: the choices' texts, or ModelCallError."""
        attempt = 0
        used = dict.fromkeys(RETRY_KINDS, 0)
        while True:
            try:
                return await self._attempt(payload, how)
            except _CallError as failed:
                if failed.outcome == "circuit_open":
                    raise ModelCallError(str(failed), retriable=True) from None
                kind = _RETRY_KIND.get(failed.outcome)
                retry = kind is not None and used[kind] < self._retries[kind]
                if kind is not None:
                    used[kind] += 1
                if not retry:
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    raise ModelCallError(
                        f"model call to {self._shown_url}{how.path or ''} failed{tries}: {failed}",
                        retriable=failed.outcome in _RETRIABLE,
                        status=failed.status,
                    ) from None
                delay = self._backoff(attempt, failed.retry_after)
                attempt += 1
                await self._sleep(delay)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self._backoff_max_s)
        cap = min(self._backoff_max_s, self._backoff_base_s * 2.0 ** min(attempt, 60))
        return cap / 2 + self._rng.uniform(0.0, cap / 2)

    async def _attempt(self, payload: bytes, how: Call) -> list[str]:
        """One HTTP call through the breaker, the concurrency slots and the rate limit."""
        allowed, trial = self._breaker.admit()
        if not allowed:
            self._report("circuit_open")
            raise _CallError("circuit_open", "circuit open: endpoint failing, not called")
        try:
            async with self._slots:
                if self._bucket is not None:
                    wait = self._bucket.reserve()
                    if wait > 0:
                        await self._sleep(wait)
                texts = await self._post(payload, how)
        except _CallError as failed:
            self._breaker.record(failed.outcome in _ENDPOINT_UP, trial)
            self._report(failed.outcome)
            raise
        except BaseException:
            self._breaker.release(trial)
            raise
        self._breaker.record(True, trial)
        self._report("ok")
        return texts

    def _report(self, outcome: Outcome) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    async def _post(self, payload: bytes, how: Call) -> list[str]:
        if self._closed:
            raise ModelCallError("model client is closed", retriable=False)
        try:
            status, retry_after, raw = await self._transport.post(
                payload, path=how.path, auth=how.auth, headers=how.headers
            )
        except TransportError as exc:
            outcome = _TRANSPORT_OUTCOME.get(exc.kind, "connection_error")
            message = f"invalid response: {exc}" if outcome == "invalid_response" else str(exc)
            raise _CallError(outcome, message) from None
        if not 200 <= status < 300:
            raise self._status_failure(status, retry_after, how)
        try:
            return how.parse(raw)
        except InputError as exc:
            raise _CallError("invalid_response", f"invalid response: {exc}") from None

    def _status_failure(self, status: int, retry_after_header: str | None, how: Call) -> _CallError:
        if status in (429, 503):
            retry_after = parse_retry_after(retry_after_header, self._clock.time())
        else:
            retry_after = None
        if status == 429:
            return _CallError("rate_limited", "HTTP 429", status=status, retry_after=retry_after)
        if status == 408:
            return _CallError("timeout", "HTTP 408", status=status)
        if status >= 500:
            return _CallError(
                "server_error", f"HTTP {status}", status=status, retry_after=retry_after
            )
        if status in (404, 405):
            return _CallError(
                "client_error", f"HTTP {status}: {not_found_hint(how)}", status=status
            )
        return _CallError("client_error", f"HTTP {status}", status=status)


def shown_url(url: str) -> str:
    """``url`` as messages may show it: without user info, query or fragment (a key
    never leaves through a log line)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, host_and_port(parts), parts.path, "", ""))


def _first_model_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first ModelCallError in a (nested) exception group, else the group itself."""
    for exc in group.exceptions:
        if isinstance(exc, ModelCallError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_model_error(exc)
            if found is not exc:
                return found
    return group
