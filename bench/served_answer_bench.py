"""Calls per item with and without the served answer as a draw, on the demo's simulated
model (monitor/app/demo/model.py), through the real MonitorService with the demo task's
stopping settings (k_max 10, k0 3, the default rule). Run from the repository:

    .venv/bin/python bench/served_answer_bench.py [ITEMS]
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys

import structlog
from prometheus_client import CollectorRegistry

from monitor.app.demo.model import QuestionBank, SimulatedModel
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.events import parse_event
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock


async def run(items: int, *, served: bool, quality_drop: bool) -> tuple[float, float]:
    bank = QuestionBank()
    model = SimulatedModel(drift_after_s=0.0 if quality_drop else None, bank=bank, seed=5)
    client = FakeModelClient(lambda q, i: model.answer(q))
    settings = TaskSettings(
        name="arithmetic",
        canonicalizer="numeric",
        k_max=10,
        k0=3,
        sampling_rate=1.0,
        review_rate=0.0001,
        endpoint={"model": "sim-arith-1"},
    )
    canon = get_canonicalizer("numeric")
    rule = get_stopping_rule(
        settings.stopping_rule, k_max=10, k0=3, delta=settings.delta, futility=settings.futility
    )
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=rule,
        client=client,
        sync_canonicalizer=canon,
    )
    store = InMemoryStore()
    registry = CollectorRegistry()
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(registry, k_max=10),
        budget=BudgetSettings(calls_per_minute=10**9, max_in_flight=4, queue_size=items + 1),
        clock=ManualClock(),
    )
    await service.load()
    service.start()
    rng = random.Random(1)
    for i in range(items):
        question, _ = rng.choice(bank.questions)
        request = {
            "model": "sim-arith-1",
            "messages": [{"role": "user", "content": question}],
            "temperature": 0.7,
            "max_tokens": 64,
        }
        doc = {"id": f"r{i}", "task": "arithmetic", "request": request}
        if served:
            doc["response"] = {"choices": [{"message": {"content": model.answer(question)}}]}
        assert service.offer(parse_event(doc), "bench").decision == "sampled"
    await service.drain()
    await service.stop(5)
    labels = {"model": "sim-arith-1", "task": "arithmetic"}
    samples = registry.get_sample_value("relmon_samples_per_item_sum", labels) or 0.0
    return client.calls / items, samples / items


async def main() -> None:
    # the per-item log lines would drown the table
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    items = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    print(f"{items} items a row; k_max 10, k0 3, the default stopping rule")
    print(f"{'model':>9} {'served answer':>14} {'calls/item':>11} {'draws/item':>11}")
    for drop in (False, True):
        for served in (False, True):
            calls, draws = await run(items, served=served, quality_drop=drop)
            name = "drifted" if drop else "ok"
            print(f"{name:>9} {'a draw' if served else 'none':>14} {calls:11.3f} {draws:11.3f}")


asyncio.run(main())
