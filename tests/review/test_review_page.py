"""The review page's API over a real server and SQLite store: leases and their renewal,
the undo window (held verdicts, undone only by their session), progress, and held
verdicts surviving a restart (a property)."""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.review.review import ReviewServer
from adapters.review.review_page import ReviewPage
from adapters.sqlite.store import SqliteStore
from monitor.core.review import TaskProgress, Verdict, minimum_calibration_items
from monitor.testing import ManualClock
from tests.review.test_review_api import AUTH, TOKEN, Handler, item


@dataclass
class PageApi:
    base: str
    store: SqliteStore
    handler: Handler
    page: ReviewPage
    clock: ManualClock
    http: aiohttp.ClientSession

    async def next(self, session: str, *exclude: str) -> str | None:
        query = "".join(f"&exclude={e}" for e in exclude)
        url = f"{self.base}/api/reviews/next?session={session}{query}"
        async with self.http.get(url, headers=AUTH) as r:
            return None if r.status == 204 else str((await r.json())["item_id"])

    async def hold(self, item_id: str, session: str, body: object) -> tuple[int, object]:
        url = f"{self.base}/api/review-page/verdicts/{item_id}?session={session}"
        async with self.http.post(url, json=body, headers=AUTH) as r:
            return r.status, await r.json()

    async def renew(self, item_id: str, session: str) -> tuple[int, object]:
        url = f"{self.base}/api/review-page/lease/{item_id}?session={session}"
        async with self.http.post(url, headers=AUTH) as r:
            return r.status, await r.json()

    async def undo(self, item_id: str, session: str) -> tuple[int, object]:
        url = f"{self.base}/api/review-page/verdicts/{item_id}?session={session}"
        async with self.http.delete(url, headers=AUTH) as r:
            return r.status, await r.json()


def progress() -> list[TaskProgress]:
    return [TaskProgress("m1", "qa", 3, 2.5, 9, False)]


@pytest.fixture
async def papi(tmp_path: Path) -> AsyncIterator[PageApi]:
    clock = ManualClock()
    store = SqliteStore(tmp_path / "relmon.db", clock=clock)
    handler = Handler(store)
    page = ReviewPage(
        store=store,
        handler=handler,
        progress=progress,
        lease_s=60,
        undo_s=10,
        flush_every_s=3600,  # the tests flush by hand
        clock=clock,
    )
    server = ReviewServer(store=store, handler=handler, token=TOKEN, port=0, page=page)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield PageApi(
                f"http://127.0.0.1:{server.bound_port}", store, handler, page, clock, http
            )
    finally:
        await server.stop()
        await store.aclose()


async def test_two_sessions_never_get_the_same_item_until_the_lease_expires(
    papi: PageApi,
) -> None:
    for name in ("a", "b", "c"):
        await papi.store.submit(item(name))
    assert await papi.next("tab1") == "a"
    assert await papi.next("tab2") == "b"  # "a" is leased to tab1
    assert await papi.next("tab1") == "a"  # a reload gets its own item back
    assert await papi.next("tab1", "a") == "c"  # the prefetch: the next free one
    assert await papi.next("tab2", "b") is None  # everything else is held
    papi.clock.advance(61)  # leases expire
    assert await papi.next("tab2", "b") == "a"
    async with papi.http.post(
        f"{papi.base}/api/review-page/release/a?session=tab2", headers=AUTH
    ) as r:
        assert (await r.json()) == {"released": True}
    assert await papi.next("tab3") == "a"


async def test_a_renewed_lease_keeps_the_item_from_other_sessions(papi: PageApi) -> None:
    for name in ("a", "b"):
        await papi.store.submit(item(name))
    assert await papi.next("tab1") == "a"
    for _ in range(3):  # 120 s in all, twice the lease, renewed every 40 s
        papi.clock.advance(40)
        assert await papi.renew("a", "tab1") == (200, {"renewed": True, "lease_s": 60})
    assert await papi.next("tab2") == "b"  # not "a"
    assert await papi.next("tab3") is None
    papi.clock.advance(61)  # no renewal: the leases expire
    assert await papi.next("tab3") == "a"


