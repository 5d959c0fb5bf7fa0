"""The review API and review page on aiohttp (DESIGN §3: 9109, ``/api/reviews/...``, ``/review``).

Every ``/api`` route needs ``Authorization: Bearer <token>`` (compared in constant time;
401 with ``WWW-Authenticate`` otherwise; the token is never logged)::

    GET  /api/reviews/next[?task=T]  200 the oldest item waiting for a verdict, 204 if none
    GET  /api/reviews/{id}           200 the item plus "verdict" (null if none), 404 unknown
    POST /api/reviews/{id}           a verdict: {"accepted_ranks": [1]} or
                                     {"none_of_these": true, "correct_answer": "42"},
                                     optional "reviewer" -> 200 {"status", "score"} for
                                     "applied" and "duplicate" (posting twice is not an
                                     error), 404 unknown item, 400 invalid (one-line
                                     message), 413 over 64 KiB

``score`` is the item's rank score, the string ``"inf"`` when no candidate was accepted.
(An item whose id is literally ``next`` can be reviewed but not fetched by id.)
``GET /review`` serves a self-contained page (inline script and style pinned by hashes in
its Content-Security-Policy, nothing fetched from elsewhere) that asks for the token
once, keeps it in ``sessionStorage`` and walks the queue. The page itself needs no
token; everything it shows comes from the API. Model text is only ever inserted as text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import structlog
from aiohttp import web

from monitor.errors import ConfigError, InputError, RelmonError
from monitor.ports import VerdictHandler, VerdictOutcome
from monitor.review import ReviewItem, Verdict, parse_verdict

__all__ = ["REVIEW_PAGE", "ReviewServer", "ReviewStoreReader"]

_log = structlog.get_logger(__name__)
_MAX_VERDICT_BYTES = 65_536
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ReviewStoreReader(Protocol):
    """What the review API reads (``adapters.sqlite_store.SqliteStore`` has it all)."""

    async def next_pending(self, task: str | None = None) -> ReviewItem | None: ...

    async def get_review_item(self, item_id: str) -> ReviewItem | None: ...

    async def get_verdict(self, item_id: str) -> Verdict | None: ...


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
        token: str,
        port: int,
        host: str = "127.0.0.1",
        max_body_bytes: int = _MAX_VERDICT_BYTES,
        shutdown_timeout_s: float = 5.0,
    ) -> None:
        if not token or not token.strip():
            raise ConfigError("the review API needs a non-empty token")
        self._store = store
        self._handler = handler
        self._token = token.encode("utf-8")
        self._host = host
        self._port = port
        self._max_body = max_body_bytes
        self._shutdown_timeout = shutdown_timeout_s
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    def __repr__(self) -> str:
        return f"ReviewServer(host={self._host!r}, port={self._port!r})"

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with ``port=0``)."""
        if self._bound_port is None:
            raise RuntimeError("ReviewServer is not started")
        return self._bound_port

    def app(self) -> web.Application:
        """The aiohttp application (routes and middlewares), for embedding."""
        app = web.Application(
            client_max_size=self._max_body, middlewares=[self._errors, self._auth]
        )
        app.router.add_get("/api/reviews/next", self._next)
        app.router.add_get("/api/reviews/{item_id:.+}", self._get)
        app.router.add_post("/api/reviews/{item_id:.+}", self._post)
        app.router.add_get("/review", self._page)
        return app

    async def start(self) -> None:
        """Listen; :class:`ConfigError` if the address cannot be bound."""
        if self._runner is not None:
            raise RuntimeError("ReviewServer already started")
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
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return _error(
                401, "missing bearer token", {"WWW-Authenticate": 'Bearer realm="relmon"'}
            )
        if not hmac.compare_digest(given.strip().encode("utf-8"), self._token):
            return _error(
                401,
                "invalid token",
                {"WWW-Authenticate": 'Bearer realm="relmon", error="invalid_token"'},
            )
        response = await handler(request)
        response.headers["Cache-Control"] = "no-store"
        return response

    # -- routes -------------------------------------------------------------------------

    async def _next(self, request: web.Request) -> web.StreamResponse:
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
        item = await self._store.get_review_item(item_id)
        if item is None:
            return _error(404, "no such review item")
        try:
            verdict = parse_verdict(body, item_id=item_id, max_rank=len(item.candidates))
        except InputError as exc:
            return _error(400, str(exc).splitlines()[0] if str(exc) else "invalid verdict")
        outcome: VerdictOutcome = await self._handler(verdict)
        _log.info("review_verdict", item_id=item_id, status=outcome.status)
        if outcome.status in ("applied", "duplicate"):
            return web.json_response(
                {"status": outcome.status, "score": _score_json(outcome.score)}
            )
        if outcome.status == "unknown":
            return _error(404, "no such review item")
        return _error(400, (outcome.reason or "invalid verdict").splitlines()[0])

    async def _page(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            text=REVIEW_PAGE,
            content_type="text/html",
            charset="utf-8",
            headers=_PAGE_HEADERS,
        )


