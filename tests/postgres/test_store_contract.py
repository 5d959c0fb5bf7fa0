"""One contract for every calibration store: the same tests on SQLite and on a real
PostgreSQL (a parametrised fixture), and what only a shared store must do: several
replicas writing at once, migrations that run once, the first verdict counting."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import math
import random
from dataclasses import replace
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.postgres.schema import SCHEMA_VERSION, pending_migrations
from adapters.postgres.store import PostgresStore
from monitor.core.errors import ConfigError, InputError
from monitor.core.review import Verdict
from monitor.engine.ports import Judgement
from tests.postgres import Opener, PostgresCluster
from tests.sqlite.test_sqlite_store import item, record

pytestmark = pytest.mark.timeout(300)


_databases = itertools.count()  # hypothesis seeds `random`: names come from a counter


async def test_it_is_a_calibration_store_and_a_review_queue(store: Any) -> None:
    for name in (
        "save_review_item",
        "get_review_item",
        "save_record",
        "get_record",
        "load_records",
        "recent_item_ids",
        "pending_counts",
        "submit",
        "depth",
        "next_pending",
        "get_verdict",
        "aclose",
    ):
        assert inspect.iscoroutinefunction(getattr(store, name)), name
    assert store.has_review_item("x") is False
    assert store.discard_review_item("x") is None


async def test_review_items_round_trip_and_are_idempotent(store: Any) -> None:
    original = item("a", sampled_at=12.5)
    await store.submit(original)
    await store.save_review_item(item("a", task="other"))  # a repeat is ignored
    assert await store.get_review_item("a") == original
    assert await store.get_review_item("nope") is None


async def test_queue_order_depth_and_task_filter(store: Any) -> None:
    assert await store.next_pending() is None
    assert await store.depth() == 0
    for i, task in enumerate(["qa", "triage", "qa", "triage"]):
        await store.save_review_item(item(f"i{i}", task=task))
    assert await store.depth() == 4
    assert await store.pending_counts() == {("m1", "qa"): 2, ("m1", "triage"): 2}
    assert (await store.next_pending()).item_id == "i0"
    assert (await store.next_pending("triage")).item_id == "i1"
    assert await store.next_pending("nothing") is None
    assert await store.recent_item_ids(3) == ["i1", "i2", "i3"]
    assert await store.save_record(record("i0"), Verdict("i0", accepted_ranks=(1,)))
    assert await store.depth() == 3
    assert (await store.next_pending("qa")).item_id == "i2"


async def test_the_first_verdict_counts_and_infinity_is_kept(store: Any) -> None:
    await store.submit(item("a"))
    verdict = Verdict("a", none_of_these=True, correct_answer="43", reviewer="ann")
    assert await store.save_record(record("a", score=math.inf), verdict) == (1,)
    again = Verdict("a", accepted_ranks=(1,), reviewer="bob")
    assert await store.save_record(record("a", score=1.0), again) is None
    (only,) = await store.load_records()
    assert only == replace(record("a", score=math.inf), order=(1,))
    assert await store.get_record("a") == only
    assert await store.get_verdict("a") == verdict
    assert await store.get_record("b") is None and await store.get_verdict("b") is None


async def test_invalid_records_are_refused(store: Any) -> None:
    with pytest.raises(InputError, match="rank score"):
        await store.save_record(record("a", score=math.nan), Verdict("a", accepted_ranks=(1,)))
    with pytest.raises(InputError, match="rank score"):
        await store.save_record(record("a", score=0.0), Verdict("a", accepted_ranks=(1,)))
    with pytest.raises(InputError, match="saved with"):
        await store.save_record(record("a"), Verdict("b", accepted_ranks=(1,)))
    assert await store.load_records() == []


async def test_records_load_in_the_order_they_were_applied(store: Any) -> None:
    for item_id, at in [("c", 30.0), ("a", 10.0), ("b2", 20.0), ("b1", 20.0)]:
        await store.save_record(record(item_id, sampled_at=at), Verdict(item_id, (1,)))
    loaded = await store.load_records()
    assert [r.item_id for r in loaded] == ["c", "a", "b2", "b1"]
    assert [r.order for r in loaded] == [(1,), (2,), (3,), (4,)]


async def test_an_item_saved_after_its_verdict_is_not_pending(store: Any) -> None:
    await store.save_record(record("late"), Verdict("late", (1,)))
    await store.save_review_item(item("late"))
    assert await store.depth() == 0


async def test_everything_survives_closing_and_reopening(opener: Opener) -> None:
    first = await opener()
    await first.submit(item("a"))
    await first.submit(item("b"))
    await first.save_record(record("a", score=2.0), Verdict("a", (2,)))
    await first.aclose()
    again = await opener()
    assert await again.get_review_item("b") == item("b")
    assert [r.item_id for r in await again.load_records()] == ["a"]
    assert await again.depth() == 1
    assert await again.recent_item_ids(10) == ["a", "b"]


async def test_judge_labels_are_kept_once_numbered_and_reloaded(opener: Opener) -> None:
    first = await opener()
    labels = [Judgement(f"j{i}", "m", "t", 100.0 + i, i % 3 != 0) for i in range(5)]
    seqs = [await first.save_judgement(j) for j in labels]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5 and min(seqs) > 0
    assert await first.save_judgement(replace(labels[1], acceptable=False)) == 0  # once
    await first.aclose()
    again = await opener()
    loaded = await again.load_judgements(102.0)
    assert [(j.item_id, j.acceptable) for j in loaded] == [
        ("j2", True),
        ("j3", False),
        ("j4", True),
    ]
    assert [j.seq for j in loaded] == seqs[2:]
    if hasattr(again, "judgements_after"):  # a shared store: followed in number order
        assert [j.item_id for j in await again.judgements_after(seqs[1])] == ["j2", "j3", "j4"]


# ---------------------------------------------------------------- a shared store


async def _replica(store: PostgresStore, ops: list[tuple[str, int]], seed: int) -> dict[str, Any]:
    """Write review items and verdicts in the order given, yielding to the other replica
    at random points; returns what this replica was told was stored."""
    rng = random.Random(seed)
    acked: dict[str, Any] = {"items": set(), "verdicts": {}}
    for kind, n in ops:
        item_id = f"it{n}"
        if rng.random() < 0.5:
            await asyncio.sleep(0)  # another replica's turn
        if kind == "item":
            await store.submit(item(item_id))
            acked["items"].add(item_id)
        else:
            score = float(1 + seed % 3)
            seq = await store.save_record(
                record(item_id, score=score), Verdict(item_id, (1,), reviewer=f"r{seed}")
            )
            if seq is not None:
                acked["verdicts"][item_id] = (seq, score)
    return acked


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.lists(st.tuples(st.sampled_from(["item", "verdict"]), st.integers(0, 15)), max_size=30),
        min_size=2,
        max_size=3,
    )
)
async def test_replicas_writing_at_once_lose_nothing_and_agree(
    pg_cluster: PostgresCluster, ops: list[list[tuple[str, int]]]
) -> None:
    dsn = pg_cluster.create_database(f"relmon_prop_{next(_databases)}")
    stores = [await PostgresStore.open(dsn, max_size=2) for _ in ops]
    try:
        results = await asyncio.gather(
            *(_replica(s, o, seed) for seed, (s, o) in enumerate(zip(stores, ops, strict=True)))
        )
        views = [await s.load_records() for s in stores]
        assert all(v == views[0] for v in views)  # every replica reads the same calibration
        loaded = {r.item_id: r for r in views[0]}
        seqs = [r.order[0] for r in views[0]]
        assert seqs == list(range(1, len(seqs) + 1))  # numbered without gaps, in order
        acked: dict[str, tuple[int, float]] = {}
        for result in results:
            for item_id, (seq, score) in result["verdicts"].items():
                assert item_id not in acked  # one replica's verdict was stored, once
                acked[item_id] = (seq[0], score)
        assert {k: (r.order[0], r.score) for k, r in loaded.items()} == acked  # nothing lost
        items = set().union(*(r["items"] for r in results))
        for item_id in items:
            assert await stores[0].get_review_item(item_id) == item(item_id)
        assert await stores[0].depth() == len(items - set(loaded))
        # A replica that has read up to seq n follows the others from there.
        if seqs:
            middle = seqs[len(seqs) // 2]
            assert await stores[-1].records_after(middle) == views[0][middle:]
    finally:
        for s in stores:
            await s.aclose()


async def test_replicas_starting_at_once_migrate_once(pg_cluster: PostgresCluster) -> None:
    dsn = pg_cluster.create_database("relmon_migrate_race")
    stores = await asyncio.gather(*(PostgresStore.open(dsn) for _ in range(5)))
    try:
        conn = await asyncpg.connect(dsn)
        try:
            versions = [r["version"] for r in await conn.fetch("SELECT version FROM relmon_schema")]
            assert versions == list(range(1, SCHEMA_VERSION + 1))
            assert await pending_migrations(conn) == []
        finally:
            await conn.close()
    finally:
        for s in stores:
            await s.aclose()


async def test_a_newer_database_and_a_bad_dsn_are_config_errors(
    pg_cluster: PostgresCluster,
) -> None:
    dsn = pg_cluster.create_database("relmon_newer")
    await (await PostgresStore.open(dsn)).aclose()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO relmon_schema (version) VALUES ($1)", SCHEMA_VERSION + 1)
    finally:
        await conn.close()
    with pytest.raises(ConfigError, match="newer than this relmon"):
        await PostgresStore.open(dsn)
    bad = f"postgresql://relmon:s3cret-pw@127.0.0.1:{pg_cluster.port}/no_such_database"
    with pytest.raises(ConfigError, match=r"store\.dsn: cannot connect") as info:
        await PostgresStore.open(bad)
    assert "s3cret-pw" not in str(info.value)
    assert "no_such_database" in str(info.value)


# ------------------------------------------------------------------ the review page


async def test_leases_skip_what_others_hold_and_expire(store: Any) -> None:
    for i in range(3):
        await store.submit(item(f"i{i}"))
    first = await store.lease_next(None, holder="ann", lease_s=60)
    second = await store.lease_next(None, holder="bob", lease_s=60)
    assert (first.item_id, second.item_id) == ("i0", "i1")
    again = await store.lease_next(None, holder="ann", lease_s=60)
    assert again.item_id == "i0"  # ann's own lease is renewed, not skipped
    skipped = await store.lease_next(None, holder="ann", lease_s=60, exclude=["i0"])
    assert skipped.item_id == "i2"
    assert await store.lease_next(None, holder="cy", lease_s=60) is None  # all held
    assert await store.renew_lease("i1", holder="bob", lease_s=60) is True
    assert await store.renew_lease("i1", holder="ann", lease_s=60) is False
    assert await store.release_lease("i1", "bob") is True
    assert await store.release_lease("i1", "bob") is False
    assert (await store.lease_next(None, holder="cy", lease_s=60)).item_id == "i1"
    await store.lease_item("i1", holder="dee", lease_s=-1)  # an expired lease
    assert (await store.lease_next("qa", holder="eve", lease_s=60)).item_id == "i1"


async def test_held_verdicts_undo_claim_and_counts(store: Any) -> None:
    await store.submit(item("a"))
    await store.submit(item("b"))
    verdict = Verdict("a", accepted_ranks=(1,), reviewer="ann")
    assert await store.hold_verdict(verdict, 60, holder="s1") == "held"
    assert await store.hold_verdict(Verdict("a", (2,)), 60, holder="s2") == "duplicate"
    assert (await store.held_verdict("a"))[0] == verdict
    assert await store.lease_next(None, holder="x", lease_s=60) == item("b")  # a is held
    assert await store.review_counts(0.0) == {("m1", "qa"): (0, 1, 1)}
    assert await store.undo_held("a", "s2") == "other"
    assert await store.undo_held("a", "s1") == "undone"
    assert await store.undo_held("a", "s1") == "none"
    assert await store.hold_verdict(verdict, 0, holder="s1") == "held"
    assert await store.claim_due() == [verdict]
    assert await store.undo_held("a", "s1") == "none"  # claimed: it stands
    await store.save_record(record("a"), verdict)
    await store.drop_held("a")
    assert await store.claim_due() == []
    assert await store.review_counts(0.0) == {("m1", "qa"): (1, 1, 0)}
    assert await store.hold_verdict(Verdict("a", (1,)), 60) == "duplicate"  # applied


async def test_two_replicas_never_lease_the_same_item(pg_cluster: PostgresCluster) -> None:
    dsn = pg_cluster.create_database("relmon_leases_race")
    stores = [await PostgresStore.open(dsn, max_size=4) for _ in range(2)]
    try:
        for i in range(20):
            await stores[0].submit(item(f"i{i:02d}"))
        leased = await asyncio.gather(
            *(stores[n % 2].lease_next(None, holder=f"reviewer-{n}", lease_s=60) for n in range(24))
        )
        taken = [x.item_id for x in leased if x is not None]
        assert sorted(taken) == [f"i{i:02d}" for i in range(20)]  # each once, all of them
        assert leased.count(None) == 4
    finally:
        for s in stores:
            await s.aclose()
