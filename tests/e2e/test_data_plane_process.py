"""``traffic.data_plane: process``: the mirror's or proxy's listener in a process of its
own (adapters/traffic/dataplane.py), against a real child process.

The properties: it decides and counts every request exactly as the one-process data
plane does (same random request sequences, both ways); a scrape counts every request
answered before it; a child killed with SIGKILL is replaced while the port keeps
queueing connections, and nothing synced before the kill is lost; a stop drains the
child's events into the service; the child never outlives the main process."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.traffic.dataplane import DataPlaneProcess
from monitor.app.demo.model import QuestionBank, SimulatedModel
from monitor.app.runner import Running, start_service
from monitor.config import load_settings
from monitor.core.errors import ConfigError
from monitor.core.sampler import sampled
from tests.e2e.test_run_drain import parse_metrics
from tests.ports import free_port
from tests.waiting import answers_http, wait_until

TOKEN = "data-plane-token-123456"
TASKS = ("arithmetic", "other")


def settings_for(
    tmp: Path, model_url: str, mode: str, data_plane: str, *, rate: float = 0.5, port: int = 0
) -> Any:
    origin = model_url.removesuffix("/v1")
    traffic: dict[str, Any] = {"port": port, "mode": mode, "data_plane": data_plane}
    if mode == "proxy":
        traffic["upstream_url"] = origin
    tasks = [
        {
            "name": name,
            "match": {"header": name, **({"model": "sim-arith-1"} if i == 0 else {})},
            "canonicalizer": "numeric",
            "sampling_rate": rate,
            "review_rate": 0.01,
            "k_max": 4,
            "k0": 2,
            "endpoint": {"base_url": model_url, "model": "sim-arith-1", "timeout_s": 5},
        }
        for i, name in enumerate(TASKS)
    ]
    return load_settings(
        None,
        tasks=tasks,
        metrics={"port": 0},
        review={"port": 0, "token": TOKEN},
        traffic=traffic,
        state_dir=tmp,
        drain_timeout_s=5.0,
    )


def random_requests(seed: int, n: int) -> list[tuple[dict[str, str], bytes]]:
    """Requests as a client mixes them: tasks by header, by model, none; ids repeated
    (duplicates); now and then a body that is not JSON or not an object. (Every request
    has an id: one made up for a request without is random, so both runs would differ.)"""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        headers = {"Content-Type": "application/json"}
        headers["X-Request-Id"] = f"req-{seed}-{rng.randrange(n)}"
        pick = rng.random()
        if pick < 0.5:
            headers["X-Relmon-Task"] = rng.choice(TASKS)
        model = rng.choice(["sim-arith-1", "unknown-model"])
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": f"What is {i} + 1?"}]}
        ).encode()
        junk = rng.random()
        if junk < 0.08:
            body = b"{not json"
        elif junk < 0.12:
            body = b"[1, 2]"
        out.append((headers, body))
    return out


async def send_all(port: int, requests: list[tuple[dict[str, str], bytes]]) -> list[int]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    statuses = []
    async with aiohttp.ClientSession() as session:
        for headers, body in requests:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                statuses.append(resp.status)
    return statuses


async def scrape(running: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert running.metrics_server is not None
    url = f"http://127.0.0.1:{running.metrics_server.bound_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return parse_metrics(await resp.text())


def traffic_counts(metrics: dict[Any, float], source: str) -> dict[str, float]:
    return {
        dict(labels)["decision"]: value
        for (name, labels), value in metrics.items()
        if name == "relmon_traffic_events_total" and dict(labels)["source"] == source
    }


def proxy_counts(metrics: dict[Any, float]) -> dict[str, float]:
    return {
        dict(labels)["status_class"]: value
        for (name, labels), value in metrics.items()
        if name == "relmon_proxy_requests_total"
    }


@pytest.fixture
async def model() -> Any:
    sim = SimulatedModel(drift_after_s=None, bank=QuestionBank(size=10, seed=3))
    url = await sim.start()
    try:
        yield url
    finally:
        await sim.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["proxy", "mirror"])
async def test_the_process_decides_and_counts_as_one_process_does(
    tmp_path: Path, model: str, mode: str
) -> None:
    """The same random request sequences through both data planes: the same statuses
    and, at the scrape right after the last answer, the same counts by decision (and
    the same proxy counts), the skipped ones as the hash sampler says."""
    for seed in (1, 2):
        requests = random_requests(seed, 80)
        seen = {}
        for plane in ("inline", "process"):
            settings = settings_for(tmp_path / f"{plane}-{seed}", model, mode, plane)
            running = await start_service(settings, review_token=TOKEN)
            try:
                assert running.traffic_server is not None
                statuses = await send_all(running.traffic_server.bound_port, requests)
                metrics = await scrape(running)  # no wait: the scrape syncs the child
                seen[plane] = (statuses, traffic_counts(metrics, mode), proxy_counts(metrics))
            finally:
                await running.close(5.0)
        assert seen["inline"] == seen["process"], seed
        statuses, counts, proxied = seen["process"]
        assert counts["skipped"] > 0 and counts["sampled"] > 0 and counts["duplicate"] > 0
        if mode == "mirror":  # every request is an event; junk is rejected
            assert statuses == [202] * len(requests)
            assert sum(counts.values()) == len(requests) and counts["rejected"] > 0
        else:  # only a 2xx answer makes an event (the upstream refuses junk: 500)
            answered = statuses.count(200)
            assert answered < len(requests) and sum(counts.values()) == answered
            assert (proxied["2xx"], proxied["5xx"]) == (answered, len(requests) - answered)


def by_task_header(n: int, prefix: str) -> list[tuple[dict[str, str], bytes]]:
    body = json.dumps({"model": "sim-arith-1", "messages": [{"role": "user", "content": "1+1"}]})
    return [
        ({"X-Request-Id": f"{prefix}{i}", "X-Relmon-Task": "arithmetic"}, body.encode())
        for i in range(n)
    ]


def expected_skips(requests: list[tuple[dict[str, str], bytes]], rate: float) -> int:
    return sum(not sampled("arithmetic", h["X-Request-Id"], rate) for h, _ in requests)


@pytest.mark.timeout(180)
async def test_a_killed_child_is_replaced_and_the_port_keeps_its_queue(
    tmp_path: Path, model: str
) -> None:
    running = await start_service(
        settings_for(tmp_path, model, "proxy", "process"), review_token=TOKEN
    )
    try:
        plane = running.traffic_server
        assert isinstance(plane, DataPlaneProcess) and plane.proc is not None
        port = plane.bound_port
        first = by_task_header(40, "a")
        assert await send_all(port, first) == [200] * 40
        before = traffic_counts(await scrape(running), "proxy")
        assert before["skipped"] == expected_skips(first, 0.5)
        assert sum(before.values()) == 40
        pid = plane.proc.pid
        os.kill(pid, signal.SIGKILL)
        # Sent at once: the connection waits in the listening socket's queue (held by
        # this process) until the new child takes it.
        during = by_task_header(5, "d")
        assert await asyncio.wait_for(send_all(port, during), 30) == [200] * 5
        assert plane.proc.pid != pid
        await wait_until(lambda: not plane.down, what="the new child to serve")
        second = by_task_header(40, "b")
        assert await send_all(port, second) == [200] * 40
        metrics = await scrape(running)
        after = traffic_counts(metrics, "proxy")
        skips = expected_skips(first + during + second, 0.5)
        assert after["skipped"] == skips
        assert sum(after.values()) == 85
        restarts = metrics[("relmon_source_restarts_total", (("source", "proxy"),))]
        assert restarts == 1
        assert proxy_counts(metrics)["2xx"] == 85
        assert running.not_ready_for_traffic() == []
    finally:
        await running.close(5.0)


@pytest.mark.timeout(120)
async def test_stop_hands_every_event_of_the_child_to_the_service(
    tmp_path: Path, model: str
) -> None:
    """Mirror: each request is answered 202 before its event is handed on; a stop right
    after the last answer still counts every one of them."""
    running = await start_service(
        settings_for(tmp_path, model, "mirror", "process", rate=1.0), review_token=TOKEN
    )
    closed = False
    try:
        assert running.traffic_server is not None
        requests = by_task_header(60, "m")
        assert await send_all(running.traffic_server.bound_port, requests) == [202] * 60
        await running.close(10.0)
        closed = True
        assert sum(running.service.stats.by_decision.values()) == 60
        assert running.service.stats.by_decision["skipped"] == 0
    finally:
        if not closed:
            await running.close(5.0)


async def test_a_taken_port_fails_the_start_naming_it(tmp_path: Path, model: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = settings_for(tmp_path, model, "proxy", "process", port=port)
        with pytest.raises(ConfigError, match=r"traffic\.port: cannot listen"):
            await start_service(settings, review_token=TOKEN)


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.timeout(120)
async def test_the_child_exits_when_the_main_process_is_killed(tmp_path: Path, model: str) -> None:
    ports = {"metrics": free_port(), "traffic": free_port()}
    config = tmp_path / "relmon.yaml"
    config.write_text(
        f"""
tasks:
  - name: arithmetic
    canonicalizer: numeric
    endpoint: {{base_url: "{model}", model: sim-arith-1}}
metrics: {{port: {ports["metrics"]}}}
review: {{port: 0, token: {TOKEN}}}
traffic: {{port: {ports["traffic"]}, mode: proxy, upstream_url: "{model.removesuffix("/v1")}",
  data_plane: process}}
state_dir: "{tmp_path / "state"}"
"""
    )
    cmd = [sys.executable, "-m", "monitor", "run", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        url = f"http://127.0.0.1:{ports['metrics']}/readyz/traffic"
        await wait_until(answers_http(url), timeout_s=60, what="relmon ready", alive=proc)
        kids = children(proc.pid)
        assert len(kids) == 1
        assert await send_all(ports["traffic"], by_task_header(3, "k")) == [200] * 3
        proc.kill()
        proc.wait()
        await wait_until(lambda: not alive(kids[0]), timeout_s=20, what="the child to exit")
        with socket.socket() as again:  # the port is free again
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", ports["traffic"]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
