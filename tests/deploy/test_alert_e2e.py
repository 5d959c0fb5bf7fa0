"""The alert path end to end, with real parts: relmon (in process, fed by the demo's
simulated model after a drift, reviewed by the demo's ground-truth reviewer) -> a real
Prometheus scraping it and evaluating the rules generated from deploy/slo/relmon-slo.yaml
-> a real Alertmanager (Debian's prometheus-alertmanager) routing and inhibiting with
deploy/alertmanager/alertmanager.yml -> a webhook receiver in this test.

The rules are the shipped ones with time shortened through the documented test override
only: ``relmon slo generate --time-scale 60`` (every window, ``for:`` and offset divided
by 60: an hour is a minute). The minimum volume is the shipped one (20 reviewed items).

Phase 1: a few verdicts a minute on a drifted model: the answers look wrong but the
volume is low, so no page arrives, the warning "too few reviews to know" does. Phase 2:
traffic up, the volume passes 20: the page arrives with its deployment's labels and its
runbook link.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from monitor.app.demo.model import QuestionBank, SimulatedModel
from monitor.app.demo.reviewer import auto_review
from monitor.app.demo.traffic import generate_traffic
from monitor.app.runner import Running, start_service
from monitor.app.slo import generate, load_spec
from monitor.config import load_settings
from tests.e2e.test_run_drain import TOKEN, free_port
from tests.waiting import answers_http, wait_until

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "deploy" / "slo" / "relmon-slo.yaml"
ALERTMANAGER_EXAMPLE = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
TIME_SCALE = 60
MODEL, TASK, NAMESPACE, CLUSTER = "sim-arith-1", "arithmetic", "llm-e2e", "e2e"

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")),
    reason="Debian's prometheus-alertmanager is not installed (make system-deps)",
)


class Webhook:
    """Alertmanager's webhook receiver: every notification, by path (/page, /ticket)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append((request.path, await request.json()))
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.post("/page", self._handle), web.post("/ticket", self._handle)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def alerts(self, path: str, alertname: str | None = None) -> list[dict[str, Any]]:
        return [
            alert
            for p, body in self.received
            if p == path
            for alert in body["alerts"]
            if alert["status"] == "firing"
            and (alertname is None or alert["labels"]["alertname"] == alertname)
        ]


def alertmanager_config(webhook: Webhook) -> dict[str, Any]:
    """The shipped example's routes and inhibitions; its PagerDuty and Slack receivers
    replaced by the test's webhook, and its waits shortened."""
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
    base = f"http://127.0.0.1:{webhook.port}"
    config["receivers"] = [
        {"name": "relmon-page", "webhook_configs": [{"url": f"{base}/page"}]},
        {"name": "relmon-tickets", "webhook_configs": [{"url": f"{base}/ticket"}]},
    ]
    for route in [config["route"], *config["route"]["routes"]]:
        route.update(group_wait="1s", group_interval="1s")
    return config