async def test_only_a_live_lease_of_ones_own_is_renewed(papi: PageApi) -> None:
    await papi.store.submit(item("a"))
    assert await papi.next("tab1") == "a"
    refused = {"error": "this session holds no lease on the item (expired or taken)"}
    assert await papi.renew("a", "tab2") == (409, refused)  # someone else's
    assert await papi.renew("nope", "tab1") == (409, refused)  # no such item
    assert await papi.renew("a", "tab1") == (200, {"renewed": True, "lease_s": 60})
    papi.clock.advance(60)
    assert await papi.renew("a", "tab1") == (409, refused)  # expired
    assert await papi.next("tab2") == "a"  # and free for another session
    assert await papi.renew("a", "tab1") == (409, refused)  # now tab2's
    status, body = await papi.renew("a", "")
    assert status == 400 and "session" in body["error"]  # type: ignore[index]
    async with papi.http.post(f"{papi.base}/api/review-page/lease/a?session=tab2") as r:
        assert r.status == 401  # the token is needed


async def test_an_item_reviewed_twice_keeps_the_first_verdict(papi: PageApi) -> None:
    await papi.store.submit(item("a"))
    papi.clock.advance(61)
    first = {"accepted_ranks": [2], "reviewer": "ann"}
    assert await papi.hold("a", "tab1", first) == (202, {"status": "held", "undo_s": 10})
    status, body = await papi.hold("a", "tab2", {"accepted_ranks": [1], "reviewer": "bob"})
    assert (status, body["verdict"]["accepted_ranks"], body["held"]) == (409, [2], True)  # type: ignore[index]
    assert await papi.hold("a", "tab3", {"accepted_ranks": [2]}) == (200, {"status": "duplicate"})
    papi.clock.advance(10)
    assert await papi.page.flush() == 1
    assert await papi.store.get_verdict("a") == Verdict("a", accepted_ranks=(2,), reviewer="ann")
    # Through the plain API too: another judgement is refused, the first stays.
    async with papi.http.post(
        f"{papi.base}/api/reviews/a", json={"none_of_these": True}, headers=AUTH
    ) as r:
        assert r.status == 409 and (await r.json())["held"] is False
    assert await papi.hold("a", "tab2", first) == (200, {"status": "duplicate"})
    assert (await papi.store.get_verdict("a")) == Verdict("a", (2,), reviewer="ann")


async def test_undo_within_the_window_and_not_after(papi: PageApi) -> None:
    for name in ("a", "b"):
        await papi.store.submit(item(name))
    assert await papi.next("tab1") == "a"
    assert (await papi.hold("a", "tab1", {"accepted_ranks": [1], "reviewer": "ann"}))[0] == 202
    assert await papi.next("tab2") == "b"  # a held item is not handed out
    papi.clock.advance(5)
    assert await papi.page.flush() == 0  # not due yet
    status, body = await papi.undo("a", "tab1")
    assert status == 200 and body["status"] == "undone"  # type: ignore[index]
    assert body["item"]["item_id"] == "a"  # type: ignore[index]
    assert await papi.store.get_verdict("a") is None and papi.handler.calls == []
    assert await papi.next("tab3") is None  # "a" is leased back to tab1, "b" to tab2
    assert await papi.next("tab1") == "a"

    assert (await papi.hold("a", "tab1", {"none_of_these": True, "reviewer": "ann"}))[0] == 202
    papi.clock.advance(10)
    assert await papi.page.flush() == 1
    assert await papi.undo("a", "tab1") == (
        409,
        {"error": "too late to undo: the verdict has been applied"},
    )
    assert (await papi.store.get_verdict("a")) == Verdict("a", none_of_these=True, reviewer="ann")
    assert [v.item_id for v in papi.handler.calls] == ["a"]


