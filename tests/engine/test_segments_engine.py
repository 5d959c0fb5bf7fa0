"""Reliability per segment (DESIGN.md §6) through the service with fakes: the worker fixes
each scored item's segment label, the review item and the verdict's record carry it, the
engine keeps one window per (model, task, segment) beside the task's (unchanged), and
exports it as ``relmon_segment_*``; a restart restores the same figures; label values
stay bounded whatever the number of distinct segment values."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from adapters.sqlite.store import SqliteStore
from monitor.config import BudgetSettings, TaskSettings, load_settings
from monitor.core.apis.registry import captured_headers, carried_headers
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.errors import ConfigError, InputError
from monitor.core.events import parse_event
from monitor.core.review import ReviewItem, Verdict
from monitor.core.segments import OTHER
from monitor.core.stopping import get_stopping_rule
from monitor.core.window import CalibrationWindow
from monitor.engine.metrics import Metrics
from monitor.engine.ports import CalibrationRecord
from monitor.engine.segment_metrics import SegmentMetrics
from monitor.engine.segments import SegmentWindows
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock

K_MAX = 10
MODEL = "sim-1"
TASK = "arith"
SEGMENT_GAUGES = (
    "relmon_segment_reliability_level",
    "relmon_segment_reliability_lower_bound",
    "relmon_segment_calibration_items",
    "relmon_segment_conformal_threshold",
)
TASK_GAUGES = (
    "relmon_reliability_level",
    "relmon_reliability_lower_bound",
    "relmon_calibration_items",
    "relmon_calibration_effective_items",
    "relmon_conformal_threshold",
)


def _settings(segments: dict[str, Any] | None, *, review_rate: float = 1.0) -> TaskSettings:
    return TaskSettings(
        name=TASK,
        canonicalizer="numeric",
        k_max=K_MAX,
        k0=3,
        sampling_rate=1.0,
        review_rate=review_rate,
        half_life_s=600,
        endpoint={"model": MODEL},
        segments=segments,
    )


def _service(
    store: Any,
    clock: ManualClock,
    segments: dict[str, Any] | None,
    *,
    review_rate: float = 1.0,
) -> tuple[MonitorService, CollectorRegistry]:
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=_settings(segments, review_rate=review_rate),
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=K_MAX, k0=3),
        # Two classes now and then, so that a verdict can accept the second rank.
        client=FakeModelClient(lambda q, i: "9" if i % 5 == 4 else "8"),
        sync_canonicalizer=canon,
    )
    registry = CollectorRegistry()
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(registry, k_max=K_MAX),
        budget=BudgetSettings(calls_per_minute=1_000_000, max_in_flight=1, queue_size=20_000),
        clock=clock,
    )
    return service, registry


def _event(i: int, tenant: str | None, *, headers: dict[str, str] | None = None) -> Any:
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"What is {i} + 7?"}],
        "temperature": 0.7,
    }
    if tenant is not None:
        request["metadata"] = {"tenant": tenant}
    doc: dict[str, Any] = {"id": f"req-{i}", "model": MODEL, "task": TASK, "request": request}
    if headers is not None:
        doc["headers"] = headers
    return parse_event(doc)


def _tenant(i: int) -> str:
    return "gold" if i % 2 == 0 else "bronze"


def _verdict(item: ReviewItem, i: int) -> Verdict:
    """Gold's top answer acceptable 95% of the time, bronze's 70% (and 10% the second)."""
    j = i // 2
    if _tenant(i) == "gold":
        return (
            Verdict(item.item_id, none_of_these=True)
            if j % 20 == 0
            else Verdict(item.item_id, (1,))
        )
    if j % 10 < 7:
        return Verdict(item.item_id, (1,))
    if j % 10 == 7 and len(item.candidates) >= 2:
        return Verdict(item.item_id, (2,))
    return Verdict(item.item_id, none_of_these=True)


def _score(verdict: Verdict) -> float:
    return float(min(verdict.accepted_ranks)) if verdict.accepted_ranks else math.inf


async def _run_mix(
    service: MonitorService, store: Any, clock: ManualClock, n: int = 240
) -> list[tuple[ReviewItem, Verdict]]:
    """``n`` events of two tenants in three batches, 5 minutes apart, every one reviewed."""
    await service.load()
    service.start()
    applied = []
    for batch in range(3):
        ids = range(batch * n // 3, (batch + 1) * n // 3)
        for i in ids:
            assert service.offer(_event(i, _tenant(i)), "test").decision == "sampled"
        await service.drain()
        for i in ids:
            item = await store.get_review_item(f"{TASK}:req-{i}")
            assert item is not None
            verdict = _verdict(item, i)
            assert (await service.apply_verdict(verdict)).status == "applied"
            applied.append((item, verdict))
        clock.advance(300.0)
    service.publish()
    return applied


def _samples(registry: CollectorRegistry, names: tuple[str, ...]) -> dict[tuple[Any, ...], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name in names:
                out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def _gauge(registry: CollectorRegistry, name: str, segment: str, **extra: str) -> float | None:
    labels = {"model": MODEL, "task": TASK, "segment": segment, **extra}
    return registry.get_sample_value(name, labels)


async def test_each_segment_has_the_window_of_its_own_verdicts_and_the_task_is_unchanged() -> None:
    clock = ManualClock()
    store = InMemoryStore()
    spec = {"by": {"field": "metadata.tenant"}, "max": 5}
    service, registry = _service(store, clock, spec)
    applied = await _run_mix(service, store, clock)

    # Every item carries its segment value, from its first event on (not "other" until
    # the tenant has proven busy): a tenant's window holds all its verdicts.
    assert [item.segment for item, _ in applied] == [_tenant(i) for i in range(len(applied))]
    assert all(store.records[item.item_id][0].segment == item.segment for item, _ in applied)
    assert applied[-1][0].to_json()["segment"] == "bronze"
    assert _gauge(registry, "relmon_segment_calibration_items", OTHER) is None

    task = service.tasks[TASK]
    for label in ("gold", "bronze"):
        window = CalibrationWindow(
            alphas=task.alphas, max_items=2000, half_life_s=600, min_inclusion_probability=1.0
        )
        for n, (item, verdict) in enumerate(applied, start=1):
            if item.segment == label:
                window.add(item.item_id, _score(verdict), 1.0, item.sampled_at, order=(n,))
        snap = window.snapshot(clock.time())
        assert _gauge(registry, "relmon_segment_reliability_level", label) == pytest.approx(
            snap.reliability_level, rel=1e-12
        )
        assert _gauge(registry, "relmon_segment_reliability_lower_bound", label) == pytest.approx(
            snap.reliability_lower_bound, rel=1e-12
        )
        assert _gauge(registry, "relmon_segment_calibration_items", label) == snap.n
        for alpha in task.alphas:
            got = _gauge(registry, "relmon_segment_conformal_threshold", label, alpha=f"{alpha:g}")
            assert got == snap.thresholds[alpha]
    gold = _gauge(registry, "relmon_segment_reliability_level", "gold")
    bronze = _gauge(registry, "relmon_segment_reliability_level", "bronze")
    assert gold is not None and bronze is not None
    assert gold == pytest.approx(0.95, abs=0.03) and bronze == pytest.approx(0.70, abs=0.05)

    # The same traffic and verdicts without segments: the task's figures are the same.
    plain_clock = ManualClock()
    plain_store = InMemoryStore()
    plain, plain_registry = _service(plain_store, plain_clock, None)
    plain_applied = await _run_mix(plain, plain_store, plain_clock)
    assert all(item.segment is None for item, _ in plain_applied)
    assert "segment" not in plain_applied[0][0].to_json()
    assert _samples(plain_registry, SEGMENT_GAUGES) == {}
    with_segments = _samples(registry, TASK_GAUGES)
    assert with_segments and with_segments == _samples(plain_registry, TASK_GAUGES)


async def test_no_segment_series_before_the_first_verdict() -> None:
    clock = ManualClock()
    store = InMemoryStore()
    service, registry = _service(store, clock, {"by": {"field": "metadata.tenant"}})
    await service.load()
    service.start()
    for i in range(8):
        service.offer(_event(i, "gold"), "test")
    await service.drain()
    service.publish()
    assert _samples(registry, SEGMENT_GAUGES) == {}
    item = await store.get_review_item(f"{TASK}:req-7")
    assert item is not None and item.segment == "gold"
    await service.apply_verdict(Verdict(item.item_id, (1,)))
    # One accepted verdict, and the test point's weight: 1 / (1 + 1), as the task's level.
    # Gold has one record: under "other" until it has five, then under its own label
    # with all five.
    assert _gauge(registry, "relmon_segment_reliability_level", OTHER) == 0.5
    assert (
        registry.get_sample_value("relmon_reliability_level", {"model": MODEL, "task": TASK}) == 0.5
    )
    assert _gauge(registry, "relmon_segment_calibration_items", OTHER) == 1.0
    assert _gauge(registry, "relmon_segment_calibration_items", "gold") is None
    for i in range(3, 6):
        await service.apply_verdict(Verdict(f"{TASK}:req-{i}", (1,)))
        assert _gauge(registry, "relmon_segment_calibration_items", "gold") is None
    await service.apply_verdict(Verdict(f"{TASK}:req-2", (1,)))
    assert _gauge(registry, "relmon_segment_calibration_items", "gold") == 5.0
    assert _gauge(registry, "relmon_segment_calibration_items", OTHER) is None


async def test_a_restart_from_sqlite_restores_the_same_segment_figures(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    clock = ManualClock()
    spec = {"by": {"field": "metadata.tenant"}, "max": 5}
    store = SqliteStore(path, clock=clock)
    service, registry = _service(store, clock, spec)
    await _run_mix(service, store, clock, n=90)
    before = _samples(registry, (*SEGMENT_GAUGES, *TASK_GAUGES))
    assert any(k[0] == "relmon_segment_reliability_level" for k in before)
    await service.stop(5.0)
    await store.aclose()

    again_store = SqliteStore(path, clock=clock)
    again, again_registry = _service(again_store, clock, spec)
    assert await again.load() == 90
    assert _samples(again_registry, (*SEGMENT_GAUGES, *TASK_GAUGES)) == before
    # A replica configured without segments reads the same stored labels.
    plain, plain_registry = _service(again_store, clock, None)
    await plain.load()
    assert _samples(plain_registry, SEGMENT_GAUGES) == _samples(again_registry, SEGMENT_GAUGES)
    await again_store.aclose()

    # A file from before the column: its verdicts have no segment, the task's level stands.
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE records DROP COLUMN segment")
    old_store = SqliteStore(path, clock=clock)
    old, old_registry = _service(old_store, clock, spec)
    assert await old.load() == 90
    assert _samples(old_registry, SEGMENT_GAUGES) == {}
    tasks = _samples(old_registry, TASK_GAUGES)
    assert tasks == {k: v for k, v in before.items() if k[0] in TASK_GAUGES}
    await old_store.aclose()


def _busy_or_one_off(i: int) -> str:
    """Six busy tenants, a sixth of a third of the traffic each; the rest (two thirds) a
    value never seen again."""
    return f"tenant-{i // 3 % 6}" if i % 3 == 0 else f"one-off-{i}"


@pytest.mark.timeout(240)
async def test_ten_thousand_distinct_values_leave_a_bounded_set_of_labels() -> None:
    clock = ManualClock()
    store = InMemoryStore()
    spec = {"by": {"field": "metadata.tenant"}, "max": 5}
    service, registry = _service(store, clock, spec, review_rate=0.25)
    await service.load()
    service.start()
    n = 15_000  # 10,000 of them one-off values
    for start in range(0, n, 5000):
        for i in range(start, start + 5000):
            assert service.offer(_event(i, _busy_or_one_off(i)), "test").decision == "sampled"
        await service.drain()
    for item in list(store.items.values()):
        await service.apply_verdict(Verdict(item.item_id, (1,)))
    service.publish()
    assert sum(1 for i in range(n) if _busy_or_one_off(i).startswith("one-off")) == 10_000
    labels = {dict(k[1:])["segment"] for k in _samples(registry, SEGMENT_GAUGES)}
    assert OTHER in labels
    assert len(labels - {"none"}) <= 5 + 1
    assert len({label for label in labels if label.startswith("tenant-")}) == 5  # max
    assert not any(label.startswith("one-off") for label in labels)
    assert len(service.calibration.windows[(MODEL, TASK)].segments or ()) == len(labels)
    # Every label value exported (but "other") is one of the task window's records'.
    window = service.calibration.windows[(MODEL, TASK)].window
    held = {store.records[i][0].segment for i, *_ in window.entries()}
    assert labels - {OTHER} <= held


async def test_a_kafka_event_segments_by_its_header_never_resent() -> None:
    clock = ManualClock()
    store = InMemoryStore()
    service, registry = _service(store, clock, {"by": {"header": "X-Tenant"}, "max": 3})
    assert "x-tenant" in captured_headers()
    events = [_event(i, None, headers={"X-Tenant": "acme", "X-Other": "no"}) for i in range(8)]
    assert ("x-tenant", "acme") in events[0].headers
    assert all(name != "x-other" for name, _ in events[0].headers)
    await service.load()
    service.start()
    for e in events:
        service.offer(e, "test")
    await service.drain()
    labels = [(await store.get_review_item(f"{TASK}:req-{i}")) for i in range(8)]
    assert [item.segment for item in labels if item is not None] == ["acme"] * 8
    client = service.tasks[TASK].client
    assert isinstance(client, FakeModelClient)
    assert all(route is None or not route.headers for _, route in client.routes)
    for item in labels:
        assert item is not None
        await service.apply_verdict(Verdict(item.item_id, (1,)))
    assert _gauge(registry, "relmon_segment_calibration_items", "acme") == 8.0
    assert _gauge(registry, "relmon_segment_calibration_items", OTHER) is None
    # The proxy and the mirror read a request's headers through the same function.
    headers = {"x-tenant": "beta", "authorization": "Bearer sk-secret"}
    assert carried_headers("openai.chat", headers.get) == (("x-tenant", "beta"),)


async def test_a_task_segments_by_the_querys_language() -> None:
    clock = ManualClock()
    store = InMemoryStore()
    service, _ = _service(store, clock, {"by": "language", "max": 2})
    await service.load()  # loads the detector, off the event loop
    service.start()
    queries = [
        f"What is {i} + 7?" if i % 2 else f"Wie viel ist {i} plus 7? Bitte kurz." for i in range(16)
    ]
    for i, text in enumerate(queries):
        event = parse_event(
            {
                "id": f"req-{i}",
                "model": MODEL,
                "task": TASK,
                "request": {"model": MODEL, "messages": [{"role": "user", "content": text}]},
            }
        )
        service.offer(event, "test")
    await service.drain()
    items = [await store.get_review_item(f"{TASK}:req-{i}") for i in range(16)]
    segments = [item.segment for item in items if item is not None]
    assert segments == ["de", "en"] * 8  # the value from the first item on


def test_the_segments_setting_is_checked_and_the_item_carries_its_label() -> None:
    assert _settings(None).segment_spec is None
    spec = _settings({"by": {"header": "X-Tenant"}, "max": 3}).segment_spec
    assert spec is not None and (spec.by.name, spec.max) == ("x-tenant", 3)
    with pytest.raises(ValidationError, match="credential"):
        _settings({"by": {"header": "Authorization"}})
    with pytest.raises(ValidationError, match="max: must be from 1 to 1000"):
        _settings({"by": "language", "max": 0})
    with pytest.raises(ValidationError, match="unknown key"):
        _settings({"by": "language", "maximum": 3})
    item = ReviewItem(
        item_id="arith:1",
        model=MODEL,
        task=TASK,
        query="q",
        candidates=(("8", 3),),
        k=3,
        inclusion_probability=1.0,
        sampled_at=0.0,
        segment="h:0123456789ab",
    )
    assert ReviewItem.from_json(item.to_json()) == item
    with pytest.raises(InputError, match="segment"):
        ReviewItem.from_json(item.to_json() | {"segment": "a tenant with spaces"})


def test_a_config_error_names_the_task_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "relmon.yaml"
    path.write_text(
        "tasks:\n  - name: arith\n    endpoint: {model: m}\n"
        "    segments: {by: {field: tenant}, max: 5000}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"tasks\[0\] \(arith\)\.segments: max: must be from"):
        load_settings(path)


def test_a_segment_goes_when_the_task_window_holds_none_of_its_verdicts() -> None:
    def make() -> CalibrationWindow:
        return CalibrationWindow(alphas=(0.1,), max_items=3, half_life_s=None)

    task_window, windows = make(), SegmentWindows(make, min_records=1)
    registry = CollectorRegistry()
    metrics = SegmentMetrics(registry)

    def add(n: int, segment: str | None) -> None:
        record = CalibrationRecord(MODEL, TASK, f"i{n}", 1.0, 1.0, float(n), (n,), segment=segment)
        task_window.add(record.item_id, record.score, 1.0, record.sampled_at, order=record.order)
        windows.add(record, task_window)
        windows.publish(metrics, MODEL, TASK, (0.1,), float(n))

    add(1, "rare")
    add(2, "busy")
    add(3, None)  # no segment: the task's window only
    assert set(windows.windows) == {"rare", "busy"}
    assert _gauge(registry, "relmon_segment_calibration_items", "rare") == 1.0
    add(4, "busy")  # the task window evicts i1, the last verdict of "rare"
    assert set(windows.windows) == {"busy"}
    assert _samples(registry, SEGMENT_GAUGES).keys() == {
        (name, ("model", MODEL), ("segment", "busy"), ("task", TASK)) for name in SEGMENT_GAUGES[:3]
    } | {
        (SEGMENT_GAUGES[3], ("alpha", "0.1"), ("model", MODEL), ("segment", "busy"), ("task", TASK))
    }
    assert _gauge(registry, "relmon_segment_calibration_items", "busy") == 2.0
    add(5, "rare")  # back, with a window of its own verdicts since
    assert _gauge(registry, "relmon_segment_calibration_items", "rare") == 1.0
