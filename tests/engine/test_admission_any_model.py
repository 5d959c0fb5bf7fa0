"""The traffic port's fast path when the request's head names no task: the event is
skipped before its body is parsed only when it would be skipped whatever model the body
names (every task a model can select: the model-matched ones and the catch-all)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from prometheus_client import CollectorRegistry

from monitor.config import TaskSettings
from monitor.core.sampler import CallBudget, sampled
from monitor.engine.admission import AdmissionControl
from monitor.engine.metrics import Metrics
from monitor.engine.routing import TaskRouter
from monitor.engine.runtime import ServiceStats, TaskRuntime


def _task(name: str, rate: float, model: str | None) -> TaskRuntime:
    settings = TaskSettings(name=name, sampling_rate=rate, match={"model": model})
    return cast(TaskRuntime, SimpleNamespace(name=name, settings=settings))


def test_skipped_whatever_the_model_is_exactly_what_offer_would_skip_for_every_model() -> None:
    tasks = {t.name: t for t in (_task("a", 0.2, "m-a"), _task("b", 0.1, "m-b"))}
    tasks["rest"] = _task("rest", 0.05, None)
    registry = CollectorRegistry()
    stats = ServiceStats()
    none: Any = None
    admission = AdmissionControl(
        TaskRouter(tasks),
        store=none,
        metrics=Metrics(registry),
        clock=none,
        budget=CallBudget(1000, 0.0),
        queue=asyncio.Queue(),
        stats=stats,
    )
    models = ("m-a", "m-b", "another", None)
    fast = [admission.skip_unsampled_any_model("proxy", f"r{i}") for i in range(3000)]
    for i, skipped in enumerate(fast):
        chosen = [admission.router.resolve_fields(None, m) for m in models]
        expected = all(
            t is None or not sampled(t.name, f"r{i}", t.settings.sampling_rate) for t in chosen
        )
        assert skipped == expected, i
    # 1 - 0.8 * 0.9 * 0.95 of the ids may be sampled by some model's task: parsed.
    assert 0.28 < fast.count(False) / 3000 < 0.36
    counted = registry.get_sample_value(
        "relmon_traffic_events_total", {"source": "proxy", "decision": "skipped"}
    )
    assert counted == stats.by_decision["skipped"] == fast.count(True)