def relmon_settings(model_url: str, state: Path, ports: dict[str, int]) -> Any:
    return load_settings(
        None,
        tasks=[
            {
                "name": TASK,
                "match": {"header": TASK},
                "canonicalizer": "numeric",
                "endpoint": {"base_url": model_url, "model": MODEL, "timeout_s": 5},
                "k_max": 6,
                "k0": 3,
                "sampling_rate": 1.0,
                "review_rate": 1.0,
                # a budget of 5%: the 6x page pair fires at a 30% error ratio
                "reliability_target": 0.95,
            }
        ],
        metrics={"port": ports["metrics"]},
        review={"port": ports["review"]},
        traffic={"port": ports["traffic"], "mode": "mirror"},
        budget={"calls_per_minute": 100_000, "max_in_flight": 8, "queue_size": 256},
        state_dir=state,
        log_format="json",
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.asynccontextmanager
async def prometheus_and_alertmanager(
    tmp_path: Path, metrics_port: int, webhook: Webhook
) -> AsyncIterator[str]:
    """A real Alertmanager and a real Prometheus (on 127.0.0.1, temporary storage),
    stopped on exit; yields Prometheus's base URL."""
    ports = {"prometheus": free_port(), "alertmanager": free_port()}
    rules = tmp_path / "rules"
    rules.mkdir()
    for name, text in generate(load_spec(SPEC).scaled(TIME_SCALE)).items():
        (rules / name).write_text(text)
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(webhook)))
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": "1s",
                    "evaluation_interval": "1s",
                    "external_labels": {"cluster": CLUSTER},
                },
                "rule_files": [str(p) for p in sorted(rules.glob("*.yml"))],
                "alerting": {
                    "alertmanagers": [
                        {"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}
                    ]
                },
                "scrape_configs": [
                    {
                        "job_name": "relmon",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{metrics_port}"],
                                "labels": {"namespace": NAMESPACE, "pod": "relmon-e2e-0"},
                            }
                        ],
                    }
                ],
            }
        )
    )
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert binary is not None
    am_cmd = [
        binary,
        f"--config.file={tmp_path / 'alertmanager.yml'}",
        f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
        "--cluster.listen-address=",  # no gossip port: a single instance
    ]
    prom_cmd = [
        "prometheus",
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
    ]
    with (tmp_path / "am.log").open("wb") as am_log, (tmp_path / "prom.log").open("wb") as p_log:
        am = subprocess.Popen(am_cmd, stdout=am_log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        prom = subprocess.Popen(prom_cmd, stdout=p_log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        try:
            base = f"http://127.0.0.1:{ports['prometheus']}"
            am_url = f"http://127.0.0.1:{ports['alertmanager']}/-/ready"
            await wait_until(answers_http(am_url), timeout_s=60, what="alertmanager", alive=am)
            await wait_until(answers_http(f"{base}/-/ready"), timeout_s=60, what="prometheus")
            yield base
        finally:
            _stop(prom)
            _stop(am)


async def _query(base: str, expr: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{base}/api/v1/query", params={"query": expr}) as resp,
    ):
        body = await resp.json()
    assert body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.mark.timeout(300)
async def test_a_drift_pages_a_human_only_once_there_are_enough_reviews(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("metrics", "review", "traffic")}
    bank = QuestionBank()
    # Drifted from the start: most top answers are off by one.
    model = SimulatedModel(quality_after_drift=0.3, drift_after_s=0.0, bank=bank)
    model_url = await model.start()
    webhook = Webhook()
    await webhook.start()
    running: Running = await start_service(
        relmon_settings(model_url, tmp_path / "state", ports), review_token=TOKEN
    )
    stop_review, stop_trickle, stop_flood = asyncio.Event(), asyncio.Event(), asyncio.Event()
    mirror = f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions"
    workers = [
        asyncio.create_task(
            auto_review(f"http://127.0.0.1:{ports['review']}", TOKEN, stop=stop_review)
        )
    ]
    try:
        async with prometheus_and_alertmanager(tmp_path, ports["metrics"], webhook) as prom:
            await wait_until(
                lambda: _query(prom, 'up{job="relmon"} == 1'), timeout_s=30, what="a scrape"
            )
            # Phase 1: a trickle, 12 items a minute (an hour, scaled), every one reviewed.
            workers.append(
                asyncio.create_task(
                    generate_traffic(mirror, bank, rate_per_s=0.2, stop=stop_trickle, seed=1)
                )
            )
            await wait_until(
                lambda: bool(webhook.alerts("/ticket", "RelmonTooFewReviews")),
                timeout_s=120,
                what="the warning 'too few reviews to know'",
                interval_s=0.5,
                detail=lambda: json.dumps(webhook.received)[-2000:],
            )
            # Several wrong verdicts later, every rule evaluated many times over (the
            # warning went through Prometheus and Alertmanager): no page, none pending.
            await wait_until(
                lambda: _query(prom, "relmon:reviews:increase1m >= 5"),
                timeout_s=120,
                what="5 reviewed items in the long window",
            )
            reviewed = await _query(prom, "relmon:reviews:increase1m")
            assert reviewed and float(reviewed[0]["value"][1]) < 20, reviewed
            assert webhook.alerts("/page") == [], webhook.alerts("/page")
            assert await _query(prom, 'ALERTS{severity="critical"}') == []
            burning = await _query(prom, "slo:sli_error:ratio_rate1m")
            assert burning and float(burning[0]["value"][1]) > 0.3, burning  # it does look bad
            low_volume = {
                "reviewed_in_long_window": reviewed[0]["value"][1],
                "error_ratio_1m": burning[0]["value"][1],
                "ticket": webhook.alerts("/ticket", "RelmonTooFewReviews")[0],
            }
            # Phase 2: traffic up (new request ids), the volume passes 20.
            stop_trickle.set()
            workers.append(
                asyncio.create_task(
                    generate_traffic(mirror, bank, rate_per_s=10, stop=stop_flood, seed=2)
                )
            )
            await wait_until(
                lambda: bool(webhook.alerts("/page", "RelmonErrorBudgetBurnFast")),
                timeout_s=120,
                what="the page RelmonErrorBudgetBurnFast",
                interval_s=0.5,
                detail=lambda: json.dumps(webhook.received)[-2000:],
            )
    finally:
        stop_review.set()
        stop_trickle.set()
        stop_flood.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await running.close(5.0)
        await model.stop()
        await webhook.stop()
    page = webhook.alerts("/page", "RelmonErrorBudgetBurnFast")[0]
    (tmp_path / "webhook.json").write_text(json.dumps(webhook.received, indent=2))
    print("LOW VOLUME:", json.dumps(low_volume, indent=2))
    print("PAGE:", json.dumps(page, indent=2))
    labels = page["labels"]
    assert labels["severity"] == "critical"
    assert labels["namespace"] == NAMESPACE and labels["job"] == "relmon"
    assert labels["model"] == MODEL and labels["task"] == TASK
    assert labels["cluster"] == CLUSTER  # the external label, passed through
    assert "pod" not in labels and "instance" not in labels  # a deployment's alert
    spec = load_spec(SPEC)
    assert page["annotations"]["runbook_url"] == spec.runbook("RelmonErrorBudgetBurnFast")
    assert f"{TASK} on {MODEL} in {NAMESPACE}" in page["annotations"]["summary"]
    ticket = low_volume["ticket"]
    assert ticket["labels"]["namespace"] == NAMESPACE and ticket["labels"]["task"] == TASK
    assert "too few reviews to know" in ticket["annotations"]["description"]
