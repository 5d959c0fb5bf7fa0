"""A segment's window holds all its items (DESIGN.md §6, §7 "Segments"): every record keeps
its item's segment value, and the labels are given at export time from the task window's
records. After every verdict, each exported label's figures are those of a window fed
only that label's records (a value's own; for ``other``, exactly the values without a
label), computed from scratch here with an independent ranking; the alarms likewise."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapters.sqlite.store import SqliteStore
from monitor.core.alarm import EDetector, SplitDetectors
from monitor.core.review import ReviewItem, Verdict
from monitor.core.segments import OTHER, SegmentTable
from monitor.core.window import CalibrationWindow, WindowSnapshot
from monitor.engine.ports import CalibrationRecord
from monitor.engine.segments import SegmentAlarms, SegmentWindows
from monitor.engine.service import MonitorService
from monitor.testing import InMemoryStore, ManualClock
from tests.engine.test_segments_engine import (
    SEGMENT_GAUGES,
    TASK,
    TASK_GAUGES,
    _event,
    _gauge,
    _samples,
    _service,
)

ALPHAS = (0.05, 0.1, 0.2)
TAU, ALARM_ALPHA, FLOOR = 0.9, 0.01, 0.1


def _make(max_items: int) -> CalibrationWindow:
    return CalibrationWindow(
        alphas=ALPHAS, max_items=max_items, half_life_s=600.0, min_inclusion_probability=FLOOR
    )


def expected_labels(
    held: list[CalibrationRecord], max_segments: int, min_records: int
) -> dict[str, list[CalibrationRecord]]:
    """The labels and their records, from the task window's records alone: the
    ``max_segments`` values with the most Σ 1/π (then records, then the value), each
    with ``min_records`` records or more; ``other`` the rest."""
    by_value: dict[str, list[CalibrationRecord]] = defaultdict(list)
    for record in held:
        if record.segment is not None:
            by_value[record.segment].append(record)
    traffic = {
        v: sum((Fraction(1.0 / r.inclusion_probability) for r in rs), Fraction(0))
        for v, rs in by_value.items()
    }
    eligible = [v for v, rs in by_value.items() if len(rs) >= min_records and v != OTHER]
    ranked = sorted(eligible, key=lambda v: (-traffic[v], -len(by_value[v]), v))
    own = set(ranked[:max_segments])
    out: dict[str, list[CalibrationRecord]] = {v: by_value[v] for v in own}
    rest = [r for v, rs in by_value.items() if v not in own for r in rs]
    if rest:
        out[OTHER] = rest
    return out


def snapshot_of(records: list[CalibrationRecord], max_items: int, now: float) -> WindowSnapshot:
    window = _make(max_items)
    for r in records:
        window.add(
            r.item_id,
            r.score,
            r.inclusion_probability,
            r.sampled_at,
            order=r.order,
            served=r.served_acceptable,
        )
    return window.snapshot(now)


class Run:
    """A task window, its segment windows and alarms, and the independent model of the
    alarms: one detector per value, fed in arrival order while the value has a record
    in the task window."""

    def __init__(self, max_items: int, max_segments: int, min_records: int) -> None:
        self.max_items = max_items
        self.task = _make(max_items)
        self.windows = SegmentWindows(
            lambda: _make(max_items), max_segments, min_records=min_records, track_left=True
        )
        slots = max_segments + 2
        self.alarms = SegmentAlarms(
            SplitDetectors(tau=TAU, alpha=ALARM_ALPHA, pi_min=FLOOR, slots=slots)
        )
        self.level = ALARM_ALPHA / slots
        self.records: dict[str, CalibrationRecord] = {}
        self.detectors: dict[str, EDetector] = {}
        self.max_segments, self.min_records = max_segments, min_records

    def add(self, record: CalibrationRecord) -> None:
        added = self.task.add(
            record.item_id,
            record.score,
            record.inclusion_probability,
            record.sampled_at,
            order=record.order,
        )
        assert added
        self.records[record.item_id] = record
        self.windows.add(record, self.task)
        self.alarms.add(record, self.windows)
        held_values = {r.segment for r in self.held()}
        if record.segment is not None and record.segment in held_values:
            detector = self.detectors.setdefault(record.segment, EDetector(TAU, self.level, FLOOR))
            detector.update(record.score <= 1.0, record.inclusion_probability)
        for value in [v for v in self.detectors if v not in held_values]:
            del self.detectors[value]

    def held(self) -> list[CalibrationRecord]:
        return [self.records[item_id] for item_id, *_ in self.task.entries()]

    def check(self, now: float) -> dict[str, list[CalibrationRecord]]:
        want = expected_labels(self.held(), self.max_segments, self.min_records)
        got = self.windows.windows
        assert set(got) == set(want)
        assert len(got) <= self.max_segments + 1
        for label, records in want.items():
            assert {e[0] for e in got[label].entries()} == {r.item_id for r in records}
            assert got[label].snapshot(now) == snapshot_of(records, self.max_items, now)
        # The alarms: a value's own detector; other's, the largest of the others'.
        alarms = self.alarms.statistics(self.windows)
        want_alarms: dict[str, float] = {}
        for value, detector in self.detectors.items():
            label = value if value in want and value != OTHER else OTHER
            want_alarms[label] = max(want_alarms.get(label, 0.0), detector.value)
        assert {k: v for k, (v, _) in alarms.items()} == want_alarms
        return want


values = st.lists(
    st.tuples(
        st.integers(0, 7),  # the value's index: few values, some busy, some rare
        st.sampled_from([1.0, 2.0, float("inf")]),  # the score
        st.sampled_from([1.0, 0.5, 0.2, 0.1]),  # pi
        st.integers(0, 5),  # how far back its order key is (out-of-order arrivals)
    ),
    max_size=150,
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    stream=values,
    max_items=st.integers(3, 40),
    max_segments=st.integers(1, 4),
    min_records=st.integers(1, 5),
)
def test_after_every_verdict_each_label_is_the_window_of_its_records(
    stream: list[tuple[int, float, float, int]],
    max_items: int,
    max_segments: int,
    min_records: int,
) -> None:
    run = Run(max_items, max_segments, min_records)
    names = ["de", "en", "fr", "h:0123456789ab", OTHER, "ja", "es", "none"]
    for n, (v, score, pi, back) in enumerate(stream):
        value = None if v == 7 and n % 2 else names[v]  # some records without a segment
        record = CalibrationRecord(
            "m", "t", f"i{n}", score, pi, 10.0 * n, order=(3 * n - 3 * back, n), segment=value
        )
        run.add(record)
        run.check(10.0 * n + 5.0)


def test_many_seeds_of_segments_that_start_small_and_grow() -> None:
    """Values that appear rarely first and then grow, with slots changing hands, over a
    window that slides: exact after every verdict, over 20 seeds."""
    for seed in range(20):
        rng = random.Random(seed)
        run = Run(max_items=60, max_segments=2, min_records=5)
        for n in range(300):
            growth = n / 300
            weights = [1.0, 0.05 + growth, 0.02 + 0.5 * growth, 0.3, 0.05]
            value = rng.choices(["en", "de", "fr", "es", f"once-{n}"], weights)[0]
            score = 1.0 if rng.random() < 0.85 else rng.choice([2.0, float("inf")])
            pi = rng.choice([1.0, 0.5, 0.25])
            record = CalibrationRecord(
                "m", "t", f"i{n}", score, pi, 30.0 * n, order=(n,), segment=value
            )
            run.add(record)
            run.check(30.0 * n)


def test_ten_thousand_values_keep_state_only_for_the_window() -> None:
    run = Run(max_items=200, max_segments=5, min_records=5)
    for n in range(10_000):
        value = f"tenant-{n % 3}" if n % 4 == 0 else f"value-{n}"
        run.add(CalibrationRecord("m", "t", f"i{n}", 1.0, 1.0, float(n), (n,), segment=value))
        assert len(run.windows.values()) <= 200
        assert len(run.alarms.detectors.detectors) <= 200
    want = run.check(10_000.0)
    assert set(want) == {"tenant-0", "tenant-1", "tenant-2", OTHER}


# -- through the service: a tenant that starts small ------------------------------------


def start_small_tenants() -> list[str]:
    """128 events: ``en`` 100, ``de`` 25 (four in the first 60 events, then growing),
    ``fr`` 3 (too few for a label of its own: it stays in ``other``)."""
    de_early = {3, 20, 40, 59}
    fr = {15, 70, 110}
    late = iter(range(21))
    out: list[str] = []
    for i in range(128):
        if i in de_early:
            out.append("de")
        elif i in fr:
            out.append("fr")
        elif i >= 60 and (i - 60) % 3 == 0 and next(late, None) is not None:
            out.append("de")
        else:
            out.append("en")
    return out


TENANTS = start_small_tenants()


def start_small_verdict(item: ReviewItem, i: int) -> Verdict:
    """``de``'s top answer acceptable 3 times in 5 (a fourth time the second), ``en``'s 19
    in 20, ``fr``'s always."""
    tenant = TENANTS[i]
    j = TENANTS[:i].count(tenant)
    if tenant == "de":
        if j % 5 < 3:
            return Verdict(item.item_id, (1,))
        if j % 5 == 3 and len(item.candidates) >= 2:
            return Verdict(item.item_id, (2,))
        return Verdict(item.item_id, none_of_these=True)
    if tenant == "en" and j % 20 == 19:
        return Verdict(item.item_id, none_of_these=True)
    return Verdict(item.item_id, (1,))


