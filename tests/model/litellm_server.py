"""Start and stop the LiteLLM proxy (PyPI ``litellm[proxy]``) in front of the llama.cpp
SmolLM2 server: a real server that speaks every wire API relmon reads and that nobody
here wrote (DESIGN §4).

``make`` installs LiteLLM into a virtual environment of its own (``<venv>/litellm``: its
pinned dependencies would fight relmon's). With ``lm_studio/`` as the provider (an
OpenAI-compatible server) LiteLLM answers ``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses`` (bridged to chat completions: llama.cpp has no
Responses API of its own), Anthropic's ``/v1/messages`` and Gemini's
``/v1beta/models/{model}:generateContent`` (and ``:streamGenerateContent?alt=sse``),
each in its API's own JSON and SSE shapes, from the backend's chat completions. It runs
offline (``LITELLM_LOCAL_MODEL_COST_MAP=True``) and refuses to start without a master
key, which every request then carries, each API its own way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port
from tests.waiting import WaitError, wait_until_sync

__all__ = ["MASTER_KEY", "MODEL", "LiteLLM", "LiteLLMError", "litellm_binary", "litellm_proxy"]

MASTER_KEY = "sk-relmon-test"
MODEL = "smollm2"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LiteLLMError(RuntimeError):
    """LiteLLM could not be found or started."""


@dataclass
class LiteLLM:
    """A running LiteLLM proxy: its root URL (no version segment), process and log."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_s: float

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return "(no log)"


def litellm_binary() -> Path:
    """The ``litellm`` command ``make`` installs beside relmon's virtual environment."""
    path = Path(sys.prefix) / "litellm" / "bin" / "litellm"
    if not path.is_file():
        raise LiteLLMError(f"{path} not found: run make install-test (it installs LiteLLM)")
    return path


def _ready(url: str) -> bool:
    request = urllib.request.Request(
        f"{url}/v1/models", headers={"Authorization": f"Bearer {MASTER_KEY}"}
    )
    try:
        with _NO_PROXY.open(request, timeout=2.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _config(backend: str) -> str:
    return (
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: lm_studio/{MODEL}\n"
        f"      api_base: {backend}\n"
        "      api_key: none\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
        "router_settings:\n"
        "  disable_cooldowns: true\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
    )


@contextmanager
def litellm_proxy(
    backend: str, *, log_dir: Path, startup_timeout_s: float = 120.0
) -> Iterator[LiteLLM]:
    """LiteLLM on 127.0.0.1 in front of ``backend`` (an OpenAI-style base URL with /v1),
    stopped on exit."""
    binary = litellm_binary()
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    config = log_dir / "litellm.yaml"
    config.write_text(_config(backend))
    log_path = log_dir / f"litellm_{port}.log"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_PROXY": "*"}
    cmd = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    server = LiteLLM(f"http://127.0.0.1:{port}", process, log_path, 0.0)
    try:
        try:
            wait_until_sync(
                lambda: _ready(server.url),
                timeout_s=startup_timeout_s,
                what=f"LiteLLM at {server.url}",
                interval_s=0.5,
                alive=process,
                detail=server.log_tail,
            )
        except WaitError as exc:
            raise LiteLLMError(str(exc)) from exc
        server.startup_s = time.monotonic() - started
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
