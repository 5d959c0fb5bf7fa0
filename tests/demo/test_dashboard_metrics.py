"""Every metric the Grafana dashboard's panels read is on a short demo's /metrics, so
every panel of ``make demo`` shows data: the panels' queries are resolved through the
shipped recording rules (``slo:…``, ``relmon:…``) to the metrics relmon exports, and
each of those has a sample. One exception, named: the Kafka row reads
``relmon_kafka_consumer_lag``, which only a Kafka source exports (the demo has none;
tests/kafka/test_dashboard_kafka.py checks that row on a real broker). The Segments
row has a row for each of the demo's tenants, and the tenant that asks the hard
questions sits under the busiest one."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

import aiohttp
import pytest
import yaml

from monitor.app.demo import MODEL, TASK, run_demo
from monitor.app.demo.traffic import TENANTS
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = (
    ROOT / "deploy" / "grafana" / "relmon.json",
    ROOT / "helm" / "relmon" / "files" / "grafana" / "relmon.json",
)
RULE_FILES = sorted((ROOT / "deploy" / "prometheus").glob("*.rules.yml"))
NEEDS_KAFKA = {"relmon_kafka_consumer_lag"}
NAME = re.compile(r"\b((?:relmon|slo)[a-zA-Z0-9_:]*)")


def _recording_rules() -> dict[str, str]:
    rules: dict[str, str] = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    rules[rule["record"]] = rule["expr"]
    return rules


def exported_names(expr: str, rules: dict[str, str]) -> set[str]:
    """The metrics relmon must export for ``expr`` to have data: its metric names, a
    recording rule's replaced by the names of its expression (recursively)."""
    out: set[str] = set()
    todo = NAME.findall(expr)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in rules:
            todo += NAME.findall(rules[name])
        else:
            assert ":" not in name, f"{name}: not a recording rule of {RULE_FILES}"
            out.add(name)
    return out


def panel_metrics(dashboard: Path) -> dict[str, set[str]]:
    """``{panel title: metrics its targets need}`` for every panel (rows included)."""
    rules = _recording_rules()
    panels = json.loads(dashboard.read_text())["panels"]
    return {
        p["title"]: set().union(*(exported_names(t["expr"], rules) for t in p["targets"]))
        for p in panels
        if p.get("targets")
    }


def samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """``{sample name: [(labels, value)]}`` of a Prometheus exposition."""
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m:
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def test_both_dashboards_read_the_same_metrics_and_every_name_is_resolved() -> None:
    deploy, helm = (panel_metrics(path) for path in DASHBOARDS)
    assert deploy == helm
    names = set().union(*deploy.values())
    shown = [p for p in json.loads(DASHBOARDS[0].read_text())["panels"] if p["type"] != "row"]
    assert len(deploy) == len(shown) and len(names) >= 25, (len(deploy), sorted(names))
    # the recording rules were followed down to what relmon exports
    assert "relmon_top_answers_total" in names and "relmon_reliability_target" in names
    assert all(":" not in n for n in names)
    assert names >= NEEDS_KAFKA  # the exception is still queried


async def test_every_metric_the_dashboard_reads_is_on_the_demo_metrics(tmp_path: Path) -> None:
    needed = panel_metrics(DASHBOARDS[0])
    ports = {name: free_port() for name in ("metrics", "review", "traffic")}
    demo = asyncio.create_task(
        run_demo(
            state_dir=tmp_path / "state",
            drift_after_s=None,
            duration_s=150,
            summary_every_s=1.0,
            rate_per_s=20.0,
            metrics_port=ports["metrics"],
            review_port=ports["review"],
            traffic_port=ports["traffic"],
            token="demo-dashboard-test-token-01",
        )
    )
    tenants = {name for name, _, _ in TENANTS}
    missing: dict[str, set[str]] = {}
    found: dict[str, list[tuple[str, float]]] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(240):  # until every panel's metrics and every tenant's row show
                await asyncio.sleep(0.5)
                assert not demo.done(), demo
                try:
                    url = f"http://127.0.0.1:{ports['metrics']}/metrics"
                    async with session.get(url) as resp:
                        found = samples(await resp.text())
                except aiohttp.ClientError:
                    continue
                missing = {
                    title: {n for n in names - NEEDS_KAFKA if not found.get(n)}
                    for title, names in needed.items()
                }
                missing = {title: names for title, names in missing.items() if names}
                rows = {
                    labels
                    for labels, _ in found.get("relmon_segment_calibration_items", [])
                    if any(f'segment="{t}"' in labels for t in tenants)
                }
                items = [v for _, v in found.get("relmon_calibration_items", [])]
                if not missing and len(rows) == len(tenants) and items and items[0] >= 150:
                    break
    finally:
        demo.cancel()
        await asyncio.gather(demo, return_exceptions=True)
    assert not missing, f"panels without their metrics on the demo's /metrics: {missing}"
    assert not any(found.get(n) for n in NEEDS_KAFKA)  # the one exception, asserted
    for title, names in needed.items():  # every series the panels read holds a number
        for name in names - NEEDS_KAFKA:
            assert not any(math.isnan(v) for _, v in found[name]), (title, name, found[name])
    task = f'model="{MODEL}",segment="{{}}",task="{TASK}"'

    def segment(name: str, tenant: str) -> float:
        values = [v for labels, v in found[name] if task.format(tenant) in labels]
        assert len(values) == 1, (name, tenant, found[name])
        return values[0]

    reviewed = {t: segment("relmon_segment_calibration_items", t) for t in tenants}
    assert all(n > 0 for n in reviewed.values()), reviewed
    # unequal shares: acme (60%) has the most reviews, initech (10%) the fewest
    assert reviewed["acme"] > reviewed["globex"] > reviewed["initech"], reviewed
    levels = {t: segment("relmon_segment_reliability_level", t) for t in tenants}
    assert levels["initech"] < levels["acme"], levels  # the hard questions' tenant