async def test_only_the_session_that_gave_a_verdict_can_undo_it(papi: PageApi) -> None:
    await papi.store.submit(item("a"))
    assert await papi.next("tab1") == "a"
    assert (await papi.hold("a", "tab1", {"accepted_ranks": [2], "reviewer": "ann"}))[0] == 202
    assert await papi.undo("a", "tab2") == (
        403,
        {"error": "this verdict was given in another session; it stands"},
    )
    assert await papi.next("tab2") is None  # still held: not handed out again
    papi.clock.advance(10)
    assert await papi.page.flush() == 1
    assert await papi.store.get_verdict("a") == Verdict("a", (2,), reviewer="ann")


async def test_bad_page_requests_are_clear_errors(papi: PageApi) -> None:
    await papi.store.submit(item("a"))
    assert (await papi.hold("nope", "t", {"accepted_ranks": [1]}))[0] == 404
    status, body = await papi.hold("a", "t", {"accepted_ranks": [4]})
    assert status == 400 and "rank" in body["error"]  # type: ignore[index]
    status, body = await papi.hold("a", "t", {"accepted_ranks": [1], "none_of_these": True})
    assert status == 400
    async with papi.http.post(
        f"{papi.base}/api/review-page/verdicts/a", json={"accepted_ranks": [1]}, headers=AUTH
    ) as r:
        assert r.status == 400 and "session" in (await r.json())["error"]
    url = f"{papi.base}/api/review-page/verdicts/a?session={'x' * 65}"
    async with papi.http.post(url, json={"accepted_ranks": [1]}, headers=AUTH) as r:
        assert r.status == 400
    async with papi.http.delete(
        f"{papi.base}/api/review-page/verdicts/a?session=t", headers={}
    ) as r:
        assert r.status == 401  # the page's API needs the token too
    assert await papi.undo("a", "t") == (
        409,
        {"error": "too late to undo: the verdict has been applied"},
    )
    assert papi.handler.calls == []


async def test_progress_counts_today_waiting_and_calibration(papi: PageApi) -> None:
    for name in ("a", "b", "c"):
        await papi.store.submit(item(name))
    await papi.store.submit(item("t", task="triage"))
    await papi.hold("a", "s", {"accepted_ranks": [1]})
    papi.clock.advance(10)
    await papi.page.flush()
    await papi.hold("b", "s", {"accepted_ranks": [1]})  # held: neither waiting nor done
    async with papi.http.get(f"{papi.base}/api/review-page/progress", headers=AUTH) as r:
        body = await r.json()
    assert body["undo_s"] == 10 and body["lease_s"] == 60
    assert body["tasks"] == [
        {
            "model": "m1",
            "task": "qa",
            "calibration_items": 3,
            "effective_items": 2.5,
            "minimum_items": 9,
            "threshold_finite": False,
            "reviewed_today": 1,
            "waiting": 1,
            "held": 1,
        },
        {
            "model": "m1",
            "task": "triage",
            "calibration_items": 0,
            "effective_items": 0.0,
            "minimum_items": 0,
            "threshold_finite": False,
            "reviewed_today": 0,
            "waiting": 1,
            "held": 0,
        },
    ]
    papi.clock.advance(86_400)  # tomorrow: nothing reviewed today yet
    async with papi.http.get(f"{papi.base}/api/review-page/progress", headers=AUTH) as r:
        assert (await r.json())["tasks"][0]["reviewed_today"] == 0
    papi.clock.advance(10)  # b's undo window has passed: applied, no longer held
    await papi.page.flush()
    async with papi.http.get(f"{papi.base}/api/review-page/progress", headers=AUTH) as r:
        qa = (await r.json())["tasks"][0]
    assert (qa["reviewed_today"], qa["held"], qa["waiting"]) == (1, 0, 1)


