"""A repeated ``X-Request-Id`` on the mirror is monitored once: the model is not asked
again and the review queue does not grow, also after a restart (the real service
wiring: mirror, SQLite review store, a simulated model over HTTP)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from monitor.app.demo.model import QuestionBank, SimulatedModel
from monitor.app.runner import Running, start_service
from monitor.config import load_settings
from tests.e2e.test_run_drain import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def value(running: Running, name: str, **labels: str) -> float:
    return running.registry.get_sample_value(name, labels) or 0.0


async def test_a_repeated_request_id_is_not_asked_again_nor_queued_twice(tmp_path: Path) -> None:
    bank = QuestionBank(size=10, seed=3)
    model = SimulatedModel(quality=0.9, drift_after_s=None, bank=bank, seed=1)
    url = await model.start()
    traffic = free_port()
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
metrics: {{port: 0}}
review: {{port: 0, token: "dup-test-token-123456"}}
traffic: {{port: {traffic}, mode: mirror}}
state_dir: "{tmp_path / "state"}"
"""
    )
    labels = {"model": "sim-arith-1", "task": "arithmetic"}
    questions = [q for q, _ in bank.questions[:3]]

    async def send(session: aiohttp.ClientSession, request_id: str, question: str) -> None:
        body = {"model": "sim-arith-1", "messages": [{"role": "user", "content": question}]}
        async with session.post(
            f"http://127.0.0.1:{traffic}/v1/chat/completions",
            json=body,
            headers={"X-Request-Id": request_id},
        ) as resp:
            assert resp.status == 202

    async def settle(running: Running, events: int) -> None:
        def handled() -> bool:
            counted = sum(
                value(running, "relmon_traffic_events_total", source="mirror", decision=d)
                for d in ("sampled", "skipped", "duplicate", "dropped", "rejected")
            )
            return counted == events and running.service.in_flight == 0

        await wait_until(handled, timeout_s=30, what=f"the {events} events all handled")

    try:
        running = await start_service(load_settings(config))
        try:
            async with aiohttp.ClientSession() as session:
                await send(session, "r1", questions[0])
                await send(session, "r1", questions[0])  # at once: the first is in flight
                await send(session, "r2", questions[1])
                await settle(running, 3)
                calls = model.calls
                await send(session, "r1", questions[0])  # later: the first is done
                await settle(running, 4)
            running.service.publish()
            assert model.calls == calls
            assert (
                value(running, "relmon_traffic_events_total", source="mirror", decision="sampled")
                == 2
            )
            assert (
                value(running, "relmon_traffic_events_total", source="mirror", decision="duplicate")
                == 2
            )
            assert value(running, "relmon_review_queue_depth", **labels) == 2
        finally:
            await running.close(5.0)

        # After a restart the stored review items are recognised.
        running = await start_service(load_settings(config))
        try:
            async with aiohttp.ClientSession() as session:
                await send(session, "r2", questions[1])
                await send(session, "r3", questions[2])
                await settle(running, 2)
            running.service.publish()
            assert (
                value(running, "relmon_traffic_events_total", source="mirror", decision="duplicate")
                == 1
            )
            assert (
                value(running, "relmon_traffic_events_total", source="mirror", decision="sampled")
                == 1
            )
            assert value(running, "relmon_review_queue_depth", **labels) == 3
            assert await running.store.depth() == 3  # type: ignore[attr-defined]
        finally:
            await running.close(5.0)
    finally:
        await model.stop()
