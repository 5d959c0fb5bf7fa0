"""The review outbox (monitor/engine/outbox.py) and its on-disk storage
(adapters/files/outbox.py): items whose review write fails wait, in order, bounded,
and are written once the queue takes writes again, across a restart too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapters.files.outbox import OUTBOX_DIR, DirectoryOutbox, open_outbox
from monitor.core.review import ReviewItem
from monitor.engine.metrics import Metrics
from monitor.engine.outbox import ReviewOutbox
from monitor.engine.ports import OutboxEntry
from tests.waiting import wait_until


def item(i: int, task: str = "arith") -> ReviewItem:
    return ReviewItem(
        item_id=f"{task}:req-{i}",
        model="sim-1",
        task=task,
        query=f"What is {i} + 1?",
        candidates=((str(i + 1), 4), (str(i), 1)),
        k=5,
        inclusion_probability=0.5,
        sampled_at=1_800_000_000.0 + i,
        thresholds=((0.1, 2.0), (0.2, float("inf"))),
    )


class Queue:
    """A review queue that refuses writes while ``down`` (keeps each id once, in the
    order it first took them, as every real queue keeps an item once by its id)."""

    def __init__(self) -> None:
        self.down = False
        self.written: list[str] = []
        self.attempts = 0

    async def submit(self, item: ReviewItem) -> None:
        self.attempts += 1
        await asyncio.sleep(0)
        if self.down:
            raise OSError("connection refused")
        if item.item_id not in self.written:
            self.written.append(item.item_id)

    async def depth(self) -> int:
        return len(self.written)


def outbox(
    queue: Queue, *, storage: DirectoryOutbox | None = None, max_items: int = 10_000
) -> tuple[ReviewOutbox, CollectorRegistry, list[str]]:
    registry = CollectorRegistry()
    dropped: list[str] = []
    box = ReviewOutbox(
        queue,
        Metrics(registry, k_max=10),
        storage=storage,
        max_items=max_items,
        name="PostgreSQL store",
        on_dropped=lambda i: dropped.append(i.item_id),
        retry_s=0.001,
        retry_max_s=0.01,
    )
    return box, registry, dropped


LABELS = {"model": "sim-1", "task": "arith"}


async def test_items_wait_in_order_and_are_written_when_the_queue_returns() -> None:
    queue = Queue()
    box, registry, dropped = outbox(queue)
    box.start()
    assert await box.submit(item(0))
    assert queue.written == ["arith:req-0"] and len(box) == 0 and box.problem() is None
    queue.down = True
    for i in range(1, 6):
        assert await box.submit(item(i))
    assert len(box) == 5 and box.counts() == {("sim-1", "arith"): 5}
    assert registry.get_sample_value("relmon_review_outbox_items", LABELS) == 5.0
    assert registry.get_sample_value("relmon_review_submit_failures_total", LABELS) == 5.0
    problem = box.problem()
    assert problem is not None and problem.startswith("PostgreSQL store not taking")
    queue.down = False
    await wait_until(lambda: len(box) == 0, timeout_s=10, what="the outbox to drain")
    assert queue.written == [f"arith:req-{i}" for i in range(6)]
    assert registry.get_sample_value("relmon_review_outbox_items", LABELS) == 0.0
    assert box.problem() is None and dropped == [] and box.written == 5
    await box.stop()


async def test_an_item_scored_while_items_wait_goes_behind_them() -> None:
    """While the outbox holds items, a new one is not written past them (even if the
    queue would take it): the queue gets the items in the order they were scored."""
    queue = Queue()
    box, _, _ = outbox(queue)  # the drainer not started: the items stay
    queue.down = True
    assert await box.submit(item(1))
    queue.down = False
    assert await box.submit(item(2))
    assert queue.written == [] and [i.item_id for i in box.items()] == [
        "arith:req-1",
        "arith:req-2",
    ]
    box.start()
    await wait_until(lambda: len(box) == 0, what="the outbox to drain")
    assert queue.written == ["arith:req-1", "arith:req-2"]
    await box.stop()


async def test_past_its_bound_the_newest_item_is_dropped_and_counted() -> None:
    queue = Queue()
    queue.down = True
    box, registry, dropped = outbox(queue, max_items=3)
    box.start()
    kept = [await box.submit(item(i)) for i in range(5)]
    assert kept == [True, True, True, False, False]
    assert dropped == ["arith:req-3", "arith:req-4"] and box.dropped == 2
    assert registry.get_sample_value("relmon_review_outbox_dropped_total", LABELS) == 2.0
    assert registry.get_sample_value("relmon_review_outbox_items", LABELS) == 3.0
    queue.down = False
    await wait_until(lambda: len(box) == 0, what="the outbox to drain")
    assert queue.written == ["arith:req-0", "arith:req-1", "arith:req-2"]
    await box.stop()


async def test_a_write_that_hangs_is_a_failure_and_the_item_waits() -> None:
    """A store that stops answering without closing its connections (SIGSTOP): the
    write times out and the item is kept, not held by the worker for ever."""

    class Hanging(Queue):
        async def submit(self, item: ReviewItem) -> None:
            self.attempts += 1
            if self.down:
                await asyncio.Event().wait()
            self.written.append(item.item_id)

    queue = Hanging()
    queue.down = True
    registry = CollectorRegistry()
    box = ReviewOutbox(queue, Metrics(registry, k_max=10), write_timeout_s=0.05, retry_s=0.01)
    assert await asyncio.wait_for(box.submit(item(1)), 5)
    assert len(box) == 1 and box.failing
    box.start()
    queue.down = False
    await wait_until(lambda: len(box) == 0, what="the outbox to drain")
    assert queue.written == ["arith:req-1"]
    await box.stop()


@settings(max_examples=60)
@given(
    schedule=st.lists(
        st.one_of(st.just("down"), st.just("up"), st.integers(1, 4)), min_size=1, max_size=40
    ),
    max_items=st.integers(1, 12),
)
def test_nothing_is_lost_under_the_bound(schedule: list[str | int], max_items: int) -> None:
    """Any order of outages, recoveries and scored items: every item is written once
    the queue returns, in the order scored, except those that came while the outbox was
    full, and exactly those are counted as dropped."""

    async def run() -> None:
        queue = Queue()
        box, registry, dropped = outbox(queue, max_items=max_items)
        box.start()
        submitted: list[str] = []
        expected_dropped: list[str] = []
        n = 0
        for step in schedule:
            if step == "down":
                queue.down = True
            elif step == "up":
                queue.down = False
            else:
                for _ in range(int(step)):
                    full = len(box) >= max_items
                    kept = await box.submit(item(n))
                    assert kept is not full
                    (submitted if kept else expected_dropped).append(f"arith:req-{n}")
                    n += 1
            await asyncio.sleep(0)
        queue.down = False
        await wait_until(lambda: len(box) == 0, timeout_s=10, what="the outbox to drain")
        assert queue.written == submitted
        assert dropped == expected_dropped
        total_dropped = registry.get_sample_value("relmon_review_outbox_dropped_total", LABELS)
        assert (total_dropped or 0.0) == len(expected_dropped)
        await box.stop()

    asyncio.run(run())


# -- on disk ---------------------------------------------------------------------------


async def test_items_on_disk_are_written_after_a_restart(tmp_path: Path) -> None:
    queue = Queue()
    queue.down = True
    opened = open_outbox(tmp_path)
    assert not isinstance(opened, str)
    storage, release = opened
    box, _, _ = outbox(queue, storage=storage)
    box.start()
    for i in range(4):
        assert await box.submit(item(i))
    assert box.durable and len(list((tmp_path / OUTBOX_DIR).glob("*.json"))) == 4
    await box.stop()  # relmon stops (or is killed) during the outage
    await release()

    queue.down = False  # the store is back when relmon starts again
    opened = open_outbox(tmp_path)
    assert not isinstance(opened, str)
    storage, release = opened
    again, registry, _ = outbox(queue, storage=storage)
    loaded = await again.load()
    assert loaded == [item(i) for i in range(4)]  # the very items, in order
    assert registry.get_sample_value("relmon_review_outbox_items", LABELS) == 4.0
    again.start()
    await wait_until(lambda: len(again) == 0, what="the loaded items to be written")
    assert queue.written == [f"arith:req-{i}" for i in range(4)]
    assert list((tmp_path / OUTBOX_DIR).glob("*.json")) == []
    # Numbers go on after the loaded ones: a new item sorts after them.
    queue.down = True
    assert await again.submit(item(9))
    assert [p.name for p in (tmp_path / OUTBOX_DIR).glob("*.json")] == ["000000000005.json"]
    await again.stop()
    await release()


async def test_an_unreadable_record_is_skipped_and_counted(tmp_path: Path) -> None:
    directory = tmp_path / OUTBOX_DIR
    directory.mkdir()
    storage = DirectoryOutbox(directory)
    for i in (1, 2, 4):
        await storage.save(OutboxEntry(i, item(i)))
    whole = (directory / "000000000004.json").read_bytes()
    (directory / "000000000004.json").write_bytes(whole[: len(whole) // 2])  # cut short
    (directory / "000000000003.json").write_text(json.dumps({"seq": 3, "item": {"k": 1}}))
    (directory / "000000000007.json").write_text(json.dumps({"seq": 8, "item": item(8).to_json()}))
    (directory / "000000000009.json.tmp").write_text("{")  # a save a crash cut short
    queue = Queue()
    box, registry, _ = outbox(queue, storage=storage)
    loaded = await box.load()
    assert [i.item_id for i in loaded] == ["arith:req-1", "arith:req-2"]
    assert registry.get_sample_value("relmon_review_outbox_unreadable_total") == 3.0
    names = sorted(p.name for p in directory.iterdir())
    assert names == [
        "000000000001.json",
        "000000000002.json",
        "000000000003.json.unreadable",
        "000000000004.json.unreadable",
        "000000000007.json.unreadable",
    ]
    box.start()
    await wait_until(lambda: len(box) == 0, what="the readable items to be written")
    assert queue.written == ["arith:req-1", "arith:req-2"]
    again, registry, _ = outbox(Queue(), storage=storage)
    assert await again.load() == []  # set aside once, not counted again
    assert registry.get_sample_value("relmon_review_outbox_unreadable_total") == 0.0
    await box.stop()


async def test_one_process_holds_the_outbox_directory(tmp_path: Path) -> None:
    opened = open_outbox(tmp_path)
    assert not isinstance(opened, str)
    second = open_outbox(tmp_path)
    assert isinstance(second, str) and "in use by another relmon" in second
    await opened[1]()
    third = open_outbox(tmp_path)
    assert not isinstance(third, str)
    await third[1]()


def test_a_state_dir_that_cannot_be_written_gives_no_outbox(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert isinstance(open_outbox(blocker), str)


async def test_a_disk_that_refuses_the_item_keeps_it_in_memory(tmp_path: Path) -> None:
    class Full(DirectoryOutbox):
        async def save(self, entry: OutboxEntry) -> None:
            raise OSError(28, "No space left on device")

    queue = Queue()
    queue.down = True
    box, _, dropped = outbox(queue, storage=Full(tmp_path))
    box.start()
    assert await box.submit(item(1)) and len(box) == 1 and dropped == []
    queue.down = False
    await wait_until(lambda: len(box) == 0, what="the outbox to drain")
    assert queue.written == ["arith:req-1"]
    await box.stop()


@pytest.mark.parametrize("n", [1, 3])
async def test_the_outbox_keeps_each_task_apart(n: int) -> None:
    queue = Queue()
    queue.down = True
    box, registry, _ = outbox(queue)
    for i in range(n):
        await box.submit(item(i, "arith"))
        await box.submit(item(i, "other"))
    assert box.counts() == {("sim-1", "arith"): n, ("sim-1", "other"): n}
    other = {"model": "sim-1", "task": "other"}
    assert registry.get_sample_value("relmon_review_outbox_items", other) == n