@pytest.mark.parametrize("alpha", [0.5, 0.2, 0.1, 0.05, 0.01, 0.3, 0.15, 0.07])
def test_minimum_calibration_items_is_the_first_finite_threshold(alpha: float) -> None:
    from monitor.core.conformal import conformal_threshold

    n = minimum_calibration_items(alpha)
    # Independently: the smallest n whose plain conformal threshold is finite.
    first = next(m for m in range(1, 1000) if math.isfinite(conformal_threshold([1.0] * m, alpha)))
    assert n == first


# -- held verdicts against a model, with restarts at random points -----------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("hold"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("direct"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("undo"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("undo_other"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("advance"), st.integers(0, 15), st.just(0)),
        st.tuples(st.just("flush"), st.just(0), st.just(0)),
        st.tuples(st.just("restart"), st.just(0), st.just(0)),
    ),
    max_size=25,
)


async def _run_against_model(path: Path, ops: list[tuple[str, int, int]]) -> None:
    clock = ManualClock()
    store = SqliteStore(path, clock=clock)
    names = [f"i{n}" for n in range(4)]
    for name in names:
        await store.submit(item(name))
    undo_s = 10.0
    applied: dict[str, int] = {}  # item -> accepted rank of its (first) verdict
    held: dict[str, tuple[int, float]] = {}  # item -> (rank, due)

    def make_page() -> tuple[ReviewPage, Handler]:
        handler = Handler(store)
        return ReviewPage(store=store, handler=handler, undo_s=undo_s, clock=clock), handler

    page, handler = make_page()
    try:
        for op, i, rank in ops:
            name = names[i % len(names)]
            if op == "hold":
                status = await store.hold_verdict(Verdict(name, (rank,)), undo_s, holder="s")
                expected = "duplicate" if name in applied or name in held else "held"
                assert status == expected
                if expected == "held":
                    held[name] = (rank, clock.time() + undo_s)
            elif op == "direct":  # the plain API, while a page verdict may be held
                await handler(Verdict(name, (rank,)))
                if name not in held or held[name][0] == rank:  # a held one counts first
                    applied.setdefault(name, rank)
            elif op == "undo":  # too late once the verdict counts (the same, by the API)
                counted = name in held and name not in applied
                assert await store.undo_held(name, "s") == ("undone" if counted else "none")
                held.pop(name, None)
            elif op == "undo_other":  # another session: refused, the verdict stands
                if name in held and name in applied:  # the held one repeats what counts
                    assert await store.undo_held(name, "t") == "none"
                    held.pop(name)
                else:
                    assert await store.undo_held(name, "t") == ("other" if name in held else "none")
            elif op == "advance":
                clock.advance(i)
            elif op == "flush":
                await page.flush()
                for due_name, (r, due) in sorted(held.items(), key=lambda kv: kv[1][1]):
                    if due <= clock.time():
                        applied.setdefault(due_name, r)
                        del held[due_name]
            else:
                await store.aclose()
                store = SqliteStore(path, clock=clock)
                page, handler = make_page()
            for name in names:
                verdict = await store.get_verdict(name)
                got = None if verdict is None else verdict.accepted_ranks[0]
                assert got == applied.get(name)
                found = await store.held_verdict(name)
                assert (None if found is None else (found[0].accepted_ranks[0], found[1])) == (
                    held.get(name)
                )
            records = await store.load_records()
            assert sorted(r.item_id for r in records) == sorted(applied)
            assert all(r.score == applied[r.item_id] for r in records)
        # In the end every held verdict is applied, whatever happened before.
        clock.advance(undo_s)
        await page.flush()
        for name, (r, _) in held.items():
            applied.setdefault(name, r)
        assert {r.item_id: r.score for r in await store.load_records()} == applied
    finally:
        await store.aclose()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_held_verdicts_match_a_model_across_restarts(ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_run_against_model(Path(tmp) / "relmon.db", ops))
