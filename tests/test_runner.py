"""The runner's wiring of a task: canonicalizer (with answer pattern), judge client, rule."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from monitor.config import TaskSettings
from monitor.errors import ConfigError
from monitor.metrics import Metrics
from monitor.runner import build_task


async def test_answer_pattern_wraps_the_canonicalizer() -> None:
    settings = TaskSettings(
        name="t", canonicalizer="numeric", answer_pattern=r"Final: (.*)", endpoint={"model": "m"}
    )
    task = build_task(settings, Metrics(CollectorRegistry()))
    try:
        classes = await task.canonicalizer.canonicalize_many(["3 steps. Final: 42.0", "no final"])
        assert classes == ["42", "<INVALID>"]
        assert task.rule.name == "mixture" and task.rule.k_max == 20
    finally:
        await task.client.aclose()


async def test_llm_canonicalizer_gets_a_temperature_zero_judge() -> None:
    settings = TaskSettings(
        name="t",
        canonicalizer="llm",
        canonicalizer_options={"endpoint": "http://127.0.0.1:9/v1", "model": "judge"},
        endpoint={"model": "m"},
    )
    task = build_task(settings, Metrics(CollectorRegistry()))
    try:
        assert task.canonicalizer.name == "llm"
        assert task.sync_canonicalizer is None
    finally:
        await task.client.aclose()
        await task.canonicalizer.aclose()  # type: ignore[attr-defined]


def test_a_task_needs_a_model() -> None:
    with pytest.raises(ConfigError, match=r"endpoint\.model"):
        build_task(TaskSettings(name="t"), Metrics(CollectorRegistry()))
