"""The browser review page and the API behind it, on the review server's port.

Routes (everything under ``/api`` needs the review token as a bearer header, checked
by :class:`adapters.review.review.ReviewServer`; the page and its two static files do not)::

    GET    /review, /review/review.js, /review/review.css   the page (package data);
           /review/ redirects to ../review
    GET    /api/reviews/next?session=S&exclude=ID...        :meth:`ReviewPage.next_item`:
           the oldest waiting item nobody else holds, leased to session S; 429 when
           the reviewer already holds ``max_leases`` leases (all sessions on the
           shared token count as one reviewer)
    POST   /api/review-page/verdicts/{id}?session=S        hold a verdict for the undo
           window: 202 {"status": "held", "undo_s"}; 200 {"status": "duplicate"} if the
           item already has a verdict that judges alike, 409 {"error", "verdict",
           "held"} with the one that counts if it judges otherwise; 400 invalid; 404
           unknown item
    DELETE /api/review-page/verdicts/{id}?session=S        undo a verdict S held: 200
           {"status": "undone", "item": {...}} (leased back to S); 403 if another
           session gave it (it stands); 409 once applied or once the item's verdict
           counts otherwise (the same judgement stored through the API meanwhile)
    POST   /api/review-page/lease/{id}?session=S           renew S's lease: 200
           {"renewed": true, "lease_s"}; 409 if S holds no live lease on the item
    POST   /api/review-page/release/{id}?session=S         give a leased item back (skip)
    GET    /api/review-page/progress                       per task: reviewed today (UTC),
           waiting, held (given, still in the undo window), calibration items,
           effective items, minimum needed

A lease lasts ``lease_s`` seconds; the page renews the leases of the item it shows
and the one it prefetched every ``lease_s / 3`` seconds, so an item stays with a
reviewer who takes long over it, and goes back to the queue soon after the tab closes.

Undo is a grace period, not a retraction: a page verdict waits in the store for
``undo_s`` seconds and only then goes to the verdict handler (the service), which adds it
to the calibration window, the counters and the alarm. Counters cannot go down and a
sequential alarm cannot take an observation back, so nothing is ever removed from the
window; a verdict withdrawn in time was simply never applied. Held verdicts are stored
(SQLite), so one held when relmon stops is applied after the restart.

Every address the page and its script use is relative to the page (``review/review.js``,
``api/reviews/next``...), so relmon can be served under a sub-path by a reverse proxy
that strips the prefix (``https://tools.example.com/relmon/review``) with nothing to
configure; the redirect from ``/review/`` is relative for the same reason.

The token stays in the tab's ``sessionStorage`` and travels only in the
``Authorization`` header: never in a URL, never in a cookie, so the browser never
attaches it on its own (no cross-site request can use it) and it is gone when the tab
closes. The Content-Security-Policy allows scripts and styles from this origin only
(no inline code), so injected markup cannot run; model text is inserted as text.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from importlib import resources
from typing import Literal, Protocol

import structlog
from aiohttp import web

from adapters.review.review_auth import reviewer_of, with_reviewer
from monitor.core.errors import ConfigError, InputError, LimitError, RelmonError, TooLargeError
from monitor.core.review import (
    MAX_VERDICT_BYTES,
    ReviewItem,
    TaskProgress,
    Verdict,
    check_item_id_size,
    parse_verdict,
    same_judgement,
)
from monitor.engine.logs import ThrottledLog
from monitor.engine.ports import Clock, SystemClock, VerdictHandler

__all__ = [
    "PAGE_HEADERS",
    "ReviewPage",
    "ReviewPageStore",
    "StandingVerdicts",
    "answer_duplicate",
    "verdict_error",
]

_log = structlog.get_logger(__name__)
_throttled = ThrottledLog(name=__name__)
"""Lines a store outage repeats (every flush): rate-limited."""
_MAX_SESSION = 64
_MAX_EXCLUDE = 64

PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
"""Headers of the page and its static files."""

_STATIC = {
    "/review": ("index.html", "text/html"),
    "/review/review.js": ("review.js", "text/javascript"),
    "/review/review.css": ("review.css", "text/css"),
}


class ReviewPageStore(Protocol):
    """What the page needs from the store (``adapters.sqlite.store.SqliteStore``)."""

    async def get_review_item(self, item_id: str) -> ReviewItem | None: ...

    async def get_verdict(self, item_id: str) -> Verdict | None: ...

    async def held_verdict(self, item_id: str) -> tuple[Verdict, float] | None: ...

    async def lease_next(
        self,
        task: str | None,
        *,
        holder: str,
        lease_s: float,
        exclude: Sequence[str] = (),
        owner: str | None = None,
        max_leases: int | None = None,
    ) -> ReviewItem | None: ...

    async def lease_item(
        self, item_id: str, *, holder: str, lease_s: float, owner: str | None = None
    ) -> None: ...

    async def renew_lease(self, item_id: str, *, holder: str, lease_s: float) -> bool: ...

    async def release_lease(self, item_id: str, holder: str) -> bool: ...

    async def hold_verdict(
        self, verdict: Verdict, hold_s: float, *, holder: str | None = None
    ) -> Literal["held", "duplicate"]: ...

    async def undo_held(self, item_id: str, holder: str) -> Literal["undone", "other", "none"]: ...

    async def claim_due(self) -> list[Verdict]: ...

    async def drop_held(self, item_id: str) -> None: ...

    async def review_counts(self, since: float) -> dict[tuple[str, str], tuple[int, int, int]]: ...


def _session(request: web.Request) -> str:
    value = request.query.get("session", "").strip()
    if not value or len(value) > _MAX_SESSION or not value.isprintable():
        raise web.HTTPBadRequest(
            text='{"error": "a session id of 1 to 64 printable characters is needed"}',
            content_type="application/json",
        )
    return value


def _holder(request: web.Request) -> str:
    """The lease and undo holder of a page request: its session (and the reviewer, when
    the token or the proxy names one: a session id alone then undoes nothing)."""
    reviewer = reviewer_of(request)
    return "page:" + _session(request) + ("" if reviewer is None else "@" + reviewer)


def _owner(request: web.Request) -> str:
    """Whose leases a request's count against ``max_leases``: the reviewer the token or
    the proxy names, else everyone on the shared token together (relmon cannot tell
    them apart)."""
    reviewer = reviewer_of(request)
    return "shared-token" if reviewer is None else "reviewer:" + reviewer


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class StandingVerdicts(Protocol):
    async def get_verdict(self, item_id: str) -> Verdict | None: ...

    async def held_verdict(self, item_id: str) -> tuple[Verdict, float] | None: ...


async def answer_duplicate(
    store: StandingVerdicts, verdict: Verdict, repeated: Mapping[str, object]
) -> web.Response:
    """The answer to a verdict for an item that already has one: ``repeated`` (200) if
    the verdict that counts judges alike, else 409 with that verdict (``"held"``: given
    on the review page and still in its undo window; with ``repeated``'s ``score``, the
    stored verdict's, once applied)."""
    stored = await store.get_verdict(verdict.item_id)
    held = False
    if stored is None:
        found = await store.held_verdict(verdict.item_id)
        stored, held = (None, False) if found is None else (found[0], True)
    if stored is None or same_judgement(stored, verdict):
        return web.json_response(repeated)
    body = {
        "error": "the item already has another verdict; the first stored one counts",
        "verdict": stored.to_json(),
        "held": held,
    }
    if not held and "score" in repeated:  # the stored verdict's score (the API's answer)
        body["score"] = repeated["score"]
    return web.json_response(body, status=409)


def verdict_error(exc: InputError) -> web.Response:
    """A refused verdict: 413 over a size limit, else 400; a one-line message."""
    message = str(exc).splitlines()[0] if str(exc) else "invalid verdict"
    return _error(413 if isinstance(exc, TooLargeError) else 400, message)


class ReviewPage:
    """The page's routes, leases and undo window. Add to an app with :meth:`add_routes`.

    ``progress`` returns each task's calibration state (``MonitorService.review_progress``);
    without it the progress table shows only the store's counts.
    """

    def __init__(
        self,
        *,
        store: ReviewPageStore,
        handler: VerdictHandler,
        progress: Callable[[], Sequence[TaskProgress]] | None = None,
        lease_s: float = 120.0,
        undo_s: float = 10.0,
        flush_every_s: float = 0.5,
        clock: Clock | None = None,
        max_leases: int | None = 20,
    ) -> None:
        if not (lease_s > 0 and undo_s >= 0 and flush_every_s > 0):
            raise ConfigError("lease_s and flush_every_s must be > 0, undo_s >= 0")
        if max_leases is not None and max_leases < 1:
            raise ConfigError("max_leases must be >= 1 (None: no cap)")
        self.max_leases = max_leases
        self._store = store
        self._handler = handler
        self._progress = progress
        self.lease_s = lease_s
        self.undo_s = undo_s
        self._flush_every = flush_every_s
        self._clock = clock or SystemClock()
        self._flusher: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._files = {
            path: (resources.files("adapters.review").joinpath("static", name).read_bytes(), ctype)
            for path, (name, ctype) in _STATIC.items()
        }

    def add_routes(self, app: web.Application) -> None:
        for path in self._files:
            app.router.add_get(path, self._static)
        app.router.add_get("/review/", self._to_page)
        app.router.add_get("/api/review-page/progress", self._progress_route)
        app.router.add_post("/api/review-page/verdicts/{item_id:.+}", self._hold)
        app.router.add_delete("/api/review-page/verdicts/{item_id:.+}", self._undo)
        app.router.add_post("/api/review-page/lease/{item_id:.+}", self._renew)
        app.router.add_post("/api/review-page/release/{item_id:.+}", self._release)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    # -- the undo window: held verdicts become verdicts ------------------------------------

    async def flush(self) -> int:
        """Apply every held verdict that is due; returns how many were handed over."""
        async with self._flush_lock:
            applied = 0
            for verdict in await self._store.claim_due():
                outcome = await self._handler(verdict)
                if outcome.status not in ("applied", "duplicate"):
                    _log.warning(
                        "held_verdict_rejected",
                        item_id=verdict.item_id,
                        status=outcome.status,
                        reason=outcome.reason,
                    )
                await self._store.drop_held(verdict.item_id)
                applied += 1
            return applied

    async def _flush_forever(self) -> None:
        while True:
            try:
                await self.flush()
            except RelmonError as exc:  # the store or the service failed: retry later
                _throttled.error("held_verdicts_flush_failed", error=type(exc).__name__)
            except Exception as exc:  # a bug: with its traceback, rate-limited all the same
                _throttled.error("held_verdicts_flush_failed", key="bug", exc_info=exc)
            await asyncio.sleep(self._flush_every)

    async def _start(self, app: web.Application) -> None:
        self._flusher = asyncio.create_task(self._flush_forever(), name="relmon-held-verdicts")

    async def _stop(self, app: web.Application) -> None:
        task, self._flusher = self._flusher, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):  # due verdicts now; the rest after a restart
            await self.flush()

    # -- routes -----------------------------------------------------------------------

    async def _static(self, request: web.Request) -> web.StreamResponse:
        body, ctype = self._files[request.path]
        return web.Response(body=body, content_type=ctype, charset="utf-8", headers=PAGE_HEADERS)

    async def _to_page(self, request: web.Request) -> web.StreamResponse:
        # Relative, so that it stays under whatever prefix a proxy serves relmon at; the
        # page's relative addresses resolve correctly only without the trailing slash.
        raise web.HTTPFound("../review", headers=PAGE_HEADERS)

    async def next_item(self, request: web.Request) -> web.StreamResponse:
        """``GET /api/reviews/next``: lease the next item to the caller's session (API
        clients without ``session`` share the holder ``api:<reviewer>``)."""
        task = request.query.get("task") or None
        if "session" in request.query:
            holder = _holder(request)
        else:
            holder = "api:" + (reviewer_of(request) or request.query.get("reviewer", "")[:128])
        exclude = request.query.getall("exclude", [])[:_MAX_EXCLUDE]
        try:
            item = await self._store.lease_next(
                task,
                holder=holder,
                lease_s=self.lease_s,
                exclude=exclude,
                owner=_owner(request),
                max_leases=self.max_leases,
            )
        except LimitError as exc:
            _log.warning("review_lease_refused", error=str(exc))
            body = {
                "error": "too many items leased at once: give a verdict or skip one first "
                f"(at most {self.max_leases} per reviewer)"
            }
            headers = {"Retry-After": str(max(1, math.ceil(self.lease_s)))}
            return web.json_response(body, status=429, headers=headers)
        if item is None:
            return web.Response(status=204)
        return web.json_response(item.to_json())

    async def _hold(self, request: web.Request) -> web.StreamResponse:
        item_id = request.match_info["item_id"]
        holder = _holder(request)
        if (request.content_length or 0) > MAX_VERDICT_BYTES:
            return _error(413, f"a verdict is at most {MAX_VERDICT_BYTES} bytes")
        body = await request.read()
        try:
            check_item_id_size(item_id)
            item = await self._store.get_review_item(item_id)
            if item is None:
                return _error(404, "no such review item")
            verdict = parse_verdict(body, item_id=item_id, max_rank=len(item.candidates))
        except InputError as exc:
            return verdict_error(exc)
        verdict = with_reviewer(request, verdict)
        status = await self._store.hold_verdict(verdict, self.undo_s, holder=holder)
        _log.info("review_verdict_held", item_id=item_id, status=status)
        if status == "duplicate":
            return await answer_duplicate(self._store, verdict, {"status": "duplicate"})
        if self.undo_s == 0:
            await self.flush()
        return web.json_response({"status": "held", "undo_s": self.undo_s}, status=202)

    async def _undo(self, request: web.Request) -> web.StreamResponse:
        item_id = request.match_info["item_id"]
        holder = _holder(request)
        outcome = await self._store.undo_held(item_id, holder)
        if outcome == "other":
            return _error(403, "this verdict was given in another session; it stands")
        if outcome == "none":
            return _error(409, "too late to undo: the verdict has been applied")
        _log.info("review_verdict_undone", item_id=item_id)
        await self._store.lease_item(
            item_id, holder=holder, lease_s=self.lease_s, owner=_owner(request)
        )
        undone = await self._store.get_review_item(item_id)
        return web.json_response(
            {"status": "undone", "item": None if undone is None else undone.to_json()}
        )

    async def _renew(self, request: web.Request) -> web.StreamResponse:
        renewed = await self._store.renew_lease(
            request.match_info["item_id"], holder=_holder(request), lease_s=self.lease_s
        )
        if not renewed:
            return _error(409, "this session holds no lease on the item (expired or taken)")
        return web.json_response({"renewed": True, "lease_s": self.lease_s})

    async def _release(self, request: web.Request) -> web.StreamResponse:
        released = await self._store.release_lease(request.match_info["item_id"], _holder(request))
        return web.json_response({"released": released})

    async def _progress_route(self, request: web.Request) -> web.StreamResponse:
        now = self._clock.time()
        midnight = now - (now % 86_400.0)  # today in UTC
        counts = await self._store.review_counts(midnight)
        tasks = []
        known = list(self._progress()) if self._progress is not None else []
        for p in known:
            today, waiting, held = counts.pop((p.model, p.task), (0, 0, 0))
            tasks.append({**asdict(p), "reviewed_today": today, "waiting": waiting, "held": held})
        for (model, task), (today, waiting, held) in sorted(counts.items()):
            tasks.append(
                {
                    "model": model,
                    "task": task,
                    "calibration_items": 0,
                    "effective_items": 0.0,
                    "minimum_items": 0,
                    "threshold_finite": False,
                    "reviewed_today": today,
                    "waiting": waiting,
                    "held": held,
                }
            )
        return web.json_response({"tasks": tasks, "undo_s": self.undo_s, "lease_s": self.lease_s})