async def run_start_small(
    service: MonitorService, store: Any, clock: ManualClock
) -> list[tuple[ReviewItem, Verdict, CalibrationRecord]]:
    """The 128 events in four batches 5 minutes apart, every one reviewed."""
    await service.load()
    service.start()
    applied = []
    for batch in range(4):
        ids = range(batch * 32, (batch + 1) * 32)
        for i in ids:
            assert service.offer(_event(i, TENANTS[i]), "test").decision == "sampled"
        await service.drain()
        for i in ids:
            item = await store.get_review_item(f"{TASK}:req-{i}")
            assert item is not None
            verdict = start_small_verdict(item, i)
            assert (await service.apply_verdict(verdict)).status == "applied"
            stored = await store.get_record(item.item_id)
            assert stored is not None
            applied.append((item, verdict, stored))
        clock.advance(300.0)
    service.publish()
    return applied


def independent(
    applied: list[tuple[ReviewItem, Verdict, CalibrationRecord]],
    tenants: set[str],
    alphas: tuple[float, ...],
    now: float,
) -> WindowSnapshot:
    """A window fed only the verdicts of ``tenants``, from the review items and verdicts
    (not the stored records): score = the first accepted rank, inf for none."""
    window = CalibrationWindow(
        alphas=alphas, max_items=2000, half_life_s=600, min_inclusion_probability=1.0
    )
    for n, (item, verdict, _) in enumerate(applied, start=1):
        if TENANTS[int(item.item_id.rsplit("-", 1)[1])] in tenants:
            score = min(verdict.accepted_ranks) if verdict.accepted_ranks else math.inf
            window.add(item.item_id, float(score), 1.0, item.sampled_at, order=(n,))
    return window.snapshot(now)


