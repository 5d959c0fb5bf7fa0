"""Judge-assisted calibration through the service: every scored item gets a judge label
(stored, counted), and the prediction-powered gauges equal the estimate computed from
what the store holds; a restart loads the labels and exports the same values."""

from __future__ import annotations

import re

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.events import parse_event
from monitor.core.judging import DEFAULT_JUDGE_TEMPLATE, render_judge_prompt
from monitor.core.ppi import ppi_reliability
from monitor.core.review import Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock
from tests.test_service import arithmetic_model, event

LABELS = {"model": "sim-1", "task": "arith"}


def judge_answers(seed: int) -> FakeModelClient:
    """A judge right 90% of the time, with some unusable replies and failed calls."""
    rng = np.random.default_rng(seed)

    def reply(prompt: str, call: int) -> str | Exception:
        question, answer = re.search(r"Question:\n(.*)\n\nAnswer:\n(.*)\n", prompt).groups()  # type: ignore[union-attr]
        a, b = map(int, re.findall(r"\d+", question)[:2])
        right = answer.strip() == str(a + b)
        draw = rng.random()
        if draw < 0.03:
            return RuntimeError("judge down")
        if draw < 0.06:
            return "Maybe, hard to say."
        says = right if draw < 0.96 else not right
        return "Yes." if says else "No, it is wrong."

    return FakeModelClient(reply)


def make(store: InMemoryStore, clock: ManualClock, judge: FakeModelClient):
    settings = TaskSettings(
        name="arith",
        canonicalizer="numeric",
        k_max=8,
        k0=3,
        sampling_rate=1.0,
        review_rate=0.4,
        half_life_s=600,
        endpoint={"model": "sim-1"},
        judge={"endpoint": {"model": "judge-1"}},
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=8, k0=3),
        client=FakeModelClient(arithmetic_model(0.65, seed=3)),
        sync_canonicalizer=canon,
        judge=judge,
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry, k_max=8)
    metrics.init_judge("sim-1", "arith")
    budget = BudgetSettings(calls_per_minute=10**6, max_in_flight=2, queue_size=1000)
    service = MonitorService(
        [task], store=store, review_queue=store, metrics=metrics, budget=budget, clock=clock
    )
    return service, registry


def expected(store: InMemoryStore, now: float, half_life: float, test_weight: float):
    """The estimate from the store's rows alone (labels and scored verdicts)."""
    labels = store.judgements
    t = np.array([j.sampled_at for j in labels.values()])
    judged = np.array([j.acceptable for j in labels.values()], dtype=float)
    reviewed = [r for r, _ in store.records.values() if r.item_id in labels]
    t_rev = np.array([r.sampled_at for r in reviewed])
    latest = max(now, t.max(), t_rev.max())
    return ppi_reliability(
        judged,
        np.exp2(-(latest - t) / half_life),
        np.array([r.score <= 1 for r in reviewed], dtype=float),
        np.array([labels[r.item_id].acceptable for r in reviewed], dtype=float),
        np.exp2(-(latest - t_rev) / half_life)
        / np.array([r.inclusion_probability for r in reviewed]),
        delta=0.05,
        test_weight=1 / 0.4,
    )


async def test_judge_labels_become_a_prediction_powered_level_that_survives_a_restart() -> None:
    store, clock = InMemoryStore(), ManualClock()
    judge = judge_answers(seed=5)
    service, registry = make(store, clock, judge)
    await service.load()
    service.start()
    for i in range(300):
        clock.advance(1.0)
        assert service.offer(parse_event(event(i, i % 17, 7)), "test").decision == "sampled"
        if i % 50 == 49:
            await service.drain()
    await service.drain()
    outcomes = {
        o: registry.get_sample_value("relmon_judge_labels_total", {**LABELS, "outcome": o})
        for o in ("acceptable", "not_acceptable", "unusable", "error")
    }
    assert sum(outcomes.values()) == 300  # one judge question per scored item
    assert outcomes["error"] > 0 and outcomes["unusable"] > 0
    assert len(store.judgements) == outcomes["acceptable"] + outcomes["not_acceptable"]
    assert registry.get_sample_value("relmon_reliability_level_ppi", LABELS) is None  # no verdict
    for item in store.pending():
        a, b = map(int, re.findall(r"\d+", item.query)[:2])
        ranks = tuple(i + 1 for i, (c, _) in enumerate(item.candidates) if c == str(a + b))
        verdict = (
            Verdict(item.item_id, ranks) if ranks else Verdict(item.item_id, none_of_these=True)
        )
        assert (await service.apply_verdict(verdict)).status == "applied"
    clock.advance(2.0)
    service.publish()
    want = expected(store, clock.time(), 600.0, 1 / 0.4)
    assert want is not None and len(store.records) > 60
    got = {
        name: registry.get_sample_value(name, LABELS)
        for name in (
            "relmon_reliability_level_ppi",
            "relmon_reliability_lower_bound_ppi",
            "relmon_judge_agreement",
        )
    }
    assert got["relmon_reliability_level_ppi"] == pytest.approx(want.level, abs=1e-9)
    assert got["relmon_reliability_lower_bound_ppi"] == pytest.approx(want.lower_bound, abs=1e-9)
    assert got["relmon_judge_agreement"] == pytest.approx(want.agreement, abs=1e-9)
    assert 0.8 < want.agreement < 1.0  # the judge is right about 90% of the time
    human = registry.get_sample_value("relmon_reliability_lower_bound", LABELS)
    assert human is not None and got["relmon_reliability_lower_bound_ppi"] > 0
    await service.stop(5)
    # A restart on the same store: the labels come back, the gauges are the same.
    again, registry2 = make(store, clock, judge_answers(seed=6))
    await again.load()
    clock.advance(2.0)
    again.publish()
    want = expected(store, clock.time(), 600.0, 1 / 0.4)
    assert want is not None
    level = registry2.get_sample_value("relmon_reliability_level_ppi", LABELS)
    assert level == pytest.approx(want.level, abs=1e-9)


def test_the_judge_sees_the_query_and_the_top_answer_only() -> None:
    prompt = render_judge_prompt(DEFAULT_JUDGE_TEMPLATE, "What is {answer} + 2?", "4 {query}")
    assert "What is {answer} + 2?" in prompt and "4 {query}" in prompt
