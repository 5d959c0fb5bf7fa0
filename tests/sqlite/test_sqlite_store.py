"""The SQLite calibration store and review queue, on real files in tmp_path.

Round trips, idempotency, ordering, queue depth, reopening, and a process killed with
SIGKILL right after it was told N records were saved: all N are there afterwards.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from adapters.sqlite.store import SCHEMA_VERSION, SqliteStore, StoreError
from monitor.core.errors import ConfigError, InputError
from monitor.core.review import ReviewItem, Verdict
from monitor.engine.ports import CalibrationRecord, CalibrationStore, ReviewQueue

ROOT = Path(__file__).resolve().parents[2]


def item(item_id: str, task: str = "qa", model: str = "m1", sampled_at: float = 0.0) -> ReviewItem:
    return ReviewItem(
        item_id=item_id,
        model=model,
        task=task,
        query="What is 6*7?",
        candidates=(("42", 7), ("41", 2), ("INVALID", 1)),
        k=10,
        inclusion_probability=0.25,
        sampled_at=sampled_at,
    )


def record(item_id: str, score: float = 1.0, sampled_at: float = 0.0) -> CalibrationRecord:
    return CalibrationRecord(
        model="m1",
        task="qa",
        item_id=item_id,
        score=score,
        inclusion_probability=0.25,
        sampled_at=sampled_at,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(tmp_path / "state" / "relmon.db")
    try:
        yield s
    finally:
        await s.aclose()


async def test_it_is_a_calibration_store_and_a_review_queue(store: SqliteStore) -> None:
    # The protocols are not runtime-checkable; mypy checks the signatures in the module.
    for protocol in (CalibrationStore, ReviewQueue):
        for name in ("save_review_item", "get_review_item", "save_record", "load_records"):
            if hasattr(protocol, name):
                assert inspect.iscoroutinefunction(getattr(store, name))
    assert inspect.iscoroutinefunction(store.submit)
    assert inspect.iscoroutinefunction(store.depth)


async def test_review_items_round_trip(store: SqliteStore) -> None:
    original = item("a", sampled_at=12.5)
    await store.submit(original)
    assert await store.get_review_item("a") == original
    assert await store.get_review_item("nope") is None


async def test_queue_order_depth_and_task_filter(store: SqliteStore) -> None:
    assert await store.next_pending() is None
    assert await store.depth() == 0
    for i, task in enumerate(["qa", "triage", "qa", "triage"]):
        await store.save_review_item(item(f"i{i}", task=task))
    await store.save_review_item(item("i0", task="other"))  # a repeat is ignored
    assert (await store.get_review_item("i0")).task == "qa"  # type: ignore[union-attr]
    assert await store.depth() == 4
    assert await store.pending_counts() == {("m1", "qa"): 2, ("m1", "triage"): 2}
    assert (await store.next_pending()).item_id == "i0"  # type: ignore[union-attr]
    assert (await store.next_pending("triage")).item_id == "i1"  # type: ignore[union-attr]
    assert await store.next_pending("nothing") is None

    assert await store.save_record(record("i0"), Verdict("i0", accepted_ranks=(1,)))
    assert await store.depth() == 3
    assert (await store.next_pending()).item_id == "i1"  # type: ignore[union-attr]
    assert (await store.next_pending("qa")).item_id == "i2"  # type: ignore[union-attr]


async def test_records_are_idempotent_and_keep_infinity(store: SqliteStore) -> None:
    await store.submit(item("a"))
    verdict = Verdict("a", none_of_these=True, correct_answer="43", reviewer="ann")
    assert await store.save_record(record("a", score=math.inf), verdict) == (1,)
    again = Verdict("a", accepted_ranks=(1,), reviewer="bob")
    assert await store.save_record(record("a", score=1.0), again) is None
    (only,) = await store.load_records()
    assert only == replace(record("a", score=math.inf), order=(1,))
    assert await store.get_record("a") == only  # the first verdict's score stays
    assert await store.get_record("b") is None
    assert await store.get_verdict("a") == verdict  # the first verdict stays
    assert await store.get_verdict("b") is None


async def test_invalid_records_are_refused(store: SqliteStore) -> None:
    with pytest.raises(InputError, match="rank score"):
        await store.save_record(record("a", score=math.nan), Verdict("a", accepted_ranks=(1,)))
    with pytest.raises(InputError, match="rank score"):
        await store.save_record(record("a", score=0.0), Verdict("a", accepted_ranks=(1,)))
    with pytest.raises(InputError, match="saved with"):
        await store.save_record(record("a"), Verdict("b", accepted_ranks=(1,)))
    assert await store.load_records() == []


async def test_records_load_in_the_order_they_were_applied(store: SqliteStore) -> None:
    """One order for the window: the verdicts' numbers, not their sampling times."""
    for item_id, at in [("c", 30.0), ("a", 10.0), ("b2", 20.0), ("b1", 20.0)]:
        await store.save_record(record(item_id, sampled_at=at), Verdict(item_id, (1,)))
    loaded = await store.load_records()
    assert [r.item_id for r in loaded] == ["c", "a", "b2", "b1"]
    assert [r.order for r in loaded] == [(1,), (2,), (3,), (4,)]


