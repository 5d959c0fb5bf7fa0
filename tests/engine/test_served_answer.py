"""The served answer (DESIGN.md §6, "Guarantees that hold"), through the service with
fakes: a draw when the re-ask is the production request unchanged, offered for review
always, judged by the verdict, its weighted share and bound kept in the window and the
store, and its counters counted at score time."""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from adapters.sqlite.store import SqliteStore
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.conformal import reliability_lower_bound
from monitor.core.consensus import rank_classes
from monitor.core.events import parse_event
from monitor.core.review import ReviewItem, Verdict, served_acceptable, verdict_score
from monitor.core.stopping import get_stopping_rule
from monitor.core.window import CalibrationWindow
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock

K_MAX = 10
UNCHANGED = {"temperature": 0.7, "max_tokens": 64}
"""Request fields that keep the re-ask the production request (no task default applies)."""


def _service(
    client: FakeModelClient,
    store: Any = None,
    *,
    registry: CollectorRegistry | None = None,
    review_rate: float = 1.0,
    clock: ManualClock | None = None,
) -> tuple[MonitorService, Any, CollectorRegistry]:
    settings = TaskSettings(
        name="arith",
        canonicalizer="numeric",
        k_max=K_MAX,
        k0=3,
        sampling_rate=1.0,
        review_rate=review_rate,
        half_life_s=600,
        endpoint={"model": "sim-1"},
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=K_MAX, k0=3),
        client=client,
        sync_canonicalizer=canon,
    )
    store = store if store is not None else InMemoryStore()
    registry = registry or CollectorRegistry()
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(registry, k_max=K_MAX),
        budget=BudgetSettings(calls_per_minute=100_000, max_in_flight=1, queue_size=1000),
        clock=clock or ManualClock(),
    )
    return service, store, registry


def _event(i: int, served: str | None, *, temperature: float = 0.7) -> Any:
    request = {
        "model": "sim-1",
        "messages": [{"role": "user", "content": f"What is {i} + 7?"}],
        **UNCHANGED,
        "temperature": temperature,
    }
    doc: dict[str, Any] = {"id": f"req-{i}", "model": "sim-1", "task": "arith", "request": request}
    if served is not None:
        doc["response"] = {"choices": [{"message": {"role": "assistant", "content": served}}]}
    return parse_event(doc)


def _right(query: str) -> int:
    a, b = map(int, re.findall(r"\d+", query)[:2])
    return a + b


def _value(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"model": "sim-1", "task": "arith"})


async def _run(service: MonitorService, events: list[Any]) -> None:
    await service.load()
    service.start()
    for e in events:
        assert service.offer(e, "test").decision == "sampled"
    await service.drain()


async def test_an_unchanged_reask_counts_the_served_answer_as_its_first_draw() -> None:
    client = FakeModelClient(lambda q, i: f"The answer is {_right(q)}.")
    service, store, registry = _service(client)
    await _run(service, [_event(1, "It is 8.")])
    (item,) = store.items.values()
    # Unanimous: the rule certifies at its usual number of draws, one of them served.
    assert item.candidates == (("8", item.k),)
    assert item.served_rank == 1
    assert client.calls == item.k - 1
    assert service.stats.calls == item.k - 1
    assert registry.get_sample_value(
        "relmon_samples_per_item_sum", {"model": "sim-1", "task": "arith"}
    ) == float(item.k)
    assert _value(registry, "relmon_served_answers_total") == 1.0
    assert _value(registry, "relmon_served_answer_disagreements_total") == 0.0
    # The whole budget reserved for the item went back but the calls made.
    assert service.budget.utilization(service.clock.monotonic()) == pytest.approx(
        (item.k - 1) / 100_000
    )
    await service.stop(5.0)


async def test_the_stopping_rule_sees_the_served_draw_and_one_call_is_saved() -> None:
    def model(q: str, i: int) -> str:
        return f"{_right(q)}"

    with_served, without = FakeModelClient(model), FakeModelClient(model)
    s1, store1, _ = _service(with_served)
    s2, store2, _ = _service(without)
    await _run(s1, [_event(i, str(i + 7)) for i in range(20)])
    await _run(s2, [_event(i, None) for i in range(20)])
    assert [i.k for i in store1.items.values()] == [i.k for i in store2.items.values()]
    assert with_served.calls == without.calls - 20  # one call an item
    await s1.stop(5.0)
    await s2.stop(5.0)


