"""The SQLite store refusing writes (another process holds its write lock) loses no
scored item: they wait in the review outbox and are written once the lock is gone;
``/readyz`` names the store meanwhile (the real service: mirror, SQLite, a simulated
model over HTTP)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from monitor.app.demo.model import QuestionBank, SimulatedModel
from monitor.app.runner import start_service
from monitor.config import load_settings
from tests.ports import free_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LABELS = {"model": "sim-arith-1", "task": "arithmetic"}


async def test_a_locked_sqlite_store_loses_no_scored_item(tmp_path: Path) -> None:
    bank = QuestionBank(size=20, seed=3)
    model = SimulatedModel(quality=0.9, drift_after_s=None, bank=bank, seed=1)
    url = await model.start()
    traffic, metrics = free_port(), free_port()
    config = tmp_path / "relmon.yaml"
    config.write_text(
        f"""
tasks:
  - name: arithmetic
    canonicalizer: numeric
    endpoint: {{base_url: "{url}", model: sim-arith-1, timeout_s: 5}}
    k_max: 6
    sampling_rate: 1.0
    review_rate: 1.0
metrics: {{port: {metrics}}}
review: {{port: 0, token: "outage-test-token-123456"}}
traffic: {{port: {traffic}, mode: mirror}}
state_dir: "{tmp_path / "state"}"
"""
    )
    running = await start_service(load_settings(config))

    def value(name: str) -> float:
        return running.registry.get_sample_value(name, LABELS) or 0.0

    async def send(http: aiohttp.ClientSession, n: int) -> None:
        for i in range(n):
            question = bank.questions[i % len(bank.questions)][0]
            body = {"model": "sim-arith-1", "messages": [{"role": "user", "content": question}]}
            async with http.post(
                f"http://127.0.0.1:{traffic}/v1/chat/completions",
                json=body,
                headers={"X-Request-Id": f"{n}-{i}-{asyncio.get_running_loop().time()}"},
            ) as resp:
                assert resp.status == 202
            await asyncio.sleep(0.1)

    locker = sqlite3.connect(tmp_path / "state" / "relmon.sqlite3", isolation_level=None)
    try:
        async with aiohttp.ClientSession() as http:
            await send(http, 5)
            locker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
            await send(http, 20)
            await wait_until(
                lambda: value("relmon_review_outbox_items") > 0, what="items in the outbox"
            )
            async with http.get(f"http://127.0.0.1:{metrics}/readyz") as resp:
                assert resp.status == 503
                reasons = (await resp.json())["reasons"]
            assert any(r.startswith("SQLite store not taking review items") for r in reasons)
            assert any((tmp_path / "state" / "review-outbox").glob("*.json"))  # on disk
            locker.execute("COMMIT")
            await running.sync_traffic()
            await wait_until(
                lambda: running.service.in_flight == 0 and len(running.service.reviews.outbox) == 0,
                timeout_s=60,
                what="every item scored and written",
            )
            async with http.get(f"http://127.0.0.1:{metrics}/readyz") as resp:
                assert resp.status == 200, await resp.text()
        scored = running.registry.get_sample_value(
            "relmon_items_total", {**LABELS, "outcome": "scored"}
        )
        assert scored == 25
        queued = locker.execute("SELECT count(*) FROM review_items").fetchone()[0]
        assert queued == scored and value("relmon_review_outbox_dropped_total") == 0
        assert value("relmon_review_submit_failures_total") > 0
        assert value("relmon_review_queue_depth") == 25
    finally:
        locker.close()
        await running.close(5)
        await model.stop()
