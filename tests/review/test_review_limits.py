"""Every field of a verdict has a size limit (docs/review.md, "Size limits"): over it,
the review API and the page's verdict route answer 413 naming the field, and nothing is
stored; at the limit the verdict is taken as given (no silent truncation)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from adapters.review.review import ReviewServer
from adapters.review.review_page import ReviewPage
from adapters.sqlite.store import SqliteStore
from monitor.config import TaskSettings
from monitor.core.errors import InputError, TooLargeError
from monitor.core.events import MAX_EVENT_ID_CHARS, parse_event
from monitor.core.review import (
    MAX_ACCEPTED_RANKS,
    MAX_CORRECT_ANSWER_CHARS,
    MAX_ITEM_ID_CHARS,
    MAX_REVIEWER_CHARS,
    MAX_TASK_NAME_CHARS,
    parse_verdict,
)
from tests.review.test_review_api import AUTH, TOKEN, Api, Handler, item

REVIEWER, ANSWER, RANKS, ITEM_ID = 256, 4096, 200, 1024
"""The documented limits: characters of reviewer, correct answer and item id, and
entries of accepted_ranks."""


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    store = SqliteStore(tmp_path / "relmon.db")
    handler = Handler(store)
    page = ReviewPage(store=store, handler=handler, undo_s=0)
    server = ReviewServer(store=store, handler=handler, token=TOKEN, port=0, page=page)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield Api(f"http://127.0.0.1:{server.bound_port}", store, handler, http)
    finally:
        await server.stop()
        await store.aclose()


ROUTES = {
    "api": "api/reviews/{}",
    "page": "api/review-page/verdicts/{}?session=s1",
}

OVER = [
    ("reviewer", {"accepted_ranks": [1], "reviewer": "r" * (REVIEWER + 1)}),
    ("correct_answer", {"none_of_these": True, "correct_answer": "4" * (ANSWER + 1)}),
    ("accepted_ranks", {"accepted_ranks": [1] * (RANKS + 1)}),
]


async def _post(api: Api, route: str, item_id: str, body: Any) -> tuple[int, dict[str, Any]]:
    url = f"{api.base}/" + ROUTES[route].format(item_id)
    async with api.http.post(url, data=json.dumps(body).encode(), headers=AUTH) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(("field", "body"), OVER, ids=[f for f, _ in OVER])
async def test_a_field_over_its_limit_is_413_naming_it(
    api: Api, route: str, field: str, body: dict[str, Any]
) -> None:
    await api.store.submit(item("a"))
    status, answer = await _post(api, route, "a", body)
    assert status == 413, answer
    assert field in answer["error"] and "\n" not in answer["error"]
    assert api.handler.calls == []
    assert await api.store.get_verdict("a") is None


@pytest.mark.parametrize("route", list(ROUTES))
async def test_an_item_id_over_its_limit_is_413(api: Api, route: str) -> None:
    long_id = "qa:" + "i" * (ITEM_ID - 2)
    status, answer = await _post(api, route, long_id, {"accepted_ranks": [1]})
    assert status == 413 and "item_id" in answer["error"]
    assert api.handler.calls == []


@pytest.mark.parametrize("route", list(ROUTES))
async def test_fields_at_their_limit_are_kept_whole(api: Api, route: str) -> None:
    long_id = "qa:" + "i" * (ITEM_ID - 3)
    assert len(long_id) == ITEM_ID
    await api.store.submit(item(long_id))
    await api.store.submit(item("b"))
    name = "Ada " + "x" * (REVIEWER - 4)
    status, answer = await _post(
        api, route, long_id, {"accepted_ranks": [1] * RANKS, "reviewer": name}
    )
    assert status in (200, 202), answer
    stored = await api.store.get_verdict(long_id)
    assert stored is not None and stored.reviewer == name and stored.accepted_ranks == (1,)
    answer_text = "42" * (ANSWER // 2)
    body = {"none_of_these": True, "correct_answer": answer_text, "reviewer": "Bo"}
    status, _ = await _post(api, route, "b", body)
    assert status in (200, 202)
    stored = await api.store.get_verdict("b")
    assert stored is not None and stored.correct_answer == answer_text


def test_the_limits_are_one_set_of_constants_and_every_item_id_fits() -> None:
    assert (
        MAX_REVIEWER_CHARS,
        MAX_CORRECT_ANSWER_CHARS,
        MAX_ACCEPTED_RANKS,
        MAX_ITEM_ID_CHARS,
    ) == (REVIEWER, ANSWER, RANKS, ITEM_ID)
    assert MAX_TASK_NAME_CHARS + 1 + MAX_EVENT_ID_CHARS <= MAX_ITEM_ID_CHARS
    event = {"model": "m", "request": {"messages": [{"role": "user", "content": "q"}]}}
    assert parse_event({**event, "id": "e" * MAX_EVENT_ID_CHARS}).id
    with pytest.raises(InputError, match="'id' is over the limit of 512"):
        parse_event({**event, "id": "e" * (MAX_EVENT_ID_CHARS + 1)})
    task = {"endpoint": {"base_url": "http://127.0.0.1:1/v1", "model": "m"}}
    assert TaskSettings(name="t" * MAX_TASK_NAME_CHARS, **task)
    with pytest.raises(ValidationError, match="name"):
        TaskSettings(name="t" * (MAX_TASK_NAME_CHARS + 1), **task)


def test_parse_verdict_raises_too_large_naming_the_field() -> None:
    with pytest.raises(TooLargeError, match="verdict of 70025 bytes is over the limit of 65536"):
        parse_verdict(json.dumps({"item_id": "i", "x": "y" * 70_000}).encode())
    with pytest.raises(TooLargeError, match="'reviewer' has 257 characters"):
        parse_verdict({"item_id": "i", "accepted_ranks": [1], "reviewer": "r" * 257})
    assert issubclass(TooLargeError, InputError)  # everything that refuses InputError