async def test_a_schema_1_file_is_numbered_in_its_old_reload_order(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL);"
            "INSERT INTO schema_version VALUES (1);"
            "CREATE TABLE records (item_id TEXT PRIMARY KEY, model TEXT NOT NULL, "
            "task TEXT NOT NULL, score REAL, inclusion_probability REAL NOT NULL, "
            "sampled_at REAL NOT NULL, verdict TEXT NOT NULL, applied_at REAL NOT NULL);"
        )
        for item_id, at in [("c", 30.0), ("a", 10.0), ("b2", 20.0), ("b1", 20.0)]:
            conn.execute(
                "INSERT INTO records VALUES (?, 'm1', 'qa', 1, 1.0, ?, '{}', 0)", (item_id, at)
            )
    conn.close()
    store = SqliteStore(path)
    try:
        loaded = await store.load_records()
        assert [r.item_id for r in loaded] == ["a", "b2", "b1", "c"]
        assert [r.order for r in loaded] == [(1,), (2,), (3,), (4,)]
        assert await store.save_record(record("d"), Verdict("d", (1,))) == (5,)
    finally:
        await store.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    conn.close()


SCHEMA_2_RECORDS = (
    "CREATE TABLE records (item_id TEXT PRIMARY KEY, model TEXT NOT NULL, "
    "task TEXT NOT NULL, score REAL, inclusion_probability REAL NOT NULL, "
    "sampled_at REAL NOT NULL, verdict TEXT NOT NULL, applied_at REAL NOT NULL, seq INTEGER);"
    "CREATE UNIQUE INDEX records_by_seq ON records (seq);"
)
"""The records table exactly as schema 2 created it (before ``aci_miss``)."""


async def test_a_schema_2_file_gets_aci_miss_null_and_keeps_its_order(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL);"
            "INSERT INTO schema_version VALUES (2);" + SCHEMA_2_RECORDS
        )
        for seq, (item_id, score) in enumerate([("b", None), ("a", 2.0)], start=1):
            conn.execute(
                "INSERT INTO records VALUES (?, 'm1', 'qa', ?, 0.25, 0.0, '{}', 0, ?)",
                (item_id, score, seq),
            )
    conn.close()
    store = SqliteStore(path)
    try:
        loaded = await store.load_records()
        assert [(r.item_id, r.score, r.order, r.aci_miss) for r in loaded] == [
            ("b", math.inf, (1,), None),
            ("a", 2.0, (2,), None),
        ]
        for item_id, miss in [("c", True), ("d", False)]:
            saved = replace(record(item_id), aci_miss=miss)
            assert await store.save_record(saved, Verdict(item_id, (1,))) is not None
        assert [r.aci_miss for r in await store.load_records()] == [None, None, True, False]
        assert (await store.get_record("c")) == replace(record("c"), order=(3,), aci_miss=True)
    finally:
        await store.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("SELECT item_id, aci_miss FROM records ORDER BY seq").fetchall() == [
            ("b", None),
            ("a", None),
            ("c", 1),
            ("d", 0),
        ]
    conn.close()


