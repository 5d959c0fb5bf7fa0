"""Errors a newcomer can act on: a port already taken, a wrong base_url, the review
token's precedence, and ``check-config --probe``."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from adapters.model.client import HttpModelClient, shown_url
from monitor.app.cli import main
from monitor.app.runner import start_service
from monitor.config import load_settings
from monitor.core.errors import ConfigError, ModelCallError
from tests.ports import free_port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def model() -> Iterator[str]:
    """An OpenAI-style server on 127.0.0.1 answering under /v1 only; its base URL. It runs
    on its own thread's event loop, so that sync tests (check-config runs asyncio.run)
    and async tests alike can call it."""

    async def answer(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer sk-secret":
            return web.json_response({"error": "no key"}, status=401)
        return web.json_response({"choices": [{"message": {"content": "ok"}}]})

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def _config(tmp_path: Path, *, metrics_port: int, base_urls: tuple[str, ...] = ()) -> Path:
    tasks = "".join(
        f"""  - name: t{i}
    canonicalizer: numeric
    endpoint: {{model: m, base_url: "{url}", api_key: sk-secret}}
"""
        for i, url in enumerate(base_urls or ("http://127.0.0.1:9/v1",))
    )
    path = tmp_path / "relmon.yaml"
    path.write_text(
        f"""tasks:
{tasks}metrics: {{port: {metrics_port}}}
review: {{port: {free_port()}, token: tok-123456}}
traffic: {{port: {free_port()}}}
state_dir: "{tmp_path / "state"}"
""",
        encoding="utf-8",
    )
    return path


def test_check_config_names_a_port_already_in_use(
    tmp_path: Path, taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, metrics_port=taken_port)
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"metrics.port: cannot listen on 127.0.0.1:{taken_port}" in err
    assert "Traceback" not in err


async def test_run_names_a_port_already_in_use_and_leaves_nothing_running(
    tmp_path: Path, taken_port: int
) -> None:
    settings = load_settings(_config(tmp_path, metrics_port=taken_port))
    before = len(asyncio.all_tasks())
    with pytest.raises(
        ConfigError, match=rf"metrics\.port: cannot listen on 127\.0\.0\.1:{taken_port}"
    ):
        await start_service(settings)
    assert len(asyncio.all_tasks()) == before  # no worker left behind
    # The store was closed: the same state dir starts cleanly on a free port.
    running = await start_service(load_settings(_config(tmp_path, metrics_port=free_port())))
    await running.close(1)


async def test_a_wrong_base_url_is_named_in_the_error_never_the_key(model: str) -> None:
    wrong = model.removesuffix("/v1")  # the classic mistake: the /v1 forgotten
    client = HttpModelClient(base_url=wrong, model="m", api_key="sk-secret", max_retries=0)
    try:
        with pytest.raises(ModelCallError) as info:
            await client.sample({"messages": [{"role": "user", "content": "hi"}]}, 1)
    finally:
        await client.aclose()
    message = str(info.value)
    assert f"{wrong}/chat/completions" in message
    assert "HTTP 404" in message and "endpoint.base_url" in message and "/v1" in message
    assert "sk-secret" not in message
    assert shown_url("https://user:pw@example.com:8443/v1/x?key=1#f") == (
        "https://example.com:8443/v1/x"
    )


def test_check_config_probe_says_what_each_endpoint_answered(
    tmp_path: Path, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = model.removesuffix("/v1")
    path = _config(tmp_path, metrics_port=free_port(), base_urls=(model, wrong))
    status = main(["check-config", "--config", str(path), "--probe"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("relmon: probe: ")]
    assert status == 2, err
    assert len(lines) == 2, err
    assert (
        f"tasks[0] (t0).endpoint: ok: {model}/chat/completions (openai.chat, model m)" in lines[0]
    )
    assert "tasks[1] (t1).endpoint: FAILED" in lines[1] and "HTTP 404" in lines[1]
    assert "sk-secret" not in err


def test_the_review_token_variable_wins_over_a_missing_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "relmon.yaml"
    path.write_text(
        f"""tasks:
  - name: t
    canonicalizer: numeric
    endpoint: {{model: m}}
metrics: {{port: {free_port()}}}
review: {{port: {free_port()}, token_file: {tmp_path / "no-such-token"}}}
traffic: {{port: {free_port()}}}
state_dir: "{tmp_path / "state"}"
""",
        encoding="utf-8",
    )
    monkeypatch.setenv("RELMON_REVIEW_TOKEN", "from-the-environment")
    assert main(["check-config", "--config", str(path)]) == 0, capsys.readouterr().err
    assert load_settings(path).resolved_review_token() == "from-the-environment"
    monkeypatch.delenv("RELMON_REVIEW_TOKEN")
    assert main(["check-config", "--config", str(path)]) == 2
    assert "review.token_file" in capsys.readouterr().err


async def test_a_second_relmon_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    first = await start_service(load_settings(_config(tmp_path, metrics_port=free_port())))
    try:
        second = load_settings(_config(tmp_path, metrics_port=free_port()))
        with pytest.raises(ConfigError, match=r"state_dir: .* is in use by another relmon"):
            await start_service(second)
    finally:
        await first.close(1)
    again = await start_service(load_settings(_config(tmp_path, metrics_port=free_port())))
    await again.close(1)  # released at close: the next start is fine
