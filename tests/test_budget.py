"""The call budget: its utilization (calls settled in the last minute plus calls held, /
budget) and the pace at which items start (budget.pace)."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from monitor.config import BudgetSettings
from monitor.core.events import parse_event
from monitor.core.sampler import CallBudget
from monitor.engine.service import MonitorService
from monitor.testing import FakeModelClient
from tests.test_service import event, make_service


def test_utilization_by_hand() -> None:
    budget = CallBudget(600, now=0.0)
    assert budget.utilization(0.0) == 0.0
    assert budget.try_reserve(20, 0.0)
    assert budget.utilization(0.0) == pytest.approx(20 / 600)  # held while in flight
    budget.settle(20, 7, 1.0)
    assert budget.utilization(1.0) == pytest.approx(7 / 600)  # 13 refunded
    assert budget.tokens == pytest.approx(min(600, 600 - 20 + 1.0 * 10 + 13))
    assert budget.try_reserve(20, 30.0)
    assert budget.utilization(30.0) == pytest.approx(27 / 600)
    assert budget.utilization(61.5) == pytest.approx(20 / 600)  # the first item is a minute old
    budget.refund(20, 62.0)  # an admitted item that was never run (queue full)
    assert budget.utilization(62.0) == 0.0


def test_utilization_is_capped_at_one() -> None:
    budget = CallBudget(30, now=0.0)
    assert budget.try_reserve(30, 0.0)
    budget.settle(30, 30, 0.5)
    assert budget.try_reserve(10, 20.0)  # refilled 10 in 20 s
    assert budget.utilization(20.0) == 1.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 30, allow_nan=False),  # time step
            st.integers(1, 20),  # reservation
            st.integers(0, 20),  # calls used
            st.booleans(),  # settle now (else stays in flight until the end)
        ),
        max_size=40,
    )
)
def test_utilization_matches_a_brute_force_recount(
    steps: list[tuple[float, int, int, bool]],
) -> None:
    per_minute = 200
    budget = CallBudget(per_minute, now=0.0)
    now = 0.0
    settled: list[tuple[float, int]] = []
    held: list[int] = []
    for step, reserve, asked, settle_now in steps:
        now += step
        if not budget.try_reserve(reserve, now):
            continue
        if settle_now:
            used = min(asked, reserve)
            budget.settle(reserve, used, now)
            settled.append((now, used))
        else:
            held.append(reserve)
        expected = sum(u for t, u in settled if t > now - 60.0) + sum(held)
        assert budget.utilization(now) == pytest.approx(min(1.0, expected / per_minute))
        assert 0.0 <= budget.tokens <= per_minute


async def test_service_exports_budget_utilization() -> None:
    registry = CollectorRegistry()
    service, _, _, _ = make_service(
        client=FakeModelClient(lambda q, i: "5"),
        budget=BudgetSettings(calls_per_minute=1_000, max_in_flight=1, queue_size=10),
        registry=registry,
    )
    service.publish()
    assert registry.get_sample_value("relmon_budget_utilization") == 0.0
    service.start()
    for i in range(3):
        service.offer(parse_event(event(i)), "test")
    await service.drain()
    await service.stop(1)
    service.publish()
    used = service.stats.calls
    assert used >= 3 * 3  # k0 = 3 samples at least per item
    assert registry.get_sample_value("relmon_budget_utilization") == pytest.approx(used / 1_000)


async def _first_calls(
    *, pace: bool, items: int, per_minute: int, stop_at_once: bool = False
) -> tuple[list[float], float, MonitorService, float]:
    """Offer ``items`` items at once; the event loop's time of each item's first model
    call after the offer, the pace's interval, the service, and how long draining (or a
    stop) took."""
    starts: dict[str, float] = {}

    def answer(query: str, _: int) -> str:
        starts.setdefault(query, asyncio.get_running_loop().time())
        return "5"

    service, _, _, _ = make_service(
        client=FakeModelClient(answer),
        budget=BudgetSettings(
            calls_per_minute=per_minute, max_in_flight=4, queue_size=100, pace=pace
        ),
    )
    service.start()
    offered = asyncio.get_running_loop().time()
    for i in range(items):
        assert service.offer(parse_event(event(i, i, 7)), "test").decision == "sampled"
    began = time.perf_counter()
    if stop_at_once:
        assert await service.stop(30)
    else:
        await service.drain()
        await service.stop(1)
    took = time.perf_counter() - began
    task = next(iter(service.tasks.values()))
    after = sorted(t - offered for t in starts.values())
    return after, task.fewest_calls * 60 / per_minute, service, took


async def test_paced_items_start_the_fewest_calls_apart() -> None:
    """budget.pace: items admitted at once start one per fewest_calls / rate seconds
    (6 calls at 6,000 a minute: 0.06 s), and every one is scored."""
    starts, interval, service, _ = await _first_calls(pace=True, items=5, per_minute=6_000)
    assert interval == pytest.approx(0.06)
    # The k-th item's slot is k intervals after the offer: it never starts before it (a
    # loaded machine can start one late, which shortens the gap after it, not the slot).
    assert len(starts) == 5
    assert all(t >= k * interval - 0.002 for k, t in enumerate(starts)), starts
    assert service.stats.scored == 5


async def test_unpaced_items_start_together() -> None:
    starts, interval, service, _ = await _first_calls(pace=False, items=5, per_minute=6_000)
    assert len(starts) == 5 and starts[-1] - starts[0] < interval / 2
    assert service.stats.scored == 5


async def test_a_stop_starts_the_paced_items_at_once() -> None:
    """At 600 calls a minute 8 items would take 4.2 s to start; a stop starts the waiting
    ones at once, and all are scored, none interrupted."""
    _, interval, service, took = await _first_calls(
        pace=True, items=8, per_minute=600, stop_at_once=True
    )
    assert interval == pytest.approx(0.6)
    assert took < 7 * interval / 2
    assert service.stats.scored == 8 and service.stats.interrupted == 0


async def test_items_waiting_counts_the_queued_and_the_paced() -> None:
    """relmon_items_waiting: admitted items not started, whether queued or taken by a
    worker and waiting for their turn; 0 once all have started."""
    registry = CollectorRegistry()
    service, _, _, _ = make_service(
        client=FakeModelClient(lambda q, i: "5"),
        budget=BudgetSettings(calls_per_minute=600, max_in_flight=2, queue_size=10),
        registry=registry,
    )
    service.start()
    for i in range(5):
        service.offer(parse_event(event(i, i, 7)), "test")
    await asyncio.sleep(0.1)  # the first is done; its slot's successors wait 0.6 s each
    service.publish()
    assert registry.get_sample_value("relmon_items_waiting") == 4
    assert service.workers.queue.qsize() == 2  # and each of the 2 workers holds one
    assert await service.stop(30)
    service.publish()
    assert registry.get_sample_value("relmon_items_waiting") == 0
    assert service.stats.scored == 5