async def test_a_verdict_held_before_the_holder_column_is_applied_not_undone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "held.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE held_verdicts (item_id TEXT PRIMARY KEY, verdict TEXT NOT NULL, "
            "held_at REAL NOT NULL, due REAL NOT NULL, claimed INTEGER NOT NULL DEFAULT 0);"
        )
        verdict = json.dumps(Verdict("a", (1,)).to_json())
        conn.execute("INSERT INTO held_verdicts VALUES ('a', ?, 0, 0, 0)", (verdict,))
    conn.close()
    store = SqliteStore(path)
    try:
        await store.submit(item("a"))
        assert await store.undo_held("a", "page:s") == "other"  # nobody may undo it
        assert await store.claim_due() == [Verdict("a", (1,))]
    finally:
        await store.aclose()


async def test_a_schema_1_file_gets_both_seq_and_aci_miss(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL);"
            "INSERT INTO schema_version VALUES (1);"
            "CREATE TABLE records (item_id TEXT PRIMARY KEY, model TEXT NOT NULL, "
            "task TEXT NOT NULL, score REAL, inclusion_probability REAL NOT NULL, "
            "sampled_at REAL NOT NULL, verdict TEXT NOT NULL, applied_at REAL NOT NULL);"
            "INSERT INTO records VALUES ('x', 'm1', 'qa', 1, 1.0, 5.0, '{}', 0);"
        )
    conn.close()
    store = SqliteStore(path)
    try:
        assert [(r.order, r.aci_miss) for r in await store.load_records()] == [((1,), None)]
    finally:
        await store.aclose()


async def test_an_item_saved_after_its_verdict_is_not_pending(store: SqliteStore) -> None:
    await store.save_record(record("late"), Verdict("late", accepted_ranks=(2,)))
    await store.save_review_item(item("late"))
    assert await store.depth() == 0 and await store.next_pending() is None


async def test_everything_survives_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "relmon.db"
    first = SqliteStore(path)
    await first.submit(item("a"))
    await first.submit(item("b"))
    await first.save_record(record("a", score=2.0, sampled_at=5.0), Verdict("a", (2,)))
    await first.aclose()
    await first.aclose()  # closing twice is fine
    with pytest.raises(StoreError, match="closed"):
        await first.depth()

    second = SqliteStore(path)
    try:
        assert await second.get_review_item("a") == item("a")
        assert await second.depth() == 1
        assert (await second.next_pending()).item_id == "b"  # type: ignore[union-attr]
        assert await second.load_records() == [
            replace(record("a", score=2.0, sampled_at=5.0), order=(1,))
        ]
        assert await second.get_verdict("a") == Verdict("a", (2,))
    finally:
        await second.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    conn.close()


async def test_memory_store_works() -> None:
    s = SqliteStore(":memory:")
    try:
        await s.submit(item("a"))
        assert await s.depth() == 1
    finally:
        await s.aclose()


def test_bad_files_and_newer_schemas_are_config_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match="cannot open"):
        SqliteStore(junk)
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
    conn.close()
    with pytest.raises(ConfigError, match="newer"):
        SqliteStore(newer)


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from adapters.sqlite.store import SqliteStore
    from monitor.engine.ports import CalibrationRecord
    from monitor.core.review import Verdict

    async def main(path):
        store = SqliteStore(path)
        i = 0
        while True:  # until killed
            rec = CalibrationRecord("m1", "qa", f"r{i}", 1.0 + i % 3, 0.5, float(i))
            await store.save_record(rec, Verdict(f"r{i}", accepted_ranks=(1,)))
            print(f"ack {i}", flush=True)
            i += 1

    asyncio.run(main(sys.argv[1]))
    """
)


def _write_until_killed(path: Path, wanted: int) -> tuple[int, int, str]:
    """Run the writer, SIGKILL it once it acknowledged ``wanted`` records."""
    acked = 0
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            assert line.startswith(b"ack ")
            acked = int(line.split()[1]) + 1
            if acked >= wanted:
                break
        proc.send_signal(signal.SIGKILL)  # most likely in the middle of the next write
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
    return acked, proc.returncode, stderr


@pytest.mark.integration  # a writer process killed with -9
async def test_acknowledged_records_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    acked, returncode, stderr = await asyncio.to_thread(_write_until_killed, path, 200)
    assert acked == 200, stderr
    assert returncode == -signal.SIGKILL
    store = SqliteStore(path)
    try:
        ids = {r.item_id for r in await store.load_records()}
    finally:
        await store.aclose()
    assert {f"r{i}" for i in range(acked)} <= ids
