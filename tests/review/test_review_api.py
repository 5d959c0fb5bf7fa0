"""The review API and page: a real ReviewServer over a real SQLite store, real clients.

The verdict handler is a small real one (score with ``verdict_score``, persist with
``save_record``), standing in for ``service.apply_verdict``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from adapters.review.review import ReviewServer
from adapters.review.review_page import ReviewPage
from adapters.sqlite.store import SqliteStore
from monitor.core.errors import ConfigError
from monitor.core.review import ReviewItem, Verdict, verdict_score
from monitor.engine.ports import CalibrationRecord, VerdictOutcome

TOKEN = "s3cret-review-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def item(item_id: str, task: str = "qa") -> ReviewItem:
    return ReviewItem(
        item_id=item_id,
        model="m1",
        task=task,
        query="<b>What</b> is 6*7?",
        candidates=(("42", 6), ("41", 3), ("40", 1)),
        k=10,
        inclusion_probability=0.5,
        sampled_at=100.0,
    )


@dataclass
class Handler:
    """Scores a verdict against its stored item and saves it, like the service does."""

    store: SqliteStore
    calls: list[Verdict] = field(default_factory=list)
    fail: bool = False

    async def __call__(self, verdict: Verdict) -> VerdictOutcome:
        self.calls.append(verdict)
        if self.fail:
            raise RuntimeError("handler broke")
        found = await self.store.get_review_item(verdict.item_id)
        if found is None:
            return VerdictOutcome("unknown")
        score = verdict_score(found, verdict)
        rec = CalibrationRecord(
            found.model, found.task, found.item_id, score, found.inclusion_probability, 0.0
        )
        applied = await self.store.save_record(rec, verdict)
        return VerdictOutcome("applied" if applied else "duplicate", score=score)


@dataclass
class Api:
    base: str
    store: SqliteStore
    handler: Handler
    http: aiohttp.ClientSession


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    store = SqliteStore(tmp_path / "relmon.db")
    handler = Handler(store)
    page = ReviewPage(store=store, handler=handler)
    server = ReviewServer(store=store, handler=handler, token=TOKEN, port=0, page=page)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield Api(f"http://127.0.0.1:{server.bound_port}", store, handler, http)
    finally:
        await server.stop()
        await store.aclose()


async def test_api_needs_the_token(api: Api) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        async with api.http.get(f"{api.base}/api/reviews/next", headers=headers) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            assert TOKEN not in await r.text()
    async with api.http.post(
        f"{api.base}/api/reviews/x", json={"accepted_ranks": [1]}, headers={}
    ) as r:
        assert r.status == 401
    async with api.http.get(f"{api.base}/api/unknown") as r:
        assert r.status == 401  # no route discovery without the token
    assert api.handler.calls == []


async def test_next_get_and_post_a_verdict(api: Api) -> None:
    async with api.http.get(f"{api.base}/api/reviews/next", headers=AUTH) as r:
        assert r.status == 204
    await api.store.submit(item("a"))
    await api.store.submit(item("b", task="triage"))

    async with api.http.get(f"{api.base}/api/reviews/next", headers=AUTH) as r:
        assert r.status == 200 and r.headers["Cache-Control"] == "no-store"
        body = await r.json()
    assert ReviewItem.from_json(body) == item("a")
    assert body["candidates"][0] == {"rank": 1, "answer": "42", "count": 6}
    async with api.http.get(f"{api.base}/api/reviews/next?task=triage", headers=AUTH) as r:
        assert (await r.json())["item_id"] == "b"

    url = f"{api.base}/api/reviews/a"
    verdict = {"accepted_ranks": [2, 1], "reviewer": "ann"}
    async with api.http.post(url, json=verdict, headers=AUTH) as r:
        assert (r.status, await r.json()) == (200, {"status": "applied", "score": 1.0})
    assert api.handler.calls == [Verdict("a", accepted_ranks=(1, 2), reviewer="ann")]
    async with api.http.post(url, json={"accepted_ranks": [3]}, headers=AUTH) as r:
        assert r.status == 409  # another judgement: the first stored one counts
        body = await r.json()
    assert body["verdict"]["accepted_ranks"] == [1, 2] and body["held"] is False
    async with api.http.post(url, json={"accepted_ranks": [1, 2]}, headers=AUTH) as r:
        assert (r.status, (await r.json())["status"]) == (200, "duplicate")  # the same

    async with api.http.get(url, headers=AUTH) as r:
        got = await r.json()
    assert got["item_id"] == "a" and got["verdict"]["accepted_ranks"] == [1, 2]
    async with api.http.get(f"{api.base}/api/reviews/b", headers=AUTH) as r:
        assert (await r.json())["verdict"] is None
    async with api.http.get(f"{api.base}/api/reviews/next", headers=AUTH) as r:
        assert (await r.json())["item_id"] == "b"  # "a" is no longer pending


async def test_none_of_these_scores_infinity(api: Api) -> None:
    await api.store.submit(item("a"))
    body = {"none_of_these": True, "correct_answer": "43"}
    async with api.http.post(f"{api.base}/api/reviews/a", json=body, headers=AUTH) as r:
        assert await r.json() == {"status": "applied", "score": "inf"}
    assert api.handler.calls[0].correct_answer == "43"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"accepted_ranks": [4]}', "above the 3 candidates"),
        (b'{"accepted_ranks": [1], "none_of_these": true}', "cannot accept"),
        (b"{}", "at least one rank"),
        (b"not json", "not valid JSON"),
        (b'{"accepted_ranks": "1"}', "list of ranks"),
    ],
)
async def test_bad_verdicts_are_400_with_one_line(api: Api, body: bytes, message: str) -> None:
    await api.store.submit(item("a"))
    async with api.http.post(f"{api.base}/api/reviews/a", data=body, headers=AUTH) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert message in error and "\n" not in error
    assert api.handler.calls == []


async def test_unknown_items_are_404(api: Api) -> None:
    async with api.http.get(f"{api.base}/api/reviews/nope", headers=AUTH) as r:
        assert r.status == 404
    body = {"accepted_ranks": [1]}
    async with api.http.post(f"{api.base}/api/reviews/nope", json=body, headers=AUTH) as r:
        assert r.status == 404
    assert api.handler.calls == []


async def test_oversize_verdicts_are_413(api: Api) -> None:
    await api.store.submit(item("a"))
    body = json.dumps({"accepted_ranks": [1], "reviewer": "x" * 70_000}).encode()

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 10_000):
            yield body[i : i + 10_000]

    for data in (body, chunked()):
        async with api.http.post(f"{api.base}/api/reviews/a", data=data, headers=AUTH) as r:
            assert r.status == 413
            assert "error" in await r.json()
    assert api.handler.calls == []


async def test_a_failing_handler_is_a_json_500(api: Api) -> None:
    await api.store.submit(item("a"))
    api.handler.fail = True
    body = {"accepted_ranks": [1]}
    async with api.http.post(f"{api.base}/api/reviews/a", json=body, headers=AUTH) as r:
        assert (r.status, await r.json()) == (500, {"error": "internal error"})


async def test_review_page_is_served_without_token_and_self_contained(api: Api) -> None:
    async with api.http.get(f"{api.base}/review") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        csp = r.headers["Content-Security-Policy"]
        page = await r.text()
    for element in ('id="token"', 'id="candidates"', 'id="submit"', 'id="none"'):
        assert element in page
    assert 'id="correct-answer"' in page and "RELMON_REVIEW_TOKEN" in page
    assert "http://" not in page and "https://" not in page
    # Only same-origin assets, and no inline code: the policy forbids it.
    # Relative to the page, so that a proxy can serve relmon under any prefix.
    assert re.findall(r'<script[^>]*src="([^"]+)"', page) == ["review/review.js"]
    assert re.findall(r'<link[^>]*href="([^"]+)"', page) == ["review/review.css"]
    assert not re.search(r"<script[^>]*>[^<\s]", page) and "<style" not in page
    assert not re.search(r"<[^>]+\son[a-z]+=", page)  # no inline event handlers
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "connect-src 'self'" in csp
    for asset, ctype in (("review.js", "text/javascript"), ("review.css", "text/css")):
        async with api.http.get(f"{api.base}/review/{asset}") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith(ctype)
            text = await r.text()
            assert r.headers["Content-Security-Policy"] == csp
        assert "http://" not in text and "https://" not in text
    async with api.http.get(f"{api.base}/review/review.js") as r:
        script = await r.text()
    assert "innerHTML" not in script and "eval(" not in script  # model text as text only
    assert "sessionStorage" in script and "Authorization" in script
    # Every request the script makes is relative to the page: no "/api/..." or "//host".
    assert re.findall(r'api\("[A-Z]+", "([^"]*)', script)
    assert all(p.startswith("api/") for p in re.findall(r'api\("[A-Z]+", "([^"]*)', script))
    assert not re.search(r'["\'`]/', script)


async def test_review_page_with_a_trailing_slash_redirects_relatively(api: Api) -> None:
    async with api.http.get(f"{api.base}/review/", allow_redirects=False) as r:
        assert r.status == 302
        assert r.headers["Location"] == "../review"  # stays under a proxy's prefix
    async with api.http.get(f"{api.base}/review/") as r:
        assert r.status == 200 and str(r.url) == f"{api.base}/review"


async def test_an_empty_token_is_refused() -> None:
    store = SqliteStore(":memory:")

    async def handler(verdict: Verdict) -> VerdictOutcome:
        return VerdictOutcome("unknown")

    try:
        for token in ("", "  "):
            with pytest.raises(ConfigError):
                ReviewServer(store=store, handler=handler, token=token, port=0)
    finally:
        await store.aclose()
