"""The review rules every store keeps, on SQLite and on a real PostgreSQL: the first
stored verdict of an item counts, whether the review page holds it (its undo window) or
the API stores it; and one reviewer holds at most ``max_leases`` leases, on every
replica together, also when asked at once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from adapters.review.review import ReviewServer
from adapters.review.review_auth import ReviewAuth
from adapters.review.review_page import ReviewPage
from monitor.core.errors import LimitError
from monitor.core.review import Verdict
from monitor.testing import ManualClock
from tests.postgres import Opener
from tests.review.test_review_api import Handler, item
from tests.sqlite.test_sqlite_store import record

pytestmark = pytest.mark.timeout(300)

TOKENS = {"ann": "ann-token-0123456789", "bob": "bob-token-0123456789"}
SHARED = "shared-token-0123456789"


def auth(name: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {SHARED if name is None else TOKENS[name]}"}


@dataclass
class Site:
    """One replica's review server over the test's store."""

    base: str
    store: Any
    page: ReviewPage
    http: aiohttp.ClientSession

    async def post(self, item_id: str, body: object, who: str | None = None) -> tuple[int, Any]:
        url = f"{self.base}/api/reviews/{item_id}"
        async with self.http.post(url, json=body, headers=auth(who)) as r:
            return r.status, await r.json()

    async def hold(self, item_id: str, session: str, body: object) -> tuple[int, Any]:
        url = f"{self.base}/api/review-page/verdicts/{item_id}?session={session}"
        async with self.http.post(url, json=body, headers=auth()) as r:
            return r.status, await r.json()

    async def undo(self, item_id: str, session: str) -> tuple[int, Any]:
        url = f"{self.base}/api/review-page/verdicts/{item_id}?session={session}"
        async with self.http.delete(url, headers=auth()) as r:
            return r.status, await r.json()

    async def next(self, session: str, who: str | None = None) -> tuple[int, str | None]:
        url = f"{self.base}/api/reviews/next?session={session}"
        async with self.http.get(url, headers=auth(who)) as r:
            if r.status == 200:
                return 200, str((await r.json())["item_id"])
            if r.status == 429:
                assert r.headers["Retry-After"] == "60"
            return r.status, None


@asynccontextmanager
async def site(store: Any, *, max_leases: int = 20) -> AsyncIterator[Site]:
    handler = Handler(store)
    page = ReviewPage(
        store=store,
        handler=handler,
        lease_s=60,
        undo_s=10,
        flush_every_s=3600,  # the tests flush by hand
        clock=store._clock,
        max_leases=max_leases,
    )
    server = ReviewServer(
        store=store,
        handler=handler,
        port=0,
        page=page,
        auth=ReviewAuth(token=SHARED, reviewer_tokens={k: [v] for k, v in TOKENS.items()}),
    )
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield Site(f"http://127.0.0.1:{server.bound_port}", store, page, http)
    finally:
        await server.stop()


async def open_with(opener: Opener, clock: ManualClock) -> Any:
    store = await opener()
    store._clock = clock  # both stores read the time through _clock
    return store


# -- the first stored verdict counts, from the page or the API alike ---------------------


async def test_a_held_page_verdict_counts_before_a_later_api_verdict(opener: Opener) -> None:
    clock = ManualClock()
    store = await open_with(opener, clock)
    for name in ("a", "b"):
        await store.submit(item(name))
    async with site(store) as s:
        assert (await s.hold("a", "tab1", {"accepted_ranks": [2]}))[0] == 202
        # Another judgement through the API while the page's is held: 409 with it.
        status, body = await s.post("a", {"accepted_ranks": [1]}, who="bob")
        assert (status, body["verdict"]["accepted_ranks"], body["held"]) == (409, [2], True)
        assert await store.get_verdict("a") is None
        # Undone in time, the item is free: the API's next verdict is the first.
        assert (await s.undo("a", "tab1"))[0] == 200
        assert await s.post("a", {"accepted_ranks": [1]}, who="bob") == (
            200,
            {"status": "applied", "score": 1.0},
        )
        status, body = await s.hold("a", "tab1", {"accepted_ranks": [3]})
        assert (status, body["verdict"]["accepted_ranks"], body["held"]) == (409, [1], False)
        assert await s.hold("a", "tab1", {"accepted_ranks": [1]}) == (200, {"status": "duplicate"})

        # The same judgement through the API while held: it counts at once, so the
        # page's undo is too late (409), and applying the held one changes nothing.
        assert (await s.hold("b", "tab1", {"accepted_ranks": [2]}))[0] == 202
        assert (await s.post("b", {"accepted_ranks": [2]}, who="ann"))[0] == 200
        status, body = await s.undo("b", "tab1")
        assert (status, body["error"]) == (409, "too late to undo: the verdict has been applied")
        clock.advance(10)
        await s.page.flush()
        assert await store.get_verdict("b") == Verdict("b", (2,), reviewer="ann")
        assert [r.item_id for r in await store.load_records()] == ["a", "b"]


async def test_the_store_refuses_another_judgement_while_one_is_held(opener: Opener) -> None:
    store = await opener()
    await store.submit(item("a"))
    held = Verdict("a", accepted_ranks=(2,), reviewer="ann")
    assert await store.hold_verdict(held, 60, holder="s1") == "held"
    assert await store.save_record(record("a", 1.0), Verdict("a", (1,))) is None
    assert await store.get_record("a") is None
    # The held verdict itself (as the flusher applies it) is stored.
    assert await store.save_record(record("a", 2.0), held) is not None
    assert await store.undo_held("a", "s1") == "none"
    assert await store.held_verdict("a") is None  # it repeated what counts: dropped


async def test_two_replicas_racing_page_and_api_verdicts_keep_one_each(
    opener: Opener,
) -> None:
    """Page holds, undos and API verdicts at once on two replicas: every item ends with
    one verdict, and every answer agrees with it."""
    rng = random.Random(7)
    clock = ManualClock()
    stores = [await open_with(opener, clock), await open_with(opener, clock)]
    names = [f"i{n}" for n in range(12)]
    for name in names:
        await stores[0].submit(item(name))
    async with site(stores[0]) as s0, site(stores[1]) as s1:
        sites = (s0, s1)
        jobs: list[tuple[str, str, int, Any]] = []
        for name in names:
            for k in range(4):
                s, rank = rng.choice(sites), rng.randint(1, 3)
                body = {"accepted_ranks": [rank]}
                if rng.random() < 0.5:
                    jobs.append(("hold", name, rank, s.hold(name, f"t{k}", body)))
                else:
                    jobs.append(("api", name, rank, s.post(name, body, "ann")))
        answers = await asyncio.gather(*(job for *_, job in jobs))
        clock.advance(10)
        await s0.page.flush()
        for (kind, name, rank, _), (status, body) in zip(jobs, answers, strict=True):
            final = await stores[1].get_verdict(name)
            assert final is not None, name
            counted = final.accepted_ranks[0]
            if status in (200, 202):
                assert rank == counted, (kind, name, rank, status, body)
            else:
                assert status == 409 and body["verdict"]["accepted_ranks"] == [counted]
        assert sorted(r.item_id for r in await stores[0].load_records()) == sorted(names)


# -- a per-reviewer lease cap ------------------------------------------------------------


async def test_a_reviewer_holds_at_most_max_leases(opener: Opener) -> None:
    clock = ManualClock()
    store = await open_with(opener, clock)
    for n in range(6):
        await store.submit(item(f"i{n}"))

    async def take(tab: str, who: str = "ann") -> str:
        got = await store.lease_next(
            None, holder=f"page:{tab}@{who}", lease_s=60, owner=who, max_leases=3
        )
        return "" if got is None else str(got.item_id)

    assert [await take(f"t{n}") for n in range(3)] == ["i0", "i1", "i2"]  # 3 tabs, 1 count
    with pytest.raises(LimitError, match=r"review\.max_leases_per_reviewer: 3"):
        await take("t3")
    # At the cap a tab still renews what it holds; bob has his own count.
    assert await take("t0") == "i0"
    assert await take("t", who="bob") == "i3"
    # A release, a verdict and an expiry each give one back.
    assert await store.release_lease("i0", "page:t0@ann")
    assert await take("t3") == "i0"
    await store.save_record(record("i1"), Verdict("i1", (1,)))
    assert await take("t4") == "i4"
    with pytest.raises(LimitError):
        await take("t5")
    clock.advance(61)
    assert await take("t5") == "i0"


async def test_the_page_answers_429_over_the_cap(opener: Opener) -> None:
    store = await open_with(opener, ManualClock())
    for n in range(6):
        await store.submit(item(f"i{n}"))
    async with site(store, max_leases=2) as s:
        assert await s.next("t1", "ann") == (200, "i0")
        assert await s.next("t2", "ann") == (200, "i1")
        assert await s.next("t3", "ann") == (429, None)
        assert await s.next("t1", "bob") == (200, "i2")
        # Everyone on the shared token is one reviewer: two tabs, then 429.
        assert await s.next("x1") == (200, "i3")
        assert await s.next("x2") == (200, "i4")
        assert await s.next("x3") == (429, None)
        assert (await s.hold("i3", "x1", {"accepted_ranks": [1]}))[0] == 202
        assert (await s.undo("i3", "x1"))[0] == 200  # leased back: still within the cap
        assert await s.next("x3") == (429, None)
        await store.save_record(record("i5"), Verdict("i5", (1,)))
        assert await s.next("x3") == (204, None)  # at the cap with nothing left: nothing


async def test_the_cap_holds_when_many_tabs_ask_at_once_on_two_replicas(opener: Opener) -> None:
    stores = [await opener(), await opener()]
    for n in range(30):
        await stores[0].submit(item(f"i{n:02d}"))

    async def ask(n: int) -> str | None:
        try:
            got = await stores[n % 2].lease_next(
                None, holder=f"page:t{n}@ann", lease_s=60, owner="ann", max_leases=5
            )
        except LimitError:
            return None
        return None if got is None else str(got.item_id)

    taken = await asyncio.gather(*(ask(n) for n in range(24)))
    leased = [t for t in taken if t is not None]
    assert len(leased) == 5 and len(set(leased)) == 5
    bob = await stores[1].lease_next(None, holder="b", lease_s=60, owner="bob", max_leases=5)
    assert bob is not None and bob.item_id not in leased