def segment_figures(registry: CollectorRegistry, label: str, alphas: tuple[float, ...]) -> Any:
    return (
        _gauge(registry, "relmon_segment_reliability_level", label),
        _gauge(registry, "relmon_segment_reliability_lower_bound", label),
        _gauge(registry, "relmon_segment_calibration_items", label),
        tuple(
            _gauge(registry, "relmon_segment_conformal_threshold", label, alpha=f"{a:g}")
            for a in alphas
        ),
    )


def snapshot_figures(snap: WindowSnapshot, alphas: tuple[float, ...]) -> Any:
    return (
        snap.reliability_level,
        snap.reliability_lower_bound,
        float(snap.n),
        tuple(snap.thresholds[a] for a in alphas),
    )


async def test_a_tenant_that_starts_small_is_exported_with_all_its_items() -> None:
    assert TENANTS.count("de") == 25 and TENANTS.count("en") == 100
    # The scenario starts small: a traffic table gives de no label for its first five
    # events (what used to send them to other's window for good).
    table = SegmentTable(5)
    early = [table.observe(t) for t in TENANTS]
    assert [label for label, t in zip(early, TENANTS, strict=True) if t == "de"][:5] == [OTHER] * 5

    clock, store = ManualClock(), InMemoryStore()
    service, registry = _service(store, clock, {"by": {"field": "metadata.tenant"}, "max": 5})
    applied = await run_start_small(service, store, clock)
    assert [item.segment for item, _, _ in applied] == TENANTS  # the value, from the first
    assert [r.segment for _, _, r in applied] == TENANTS
    alphas = service.tasks[TASK].alphas
    now = clock.time()
    for label, tenants in (("de", {"de"}), ("en", {"en"}), (OTHER, {"fr"})):
        want = snapshot_figures(independent(applied, tenants, alphas, now), alphas)
        assert segment_figures(registry, label, alphas) == want
    assert segment_figures(registry, "de", alphas)[2] == 25.0
    assert segment_figures(registry, OTHER, alphas)[2] == 3.0
    assert _gauge(registry, "relmon_segment_calibration_items", "fr") is None

    # The task's (marginal) figures: those of the same run without segments.
    plain_clock, plain_store = ManualClock(), InMemoryStore()
    plain, plain_registry = _service(plain_store, plain_clock, None)
    await run_start_small(plain, plain_store, plain_clock)
    assert _samples(registry, TASK_GAUGES) == _samples(plain_registry, TASK_GAUGES)
    await service.stop(5.0)
    await plain.stop(5.0)


