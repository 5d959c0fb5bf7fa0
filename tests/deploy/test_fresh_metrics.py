"""A fresh ``relmon run``, before any traffic, serves every series an alert needs, at 0,
and no reliability level or lower bound (no estimate before the first verdict)."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from adapters.model.client import OUTCOMES
from monitor.engine.metrics import (
    ITEM_OUTCOMES,
    REJECTED_VERDICT_REASONS,
    TOP_ANSWER_OUTCOMES,
    VERDICT_KINDS,
    Metrics,
)
from tests.e2e.test_run_drain import TOKEN, free_port, wait_ready, write_config

LABELS = {"model": "sim-arith-1", "task": "arithmetic"}
ALPHAS = ("0.05", "0.1", "0.2", "0.3")  # write_config's alphas; the target 0.9 adds 0.1


async def fetch_fresh_metrics(tmp_path: Path) -> str:
    ports = {"metrics": free_port(), "review": free_port(), "traffic": free_port()}
    config = tmp_path / "relmon.yaml"
    # No model server: nothing is called before traffic arrives.
    write_config(config, f"http://127.0.0.1:{free_port()}/v1", ports, tmp_path / "state")
    env = {**os.environ, "RELMON_REVIEW_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "monitor", "run", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # noqa: ASYNC220
    try:
        await wait_ready(f"http://127.0.0.1:{ports['metrics']}/readyz", proc)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{ports['metrics']}/metrics") as resp,
        ):
            assert resp.status == 200
            return await resp.text()
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)


@pytest.mark.timeout(120)
async def test_fresh_run_serves_every_series_at_zero(tmp_path: Path) -> None:
    text = await fetch_fresh_metrics(tmp_path)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("relmon_")
    }
    names = {name for name, _ in samples}

    def value(name: str, **extra: str) -> float:
        key = (name, tuple(sorted({**LABELS, **extra}.items())))
        assert key in samples, f"missing {name} {extra}"
        return samples[key]

    # Every family the service declares has series, except the per-partition Kafka lag
    # (this run has no Kafka source, so there is no partition to name) and the level and
    # its lower bound: no estimate exists before the first verdict, and a 0 would read
    # as "reliability 0" (and page).
    registry = CollectorRegistry()
    Metrics(registry)
    declared = {family.name for family in registry.collect()}
    families = {f.name for f in text_string_to_metric_families(text)}
    no_series_yet = {
        "relmon_kafka_consumer_lag",
        "relmon_reliability_level",
        "relmon_reliability_lower_bound",
    }
    assert declared - no_series_yet <= families
    assert "relmon_reliability_level" not in names
    assert "relmon_reliability_lower_bound" not in names
    # No series under empty model and task labels (a verdict that names no known item is
    # counted by reason alone).
    assert not any(dict(labels).get("model") == "" for _, labels in samples)
    assert not any(n.endswith("_created") for n in names)

    for outcome in ITEM_OUTCOMES:
        assert value("relmon_items_total", outcome=outcome) == 0
    for verdict in VERDICT_KINDS:
        assert value("relmon_reviews_total", verdict=verdict) == 0
    for reason in REJECTED_VERDICT_REASONS:
        assert samples[("relmon_verdicts_rejected_total", (("reason", reason),))] == 0
    for outcome in TOP_ANSWER_OUTCOMES:
        assert value("relmon_top_answers_total", outcome=outcome) == 0
    for outcome in OUTCOMES:
        assert value("relmon_model_calls_total", outcome=outcome) == 0
    for decision in ("sampled", "skipped", "duplicate", "dropped", "rejected"):
        key = ("relmon_traffic_events_total", (("decision", decision), ("source", "mirror")))
        assert samples[key] == 0
    # Every configured source's restarts (this run's only source: the mirror listener).
    assert samples[("relmon_source_restarts_total", (("source", "mirror"),))] == 0
    sources = {
        dict(labels)["source"] for n, labels in samples if n == "relmon_source_restarts_total"
    }
    assert sources == {"mirror"}
    for alpha in ALPHAS:
        assert value("relmon_coverage_checks_total", alpha=alpha) == 0
        assert value("relmon_coverage_misses_total", alpha=alpha) == 0
        assert value("relmon_conformal_threshold", alpha=alpha) == math.inf  # k > n = 0
        assert value("relmon_coverage_target", alpha=alpha) == pytest.approx(1 - float(alpha))
    for gauge in (
        "relmon_calibration_items",
        "relmon_calibration_effective_items",
        "relmon_review_queue_depth",
        "relmon_reliability_alarm",
        "relmon_circuit_open",
        "relmon_set_size_count",
        "relmon_samples_per_item_count",
        "relmon_item_duration_seconds_count",
    ):
        assert value(gauge) == 0, gauge
    assert value("relmon_reliability_alarm_evalue") == 1.0  # the e-detector starts at 1
    assert value("relmon_reliability_target") == 0.9
    assert value("relmon_max_samples_per_item") == 10  # write_config's k_max
    assert value("relmon_set_size_bucket", le="+Inf") == 0
    # Nothing else is non-zero.
    special = {"relmon_conformal_threshold", "relmon_reliability_alarm_evalue"}
    special |= {"relmon_reliability_target", "relmon_coverage_target"}
    special |= {"relmon_max_samples_per_item"}
    others = {k: v for k, v in samples.items() if k[0] not in special}
    assert all(v == 0 for v in others.values()), {k: v for k, v in others.items() if v != 0}
