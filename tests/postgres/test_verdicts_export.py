"""``relmon verdicts export|import`` on the shared PostgreSQL store: a SQLite export
imported into PostgreSQL exports again byte for byte (JSONL and CSV), with the same
records and numbers; a second import changes nothing; an import is announced to the
running replicas' followers."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from adapters.postgres.store import PostgresStore
from adapters.sqlite.store import ExportedVerdict, SqliteStore
from monitor.app.cli import main
from monitor.core.review import ReviewItem, Verdict
from tests.postgres.test_app_store import _config
from tests.review.test_verdicts_cli import _fill, _state
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


def _rows(seed: int, n: int) -> list[tuple[ReviewItem, Verdict]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        counts = sorted((rng.randint(1, 5) for _ in range(rng.randint(1, 4))), reverse=True)
        candidates = tuple((str(a), c) for a, c in enumerate(counts))
        item = ReviewItem(
            f"qa:{i}", "m1", rng.choice(["qa", "arith"]), f"=q {i}", candidates, 10,
            rng.uniform(0.05, 1.0), 1.7e9 + i,
        )  # fmt: skip
        if rng.random() < 0.3:
            verdict = Verdict(item.item_id, none_of_these=True, correct_answer="+7", reviewer="a")
        else:
            ranks = (rng.randint(1, len(candidates)),)
            verdict = Verdict(item.item_id, accepted_ranks=ranks, reviewer="b")
        rows.append((item, verdict))
    return rows


async def _pg_records(dsn: str) -> list[object]:
    store = await PostgresStore.open(dsn)
    try:
        return list(await store.load_records())
    finally:
        await store.aclose()


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_and_import_work_on_the_shared_store(
    tmp_path: Path, pg_dsn: str, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src"
    asyncio.run(_fill(source / "relmon.sqlite3", _rows(3, 15)))
    first, second = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
    export = ["verdicts", "export", "--format", fmt, "-o"]
    assert main([*export, str(first), "--state-dir", str(source)]) == 0
    config = _config(tmp_path, "pg", f"{{backend: postgres, dsn: '{pg_dsn}'}}")
    assert main(["verdicts", "import", "--config", str(config), str(first)]) == 0
    assert "imported 15 verdicts into the PostgreSQL store" in capsys.readouterr().err
    assert main([*export, str(second), "--config", str(config)]) == 0
    assert second.read_bytes() == first.read_bytes()
    sqlite_records, _ = asyncio.run(_state(source / "relmon.sqlite3"))
    assert asyncio.run(_pg_records(pg_dsn)) == sqlite_records  # numbers 1..15 as well
    # Again: every item keeps its one verdict.
    assert main(["verdicts", "import", "--config", str(config), str(first)]) == 0
    assert "imported 0 verdicts" in capsys.readouterr().err
    assert asyncio.run(_pg_records(pg_dsn)) == sqlite_records


async def test_an_import_is_announced_to_the_followers(pg_dsn: str, tmp_path: Path) -> None:
    rows = _rows(5, 4)
    source = tmp_path / "src"
    await _fill(source / "relmon.sqlite3", rows)
    store = await PostgresStore.open(pg_dsn)
    woken: list[int] = []
    listener = asyncio.create_task(store.listen(lambda: woken.append(1)))
    try:
        await wait_until(lambda: len(woken) == 1, timeout_s=10, what="the listener")
        from_sqlite = await _export_rows(source / "relmon.sqlite3")
        assert await store.import_verdicts(from_sqlite) == (4, 0)
        await wait_until(lambda: len(woken) == 2, timeout_s=10, what="the import's notice")
        assert [r.order for r in await store.records_after(0)] == [(1,), (2,), (3,), (4,)]
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await store.aclose()


async def _export_rows(path: Path) -> list[ExportedVerdict]:
    store = await SqliteStore.open(path)
    try:
        return list(await store.export_verdicts())
    finally:
        await store.aclose()
