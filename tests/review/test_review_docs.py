"""docs/review.md, "The review API", against the server's router: every curl example
names a route the server has (with that method), and every route the server has is shown
by an example, so the document cannot drift from the code."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from adapters.review.review import ReviewServer
from adapters.review.review_page import ReviewPage
from adapters.sqlite.store import SqliteStore
from monitor.core.review import Verdict
from monitor.engine.ports import VerdictOutcome
from tests.conftest import ROOT

DOC = ROOT / "docs" / "review.md"


def curl_examples(text: str) -> list[tuple[str, str]]:
    """(method, path) of every curl command in the document's ``sh`` code blocks."""
    found = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if not words or words[0] != "curl":
                continue
            pairs = dict(itertools.pairwise(words))  # a flag -> the word after it
            data = any(f in words for f in ("-d", "--data", "--data-binary"))
            method = pairs.get("-X") or pairs.get("--request") or ("POST" if data else "GET")
            urls = [w for w in words if w.startswith("$RELMON_URL/")]
            assert len(urls) == 1, f"one $RELMON_URL address per example: {command}"
            found.append((method, urls[0].removeprefix("$RELMON_URL").split("?")[0]))
    return found


@pytest.fixture
async def app() -> AsyncIterator[web.Application]:
    store = SqliteStore(":memory:")

    async def handler(verdict: Verdict) -> VerdictOutcome:
        return VerdictOutcome("unknown")

    page = ReviewPage(store=store, handler=handler)
    try:
        yield ReviewServer(store=store, handler=handler, token="t", port=0, page=page).app()
    finally:
        await store.aclose()


def api_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, route) of the review API: every /api route and /openapi.json."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None
        and route.method != "HEAD"
        and (
            route.resource.canonical.startswith("/api/")
            or route.resource.canonical == "/openapi.json"
        )
    }


async def test_every_curl_example_names_a_route_of_the_server(app: web.Application) -> None:
    examples = curl_examples(DOC.read_text(encoding="utf-8"))
    assert len(examples) >= 10
    routes = api_routes(app)
    documented = set()
    for method, path in examples:
        match = await app.router.resolve(make_mocked_request(method, path, app=app))
        route = (match.route.method, match.route.resource.canonical if match.route.resource else "")
        assert route in routes, f"docs/review.md: {method} {path} is no route of the server"
        documented.add(route)
    assert documented == routes, f"routes without an example: {routes - documented}"


def test_the_parser_reads_methods_and_paths() -> None:
    text = (
        "```sh\ncurl -sS -X DELETE -H 'A: b' \\\n  \"$RELMON_URL/api/x/1?session=s\"\n"
        "curl -d '{}' \"$RELMON_URL/api/y\"  # a comment\necho no\n```\n"
        '```json\ncurl "$RELMON_URL/api/not-a-shell-block"\n```\n'
    )
    assert curl_examples(text) == [("DELETE", "/api/x/1"), ("POST", "/api/y")]
