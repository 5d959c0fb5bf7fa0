"""examples/reviewer.py against a real review API (ReviewServer, ReviewPage, SQLite): the
verdicts it is given on stdin are the ones stored, an undo withdraws one, and it stops
on an empty queue."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.review.review import ReviewServer
from adapters.review.review_page import ReviewPage
from adapters.sqlite.store import SqliteStore
from monitor.core.review import Verdict
from monitor.testing import ManualClock
from tests.conftest import ROOT
from tests.review.test_review_api import TOKEN, Handler, item

SCRIPT = ROOT / "examples" / "reviewer.py"


@dataclass
class Running:
    base: str
    store: SqliteStore
    handler: Handler
    page: ReviewPage
    clock: ManualClock


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    clock = ManualClock()
    store = SqliteStore(tmp_path / "relmon.db", clock=clock)
    handler = Handler(store)
    page = ReviewPage(
        store=store, handler=handler, undo_s=60, flush_every_s=3600, clock=clock
    )  # verdicts stay held (undoable) until the test flushes them
    server = ReviewServer(store=store, handler=handler, token=TOKEN, port=0, page=page)
    await server.start()
    try:
        yield Running(f"http://127.0.0.1:{server.bound_port}", store, handler, page, clock)
    finally:
        await server.stop()
        await store.aclose()


async def reviewer(base: str, *args: str, stdin: str = "", token: str = TOKEN) -> tuple[int, str]:
    """Run the script to its end: (exit code, stdout and stderr)."""
    env = {**os.environ, "RELMON_REVIEW_TOKEN": token}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        base,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(process.communicate(stdin.encode()), timeout=60)
    return process.returncode or 0, out.decode()


async def applied(running: Running) -> dict[str, Verdict | None]:
    """Every item's verdict once the undo window has passed."""
    running.clock.advance(61)
    await running.page.flush()
    return {i: await running.store.get_verdict(i) for i in ("a", "b", "c")}


async def test_piped_answers_are_the_verdicts_stored_and_undo_withdraws_one(
    running: Running,
) -> None:
    for item_id in ("a", "b", "c"):
        await running.store.submit(item(item_id))
    # a: ranks 1 2, then undone (shown again) and judged 2; b: none, the answer is 43;
    # "x" is not understood and asked again; c: rank 1; then the queue is empty.
    answers = "1 2\nu\n2\n0 43\nx\n1\n"
    code, out = await reviewer(running.base, "--reviewer", "ann", stdin=answers)
    assert code == 0, out
    assert "undone" in out and "not understood" in out
    assert out.count("[qa] a\n") == 2  # a came back after the undo
    assert out.rstrip().endswith("nothing left to review\n3 verdict(s) given")

    assert await applied(running) == {
        "a": Verdict("a", accepted_ranks=(2,), reviewer="ann"),
        "b": Verdict("b", none_of_these=True, correct_answer="43", reviewer="ann"),
        "c": Verdict("c", accepted_ranks=(1,), reviewer="ann"),
    }
    assert [v.item_id for v in running.handler.calls] == ["a", "b", "c"]  # "1 2" never applied


async def test_skip_and_quit_leave_items_waiting(running: Running) -> None:
    for item_id in ("a", "b", "c"):
        await running.store.submit(item(item_id))
    code, out = await reviewer(running.base, stdin="s\n3\nq\n")  # skip a, b: rank 3, quit
    assert code == 0, out
    assert out.rstrip().endswith("1 verdict(s) given")
    assert await applied(running) == {
        "a": None,
        "b": Verdict("b", accepted_ranks=(3,)),
        "c": None,
    }
    # Skipped and quit items went back to the queue: another reviewer is handed them now.
    handed = [await running.store.lease_next(None, holder=who, lease_s=60) for who in "xyz"]
    assert [i.item_id if i else None for i in handed] == ["a", "c", None]


async def test_accept_top_needs_no_input(running: Running) -> None:
    for item_id in ("a", "b"):
        await running.store.submit(item(item_id))
    code, out = await reviewer(running.base, "--accept-top")
    assert code == 0, out
    verdicts = await applied(running)
    assert verdicts["a"] == Verdict("a", accepted_ranks=(1,))
    assert verdicts["b"] == Verdict("b", accepted_ranks=(1,))


async def test_a_wrong_token_stops_it_with_the_servers_reason(running: Running) -> None:
    await running.store.submit(item("a"))
    code, out = await reviewer(running.base, token="wrong")
    assert code == 1
    assert "invalid token" in out and "RELMON_REVIEW_TOKEN" in out and "wrong" not in out
    code, out = await reviewer(running.base, token="")
    assert code == 1 and "set RELMON_REVIEW_TOKEN" in out
