"""A failing minority, end to end, with real parts: relmon (in process, segments by
``metadata.tenant``) -> a real Prometheus scraping it and evaluating the rules generated
from deploy/slo/relmon-slo.yaml -> a real Alertmanager routing with
deploy/alertmanager/alertmanager.yml -> a webhook receiver in this test. The Prometheus,
Alertmanager and webhook parts are test_alert_e2e.py's, unchanged (rules time-scaled by
60 through ``relmon slo generate --time-scale``; the volume gate is the shipped 20).

Traffic: tenant ``acme`` sends 9 items in 10, and the model's top answer is acceptable
on 95% of its questions; tenant ``beta`` sends 1 in 10, acceptable on 70%. The task's
target is 0.9, so the task as a whole is at 0.925 (reliable), ``beta`` is not. The model
answers each question the same way every time (right, or off by one), so those shares
are the true levels exactly; every item is reviewed by the demo's ground-truth reviewer.

Phase 1, relmon alone: the traffic runs until the task's 95% lower bound is 0.005 above
its target (a new deployment cannot certify 0.925 against 0.9 before some 420 reviews,
and RelmonReliabilityBelowTarget would rightly page during that ramp: not this
scenario). beta's alarm may or may not be raised by then (it needs some 60 of beta's
reviews). Phase 2: Prometheus and Alertmanager watch the same traffic; beta's
anytime-valid alarm (at alarm_alpha / (max + 2)) pages as RelmonSegmentReliabilityAlarm
with segment="beta"; the task never pages nor is pending, nor does acme, and the task's
bound stays at or above its target at every scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.demo.model import QUESTION, QuestionBank, SimulatedModel, truth_of
from monitor.app.demo.reviewer import auto_review
from monitor.app.runner import Running, start_service
from monitor.app.slo import load_spec
from monitor.config import load_settings
from tests.deploy.test_alert_e2e import (
    CLUSTER,
    NAMESPACE,
    SPEC,
    Webhook,
    _query,
    prometheus_and_alertmanager,
)
from tests.e2e.test_run_drain import TOKEN, free_port
from tests.waiting import wait_until

MODEL, TASK = "sim-arith-1", "arithmetic"
TARGET = 0.9
SEGMENTS_MAX = 5
# tenant: (share of traffic in tenths, questions per pool, of which the model gets wrong)
TENANTS = {"acme": (9, 100, 5), "beta": (1, 100, 30)}
RATE_PER_S = 20.0
# Phase 1 ends with the task's bound this far above its target (some 450 reviews): one
# wrong answer moves a bound of 450 reviews by about 0.002, so it stays above the target
# while Prometheus watches (its lowest: 0.906 in test runs).
MARGIN = 0.005

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")),
    reason="Debian's prometheus-alertmanager is not installed (make system-deps)",
)


class ConsistentModel(SimulatedModel):
    """The demo's simulated model, answering each question the same way every time:
    right, or (for the questions in ``wrong``) off by one, in the demo's surface forms.
    So the share of a tenant's questions in ``wrong`` is the share of its items whose
    top answer is not acceptable."""

    def __init__(self, wrong: set[str], **kwargs: Any) -> None:
        super().__init__(drift_after_s=None, **kwargs)
        self.wrong = wrong

    def answer(self, query: str) -> str:
        truth = truth_of(query)
        m = QUESTION.search(query)
        if truth is None or m is None:
            return "I can only do arithmetic."
        value = truth + 1 if m.group(0) in self.wrong else truth
        form = self.rng.choice(("{v}", "The answer is {v}.", "#### {v}", "Answer: {v}"))
        return form.format(v=value)


def question_pools() -> tuple[dict[str, list[str]], set[str]]:
    """Each tenant's questions (disjoint), in the order it asks them, and the ones the
    model gets wrong: spread evenly through the pool, so that any run of a tenant's items
    holds its share of wrong ones to within one (acme: 1 in 20; beta: 3 in 10)."""
    questions = iter(dict.fromkeys(q for q, _ in QuestionBank(size=1000, seed=5).questions))
    pools: dict[str, list[str]] = {}
    wrong: set[str] = set()
    for tenant, (_, size, bad) in TENANTS.items():
        pools[tenant] = list(itertools.islice(questions, size))
        wrong.update(
            q for j, q in enumerate(pools[tenant]) if (j + 1) * bad // size > j * bad // size
        )
    return pools, wrong


async def tenant_traffic(url: str, pools: dict[str, list[str]], *, stop: asyncio.Event) -> None:
    """Mirror chat requests to relmon until ``stop``: in every 10, 9 of acme and 1 of
    beta (``metadata.tenant`` in the body), each tenant cycling through its questions."""
    tenths = [t for t, (share, _, _) in TENANTS.items() for _ in range(share)]
    next_question = {tenant: itertools.cycle(pools[tenant]) for tenant in TENANTS}
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i in itertools.count():
            if stop.is_set():
                break
            tenant = tenths[i % len(tenths)]
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": next(next_question[tenant])}],
                "temperature": 0.7,
                "max_tokens": 64,
                "metadata": {"tenant": tenant},
            }
            headers = {"X-Relmon-Task": TASK, "X-Request-Id": f"seg-{i}"}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(url, json=body, headers=headers) as resp:
                    await resp.read()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / RATE_PER_S)


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
                # every item reviewed: the review floor (min_reviews_per_hour) has nothing
                # to raise, and every inclusion probability is 1
                "review_rate": 1.0,
                "reliability_target": TARGET,
                "segments": {"by": {"field": "metadata.tenant"}, "max": SEGMENTS_MAX},
            }
        ],
        metrics={"port": ports["metrics"]},
        review={"port": ports["review"]},
        traffic={"port": ports["traffic"], "mode": "mirror"},
        budget={"calls_per_minute": 100_000, "max_in_flight": 8, "queue_size": 256},
        state_dir=state,
        log_format="json",
    )


async def relmon_gauges(metrics_port: int) -> dict[tuple[str, str], float]:
    """relmon's own /metrics: {(metric name, segment or ""): value} for this task."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp,
    ):
        text = await resp.text()
    return {
        (sample.name, sample.labels.get("segment", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("task") == TASK and "alpha" not in sample.labels
    }


async def _holds(base: str, expr: str) -> bool:
    """Whether the PromQL ``expr`` has a result now."""
    return bool(await _query(base, expr))


def _value(rows: list[dict[str, Any]], **labels: str) -> float:
    [row] = [r for r in rows if all(r["metric"].get(k) == v for k, v in labels.items())]
    return float(row["value"][1])


@pytest.mark.timeout(300)
async def test_a_failing_tenant_pages_for_its_segment_while_the_task_meets_its_target(
    tmp_path: Path,
) -> None:
    ports = {name: free_port() for name in ("metrics", "review", "traffic")}
    pools, wrong = question_pools()
    model = ConsistentModel(wrong)
    model_url = await model.start()
    webhook = Webhook()
    await webhook.start()
    running: Running = await start_service(
        relmon_settings(model_url, tmp_path / "state", ports), review_token=TOKEN
    )
    stop = asyncio.Event()
    mirror = f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions"
    workers = [
        asyncio.create_task(auto_review(f"http://127.0.0.1:{ports['review']}", TOKEN, stop=stop)),
        asyncio.create_task(tenant_traffic(mirror, pools, stop=stop)),
    ]

    async def task_certified() -> bool:
        gauges = await relmon_gauges(ports["metrics"])
        return gauges.get(("relmon_reliability_lower_bound", ""), 0.0) >= TARGET + MARGIN

    try:
        # Phase 1: relmon alone, until the task is certified at its target, with a margin.
        await wait_until(
            task_certified,
            timeout_s=150,
            what="the task's lower bound at its target",
            interval_s=0.5,
            detail=lambda: str(model.calls),
        )
        gauges = await relmon_gauges(ports["metrics"])
        watch_start = {
            "task_lower_bound": gauges[("relmon_reliability_lower_bound", "")],
            "task_reviewed_items": gauges[("relmon_calibration_items", "")],
            "beta_reviewed_items": gauges.get(("relmon_segment_calibration_items", "beta")),
            "beta_alarm": gauges.get(("relmon_segment_reliability_alarm", "beta")),
        }
        async with prometheus_and_alertmanager(tmp_path, ports["metrics"], webhook) as prom:
            await wait_until(
                lambda: _holds(prom, 'up{job="relmon"} == 1'), timeout_s=30, what="a scrape"
            )
            # Phase 2: the same traffic, watched. beta's alarm pages.
            await wait_until(
                lambda: bool(webhook.alerts("/page", "RelmonSegmentReliabilityAlarm")),
                timeout_s=90,
                what="the page RelmonSegmentReliabilityAlarm",
                interval_s=0.5,
                detail=lambda: json.dumps(webhook.received)[-2000:],
            )
            # Many more verdicts and rule evaluations later (60 reviewed items of the
            # task, every rule evaluated at least 3 times over): still no other page,
            # none pending, and nothing critical but beta's segment alarm.
            reviewed = _value(await _query(prom, "relmon_calibration_items"), task=TASK)
            await wait_until(
                lambda: _holds(prom, f"relmon_calibration_items >= {reviewed + 60}"),
                timeout_s=60,
                what="60 more reviewed items",
            )
            # Every critical reliability alert (they carry the task) pending or firing at
            # any evaluation since Prometheus started (less than 10 minutes ago), and the
            # task's lowest bound meanwhile. (RelmonAbsent, pending until the first
            # scrape, is not about reliability.)
            critical = await _query(
                prom, 'max_over_time(ALERTS{severity="critical", task!=""}[10m])'
            )
            task = {
                "target": TARGET,
                "level": _value(await _query(prom, "relmon_reliability_level"), task=TASK),
                "lower_bound": _value(
                    await _query(prom, "relmon_reliability_lower_bound"), task=TASK
                ),
                "lowest_bound_while_watched": _value(
                    await _query(prom, "min_over_time(relmon_reliability_lower_bound[10m])"),
                    task=TASK,
                ),
                "reviewed_items": _value(await _query(prom, "relmon_calibration_items"), task=TASK),
                "alarm_ever": _value(
                    await _query(prom, "max_over_time(relmon_reliability_alarm[10m])"), task=TASK
                ),
            }
            segments = {
                row["metric"]["segment"]: {
                    "level": float(row["value"][1]),
                    "lower_bound": _value(
                        await _query(prom, "relmon_segment_reliability_lower_bound"),
                        segment=row["metric"]["segment"],
                    ),
                    "reviewed_items": _value(
                        await _query(prom, "relmon_segment_calibration_items"),
                        segment=row["metric"]["segment"],
                    ),
                    "alarm": _value(
                        await _query(prom, "relmon_segment_reliability_alarm"),
                        segment=row["metric"]["segment"],
                    ),
                }
                for row in await _query(prom, "relmon_segment_reliability_level")
            }
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await running.close(5.0)
        await model.stop()
        await webhook.stop()
    (tmp_path / "webhook.json").write_text(json.dumps(webhook.received, indent=2))
    pages = webhook.alerts("/page")
    page = webhook.alerts("/page", "RelmonSegmentReliabilityAlarm")[0]
    print("WHEN PROMETHEUS STARTED (relmon's /metrics):", json.dumps(watch_start))
    print("TASK (marginal over segments):", json.dumps(task, indent=2))
    print("SEGMENTS:", json.dumps(segments, indent=2))
    print("PAGE:", json.dumps(page, indent=2))

    # The task is reliable and was certified so all along: no task-level page, none
    # pending, its alarm never raised; the one critical alert ever is beta's.
    assert task["level"] > TARGET and task["lowest_bound_while_watched"] >= TARGET, task
    assert task["alarm_ever"] == 0, task
    assert {(a["metric"]["alertname"], a["metric"].get("segment")) for a in critical} == {
        ("RelmonSegmentReliabilityAlarm", "beta")
    }, critical
    # One page, for beta only; acme is reliable and has its own series, and no alarm.
    assert {(a["labels"]["alertname"], a["labels"].get("segment")) for a in pages} == {
        ("RelmonSegmentReliabilityAlarm", "beta")
    }, pages
    assert segments["acme"]["level"] > TARGET and segments["acme"]["alarm"] == 0
    assert segments["beta"]["level"] < TARGET and segments["beta"]["alarm"] == 1
    assert segments["beta"]["reviewed_items"] >= 20  # the shipped volume gate
    labels = page["labels"]
    assert labels["severity"] == "critical"
    assert labels["model"] == MODEL and labels["task"] == TASK and labels["segment"] == "beta"
    assert labels["namespace"] == NAMESPACE and labels["job"] == "relmon"
    assert labels["cluster"] == CLUSTER
    assert "pod" not in labels and "instance" not in labels  # a deployment's alert
    spec = load_spec(SPEC)
    assert page["annotations"]["runbook_url"] == spec.runbook("RelmonSegmentReliabilityAlarm")
    assert "in segment beta" in page["annotations"]["summary"]
