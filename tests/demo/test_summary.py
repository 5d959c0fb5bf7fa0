"""The demo's summary line: alpha = 1 - target, and a verdict against the target."""

from __future__ import annotations

import re
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from monitor.app.demo import MODEL, TASK, _summary
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock


def _running(n_right: int, n_wrong: int) -> SimpleNamespace:
    settings = TaskSettings(
        name=TASK,
        canonicalizer="numeric",
        reliability_target=0.8,
        review_rate=1.0,
        alphas=[0.05, 0.1],
        endpoint={"model": MODEL},
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=10, k0=3),
        client=FakeModelClient(lambda q, i: "1"),
        sync_canonicalizer=canon,
    )
    store = InMemoryStore()
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(CollectorRegistry()),
        budget=BudgetSettings(),
        clock=ManualClock(),
    )
    window = service.calibration.state(MODEL, task).window
    now = service.clock.time()
    for i in range(n_right):
        window.add(f"r{i}", 1.0, 1.0, now)
    for i in range(n_wrong):
        window.add(f"w{i}", 3.0, 1.0, now)
    return SimpleNamespace(service=service)


def _line(n_right: int, n_wrong: int) -> str:
    return _summary(_running(n_right, n_wrong), 0.0, SimpleNamespace(drifted=False))  # type: ignore[arg-type]


def test_summary_uses_alpha_one_minus_target() -> None:
    # 85 right, 15 wrong (weights equal): M*(0.20) = 1 since 85/101 >= 0.8, while
    # M*(0.10) = 3 since 85/101 < 0.9 -- the line must show the former.
    line = _line(85, 15)
    assert "M*@0.20=1" in line, line
    assert "M*@0.10" not in line


def test_summary_says_when_the_lower_bound_is_below_the_target() -> None:
    good = _line(400, 10)
    bad = _line(70, 30)
    assert "meets target 0.8" in good and "BELOW" not in good, good
    assert "BELOW TARGET 0.8" in bad, bad
    lower = float(re.search(r"lower bound ([0-9.]+)", bad).group(1))  # type: ignore[union-attr]
    assert lower < 0.8


def test_summary_says_no_verdicts_yet_instead_of_a_level_of_zero() -> None:
    line = _line(0, 0)
    assert "reliability=no verdicts yet (target 0.8)" in line, line
    assert "BELOW" not in line and "0.000" not in line