async def test_a_changed_reask_offers_the_served_class_unranked_and_keeps_the_score() -> None:
    client = FakeModelClient(lambda q, i: f"{_right(q)}" if i % 4 else f"{_right(q) + 1}")
    service, store, registry = _service(client)
    # temperature 0 is raised: the served answer is no draw; the re-asks never say 99.
    await _run(service, [_event(1, "99", temperature=0.0)])
    (item,) = store.items.values()
    assert "temperature" in item.reask_changes
    assert client.calls == item.k
    ranked = [c for c, n in item.candidates if n > 0]
    assert item.candidates[-1] == ("99", 0)
    assert item.served_rank == len(item.candidates) == len(ranked) + 1
    assert item.consensus.classes == tuple(ranked)
    assert _value(registry, "relmon_served_answer_disagreements_total") == 1.0
    # Only the served class accepted: no ranked candidate was, the score is +inf, and the
    # verdict still says the served answer was acceptable.
    outcome = await service.apply_verdict(Verdict(item.item_id, (item.served_rank,)))
    assert outcome.status == "applied"
    assert outcome.score is not None and math.isinf(outcome.score)
    ((record, _),) = store.records.values()
    assert record.served_acceptable is True
    assert _value(registry, "relmon_served_answer_acceptable_ratio") == 1.0
    await service.stop(5.0)


async def test_a_served_class_the_reasks_drew_is_judged_by_its_rank() -> None:
    client = FakeModelClient(lambda q, i: f"{_right(q)}" if i % 3 else f"{_right(q) + 1}")
    service, store, registry = _service(client)
    await _run(service, [_event(1, "9", temperature=0.0)])  # a changed re-ask drew "9"
    (item,) = store.items.values()
    assert all(n > 0 for _, n in item.candidates)
    assert item.candidates[item.served_rank - 1][0] == "9"  # type: ignore[operator]
    right = [r for r, (c, _) in enumerate(item.candidates, 1) if c == "8"]
    await service.apply_verdict(Verdict(item.item_id, tuple(right)))
    ((record, _),) = store.records.values()
    assert record.served_acceptable is False
    assert _value(registry, "relmon_served_answer_acceptable_ratio") == 0.0
    assert _value(registry, "relmon_served_answer_acceptable_lower_bound") == 0.0
    await service.stop(5.0)


async def test_no_served_answer_no_gauges_and_counters_at_zero() -> None:
    service, store, registry = _service(FakeModelClient(lambda q, i: "8"))
    await _run(service, [_event(1, None)])
    (item,) = store.items.values()
    assert item.served_rank is None and "served_rank" not in item.to_json()
    await service.apply_verdict(Verdict(item.item_id, (1,)))
    assert _value(registry, "relmon_reliability_level") is not None
    assert _value(registry, "relmon_served_answer_acceptable_ratio") is None
    assert _value(registry, "relmon_served_answer_acceptable_lower_bound") is None
    assert _value(registry, "relmon_served_answers_total") == 0.0
    assert _value(registry, "relmon_served_answer_disagreements_total") == 0.0
    await service.stop(5.0)


def _window_of(entries: list[tuple[float, float, bool | None]]) -> CalibrationWindow:
    window = CalibrationWindow(alphas=(0.1,), half_life_s=100.0, min_inclusion_probability=0.2)
    for i, (t, pi, ok) in enumerate(entries):
        window.add(f"i{i}", 1.0, pi, t, served=ok)
    return window


def test_the_served_ratio_uses_the_levels_weights_and_a_clopper_pearson_bound() -> None:
    rng = np.random.default_rng(3)
    entries = [
        (
            1000.0 + float(rng.uniform(0, 500)),
            float(rng.choice([0.2, 0.5, 1.0])),
            None if rng.random() < 0.3 else bool(rng.random() < 0.8),
        )
        for _ in range(60)
    ]
    snap = _window_of(entries).snapshot(2000.0)
    assert snap.served is not None
    held = [(t, pi, ok) for t, pi, ok in entries if ok is not None]
    w = np.array([2.0 ** (-(2000.0 - t) / 100.0) / pi for t, pi, _ in held])
    ok = np.array([o for _, _, o in held], dtype=float)
    ratio = float((w * ok).sum() / w.sum())
    n_eff = float(w.sum() ** 2 / (w**2).sum())
    assert snap.served.n == len(held)
    assert snap.served.acceptable_ratio == pytest.approx(ratio, rel=1e-12)
    assert snap.served.n_eff == pytest.approx(n_eff, rel=1e-9)
    assert snap.served.lower_bound == pytest.approx(
        reliability_lower_bound(ratio * n_eff, n_eff, 0.05), rel=1e-9
    )
    # Path independence: the same items in another order give the same snapshot.
    again = _window_of(entries[::-1]).snapshot(2000.0)
    assert again.served == snap.served