ALARM_GAUGES = ("relmon_segment_reliability_alarm_evalue", "relmon_segment_reliability_alarm")


async def test_a_restart_from_sqlite_exports_the_same_segments(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    clock = ManualClock()
    spec = {"by": {"field": "metadata.tenant"}, "max": 1}  # en has it; de and fr are other
    store = SqliteStore(path, clock=clock)
    service, registry = _service(store, clock, spec)
    applied = await run_start_small(service, store, clock)
    before = _samples(registry, (*SEGMENT_GAUGES, *ALARM_GAUGES, *TASK_GAUGES))
    alphas = service.tasks[TASK].alphas
    want = snapshot_figures(independent(applied, {"de", "fr"}, alphas, clock.time()), alphas)
    assert segment_figures(registry, OTHER, alphas) == want  # en has the one label
    await service.stop(5.0)
    await store.aclose()

    again_store = SqliteStore(path, clock=clock)
    again, again_registry = _service(again_store, clock, spec)
    assert await again.load() == 128
    again.publish()
    assert _samples(again_registry, (*SEGMENT_GAUGES, *ALARM_GAUGES, *TASK_GAUGES)) == before
    await again_store.aclose()


async def test_records_stored_as_other_before_values_were_kept_stay_in_other() -> None:
    def make() -> CalibrationWindow:
        return CalibrationWindow(alphas=(0.1,), max_items=100, half_life_s=None)

    task_window, windows = make(), SegmentWindows(make, 5, min_records=1)
    for n, segment in enumerate(["other"] * 6 + ["gold"]):
        record = CalibrationRecord("m", "t", f"i{n}", 1.0, 1.0, float(n), (n,), segment=segment)
        task_window.add(record.item_id, 1.0, 1.0, float(n), order=(n,))
        windows.add(record, task_window)
    assert {k: len(w) for k, w in windows.windows.items()} == {OTHER: 6, "gold": 1}
