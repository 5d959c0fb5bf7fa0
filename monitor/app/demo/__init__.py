"""``relmon demo``: everything on one machine with embedded defaults.

A simulated OpenAI-compatible model (arithmetic with ground truth and a drift event),
a traffic generator whose requests go through relmon's inline proxy to that model (so
relmon sees the answer each request was served), an automatic reviewer answering
review items from the ground truth, and the service itself, on the default ports
(9108 metrics, 9109 review API and page, 9110 traffic; the model on any free port unless
``model_port`` is given), all on 127.0.0.1. The traffic carries a tenant header and the
task segments by it, so every panel of the Grafana dashboard has data, the Segments row
too. A one-line summary prints every few seconds
(the served answers' acceptable share at its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

from monitor.app.demo.model import QuestionBank, SimulatedModel
from monitor.app.demo.reviewer import auto_review
from monitor.app.demo.traffic import TENANT_HEADER, generate_traffic
from monitor.app.runner import Running, start_service
from monitor.config import Settings, load_settings

__all__ = ["demo_settings", "run_demo"]

TASK = "arithmetic"
MODEL = "sim-arith-1"


def demo_settings(
    model_url: str, state_dir: Path, *, metrics_port: int, review_port: int, traffic_port: int
) -> Settings:
    """The demo's settings: the traffic port proxies to the simulated model (its origin)."""
    origin = model_url.split("/v1", 1)[0]
    return load_settings(
        None,
        tasks=[
            {
                "name": TASK,
                "match": {"header": TASK},
                "canonicalizer": "numeric",
                "endpoint": {
                    "base_url": model_url,
                    "model": MODEL,
                    "concurrency": 8,
                    "timeout_s": 5,
                },
                "k_max": 10,
                "k0": 3,
                "sampling_rate": 0.5,
                "review_rate": 0.5,
                "reliability_target": 0.8,
                "window_size": 1000,
                "half_life_s": 30,
                # the traffic's tenants (demo/traffic.py), one calibration window each
                "segments": {"by": {"header": TENANT_HEADER}, "max": 5},
            }
        ],
        metrics={"port": metrics_port},
        review={"port": review_port},
        traffic={
            "port": traffic_port,
            "mode": "proxy",
            "upstream_url": origin,
            # the OTLP receiver on any free port: its counters on /metrics, at 0
            "otlp": {"enabled": True, "port": 0},
        },
        budget={"calls_per_minute": 20_000, "max_in_flight": 8, "queue_size": 256},
        state_dir=state_dir,
        log_format="json",
    )


def _summary(running: Running, started: float, model: SimulatedModel) -> str:
    """One status line; alpha = 1 - target, the alpha of ``relmon_set_size`` and the SLO."""
    task = running.service.tasks[TASK]
    target = task.settings.reliability_target
    alpha = task.target_alpha
    snap = running.service.snapshot(MODEL, TASK)
    stats = running.service.stats
    m = snap.thresholds.get(alpha, math.inf)
    m_text = "inf" if m == math.inf else str(int(m))
    status = (
        f"BELOW TARGET {target:g}"
        if snap.reliability_lower_bound < target
        else f"meets target {target:g}"
    )
    # No verdict yet: no estimate (relmon exports no level then), not "0.000, BELOW".
    level = (
        f"reliability={snap.reliability_level:.3f} "
        f"(lower bound {snap.reliability_lower_bound:.3f}: {status})"
        if snap.n > 0
        else f"reliability=no verdicts yet (target {target:g})"
    )
    # What users saw: the served answers' acceptable share (proxy traffic carries them).
    served = (
        f"  served={snap.served.acceptable_ratio:.3f} (lower bound {snap.served.lower_bound:.3f})"
        if snap.served is not None
        else ""
    )
    return (
        f"t={time.monotonic() - started:5.0f}s  {level}  "
        f"M*@{alpha:.2f}={m_text}  "
        f"n={snap.n} n_eff={snap.n_eff:.0f}  items={stats.scored} reviewed={stats.verdicts} "
        f"calls={stats.calls}  model={'DRIFTED' if model.drifted else 'ok'}{served}"
    )


async def run_demo(
    *,
    state_dir: Path | None,
    auto_reviewer: bool = True,
    drift_after_s: float | None = 120.0,
    duration_s: float | None = None,
    summary_every_s: float = 5.0,
    rate_per_s: float = 10.0,
    metrics_port: int = 9108,
    review_port: int = 9109,
    traffic_port: int = 9110,
    model_port: int = 0,
    token: str | None = None,
) -> int:

    token = token or os.environ.get("RELMON_REVIEW_TOKEN")
    if not token:
        token = secrets.token_urlsafe(18)
        print(f"review token (set RELMON_REVIEW_TOKEN to choose one): {token}", file=sys.stderr)
    tmp = None
    if state_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="relmon-demo-")
        state_dir = Path(tmp.name)
    bank = QuestionBank()
    model = SimulatedModel(drift_after_s=drift_after_s, bank=bank, port=model_port)
    model_url = await model.start()
    settings = demo_settings(
        model_url,
        state_dir,
        metrics_port=metrics_port,
        review_port=review_port,
        traffic_port=traffic_port,
    )
    running = await start_service(settings, review_token=token)
    print(
        f"relmon demo: metrics http://127.0.0.1:{metrics_port}/metrics  "
        f"review http://127.0.0.1:{review_port}/review  traffic http://127.0.0.1:{traffic_port}"
        f"  model {model_url}  (drift after {drift_after_s}s)",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    workers = [
        asyncio.create_task(
            generate_traffic(
                f"http://127.0.0.1:{traffic_port}/v1/chat/completions",
                bank,
                rate_per_s=rate_per_s,
                task=TASK,
                model=MODEL,
                stop=stop,
            )
        )
    ]
    if auto_reviewer:
        workers.append(
            asyncio.create_task(auto_review(f"http://127.0.0.1:{review_port}", token, stop=stop))
        )
    started = time.monotonic()
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), summary_every_s)
            running.service.publish()
            print(_summary(running, started, model), flush=True)
            if duration_s is not None and time.monotonic() - started >= duration_s:
                stop.set()
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await running.close(settings.drain_timeout_s)
        await model.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0
