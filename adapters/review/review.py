"""The review API and review page on aiohttp (port 9109: ``/api/reviews/...``,
``/review``; docs/review.md).

Every ``/api`` route needs ``Authorization: Bearer <token>`` (compared in constant time;
401 with ``WWW-Authenticate`` otherwise; the token is never logged), or with
``review.auth: proxy`` a trusted auth proxy's reviewer header
(:mod:`adapters.review.review_auth`); a reviewer so identified is recorded in every
verdict in place of the self-typed ``reviewer``::

    GET  /api/whoami                 200 {"auth": "token"|"proxy", "reviewer": name|null}

    GET  /api/reviews/next[?task=T]  200 the oldest item waiting for a verdict, 204 if none
    GET  /api/reviews/{id}           200 the item plus "verdict" (null if none), 404 unknown
    POST /api/reviews/{id}           a verdict: {"accepted_ranks": [1]} or
                                     {"none_of_these": true, "correct_answer": "42"},
                                     optional "reviewer" -> 200 {"status", "score"} for
                                     "applied" and "duplicate" (posting the same judgement
                                     twice is not an error), 409 {"error", "verdict",
                                     "held"} when the item already has a verdict that
                                     judges otherwise (the first stored one counts, from
                                     the page or the API alike; "held": still in the
                                     page's undo window), 404 unknown item, 400 invalid (one-line
                                     message), 413 over 64 KiB or a field over its
                                     limit (monitor.core.review, docs/review.md)

``GET /openapi.json`` (no token) describes all of it (:mod:`adapters.review.openapi`).
``score`` is the item's rank score, the string ``"inf"`` when no candidate was accepted.
(An item whose id is literally ``next`` can be reviewed but not fetched by id.)
With a ``page`` (:class:`adapters.review.review_page.ReviewPage`), ``GET /review`` serves
the review page, ``/api/review-page/...`` its undo window and progress, and
``/api/reviews/next`` leases the item it returns (``?session=S&exclude=ID``), so two
reviewers are not handed the same item at the same time.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog
from aiohttp import web

from adapters.http import expect as http_expect
from adapters.review.openapi import openapi_document
from adapters.review.review_auth import ReviewAuth, remember_reviewer, reviewer_of, with_reviewer
from adapters.review.review_page import ReviewPage, answer_duplicate, verdict_error
from monitor.core.errors import ConfigError, InputError, RelmonError, StateError
from monitor.core.review import (
    MAX_VERDICT_BYTES,
    ReviewItem,
    Verdict,
    check_item_id_size,
    parse_verdict,
)
from monitor.engine.ports import VerdictHandler, VerdictOutcome

__all__ = ["ReviewServer", "ReviewStoreReader"]

_log = structlog.get_logger(__name__)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ReviewStoreReader(Protocol):
    """What the review API reads (a store that implements the review queue port)."""

    async def next_pending(self, task: str | None = None) -> ReviewItem | None: ...

    async def get_review_item(self, item_id: str) -> ReviewItem | None: ...

    async def get_verdict(self, item_id: str) -> Verdict | None: ...

    async def held_verdict(self, item_id: str) -> tuple[Verdict, float] | None: ...


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _score_json(score: float | None) -> float | str | None:
    return "inf" if score is not None and math.isinf(score) else score


class ReviewServer:
    """Serves the review API and page. ``await start()``, ``await stop()``."""

    def __init__(
        self,
        *,
        store: ReviewStoreReader,
        handler: VerdictHandler,
        token: str | None = None,
        port: int,
        host: str = "127.0.0.1",
        max_body_bytes: int = MAX_VERDICT_BYTES,
        shutdown_timeout_s: float = 5.0,
        page: ReviewPage | None = None,
        traffic_url: str | None = None,
        auth: ReviewAuth | None = None,
    ) -> None:
        self._auth_of = auth if auth is not None else ReviewAuth(token=token)
        """Who is reviewing (``auth``, else the shared ``token``; ConfigError if neither)."""
        self._store = store
        self._handler = handler
        self._host = host
        self._port = port
        self._max_body = max_body_bytes
        self._shutdown_timeout = shutdown_timeout_s
        self._page = page
        self.traffic_url = traffic_url
        """Where the traffic endpoint listens, for ``/openapi.json`` (None: not described)."""
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    def __repr__(self) -> str:
        return f"ReviewServer(host={self._host!r}, port={self._port!r})"

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        if self._bound_port is None:
            raise StateError("ReviewServer is not started")
        return self._bound_port

    def app(self) -> web.Application:
        """The aiohttp application (routes and middlewares), for embedding."""
        app = web.Application(
            client_max_size=self._max_body, middlewares=[self._errors, self._auth]
        )
        if self._page is not None:  # the page, its API, leases (adapters.review.review_page)
            self._page.add_routes(app)
        app.router.add_get("/openapi.json", self._openapi_route)
        app.router.add_get("/api/whoami", self._whoami)
        app.router.add_get("/api/reviews/next", self._next)
        app.router.add_get("/api/reviews/{item_id:.+}", self._get)
        app.router.add_post("/api/reviews/{item_id:.+}", self._post)
        http_expect.install(app)
        return app

    async def start(self) -> None:
        """Listen; :class:`ConfigError` if the address cannot be bound."""
        if self._runner is not None:
            raise StateError("ReviewServer already started")
        runner = web.AppRunner(
            self.app(), handle_signals=False, shutdown_timeout=self._shutdown_timeout
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"cannot listen on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        self._bound_port = int(runner.addresses[0][1])
        _log.info("review_server_started", host=self._host, port=self._bound_port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._bound_port = None

    # -- middlewares --------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except RelmonError as exc:
            _log.error("review_api_failed", path=request.path, error=type(exc).__name__)
            return _error(503 if exc.retriable else 500, "the review store failed; try again")
        except Exception:
            _log.exception("review_api_failed", path=request.path)
            return _error(500, "internal error")

    @web.middleware
    async def _auth(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        outcome = self._auth_of.authenticate(request)
        if outcome.status is not None:
            body = {"error": outcome.error, "auth": self._auth_of.mode}
            return web.json_response(body, status=outcome.status, headers=outcome.headers)
        remember_reviewer(request, outcome)
        response = await handler(request)
        response.headers["Cache-Control"] = "no-store"
        return response

    # -- routes -------------------------------------------------------------------------

    async def _openapi_route(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(openapi_document(traffic_url=self.traffic_url))

    async def _whoami(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"auth": self._auth_of.mode, "reviewer": reviewer_of(request)})

    async def _next(self, request: web.Request) -> web.StreamResponse:
        if self._page is not None:
            return await self._page.next_item(request)  # leased to the caller
        task = request.query.get("task") or None
        item = await self._store.next_pending(task)
        if item is None:
            return web.Response(status=204)
        return web.json_response(item.to_json())

    async def _get(self, request: web.Request) -> web.StreamResponse:
        item_id = request.match_info["item_id"]
        item = await self._store.get_review_item(item_id)
        if item is None:
            return _error(404, "no such review item")
        verdict = await self._store.get_verdict(item_id)
        return web.json_response(
            {**item.to_json(), "verdict": None if verdict is None else verdict.to_json()}
        )

    async def _post(self, request: web.Request) -> web.StreamResponse:
        item_id = request.match_info["item_id"]
        length = request.content_length
        try:
            if length is not None and length > self._max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self._max_body, actual_size=length)
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"a verdict is at most {self._max_body} bytes")
        try:
            check_item_id_size(item_id)
            item = await self._store.get_review_item(item_id)
            if item is None:
                return _error(404, "no such review item")
            verdict = parse_verdict(body, item_id=item_id, max_rank=len(item.candidates))
        except InputError as exc:
            return verdict_error(exc)
        verdict = with_reviewer(request, verdict)
        outcome: VerdictOutcome = await self._handler(verdict)
        _log.info("review_verdict", item_id=item_id, status=outcome.status)
        if outcome.status == "duplicate":  # 409 if the verdict that counts differs
            repeated = {"status": "duplicate", "score": _score_json(outcome.score)}
            return await answer_duplicate(self._store, verdict, repeated)
        if outcome.status == "applied":
            return web.json_response(
                {"status": outcome.status, "score": _score_json(outcome.score)}
            )
        if outcome.status == "unknown":
            return _error(404, "no such review item")
        return _error(400, (outcome.reason or "invalid verdict").splitlines()[0])
