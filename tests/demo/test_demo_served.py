"""The demo's traffic goes through relmon's proxy, so its /metrics shows the served
answers' acceptable share and bound beside the reliability level, with sane values."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from monitor.app.demo import run_demo
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LABELS = '{model="sim-arith-1",task="arithmetic"}'


def _sample(text: str, name: str, labels: str = LABELS) -> float | None:
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return None if m is None else float(m.group(1))


async def test_the_demo_exports_the_served_answer_beside_the_level(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("metrics", "review", "traffic")}
    demo = asyncio.create_task(
        run_demo(
            state_dir=tmp_path / "state",
            drift_after_s=None,
            duration_s=60,
            summary_every_s=1.0,
            rate_per_s=20.0,
            metrics_port=ports["metrics"],
            review_port=ports["review"],
            traffic_port=ports["traffic"],
            token="demo-served-test-token-0123",
        )
    )
    text = ""
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # until 20 reviewed items have a served answer
                await asyncio.sleep(0.5)
                assert not demo.done(), demo
                try:
                    url = f"http://127.0.0.1:{ports['metrics']}/metrics"
                    async with session.get(url) as resp:
                        text = await resp.text()
                except aiohttp.ClientError:
                    continue
                reviewed = _sample(text, "relmon_calibration_items") or 0.0
                if _sample(text, "relmon_served_answer_acceptable_ratio") and reviewed >= 20:
                    break
    finally:
        demo.cancel()
        await asyncio.gather(demo, return_exceptions=True)
    level = _sample(text, "relmon_reliability_level")
    ratio = _sample(text, "relmon_served_answer_acceptable_ratio")
    bound = _sample(text, "relmon_served_answer_acceptable_lower_bound")
    assert level is not None and ratio is not None and bound is not None, text
    # The simulated model is right about 85% of the time a draw before its drift.
    assert 0.5 < ratio <= 1.0 and 0.0 < bound < ratio
    served = _sample(text, "relmon_served_answers_total")
    scored = _sample(
        text, "relmon_items_total", '{model="sim-arith-1",outcome="scored",task="arithmetic"}'
    )
    disagreed = _sample(text, "relmon_served_answer_disagreements_total")
    assert served is not None and scored is not None and disagreed is not None
    assert served == scored > 0  # every proxied request carried its answer
    assert 0 <= disagreed < served / 2
    # The demo's clients send what relmon would re-ask: the served answer is a draw.
    overrides = re.findall(r"^relmon_reask_overrides_total\{.*\} (\S+)$", text, re.MULTILINE)
    assert overrides and all(float(v) == 0.0 for v in overrides)
