"""The dashboard's Segments row (DESIGN.md §6): one table of the segments of the chosen
tasks, worst first by the segment's lower bound, with its level, reviewed items and
alarm, each the worst replica's; the rest of the dashboard's conventions are checked in
tests/deploy/test_dashboard.py."""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry

from monitor.engine.segment_metrics import SegmentMetrics
from tests.deploy.test_dashboard import dashboard

SELECTOR = (
    '{cluster=~"$cluster", namespace=~"$namespace", job=~"$job", model=~"$model", task=~"$task"}'
)


def _segments_table() -> tuple[dict[str, Any], dict[str, Any]]:
    panels = dashboard()["panels"]
    at = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Segments")
    return panels[at], panels[at + 1]


def test_a_segments_row_follows_reliability_with_one_table() -> None:
    row, table = _segments_table()
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows.index("Segments") == rows.index("Reliability") + 1
    assert table["type"] == "table" and table["title"] == "Segments, worst first"
    assert table["gridPos"]["y"] == row["gridPos"]["y"] + 1
    ys = [p["gridPos"]["y"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert ys == sorted(ys)


def test_the_table_is_sorted_by_the_lower_bound_lowest_first() -> None:
    _, table = _segments_table()
    columns = {
        t["refId"]: t["expr"] for t in table["targets"] if t["instant"] and t["format"] == "table"
    }
    by = "by (namespace, job, model, task, segment)"
    assert columns == {
        "A": f"min {by} (relmon_segment_reliability_lower_bound{SELECTOR})",
        "B": f"min {by} (relmon_segment_reliability_level{SELECTOR})",
        "C": f"min {by} (relmon_segment_calibration_items{SELECTOR})",
        "D": f"max {by} (relmon_segment_reliability_alarm{SELECTOR})",
    }
    names = next(t for t in table["transformations"] if t["id"] == "organize")["options"]
    assert names["renameByName"]["Value #A"] == "Lower bound (95%)"
    assert names["renameByName"]["Value #C"] == "Reviewed items"
    sort = next(t for t in table["transformations"] if t["id"] == "sortBy")["options"]["sort"]
    assert sort == [{"field": "Lower bound (95%)", "desc": False}]
    assert table["options"]["sortBy"] == [{"displayName": "Lower bound (95%)", "desc": False}]


def test_every_metric_the_table_reads_is_one_the_engine_exports() -> None:
    registry = CollectorRegistry()
    SegmentMetrics(registry)
    exported = {m.name for m in registry.collect()}
    _, table = _segments_table()
    for target in table["targets"]:
        names = re.findall(r"relmon_segment_[a-z_]+", target["expr"])
        assert names and all(n in exported for n in names), target["expr"]
