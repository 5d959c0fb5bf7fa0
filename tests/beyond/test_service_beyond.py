"""Service wiring: the live self-check counters, the alarm gauges, ACI and prioritised
review, each checked against an independent computation from the same verdicts."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from monitor.config import BudgetSettings, TaskSettings
from monitor.core.alarm import EDetector
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.conformal import weighted_threshold
from monitor.core.events import parse_event
from monitor.core.review import ReviewItem, Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock

LABELS = {"model": "sim-1", "task": "arith"}


def noisy_model(seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)

    def answer(query: str, call: int) -> str:
        a, b = map(int, re.findall(r"\d+", query)[:2])
        right = a + b
        # the right answer, an off-by-one, or an off-by-ten: ranks 1..3 vary per item
        return str(rng.choice([right, right + 1, right + 10], p=[0.55, 0.3, 0.15]))

    return answer


def make(
    store: InMemoryStore | None = None, **options: Any
) -> tuple[MonitorService, InMemoryStore, CollectorRegistry]:
    settings = TaskSettings(
        name="arith",
        canonicalizer="numeric",
        k_max=10,
        k0=3,
        sampling_rate=1.0,
        review_rate=options.pop("review_rate", 1.0),
        half_life_s=None,
        alphas=[0.1, 0.3],
        reliability_target=options.pop("reliability_target", 0.8),
        endpoint={"model": "sim-1"},
        **options,
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule("fixed", k_max=10, k0=3),
        client=FakeModelClient(noisy_model()),
        sync_canonicalizer=canon,
    )
    store = store or InMemoryStore()
    registry = CollectorRegistry()
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(registry, k_max=10),
        budget=BudgetSettings(calls_per_minute=1_000_000, max_in_flight=1, queue_size=500),
        clock=ManualClock(),
    )
    return service, store, registry


def event(i: int) -> dict[str, object]:
    return {
        "id": f"req-{i}",
        "model": "sim-1",
        "task": "arith",
        "request": {"messages": [{"role": "user", "content": f"What is {i} + 7?"}]},
    }


def truthful(item: ReviewItem) -> Verdict:
    a, b = map(int, re.findall(r"\d+", item.query)[:2])
    ranks = [i + 1 for i, (c, _) in enumerate(item.candidates) if c == str(a + b)]
    return (
        Verdict(item.item_id, tuple(ranks)) if ranks else Verdict(item.item_id, none_of_these=True)
    )


async def run_round(
    service: MonitorService, store: InMemoryStore, ids: range
) -> list[tuple[ReviewItem, float]]:
    for i in ids:
        assert service.offer(parse_event(event(i)), "test").decision == "sampled"
    await service.drain()
    out = []
    for item in [store.items[f"arith:req-{i}"] for i in ids if f"arith:req-{i}" in store.items]:
        outcome = await service.apply_verdict(truthful(item))
        assert outcome.status == "applied" and outcome.score is not None
        out.append((item, outcome.score))
    return out


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, {**LABELS, **labels})
    assert v is not None, (name, labels)
    return v


async def test_self_check_counts_misses_against_the_threshold_in_force() -> None:
    service, store, registry = make()
    await service.load()
    service.start()
    first = await run_round(service, store, range(30))
    # the window was empty: every threshold in force was +inf (the full set)
    assert all(dict(item.thresholds)[0.1] == math.inf for item, _ in first)
    second = await run_round(service, store, range(30, 90))
    await service.stop(5)
    scores1 = [s for _, s in first]
    expected_thr = {a: weighted_threshold(scores1, np.ones(30), a) for a in (0.1, 0.2, 0.3)}
    assert all(dict(item.thresholds) == expected_thr for item, _ in second)
    scores2 = np.array([s for _, s in second])
    for alpha, thr in expected_thr.items():
        label = f"{alpha:g}"
        assert value(registry, "relmon_coverage_checks_total", alpha=label) == 90
        assert value(registry, "relmon_coverage_misses_total", alpha=label) == int(
            (scores2 > thr).sum()
        )
    assert (scores2 > expected_thr[0.3]).sum() > 0  # the test can fail


async def test_alarm_gauges_follow_the_detector_and_survive_a_restart() -> None:
    service, store, registry = make(reliability_target=0.97)
    await service.load()
    service.start()
    applied = await run_round(service, store, range(60))
    await service.stop(5)
    det = EDetector(tau=0.97, alpha=0.001, pi_min=1.0)
    for _, score in applied:
        det.update(score <= 1, 1.0)
    assert value(registry, "relmon_reliability_alarm_evalue") == pytest.approx(det.value)
    assert value(registry, "relmon_reliability_alarm") == (1.0 if det.alarm else 0.0)
    # the top answer is right on ~85% of items, against a target of 97%: alarm up
    assert np.mean([s <= 1 for _, s in applied]) < 0.92
    assert det.alarm
    again, _, registry2 = make(store, reliability_target=0.97)
    await again.load()
    v2 = registry2.get_sample_value("relmon_reliability_alarm_evalue", LABELS)
    assert v2 == pytest.approx(det.value)


async def test_aci_alpha_follows_the_misses_of_its_own_thresholds() -> None:
    service, store, _ = make(aci_gamma=0.05)
    await service.load()
    service.start()
    applied = await run_round(service, store, range(80))
    await service.stop(5)
    alpha = 0.2  # 1 - reliability_target
    a = alpha
    for item, score in applied:
        assert item.aci_threshold is not None
        a = a + 0.05 * (alpha - float(score > item.aci_threshold))
    assert service.aci_alpha("sim-1", "arith") == pytest.approx(a)
    assert a != alpha


async def test_prioritised_review_probabilities_come_from_the_margin() -> None:
    service, store, registry = make(
        review_rate=0.9, review_priority="uncertainty", review_min_rate=0.1
    )
    await service.load()
    service.start()
    applied = await run_round(service, store, range(150))
    await service.stop(5)
    assert 20 < len(applied) < 150
    total = 0.0
    for item, _score in applied:
        c = item.consensus
        expected = 0.1 + 0.8 * (1 - c.margin)
        assert item.inclusion_probability == pytest.approx(expected)
        total += 1 / item.inclusion_probability
    checks = value(registry, "relmon_coverage_checks_total", alpha="0.1")
    assert checks == pytest.approx(total)  # weighted 1/pi like the SLI


def test_review_item_json_round_trip_keeps_thresholds() -> None:
    item = ReviewItem(
        item_id="t:1",
        model="m",
        task="t",
        query="q",
        candidates=(("a", 3), ("b", 1)),
        k=4,
        inclusion_probability=0.5,
        sampled_at=1.0,
        thresholds=((0.1, math.inf), (0.3, 2.0)),
        aci_threshold=math.inf,
    )
    text = json.dumps(item.to_json(), allow_nan=False)
    assert ReviewItem.from_json(json.loads(text)) == item
    old = json.loads(text)
    del old["thresholds"], old["aci_threshold"]
    legacy = ReviewItem.from_json(old)  # written before the self-check existed
    assert legacy.thresholds == () and legacy.aci_threshold is None


def test_review_min_rate_must_not_exceed_review_rate() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="review_min_rate"):
        TaskSettings(name="t", review_rate=0.1, review_min_rate=0.2, review_priority="uncertainty")