def test_evicted_items_leave_the_served_sums() -> None:
    window = CalibrationWindow(alphas=(0.1,), max_items=2, half_life_s=None)
    window.add("a", 1.0, 1.0, 1.0, served=False)
    window.add("b", 1.0, 1.0, 2.0, served=True)
    window.add("c", 2.0, 1.0, 3.0)  # evicts "a": no served answer
    served = window.snapshot(3.0).served
    assert served is not None and (served.n, served.acceptable_ratio) == (1, 1.0)
    window.add("d", 2.0, 1.0, 4.0)  # evicts "b"
    assert window.snapshot(4.0).served is None


def _item(served: str | None) -> ReviewItem:
    consensus = rank_classes(["4", "4", "4", "5", "5"], np.random.default_rng(0))
    return ReviewItem.from_consensus(
        item_id="arith:req-1",
        model="sim-1",
        task="arith",
        query="What is 2 plus 2?",
        consensus=consensus,
        inclusion_probability=1.0,
        sampled_at=1.0,
        served=served,
    )


def test_the_served_rule_for_every_kind_of_verdict() -> None:
    canon = get_canonicalizer("numeric")
    drawn, unranked, unknown = _item("5"), _item("6"), _item(None)
    assert drawn.served_rank == 2 and unranked.served_rank == 3
    assert ReviewItem.from_json(unranked.to_json()) == unranked
    typed_5 = Verdict(drawn.item_id, none_of_these=True, correct_answer="5.0")
    typed_6 = Verdict(drawn.item_id, none_of_these=True, correct_answer="6")
    for item, verdict, canonicalizer, expected in [
        (drawn, Verdict(drawn.item_id, (2,)), None, True),
        (drawn, Verdict(drawn.item_id, (1,)), None, False),
        (drawn, typed_5, canon, True),
        (drawn, typed_5, None, False),  # unread without one, as for the score (+inf)
        (drawn, Verdict(drawn.item_id, none_of_these=True), canon, False),
        (unranked, Verdict(drawn.item_id, (3,)), None, True),
        (unranked, Verdict(drawn.item_id, (1, 2)), None, False),
        (unranked, typed_6, canon, True),
        (unranked, typed_6, None, False),  # no canonicalizer: cannot tell
        (unknown, Verdict(drawn.item_id, (1,)), canon, None),
    ]:
        score = verdict_score(item, verdict, canonicalizer)
        got = served_acceptable(item, verdict, score, canonicalizer)
        assert got is expected, (item.served_rank, verdict)
    # The unranked candidate never scores: accepting only it is +inf.
    assert math.isinf(verdict_score(unranked, Verdict(unranked.item_id, (3,))))


async def test_the_store_keeps_it_for_restarts_and_old_files_have_none(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    client = FakeModelClient(lambda q, i: f"{_right(q)}")
    clock = ManualClock()
    service, store, registry = _service(client, SqliteStore(path, clock=clock), clock=clock)
    await _run(service, [_event(i, str(i + 7 + (i % 2))) for i in range(6)])
    pending = [await store.get_review_item(f"arith:req-{i}") for i in range(6)]
    for item in pending:
        assert item is not None
        await service.apply_verdict(Verdict(item.item_id, (1,)))  # the right answer
    ratio = _value(registry, "relmon_served_answer_acceptable_ratio")
    bound = _value(registry, "relmon_served_answer_acceptable_lower_bound")
    assert ratio == pytest.approx(0.5) and bound is not None and 0 < bound < 0.5
    await service.stop(5.0)
    await store.aclose()
    # A restart rebuilds the same ratio and bound from the file.
    again, store2, registry2 = _service(client, SqliteStore(path, clock=clock), clock=clock)
    await again.load()
    assert _value(registry2, "relmon_served_answer_acceptable_ratio") == ratio
    assert _value(registry2, "relmon_served_answer_acceptable_lower_bound") == bound
    await store2.aclose()
    # A file from before the column: its verdicts have no served answer.
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE records DROP COLUMN served_acceptable")
    old, store3, registry3 = _service(client, SqliteStore(path, clock=clock), clock=clock)
    assert await old.load() == 6
    assert _value(registry3, "relmon_reliability_level") is not None
    assert _value(registry3, "relmon_served_answer_acceptable_ratio") is None
    await store3.aclose()