_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:52rem;margin:1.5rem auto;padding:0 1rem;
color:#1b1b1b;background:#fafafa}
h1{font-size:1.3rem}pre{white-space:pre-wrap;word-break:break-word;margin:.2rem 0;
font:14px/1.4 ui-monospace,monospace}
.box{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8rem 1rem;margin:.8rem 0}
.meta{color:#555;font-size:.9rem}.count{color:#555;margin:0 .5rem;font-size:.9rem}
ol{list-style:none;padding:0}li label{display:flex;gap:.4rem;align-items:baseline;
padding:.35rem;border-bottom:1px solid #eee;cursor:pointer}
button{font:inherit;padding:.35rem .9rem;margin:.2rem .3rem .2rem 0;cursor:pointer}
input[type=text],input[type=password]{font:inherit;padding:.3rem;width:18rem}
#status{min-height:1.4rem;color:#7a2e00}
"""

_SCRIPT = """
"use strict";
const $ = (id) => document.getElementById(id);
let item = null;
const token = () => sessionStorage.getItem("relmon-token") || "";
function say(msg) { $("status").textContent = msg; }
function showLogin(on) { $("login").hidden = !on; $("review").hidden = on; }
async function api(method, path, body) {
  const headers = {"Authorization": "Bearer " + token()};
  const init = {method, headers, cache: "no-store"};
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) {
    sessionStorage.removeItem("relmon-token");
    showLogin(true);
    throw new Error("The token was not accepted: paste it again.");
  }
  return r;
}
async function errorText(r) {
  try { return (await r.json()).error || r.statusText; } catch (e) { return r.statusText; }
}
function render(d) {
  item = d;
  $("meta").textContent = d.model + " \\u00b7 task " + d.task + " \\u00b7 item " + d.item_id +
    " \\u00b7 K=" + d.k + " \\u00b7 inclusion probability " + d.inclusion_probability;
  $("query").textContent = d.query;
  const list = $("candidates");
  list.replaceChildren();
  for (const c of d.candidates) {
    const li = document.createElement("li");
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox"; box.name = "rank"; box.value = String(c.rank);
    const count = document.createElement("span");
    count.className = "count";
    count.textContent = "#" + c.rank + " (" + c.count + "/" + d.k + ")";
    const answer = document.createElement("pre");
    answer.textContent = c.answer;
    label.append(box, count, answer);
    li.append(label);
    list.append(li);
  }
  $("correct-answer").value = "";
  $("item").hidden = false;
}
async function next(done = "") {
  item = null;
  $("item").hidden = true;
  const task = $("task").value.trim();
  try {
    const query = task ? "?task=" + encodeURIComponent(task) : "";
    const r = await api("GET", "api/reviews/next" + query);
    if (r.status === 204) { say(done + "No items are waiting for review."); return; }
    if (!r.ok) { say("Error " + r.status + ": " + await errorText(r)); return; }
    render(await r.json());
    say(done);
  } catch (e) { say(e.message); }
}
async function send(verdict) {
  if (!item) return;
  const reviewer = $("reviewer").value.trim();
  sessionStorage.setItem("relmon-reviewer", reviewer);
  if (reviewer) verdict.reviewer = reviewer;
  try {
    const r = await api("POST", "api/reviews/" + encodeURIComponent(item.item_id), verdict);
    if (!r.ok) { say("Error " + r.status + ": " + await errorText(r)); return; }
    const d = await r.json();
    await next("Item " + item.item_id + ": " + d.status + ", score " + d.score + ". ");
  } catch (e) { say(e.message); }
}
$("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const t = $("token").value.trim();
  if (!t) return;
  sessionStorage.setItem("relmon-token", t);
  $("token").value = "";
  say("");
  showLogin(false);
  next();
});
$("accept").addEventListener("click", () => {
  const boxes = document.querySelectorAll("input[name=rank]:checked");
  const ranks = Array.from(boxes, (b) => Number(b.value));
  if (!ranks.length) { say("Select at least one candidate, or use None of these."); return; }
  send({accepted_ranks: ranks});
});
$("none").addEventListener("click", () => {
  const correct = $("correct-answer").value.trim();
  send(correct ? {none_of_these: true, correct_answer: correct} : {none_of_these: true});
});
$("refresh").addEventListener("click", () => { say(""); next(); });
document.addEventListener("keydown", (ev) => {
  if (!item || ev.target.tagName === "INPUT" || !/^[1-9]$/.test(ev.key)) return;
  const box = document.querySelector("input[name=rank][value='" + ev.key + "']");
  if (box) box.checked = !box.checked;
});
$("reviewer").value = sessionStorage.getItem("relmon-reviewer") || "";
if (token()) { showLogin(false); next(); } else { showLogin(true); }
"""


def _csp_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


REVIEW_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>relmon review</title><style>{_STYLE}</style></head>
<body><h1>relmon review</h1>
<form id="login" class="box" hidden autocomplete="off">
<label>Review token <input id="token" type="password" autocomplete="off" required></label>
<button type="submit">Use token</button>
<p class="meta">The token relmon was started with: RELMON_REVIEW_TOKEN, review.token
or review.token_file (<code>relmon demo</code> prints it at start).
Kept in this tab only (sessionStorage).</p></form>
<p id="status" role="status"></p>
<div id="review" hidden>
<div class="box"><label>Task <input id="task" type="text" placeholder="any"></label>
<label>Reviewer <input id="reviewer" type="text" placeholder="your name"></label>
<button id="refresh" type="button">Next item</button></div>
<div id="item" class="box" hidden>
<p id="meta" class="meta"></p><h2>Query</h2><pre id="query"></pre>
<h2>Candidates</h2><p class="meta">Tick every acceptable answer (keys 1&ndash;9 toggle).</p>
<ol id="candidates"></ol>
<button id="accept" type="button">Accept selected</button>
<p><label>Correct answer (optional)
<input id="correct-answer" type="text"></label>
<button id="none" type="button">None of these</button></p>
</div></div>
<script>{_SCRIPT}</script></body></html>
"""
"""The review page: HTML with its script and style inline (nothing fetched elsewhere)."""

_PAGE_HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; "
        f"style-src {_csp_hash(_STYLE)}; connect-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


if TYPE_CHECKING:
    from adapters.sqlite_store import SqliteStore

    def _reads(store: SqliteStore) -> ReviewStoreReader:
        return store  # mypy checks that the SQLite store serves the review API
