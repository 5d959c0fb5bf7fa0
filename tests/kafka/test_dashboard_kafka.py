"""The dashboard's Kafka row, live: ``relmon run`` reading a real Tansu broker over its
call budget (so a backlog is held on the traffic topic), a real Prometheus scraping it,
and every Kafka panel query of deploy/grafana/relmon.json answered with the lag that
relmon's own ``/metrics`` reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.demo.model import QuestionBank, SimulatedModel
from tests.deploy.test_dashboard import _stop, concrete, queries
from tests.e2e.test_run_drain import wait_ready
from tests.kafka import (
    arith_events,
    free_port,
    produce,
    relmon_config,
    relmon_topics,
    unique,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

EVENTS = 40


def kafka_queries() -> list[tuple[str, str]]:
    found = [(title, expr) for title, expr in queries() if "relmon_kafka_" in expr]
    assert found, "the dashboard has no Kafka panel"
    return found


async def own_lag(session: aiohttp.ClientSession, port: int) -> dict[str, float]:
    """relmon's own /metrics: lag per topic, summed over partitions."""
    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "relmon_kafka_consumer_lag":
            for s in family.samples:
                out[s.labels["topic"]] = out.get(s.labels["topic"], 0.0) + s.value
    return out


async def test_the_kafka_panels_show_the_lag_relmon_reports(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = await relmon_topics(kafka_bootstrap, traffic_partitions=2)
    bank = QuestionBank(size=EVENTS, seed=3)
    model = SimulatedModel(quality=0.8, drift_after_s=None, bank=bank, seed=5)
    url = await model.start()
    metrics_port, prom_port = free_port(), free_port()
    cfg = tmp_path / "relmon.yaml"
    # A budget of 20 calls a minute with k_max 10: a couple of items, then the source
    # holds the rest of the backlog (paused partitions), which stays as lag.
    relmon_config(
        cfg,
        url,
        kafka_bootstrap,
        topics=topics,
        group=unique("dash"),
        port=metrics_port,
        budget={"calls_per_minute": 20, "max_in_flight": 2},
    )
    await produce(
        kafka_bootstrap, topics["traffic"], arith_events([q for q, _ in bank.questions], "d")
    )
    prom_cfg = tmp_path / "prometheus.yml"
    prom_cfg.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "relmon",
                        "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
                    }
                ],
            }
        )
    )
    base = f"http://127.0.0.1:{prom_port}"
    with (
        (tmp_path / "relmon.log").open("wb") as log,
        (tmp_path / "prometheus.log").open("wb") as prom_log,
    ):
        relmon = subprocess.Popen(  # noqa: ASYNC220 - stopped in finally
            [sys.executable, "-m", "monitor", "run", "--config", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
        prom = subprocess.Popen(  # noqa: ASYNC220 - stopped in finally
            [
                "prometheus",
                f"--config.file={prom_cfg}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=prom_log,
            stderr=subprocess.STDOUT,
        )
        try:
            await wait_ready(f"http://127.0.0.1:{metrics_port}/readyz", relmon, 90)
            await wait_ready(f"{base}/-/ready", prom, 60)
            async with aiohttp.ClientSession() as session:

                async def query(expr: str) -> dict[str, float]:
                    async with session.get(f"{base}/api/v1/query", params={"query": expr}) as resp:
                        body: dict[str, Any] = await resp.json()
                    assert resp.status == 200 and body["status"] == "success", (expr, body)
                    return {
                        r["metric"]["topic"]: float(r["value"][1]) for r in body["data"]["result"]
                    }

                # The backlog is held: relmon reports it as traffic lag.
                async def held() -> bool:
                    lag = await own_lag(session, metrics_port)
                    return lag.get(topics["traffic"], 0.0) > 0

                await wait_until(
                    held,
                    timeout_s=90,
                    what="a lag on the traffic topic (events held for the budget)",
                )
                for title, expr in kafka_queries():
                    seen: dict[str, float] = {}
                    mine: dict[str, float] = {}

                    async def panel_matches(expr: str = expr) -> bool:
                        # The same numbers through Prometheus as on /metrics (the
                        # lag moves while the budget refills: compare until they agree).
                        nonlocal seen, mine
                        seen = await query(concrete(expr))
                        mine = await own_lag(session, metrics_port)
                        return bool(seen) and seen == mine

                    try:
                        await wait_until(
                            panel_matches,
                            timeout_s=60,
                            what=f"the panel {title!r} to agree with /metrics",
                        )
                    except AssertionError:
                        raise AssertionError((title, seen, mine)) from None
                    assert set(seen) >= {topics["traffic"], topics["review"], topics["verdict"]}
                    assert seen[topics["traffic"]] > 0, (title, seen)
        finally:
            _stop(prom)
            _stop(relmon)
            await model.stop()
