"""A real ``relmon run`` process: health, readiness, and a graceful drain on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from monitor.app.demo.model import QuestionBank, SimulatedModel
from tests.e2e.test_run_drain import TOKEN, free_port, wait_ready, write_config


@pytest.mark.timeout(120)
async def test_sigterm_drains_in_flight_items_and_state_survives(tmp_path: Path) -> None:
    bank = QuestionBank(size=20, seed=1)
    model = SimulatedModel(drift_after_s=None, bank=bank)
    url = await model.start()
    ports = {"metrics": free_port(), "review": free_port(), "traffic": free_port()}
    config = tmp_path / "relmon.yaml"
    write_config(config, url, ports, tmp_path / "state")
    env = {**os.environ, "RELMON_REVIEW_TOKEN": TOKEN}
    log = (tmp_path / "log").open("wb")
    cmd = [sys.executable, "-m", "monitor", "run", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)  # noqa: ASYNC220
    try:
        await wait_ready(f"http://127.0.0.1:{ports['metrics']}/readyz", proc)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{ports['metrics']}/healthz") as resp:
                assert resp.status == 200
            for i, (q, _) in enumerate(bank.questions):
                body = {"model": "sim-arith-1", "messages": [{"role": "user", "content": q}]}
                async with session.post(
                    f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions",
                    json=body,
                    headers={"X-Relmon-Task": "arithmetic", "X-Request-Id": f"s{i}"},
                ) as resp:
                    assert resp.status == 202
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0  # drained within the timeout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "log").read_text()
    assert '"drained": true' in text
    assert '"interrupted": 0' in text  # the last line counts items stopped unfinished
    # Every admitted item was handled before exit: all 20 review items are in the store.
    from adapters.sqlite.store import SqliteStore

    store = SqliteStore(tmp_path / "state" / "relmon.sqlite3")
    try:
        assert await store.depth() == 20
    finally:
        await store.aclose()
    # A restart with the same state dir comes up ready with the same pending reviews.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # noqa: ASYNC220
    try:
        await wait_ready(f"http://127.0.0.1:{ports['metrics']}/readyz", proc)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{ports['metrics']}/metrics") as resp,
        ):
            text = await resp.text()
        assert 'relmon_review_queue_depth{model="sim-arith-1",task="arithmetic"} 20.0' in text
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
        await model.stop()
