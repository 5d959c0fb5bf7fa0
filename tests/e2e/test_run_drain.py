"""``relmon run --drain`` as a real process: mirror in, re-asks to a (simulated) model,
review through the HTTP API, verdicts, metrics out; the exported reliability level and
thresholds are checked against an independent computation from the same verdicts."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.demo.model import QuestionBank, SimulatedModel, truth_of
from tests.ports import free_port
from tests.waiting import answers_http, wait_until

TOKEN = "e2e-test-token-123456"


def write_config(path: Path, model_url: str, ports: dict[str, int], state: Path) -> None:
    path.write_text(
        f"""
tasks:
  - name: arithmetic
    match: {{header: arithmetic}}
    canonicalizer: numeric
    endpoint: {{base_url: "{model_url}", model: sim-arith-1, concurrency: 4, timeout_s: 5}}
    k_max: 10
    k0: 3
    sampling_rate: 1.0
    review_rate: 1.0
    half_life_s: null
    alphas: [0.05, 0.1, 0.2, 0.3]
metrics: {{port: {ports["metrics"]}}}
review: {{port: {ports["review"]}}}
traffic: {{port: {ports["traffic"]}, mode: mirror}}
state_dir: "{state}"
log_format: json
"""
    )


async def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 120) -> None:
    """``url`` answers 200 while ``proc`` keeps running."""
    await wait_until(
        answers_http(url),
        timeout_s=deadline_s,
        what=f"{url} to answer 200",
        interval_s=0.1,
        alive=proc,
    )


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def independent(scores: list[float], alpha: float) -> float:
    """The k-th smallest of n scores, k = ceil((n+1)(1-alpha)), inf past n: by hand."""
    n = len(scores)
    k = math.ceil(round((n + 1) * (1 - alpha), 9))
    return math.inf if k > n else sorted(scores)[k - 1]


@pytest.mark.timeout(300)
async def test_drain_mode_end_to_end(tmp_path: Path) -> None:
    bank = QuestionBank(size=60, seed=5)
    model = SimulatedModel(quality=0.8, drift_after_s=None, bank=bank, seed=2)
    model_url = await model.start()
    ports = {"metrics": free_port(), "review": free_port(), "traffic": free_port()}
    config = tmp_path / "relmon.yaml"
    write_config(config, model_url, ports, tmp_path / "state")
    out = tmp_path / "metrics.prom"
    env = {**os.environ, "RELMON_REVIEW_TOKEN": TOKEN}
    log = (tmp_path / "relmon.log").open("wb")
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once; waited for in a thread
        [
            sys.executable,
            "-m",
            "monitor",
            "run",
            "--config",
            str(config),
            "--drain",
            "--idle-s",
            "4",
            "--metrics-out",
            str(out),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        await wait_ready(f"http://127.0.0.1:{ports['metrics']}/readyz", proc)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        scores: list[float] = []
        async with aiohttp.ClientSession() as session:
            for i, (question, _) in enumerate(bank.questions[:40]):
                body = {"model": "sim-arith-1", "messages": [{"role": "user", "content": question}]}
                async with session.post(
                    f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions",
                    json=body,
                    headers={"X-Relmon-Task": "arithmetic", "X-Request-Id": f"q{i}"},
                ) as resp:
                    assert resp.status == 202

            # Review every item as it appears, from the ground truth (the items are
            # scored meanwhile: a loaded machine may take a minute or more for all 40).
            async def review_those_waiting() -> bool:
                """Review the items waiting now; all 40 reviewed?"""
                while len(scores) < 40:
                    async with session.get(
                        f"http://127.0.0.1:{ports['review']}/api/reviews/next", headers=headers
                    ) as resp:
                        if resp.status == 204:
                            return False
                        assert resp.status == 200
                        item = await resp.json()
                    truth = str(truth_of(item["query"]))
                    ranks = [c["rank"] for c in item["candidates"] if c["answer"] == truth]
                    verdict = {"accepted_ranks": ranks} if ranks else {"none_of_these": True}
                    async with session.post(
                        f"http://127.0.0.1:{ports['review']}/api/reviews/{item['item_id']}",
                        json=verdict,
                        headers=headers,
                    ) as resp:
                        assert resp.status == 200, await resp.text()
                        assert (await resp.json())["status"] == "applied"
                    scores.append(float(min(ranks)) if ranks else math.inf)
                return True

            await wait_until(
                review_those_waiting,
                timeout_s=180,
                what="40 items to review",
                interval_s=0.1,
                detail=lambda: f"{len(scores)} reviewed",
            )
        assert len(scores) == 40
        assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        await model.stop()
    metrics = parse_metrics(out.read_text())
    labels = (("model", "sim-arith-1"), ("task", "arithmetic"))
    n = len(scores)
    assert metrics[("relmon_calibration_items", labels)] == n == 40
    assert metrics[("relmon_reliability_level", labels)] == pytest.approx(
        sum(1 for s in scores if s <= 1) / (n + 1)
    )
    for alpha in (0.05, 0.1, 0.2, 0.3):
        key = ("relmon_conformal_threshold", (*labels[:1], ("alpha", f"{alpha:g}"), labels[1]))
        key = ("relmon_conformal_threshold", tuple(sorted((*labels, ("alpha", f"{alpha:g}")))))
        assert metrics[key] == independent(scores, alpha), alpha
    assert (
        metrics[("relmon_traffic_events_total", (("decision", "sampled"), ("source", "mirror")))]
        == 40
    )
    assert metrics[("relmon_samples_per_item_count", labels)] == 40
    assert (
        metrics[("relmon_reviews_total", tuple(sorted((*labels, ("verdict", "accepted")))))]
        + metrics.get(("relmon_reviews_total", tuple(sorted((*labels, ("verdict", "none"))))), 0)
        == 40
    )
    # One JSON summary line per item in the log, and no prompt text in it.
    lines = [
        json.loads(x)
        for x in (tmp_path / "relmon.log").read_text().splitlines()
        if x.startswith("{")
    ]
    items = [x for x in lines if x.get("event") == "item"]
    assert len(items) == 40
    assert not any("What is" in json.dumps(x) for x in lines)
