"""What a new user sees first: the demo's first line, the review page, the certify table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from monitor.app.cli import main
from monitor.app.runner import start_service
from monitor.config import load_settings
from tests.ports import free_port

pytestmark = pytest.mark.integration  # runs `relmon demo` as a process

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_demo_says_where_metrics_and_the_review_page_are_first(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(4)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELMON_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monitor",
            "demo",
            "--duration",
            "1",
            "--metrics-port",
            str(ports[0]),
            "--review-port",
            str(ports[1]),
            "--traffic-port",
            str(ports[2]),
            "--model-port",
            str(ports[3]),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    first = out.splitlines()[0]
    assert first.startswith("relmon demo: starting")
    assert f"http://127.0.0.1:{ports[0]}/metrics" in first
    assert f"http://127.0.0.1:{ports[1]}/review" in first
    # once everything listens: every address, the simulated model's too
    started = out.splitlines()[1]
    assert f"traffic http://127.0.0.1:{ports[2]}" in started
    assert f"model http://127.0.0.1:{ports[3]}/v1" in started
    assert "review token (set RELMON_REVIEW_TOKEN to choose one): " in err


def test_demo_help_calls_the_traffic_port_the_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's traffic goes through the inline proxy, never a mirror."""
    assert main(["demo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    traffic = text.split("--traffic-port TRAFFIC_PORT", 2)[2].split("--model-port", 1)[0]
    assert "proxy" in traffic and "mirror" not in traffic
    assert "any free port" in text.split("--model-port MODEL_PORT", 2)[2]


async def test_review_page_says_where_the_token_comes_from(tmp_path: Path) -> None:
    settings = load_settings(
        None,
        tasks=[{"name": "a", "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}],
        metrics={"port": 0},
        review={"port": 0, "token": "t0k3n-abc"},
        traffic={"mode": "off"},
        state_dir=tmp_path / "state",
    )
    running = await start_service(settings)
    try:
        assert running.review_server is not None
        url = f"http://127.0.0.1:{running.review_server.bound_port}/review"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            assert resp.status == 200
            page = await resp.text()
    finally:
        await running.close(1)
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    for source in ("RELMON_REVIEW_TOKEN", "review.token_file", "relmon demo"):
        assert source in text, source


def test_certify_table_values_line_up(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "certify",
        "--samples",
        str(EXAMPLES / "arith_samples.jsonl"),
        "--labels",
        str(EXAMPLES / "arith_labels.jsonl"),
        "--canonicalizer",
        "numeric",
        "--test-fraction",
        "0.5",
        "--seed",
        "1",
    ]
    assert main(args) == 0
    head = capsys.readouterr().out.split("\n\n", 1)[0].splitlines()
    assert any("lower bound (95%)" in line for line in head)
    columns = {
        m.start(2) for m in (re.match(r"^(\s*\S.*?\S)\s{2,}(\S.*)$", ln) for ln in head) if m
    }
    assert len(head) >= 8 and len(columns) == 1, head
